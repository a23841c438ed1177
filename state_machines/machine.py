"""The shared Hypothesis machine: every variant's machine subclasses ``KVMachine``.

A variant's machine declares no rules by hand: ``class RadixMachine(KVMachine, ops=OPS)``
gets one rule per generator of its op table (``state_machines/gen.py``).  Each rule builds an
op and calls ``self.do(...)``, which applies it to the subject through a ``Run`` and checks
every invariant.  ``teardown`` runs the quiescence op at the end of every example and, on
Hypothesis's final (shrunk) replay, hands the trace to the ``Recorder``.  Live requests are
picked by index (``pick % len(live)``) under a precondition rather than drawn from bundles:
empty bundles make Hypothesis retry draws, and an index shrinks towards the oldest request.
"""

from __future__ import annotations

import time
from collections import Counter

from hypothesis.control import current_build_context
from hypothesis.stateful import RuleBasedStateMachine

from caches.target import DECLINE
from invariants import Violation
from state_machines.signature import Signature
from state_machines.gen import Driver, install_rules
from state_machines.ops import Op
from state_machines.run import Run
from state_machines.deadline import HANG_SHRINK_LIMIT
from state_machines.stopping import stop_requested


class StopFuzzing(KeyboardInterrupt):
    """Raised out of Hypothesis to end a session early (a time cap, too many hangs, a stop
    the user asked for): never a failure of the cache.

    It must be a ``KeyboardInterrupt``: that is the one exception Hypothesis's engine lets
    through a test case without recording the case in its tree of choices
    (``ConjectureRunner.test_function``).  Any other exception concludes the case where it was
    raised; a derandomised run that had drawn past that point before then meets a prefix that
    both continues and stops, and fails with "FlakyStrategyDefinition: Inconsistent data
    generation" -- a harness error where the budget simply ran out.  Catch it before
    ``KeyboardInterrupt`` (``fuzz._one_run``) to tell the two apart."""


class Recorder:
    """What a fuzz session learns: examples, steps, first failure time, the shrunk trace."""

    def __init__(self):
        self.started = time.monotonic()
        self.examples = 0
        self.steps = 0
        self.first_failure_at: float | None = None
        self.first_trace = None  # the first failing run, unshrunk (kept if interrupted)
        self.best_run = None  # the shortest Run that failed as the first did, so far
        self.final_trace = None  # the shrunk failing run
        self.keep_ops = False  # bench: keep every example's ops
        self.sequences: list[list] = []
        self.reached: Counter = Counter()  # "sometimes" transitions, summed over examples
        self.ops: Counter = Counter()  # ops generated (and applied), by name; quiesce included
        self.interrupted = False  # an interrupt went through an op
        self.hangs = 0  # runs that ended in a hang
        self.hang_trace = None  # the shortest of them
        self.repeats: Counter = Counter()  # tolerated failures met again, by signature
        self.distinct = 0  # distinct failures so far (the fuzz loop sets it)
        self.stop_at: float | None = None  # a time cap: no example starts after it
        self.capped = False  # the cap ended the session

    def seconds_to_first_failure(self) -> float | None:
        if self.first_failure_at is None:
            return None
        return self.first_failure_at - self.started


class KVMachine(RuleBasedStateMachine, Driver):
    spec = None  # VariantSpec
    params: dict = {}
    fault: str | None = None
    target = "reference"
    src: str | None = None  # the engine checkout a --src target loads
    known_findings = DECLINE
    device: str | None = None
    recorder: Recorder | None = None
    tolerated: frozenset | set = frozenset()  # signatures already found: met again, only counted

    def __init_subclass__(cls, ops=None, **kwargs):
        super().__init_subclass__(**kwargs)
        if ops is not None:  # a variant's machine: its rules come from the op table
            install_rules(cls, ops)

    def __init__(self):
        super().__init__()
        self.run = Run(self.spec, self.params, self.fault, self.target, self.device,
                       src=self.src, known_findings=self.known_findings)
        self.subject = self.run.subject
        self.init_driver()
        self.tolerating = False  # broke the way an earlier failure did: the rest is a no-op
        if self.recorder is not None:
            self.recorder.examples += 1

    def do(self, name: str, **args) -> str:
        if self.tolerating:
            return "tolerated"
        rec = self.recorder
        if rec is not None and not self.run.ops:  # an example's first op
            if stop_requested():  # Ctrl-C / SIGTERM that something swallowed on its way out
                raise StopFuzzing("interrupted")
            if rec.stop_at is not None and rec.examples > 1 \
                    and time.monotonic() >= rec.stop_at:
                rec.capped = True  # (after the first example): no example that ran is
                raise StopFuzzing("time cap")  # cut short
        if self.recorder is not None:
            self.recorder.ops[name] += 1
        try:
            rec = self.run.step(Op(name, args))
        except Violation as v:
            if self.tolerated and v.prop != "hang":
                sig = Signature.of(v.prop, name, v.message)
                if sig in self.tolerated:  # found before: count it, end the example quietly
                    self.tolerating = True
                    if self.recorder is not None:
                        self.recorder.repeats[sig] += 1
                    return "tolerated"
            if self.recorder is not None and self.recorder.first_failure_at is None:
                self.recorder.first_failure_at = time.monotonic()
                self.recorder.first_trace = self.run.trace()
            if self.recorder is not None and v.prop == "hang":
                self._count_hang()
            raise
        except BaseException:
            if self.recorder is not None and self.run.interrupted:
                self.recorder.interrupted = True
            raise
        if self.recorder is not None:
            self.recorder.steps += 1
        return rec.result

    def _count_hang(self) -> None:
        rec = self.recorder
        rec.hangs += 1
        trace = self.run.trace()
        if rec.hang_trace is None or len(trace.ops) < len(rec.hang_trace.ops):
            rec.hang_trace = trace
        if rec.hangs >= HANG_SHRINK_LIMIT:
            raise StopFuzzing(f"{rec.hangs} hangs")

    def teardown(self) -> None:
        try:
            # an interrupted op may have left the cache half-updated: draining it now would
            # report that as a violation of the cache (it is not one)
            if self.run.violation is None and not self.run.interrupted and not self.tolerating:
                self.do("quiesce")
        finally:
            self._record_final()

    def _record_final(self) -> None:
        if self.recorder is not None:
            self.recorder.reached.update(getattr(self.subject, "reached_counts", None) or {})
        if self.recorder is not None and self.recorder.keep_ops:
            self.recorder.sequences.append(list(self.run.ops))
        if self.recorder is None or self.run.violation is None or self.tolerating:
            return
        if _final():
            self.recorder.final_trace = self.run.trace()
            return
        self._keep_if_shorter()

    def _keep_if_shorter(self) -> None:
        """While Hypothesis shrinks, keep the shortest run that broke the way the first one
        did: what a run stopped mid-shrink (a time budget, an interrupt) reports."""
        rec, v = self.recorder, self.run.violation
        first = rec.first_trace.violation if rec.first_trace is not None else None
        if first is None or v.prop != first["property"] \
                or self.run.ops[-1].name != rec.first_trace.ops[first["step"] - 1].name:
            return
        if rec.best_run is None or len(self.run.ops) < len(rec.best_run.ops):
            rec.best_run = self.run  # (its trace is built once, if it is used)


def _final() -> bool:
    """Whether this example is Hypothesis's final replay of the failure it reports."""
    try:
        return bool(current_build_context().is_final)
    except Exception:  # noqa: BLE001  outside a Hypothesis run
        return False


def machine_class(spec, params: dict, *, fault: str | None = None, target: str = "reference",
                  device: str | None = None, recorder: Recorder | None = None,
                  src: str | None = None, known_findings: str = DECLINE,
                  tolerated: set | frozenset = frozenset()):
    """A concrete machine class for one variant, regime, fault and target; ``tolerated``:
    failure signatures already found (the set may grow between Hypothesis runs)."""
    params = spec.check_params(params, target)
    declared = spec.params_for(target)
    label = "".join(f"_{k}{v}" for k, v in sorted(params.items()) if v != declared[k].default)
    name = f"{spec.machine.__name__}{'_' + fault if fault else ''}{label}"
    return type(name, (spec.machine,), {
        "spec": spec, "params": params, "fault": fault, "target": target, "device": device,
        "recorder": recorder, "src": src, "known_findings": known_findings,
        "tolerated": tolerated,
        "__module__": spec.machine.__module__,
    })
