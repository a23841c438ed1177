"""Fuzzing one variant/regime/fault/target with Hypothesis, for a number of examples or a
time budget, returning what happened (and the shrunk trace, saved as JSON)."""

from __future__ import annotations

import random
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hypothesis import settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from caches.target import DECLINE
from state_machines.failures import Ledger, label
from state_machines.machine import Recorder, StopFuzzing, machine_class
from state_machines.profiles import pin_constant_pool, without_shrink
from state_machines.signature import Signature
from state_machines.stopping import stop_on_signals, stop_requested
from state_machines.trace import Trace

BATCH = 25  # examples per Hypothesis run when spending a time budget
MAX_ROUNDS = 8  # without a time budget: Hypothesis runs at most, while each finds a new failure


@dataclass
class FuzzOutcome:
    variant: str
    params: dict
    fault: str | None
    target: str
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0
    first_failure_seconds: float | None = None
    trace: Trace | None = None
    trace_path: Path | None = None
    interrupted: bool = False
    error: str | None = None  # the harness itself failed (not a property)
    capped: bool = False  # ``time_cap`` ended it before its budget of examples was spent
    reached: dict | None = None  # "sometimes" transitions seen, name -> count
    op_counts: dict | None = None  # ops generated (and applied), name -> count
    failures: list = field(default_factory=list)  # distinct failures (failures.Failure)

    @property
    def failed(self) -> bool:
        return self.trace is not None and self.trace.violation is not None

    @property
    def prop(self) -> str | None:
        return self.trace.violation["property"] if self.failed else None


@contextmanager
def noting_interrupts():
    """Ctrl-C while the block runs is recorded as a stop (``state_machines/stopping.py``) as
    well as raised, so a run whose ``KeyboardInterrupt`` was lost on the way (a ``SystemError``
    out of CPython's AST constructor, a gc callback) still ends as interrupted, not broken.
    Only where SIGINT has Python's default handler, in the main thread: the CLI installs the
    same handler for SIGINT and SIGTERM itself."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    with stop_on_signals((signal.SIGINT,)):
        yield


def fuzz(spec, params: dict, *, fault: str | None = None, target: str = "reference",
         device: str | None = None, max_examples: int | None = None,
         budget: float | None = None, seed: int | None = None,
         out_dir: str | Path | None = None,
         progress: Callable[[Recorder], None] | None = None,
         database=None, src: str | None = None,
         known_findings: str = DECLINE, time_cap: float | None = None,
         stop_on_first: bool = True, shrinker: str | None = "kvcheck",
         stop_on: frozenset | set | tuple = ()) -> FuzzOutcome:
    """Run the machine; ``database`` (a Hypothesis ExampleDatabase) overrides the profile's.

    With ``stop_on_first`` (the default here; ``kvcheck fuzz``, ``gate`` and ``nightly`` pass
    False unless asked) the first failure ends the run.  Otherwise the search goes on: the
    failure is shrunk and saved, its signature is *tolerated* from then on (a later example
    that breaks the same way ends quietly and is only counted, ``KVMachine.do``), and a fresh
    Hypothesis run starts -- with a time budget until it is spent, otherwise while each run
    still finds a new failure, for at most ``MAX_ROUNDS`` runs of ``max_examples`` each
    (``stop_on``: properties whose first failure ends the search).  ``out.failures`` lists the
    distinct ones (``state_machines/failures.py``).  ``time_cap`` (seconds) ends the run
    between examples once it is spent (``capped``; one example always runs), so a
    derandomised run keeps its examples and only loses its tail.  ``budget`` is a cap too:
    the whole call, shrinking included, ends within it plus one example.  A failure whose
    shrinking the cap cut short is reported with the shortest run seen so far, marked partly
    shrunk (``kvcheck shrink`` goes on from there).

    ``shrinker``: what shrinks a failure Hypothesis found.  ``"kvcheck"`` (the default):
    Hypothesis runs without its shrink phase and kvcheck's own shrinker
    (``state_machines/shrinker.py``) shrinks the failure, keeping its signature, within the
    budget's time left (``SHRINK_BUDGET`` without one) -- measured as short or shorter than
    Hypothesis's and one to two orders of magnitude faster (fault P2: 128 s against 0.7 s, the
    same 5 steps).  ``"hypothesis"``: Hypothesis's own shrink phase.  None: not shrunk."""
    pin_constant_pool()
    params = spec.check_params(params, target)
    rec = Recorder()
    if budget is not None:
        time_cap = budget if time_cap is None else min(budget, time_cap)
    if time_cap is not None:
        rec.stop_at = rec.started + time_cap
    tolerated: set = set()
    machine = machine_class(spec, params, fault=fault, target=target, device=device,
                            recorder=rec, src=src, known_findings=known_findings,
                            tolerated=tolerated)
    out = FuzzOutcome(spec.name, params, fault, target)
    ledger = Ledger()
    base = settings.default if database is None else settings(settings.default,
                                                               database=database)
    if shrinker not in ("kvcheck", "hypothesis", None):
        raise ValueError(f"shrinker {shrinker!r}: 'kvcheck', 'hypothesis' or None")
    if shrinker != "hypothesis":
        base = without_shrink(base)
    # a derandomised profile (ci) keeps a time-budgeted run derandomised too: the same code
    # gets the same examples until the budget cuts the tail
    start_seed = seed if seed is not None else 0 if base.derandomize else random.randrange(2**32)
    deadline = rec.started + budget if budget is not None else None
    rounds = 0
    with with_reporter(lambda _msg: None):  # we print our own, plain-words steps
        while True:
            if deadline is not None:
                if rounds and time.monotonic() >= deadline:
                    break  # (the first round always runs: a budget never skips the check)
                machine._hypothesis_internal_use_seed = start_seed + rounds
                run_settings = settings(base, max_examples=max_examples or BATCH,
                                        derandomize=False)
            else:
                left = max_examples or base.max_examples
                if rounds >= MAX_ROUNDS:
                    break
                if seed is not None or rounds:
                    machine._hypothesis_internal_use_seed = start_seed + rounds
                run_settings = settings(base, max_examples=left,
                                        derandomize=base.derandomize and seed is None
                                        and not rounds)
            rounds += 1
            found = _one_run(machine, run_settings, rec, out)
            if found is not None and shrinker != "hypothesis" and not out.interrupted \
                    and not out.error:
                found = _shrunk(spec, params, found, shrinker, _shrink_budget(rec),
                                fault=fault, target=target, device=device, src=src,
                                known_findings=known_findings)
                if stop_requested():
                    out.interrupted = True
            if found is not None:
                failure = ledger.record(found, found.meta["seconds_to_first_failure"],
                                        engine="hypothesis")
                tolerated.add(failure.signature)
                if out_dir is not None:
                    failure.trace_path = found.save(out_dir)
                rec.distinct = len(ledger)
            if progress and deadline is not None:
                progress(rec)
            if out.interrupted or out.error or rec.capped or (found is not None and (
                    stop_on_first or failure.signature.prop in stop_on)):
                break
            if found is None and deadline is None:
                break  # the examples budget found nothing new
    for sig, n in rec.repeats.items():
        ledger.seen(sig, 0.0, n)
    out.failures = [label(f) for f in ledger]
    first = out.failures[0] if out.failures else None
    out.trace = first.trace if first else None
    out.trace_path = first.trace_path if first else None
    out.examples, out.steps, out.capped = rec.examples, rec.steps, rec.capped
    out.reached = dict(rec.reached)
    out.op_counts = dict(rec.ops)
    out.seconds = time.monotonic() - rec.started
    out.first_failure_seconds = first.first_seen if first else None
    return out


SHRINK_BUDGET = 60.0  # seconds kvcheck's shrinker gets for a failure of a run without a budget


def _shrink_budget(rec: Recorder) -> float:
    """What is left for shrinking: the time cap's (a budget sets it too) time left, else
    ``SHRINK_BUDGET``."""
    if rec.stop_at is None:
        return SHRINK_BUDGET
    return max(0.0, rec.stop_at - time.monotonic())


def _shrunk(spec, params, found: Trace, shrinker: str | None, budget: float, **run_kw) -> Trace:
    """``found`` (Hypothesis's failure, as found) shrunk by kvcheck's shrinker within
    ``budget`` seconds, keeping its signature; marked partly shrunk if the budget cut it."""
    from state_machines.shrinker import shrink_to_trace

    meta = {k: v for k, v in found.meta.items() if k != "note"}
    if shrinker is None:
        found.meta = {**meta, "shrunk": False, "note": "not shrunk (asked for)"}
        return found
    small, whole = shrink_to_trace(spec, params, found.ops, Signature.of_trace(found),
                                   budget=budget, **run_kw)
    if small is None or len(small.ops) > len(found.ops):
        small, whole = found, False
    small.meta = {**meta, "shrunk": whole}
    if not whole:
        small.meta["note"] = "partly shrunk: the time budget ran out while shrinking"
    return small


def _one_run(machine, run_settings, rec: Recorder, out: FuzzOutcome):
    """One Hypothesis run; the failing trace it found (shrunk, with its meta), or None."""
    rec.first_trace = rec.final_trace = rec.hang_trace = rec.best_run = None
    rec.first_failure_at, rec.hangs = None, 0
    with noting_interrupts():  # (the stop it records is asked for inside it)
        try:
            run_state_machine_as_test(machine, settings=run_settings)
        except StopFuzzing:  # a time cap, too many hangs, or a stop asked for
            if stop_requested():  # (else a time cap or too many hangs)
                out.interrupted = True
        except KeyboardInterrupt:
            out.interrupted = True
        except Exception as exc:  # a property failed (shrunk), or Hypothesis complained
            if stop_requested():  # a Ctrl-C that surfaced as another exception: a
                out.interrupted = True  # SystemError, Hypothesis's own assertion
            elif rec.final_trace is None and rec.first_trace is None:
                out.error = f"{type(exc).__name__}: {exc}"
    partly = rec.final_trace is None and rec.best_run is not None \
        and len(rec.best_run.ops) < len(rec.first_trace.ops)
    trace = rec.final_trace or rec.hang_trace or (
        rec.best_run.trace() if partly else rec.first_trace)
    if trace is None:
        return None
    at = rec.seconds_to_first_failure()
    trace.meta.update({"examples": rec.examples, "shrunk": rec.final_trace is not None,
                       "seconds_to_first_failure": at if at is not None else 0.0})
    if rec.final_trace is None and rec.hang_trace is not None:
        trace.meta["shrunk"] = False
        trace.meta["note"] = (f"a hang: shrinking stopped after {rec.hangs} hanging "
                              "runs (each costs a full per-op deadline)")
    elif rec.final_trace is None:
        trace.meta["note"] = ("interrupted" if out.interrupted else
                              "partly shrunk: the time budget ran out while shrinking")
    return trace
