"""Fuzzing one variant/regime/fault/target with Hypothesis, for a number of examples or a
time budget, returning what happened (and the shrunk trace, saved as JSON)."""

from __future__ import annotations

import random
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hypothesis import settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from caches.target import DECLINE
from state_machines.machine import Recorder, StopFuzzing, machine_class
from state_machines.profiles import pin_constant_pool
from state_machines.trace import Trace

BATCH = 25  # examples per Hypothesis run when spending a time budget


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

    @property
    def failed(self) -> bool:
        return self.trace is not None and self.trace.violation is not None

    @property
    def prop(self) -> str | None:
        return self.trace.violation["property"] if self.failed else None


@contextmanager
def noting_interrupts():
    """Yields a list that gets an entry for every Ctrl-C while the block runs (which still
    raises ``KeyboardInterrupt``).  A Ctrl-C that lands inside CPython's AST constructor
    (Hypothesis compiles code as it runs) comes out as a ``SystemError`` ("AST constructor
    recursion depth mismatch"): with the list a caller still knows the run was interrupted,
    not broken.  Only where SIGINT has Python's default handler, in the main thread."""
    seen: list = []
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield seen
        return

    def handler(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, old)


def fuzz(spec, params: dict, *, fault: str | None = None, target: str = "reference",
         device: str | None = None, max_examples: int | None = None,
         budget: float | None = None, seed: int | None = None,
         out_dir: str | Path | None = None,
         progress: Callable[[Recorder], None] | None = None,
         database=None, src: str | None = None,
         known_findings: str = DECLINE, time_cap: float | None = None) -> FuzzOutcome:
    """Run the machine; ``database`` (a Hypothesis ExampleDatabase) overrides the profile's.
    ``time_cap`` (seconds) ends the run between examples once it is spent (``capped``; one
    example always runs), so a derandomised run keeps its examples and only loses its tail."""
    pin_constant_pool()
    params = spec.check_params(params, target)
    rec = Recorder()
    if time_cap is not None:
        rec.stop_at = rec.started + time_cap
    machine = machine_class(spec, params, fault=fault, target=target, device=device,
                            recorder=rec, src=src, known_findings=known_findings)
    out = FuzzOutcome(spec.name, params, fault, target)
    base = settings.default if database is None else settings(settings.default,
                                                               database=database)
    interrupts: list = []
    try:
        with noting_interrupts() as interrupts, \
                with_reporter(lambda _msg: None):  # we print our own, plain-words steps
            if budget is not None:
                deadline = rec.started + budget
                start_seed = seed if seed is not None else random.randrange(2**32)
                batch = 0
                while time.monotonic() < deadline:
                    machine._hypothesis_internal_use_seed = start_seed + batch
                    run_state_machine_as_test(machine, settings=settings(
                        base, max_examples=max_examples or BATCH, derandomize=False))
                    batch += 1
                    if progress:
                        progress(rec)
            else:
                if seed is not None:
                    machine._hypothesis_internal_use_seed = seed
                run_state_machine_as_test(machine, settings=settings(
                    base, max_examples=max_examples or base.max_examples,
                    derandomize=base.derandomize and seed is None))
    except KeyboardInterrupt:
        out.interrupted = True
    except StopFuzzing:  # a hang, shrunk as far as HANG_SHRINK_LIMIT deadlines allow
        pass
    except Exception as exc:  # a property failed (shrunk), or Hypothesis itself complained
        if interrupts:  # a Ctrl-C that surfaced as another exception (noting_interrupts)
            out.interrupted = True
        elif rec.final_trace is None and rec.first_trace is None:
            out.error = f"{type(exc).__name__}: {exc}"
    out.trace = rec.final_trace or rec.hang_trace or rec.first_trace
    out.examples, out.steps, out.capped = rec.examples, rec.steps, rec.capped
    out.reached = dict(rec.reached)
    out.op_counts = dict(rec.ops)
    out.seconds = time.monotonic() - rec.started
    out.first_failure_seconds = rec.seconds_to_first_failure()
    if out.trace is not None:
        out.trace.meta.update({"examples": rec.examples, "shrunk": rec.final_trace is not None,
                               "seconds_to_first_failure": out.first_failure_seconds})
        if rec.final_trace is None and rec.hang_trace is not None:
            out.trace.meta["shrunk"] = False
            out.trace.meta["note"] = (f"a hang: shrinking stopped after {rec.hangs} hanging "
                                      "runs (each costs a full per-op deadline)")
        if out_dir is not None:
            out.trace_path = out.trace.save(out_dir)
    return out
