"""A run: ops applied one by one to a fresh subject, every invariant checked after each step.

This is the single execution path.  The Hypothesis machines, ``replay`` and the exhaustive
explorer all drive a ``Run``; a failure is always a ``Violation`` carrying the property, the
step it broke at, and the ops so far (a trace).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from caches.target import DECLINE
from invariants import Violation
from state_machines.deadline import Hang, deadline, op_deadline, ticking
from state_machines.ops import Op
from state_machines.trace_record import Trace


# kvcheck's own packages: an exception of a programming-error type raised in their code is
# kvcheck's bug, never a verdict on the engine
_OWN = tuple(str(Path(__file__).resolve().parents[1] / d) for d in
             ("caches", "invariants", "state_machines"))
_BUG_TYPES = (TypeError, AttributeError, NameError, ImportError, SyntaxError)


class HarnessError(RuntimeError):
    """kvcheck's own code failed during an op or its checks (not the engine: never a
    ``crash`` verdict; the commands report it as a harness error, exit 4)."""


def harness_bug(exc: BaseException) -> str | None:
    """Where ``exc`` shows kvcheck's own bug: a ``TypeError``, ``AttributeError``,
    ``NameError`` or import error raised in a frame of kvcheck's own code (its innermost
    frame: the engine's code calling back into kvcheck is not the engine's fault either).
    None: the engine's (or the reference model's own assertion)."""
    if not isinstance(exc, _BUG_TYPES):
        return None
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return None
    where = last.tb_frame.f_code.co_filename
    if not where.startswith(_OWN):
        return None
    return f"{where.rsplit('/', 2)[-2]}/{where.rsplit('/', 1)[-1]}:{last.tb_lineno}"


@dataclass
class StepRecord:
    index: int  # 1-based
    op: Op
    words: str
    result: str
    counters: dict = field(default_factory=dict)


class Run:
    def __init__(self, spec, params: dict, fault: str | None = None, target: str = "reference",
                 device: str | None = None, *, src: str | None = None,
                 known_findings: str = DECLINE):
        self.spec = spec
        self.params = dict(params)
        self.fault = fault
        self.target = target
        self.src = src
        self.known_findings = known_findings
        self.subject = spec.make_subject(self.params, fault=fault, target=target, device=device,
                                         src=src, known_findings=known_findings)
        self.ops: list[Op] = []
        self.violation: Violation | None = None
        self.failed_step: int | None = None
        self.interrupted = False  # a KeyboardInterrupt/SystemExit went through an op
        self.deadline = op_deadline()  # seconds per op (+ its checks); 0: none
        # a context manager around each op's call into the subject, not its checks
        # (``kvcheck report`` records the engine calls an op makes: state_machines/report.py)
        self.around_op = None

    def step(self, op: Op) -> StepRecord:
        """Apply ``op`` and check every invariant (``apply``), and describe the step: its
        words and the counters after it."""
        result = self.apply(op)
        return StepRecord(len(self.ops), op, self.spec.ops.describe(op), result,
                          self.subject.counters())

    def apply(self, op: Op) -> str:
        """Apply ``op`` and check every invariant; returns the op's result.  Raises
        ``Violation`` (crashes and ops that overrun the per-op deadline become one).  An
        interrupt (KeyboardInterrupt, SystemExit) is never a violation: it marks the run
        ``interrupted`` and goes on up."""
        if self.violation is not None:
            raise RuntimeError("this run already failed; start a fresh one")
        if self.interrupted:
            raise KeyboardInterrupt("this run was interrupted")
        self.ops.append(op)
        index = len(self.ops)
        try:
            ticker = ticking(self.deadline)
            if ticker is not None:  # a batch's shared deadline: no system call per op
                ticker.guard()
                try:
                    return self._apply_and_check(op)
                finally:
                    ticker.clear()
            with deadline(self.deadline):
                return self._apply_and_check(op)
        except Violation as v:
            self._fail(v, index)
            raise
        except Hang as h:
            v = Violation("hang", f"'{self.spec.ops.describe(op)}' (or the checks after it) "
                          f"did not return within {h.seconds:g}s (the per-op deadline, "
                          "--op-deadline)", seconds=h.seconds)
            self._fail(v, index)
            raise v from None
        except Exception as exc:  # the cache itself crashed or asserted
            where = harness_bug(exc)
            if where is not None:  # kvcheck's own code: not a verdict on the engine
                raise HarnessError(f"kvcheck's own code failed at {where} during "
                                   f"'{self.spec.ops.describe(op)}': {type(exc).__name__}: "
                                   f"{exc}") from exc
            v = Violation("crash", f"{type(exc).__name__} in the cache during "
                          f"'{self.spec.ops.describe(op)}': {exc}", exception=type(exc).__name__)
            self._fail(v, index)
            raise v from exc
        except BaseException:  # Ctrl-C, SIGTERM-as-exit: the cache may be half-updated
            self.interrupted = True
            raise

    def _apply_and_check(self, op: Op) -> str:
        if self.around_op is None:
            result = self.spec.ops.apply(self.subject, op)
        else:
            with self.around_op():
                result = self.spec.ops.apply(self.subject, op)
        self.subject.check()
        return result

    def _fail(self, v: Violation, index: int) -> None:
        self.violation, self.failed_step = v, index
        v.step = index

    def trace(self) -> Trace:
        vio = None
        if self.violation is not None:
            vio = {**self.violation.to_json(), "step": self.failed_step}
        return Trace(self.spec.name, self.params, list(self.ops), self.fault, self.target, vio,
                     identity=target_identity(self.spec, self.target, self.src),
                     known_findings=self.known_findings, src=self.src)


def target_identity(spec, target: str, src: str | None):
    """The identity of the code ``target`` runs (None for a made-up pair target)."""
    if target in spec.extra_targets:
        return None
    from state_machines.targets import get_target

    return get_target(target).identity(src)
