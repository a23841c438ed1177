"""Replay: apply a trace's ops to a fresh subject, re-checking every property at every step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from invariants import Violation
from state_machines.run import Run, StepRecord
from state_machines.trace import Trace
from state_machines.variants import get_variant


@dataclass
class ReplayResult:
    steps: list[StepRecord] = field(default_factory=list)
    violation: Violation | None = None
    failed_step: int | None = None  # 1-based
    failed_op: str | None = None
    run: Run | None = None  # the run, for a look at the subject after the last step

    @property
    def ok(self) -> bool:
        return self.violation is None


def replay(trace: Trace, *, device: str | None = None,
           on_step: Callable[[StepRecord, Run], None] | None = None,
           src: str | None = None, known_findings: str | None = None,
           fix: str | None = None) -> ReplayResult:
    """Re-run ``trace`` on a fresh subject of its target, treating known upstream findings as
    the recorded run did (``known_findings`` overrides), from ``src`` (default: the
    checkout the trace recorded); ``fix``: with the model of that known finding's fix
    installed (``Subject.apply_fix_model``; ``NoFixModel`` if it has none)."""
    spec = get_variant(trace.variant)
    run = Run(spec, trace.params, trace.fault, trace.target, device,
              src=src if src is not None else trace.src,
              known_findings=known_findings or trace.known_findings)
    if fix is not None:
        run.subject.apply_fix_model(fix)
    result = ReplayResult(run=run)
    for op in trace.ops:
        try:
            rec = run.step(op)
        except Violation as v:
            result.violation, result.failed_step = v, run.failed_step
            result.failed_op = spec.ops.describe(op)
            return result
        result.steps.append(rec)
        if on_step is not None:
            on_step(rec, run)
    return result
