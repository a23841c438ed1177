"""The native search engine (``--engine native``): seeded swarm random walks, no Hypothesis.

Hypothesis's per-step machinery is most of every machine step; the same op sequences applied
through ``Run`` with every invariant run several times faster.  The native engine generates
walks from the op table's generators (``state_machines/gen.py``: the same definitions the
Hypothesis rules come from), applies them through the one execution path (``Run``: every
invariant after every op, quiescence at the end), and on a failure shrinks the trace itself.

* **Walks are reproducible** from ``(seed, index)``: the walk's own ``random.Random`` is seeded
  with the string ``"<seed>:<index>"`` (string seeds hash with SHA-512: the same in every
  process), and so are its swarm choices and length.
* **Swarm testing** (Groce et al., ISSTA 2012): each walk enables a random subset of the
  generators (each kept with probability 1/2; at least one) with random weights 1..8 and a
  random length, so rare interleavings -- many evictions and no admissions, only
  locks and finishes -- get walks of their own.
* **Workers**: walks are spread over processes (walk ``i`` on worker ``i % W``); a failure in
  any stops the others; results merge into one outcome (the same ``FuzzOutcome`` the
  Hypothesis engine returns, so the CLI, traces, replay, HTML, gate and nightly are unchanged).
* **Shrinking** is kvcheck's own (``state_machines/shrinker.py``), at the trace level: the
  result is an ordinary trace.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from caches.pools import resolve_device
from caches.target import DECLINE
from invariants import Violation
from state_machines.deadline import Ticker, op_deadline
from state_machines.failures import Ledger, Signature, label
from state_machines.gen import Picker, Walk, random_step, rule_generators
from state_machines.ops import Op
from state_machines.shrinker import shrink_to_trace
from state_machines.stopping import stop_requested
from state_machines.trace import Trace

QUIESCE = Op("quiesce")
MIN_LEN, MAX_LEN = 10, 100  # a walk's length (generator runs) is drawn from this range ...
FIRST_LEN, GROWTH = 3, 2  # ... once walk 2 * (MAX_LEN - 3) is reached: walk i's length is at
# most 3 + i // 2 before that, so the first walks are short (like Hypothesis's first examples)
# and a shallow bug's first failing walk is already a short trace


# -- one walk -----------------------------------------------------------------------------------
@dataclass
class Swarm:
    """A walk's configuration: which generators it runs, how often, for how long."""

    weights: dict  # generator name -> weight (absent = switched off)
    length: int

    @classmethod
    def draw(cls, names: list[str], rnd: random.Random, swarm: bool = True,
             index: int | None = None) -> "Swarm":
        hi = MAX_LEN if index is None else min(MAX_LEN, FIRST_LEN + index // GROWTH)
        length = rnd.randint(min(MIN_LEN, hi), hi)
        if not swarm:
            return cls({n: 1 for n in names}, length)
        on = [n for n in names if rnd.random() < 0.5] or [rnd.choice(names)]
        return cls({n: rnd.randint(1, 8) for n in on}, length)


@dataclass
class WalkResult:
    index: int
    steps: int
    run_ops: list  # the ``Op``s applied (``ops``: as JSON, made only when asked for)
    violation: dict | None = None  # {"property", "message", "step"}
    op_counts: Counter = field(default_factory=Counter)
    reached: Counter = field(default_factory=Counter)

    @property
    def ops(self) -> list:
        """The walk's ops as JSON (a failing walk's, for the trace; clean walks never need
        them, so no walk pays for the conversion up front)."""
        return [o.to_json() for o in self.run_ops]


def run_walk(spec, params: dict, seed: int, index: int, *, fault=None, target="reference",
             device=None, src=None, known_findings=DECLINE, swarm: bool = True) -> WalkResult:
    """Walk ``index`` of seed ``seed``: its swarm, its ops through ``Run``, then quiescence."""
    rnd = random.Random(f"{seed}:{index}")
    gens = rule_generators(spec.ops)
    conf = Swarm.draw([g.name for g in gens], rnd, swarm, index)
    d = Walk(spec, params, fault=fault, target=target, device=device, src=src,
             known_findings=known_findings)
    run = d.run
    picker = Picker(gens, d.params, conf.weights)
    try:
        for _ in range(conf.length):
            if not random_step(d, gens, rnd, picker=picker):
                break
        run.apply(QUIESCE)
    except Violation:
        pass
    vio = None
    if run.violation is not None:
        vio = {"property": run.violation.prop, "message": run.violation.message,
               "step": run.failed_step}
    return WalkResult(index, len(run.ops), run.ops, vio, d.op_counts,
                      Counter(getattr(run.subject, "reached_counts", None) or {}))


# -- the engine ---------------------------------------------------------------------------------
_stop = None  # in a worker process: the Event a failure sets to stop every worker
_done = None  # in a worker process: the shared (walks, steps) counters the parent reports,
# and the queue its new failures' signatures go to (the parent counts the distinct ones)


PROGRESS_EVERY = 1.0  # seconds between two progress reports (a long run is not silent)


@dataclass
class Progress:
    """How far a native run is, for a progress callback (the fields a Hypothesis run's
    ``Recorder`` gives it): walks so far, steps so far, and when the first failure was found
    (``time.monotonic()``; None while there is none) -- then the run is shrinking it."""

    examples: int = 0
    steps: int = 0
    first_failure_at: float | None = None
    distinct: int = 0  # distinct failures (by signature) found so far, by every worker


def _init_worker(event, done=None) -> None:
    """A worker process's initializer: the stop Event, inherited (a semaphore in shared
    memory -- asking it costs a microsecond, where a Manager's proxy costs a round trip to
    the manager process per walk); Ctrl-C is the parent's to handle (it stops the pool and
    reports), so a worker does not print a traceback of its own, and the parent's SIGTERM
    handler (the CLI's, which turns it into an interrupt) is not a worker's: the pool stops
    its workers with SIGTERM."""
    global _stop, _done
    _stop, _done = event, done
    if event is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def _workers_ignore_sigint():
    """Start worker processes with Ctrl-C ignored from their first instruction: an ignored
    signal stays ignored across fork and exec (and Python leaves it so), where a spawned
    worker reaches ``_init_worker`` only after importing torch -- a Ctrl-C to the process
    group in those seconds would print a worker's import traceback.  The parent's own handler
    is back once the workers exist."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; its caller's handling stands
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _worker(job, tick: Callable | None = None) -> dict:
    """Walks ``start, start + stride, ...`` until the deadline, a walk cap or a failure.
    After each walk its steps are counted where the parent reads them: ``tick(steps, sig)``
    in the parent's own process, the shared counters in a worker process; ``sig`` is the
    walk's failure's signature when this worker has not met it before (else None)."""
    (spec_name, params, seed, start, stride, deadline, max_walks, kw, stop_on_first) = job
    from state_machines.variants import get_variant

    stop = _stop
    if tick is None and _done is not None:
        walks_done, steps_done, new_failures = _done

        def tick(n, sig):
            with walks_done.get_lock():  # (one lock for both counters)
                walks_done.value += 1
                steps_done.value += n
            if sig is not None:
                new_failures.put(sig)

    spec = get_variant(spec_name)
    steps, walks, ops_n, reached = 0, 0, Counter(), Counter()
    i, failures = start, {}  # Signature -> [first failing walk, count, time.time() first seen]
    with Ticker(op_deadline()):  # one shared per-op deadline for all the walks
        # the first walk always runs: a budget spent before it began never skips the check
        while (walks == 0 or time.time() < deadline) and (max_walks is None or i < max_walks):
            if stop is not None and stop.is_set():
                break
            if stop_requested():  # a Ctrl-C/SIGTERM whose exception was lost (stopping.py)
                raise KeyboardInterrupt("stop requested")
            r = run_walk(spec, params, seed, i, **kw)
            steps += r.steps
            walks += 1
            ops_n.update(r.op_counts)
            reached.update(r.reached)
            new = None
            if r.violation is not None:
                v = r.violation
                sig = Signature.of(v["property"], r.run_ops[v["step"] - 1].name, v["message"])
                if sig in failures:  # met again: only counted
                    failures[sig][1] += 1
                else:
                    failures[sig] = [r, 1, time.time()]
                    new = sig
            if tick is not None:
                tick(r.steps, new)
            if r.violation is not None and stop_on_first:
                if stop is not None:
                    stop.set()
                break
            i += stride
    return {"steps": steps, "walks": walks, "ops": ops_n, "reached": reached,
            "failures": failures}


def _drain(q, into: set) -> None:
    """Every signature the workers have put on ``q`` so far, added to ``into``."""
    import queue

    while True:
        try:
            into.add(q.get_nowait())
        except queue.Empty:
            return


def _start_method(device: str | None) -> str:
    """How worker processes start: fork where it is safe (quick, and the workers inherit the
    parent's imports), spawn where the pools live on a GPU -- a process that has touched CUDA
    cannot fork children that use it ("Cannot re-initialize CUDA in forked subprocess"), and
    the parent may have run one before (a nightly loop, a test session, a bench)."""
    if os.name != "posix" or resolve_device(device).type == "cuda":
        return "spawn"
    return "fork"


def native_fuzz(spec, params: dict, *, fault: str | None = None, target: str = "reference",
                device: str | None = None, budget: float | None = None,
                max_walks: int | None = None, seed: int | None = None, workers: int = 1,
                out_dir: str | Path | None = None, swarm: bool = True,
                src: str | None = None, known_findings: str = DECLINE,
                shrink_budget: float = 60.0,
                progress: Callable | None = None, stop_on_first: bool = True):
    """Walk until ``budget`` seconds pass or ``max_walks`` walks ran (default: 10 s), over
    ``workers`` processes.  With ``stop_on_first`` (the default here) the first failing walk
    stops the others; without it every worker walks on, and each distinct failure (by
    signature, ``state_machines/failures.py``) is shrunk (within ``shrink_budget`` in all,
    split over them; one cut short is marked partly shrunk) and saved, repeats are counted, and ``out.failures`` lists
    them (``out.trace``: the first).
    ``progress(Progress)`` is called about every ``PROGRESS_EVERY`` seconds while walks run,
    and once more when a failure is found, before it is shrunk."""
    from state_machines.fuzz import FuzzOutcome

    params = spec.check_params(params, target)
    seed = seed if seed is not None else random.randrange(2**32)
    if budget is None and max_walks is None:
        budget = 10.0
    started, started_wall = time.monotonic(), time.time()
    deadline = time.time() + (budget if budget is not None else 10 ** 9)
    kw = {"fault": fault, "target": target, "device": device, "src": src,
          "known_findings": known_findings, "swarm": swarm}
    out = FuzzOutcome(spec.name, params, fault, target)
    workers = max(1, workers)
    seen = Progress()
    last_report = [time.monotonic()]
    sigs: set = set()  # the distinct failures' signatures the walks have reported so far

    def report(walks: int, steps: int) -> None:
        seen.examples, seen.steps, seen.distinct = walks, steps, len(sigs)
        last_report[0] = time.monotonic()
        progress(seen)

    try:
        if workers == 1:
            def tick(n, sig):
                seen.examples += 1
                seen.steps += n
                if sig is not None:
                    sigs.add(sig)
                if sig is not None or time.monotonic() - last_report[0] >= PROGRESS_EVERY:
                    report(seen.examples, seen.steps)
            results = [_worker((spec.name, params, seed, 0, 1, deadline, max_walks, kw,
                                stop_on_first),
                               tick if progress is not None else None)]
        else:
            ctx = mp.get_context(_start_method(device))
            jobs = [(spec.name, params, seed, w, workers, deadline, max_walks, kw,
                     stop_on_first) for w in range(workers)]
            new_failures = ctx.Queue()
            done = (ctx.Value("q", 0), ctx.Value("q", 0, lock=False), new_failures)
            with _workers_ignore_sigint():  # from their first instruction (see there)
                pool = ctx.Pool(workers, initializer=_init_worker,
                                initargs=(ctx.Event(), done))
            with pool:
                pending = pool.map_async(_worker, jobs)
                while True:
                    try:
                        results = pending.get(timeout=PROGRESS_EVERY)
                        break
                    except mp.TimeoutError:
                        if progress is not None:
                            _drain(new_failures, sigs)
                            report(done[0].value, done[1].value)
    except KeyboardInterrupt:
        out.interrupted = True
        results = []
    found: dict = {}  # Signature -> [walk, count, first seen]: merged over the workers
    for r in results:
        for sig, (walk, n, at) in r["failures"].items():
            have = found.get(sig)
            if have is None:
                found[sig] = [walk, n, at]
                continue
            have[1] += n
            if (at, walk.index) < (have[2], have[0].index):
                have[0], have[2] = walk, at
    order = sorted(found.items(), key=lambda kv: (kv[1][2], kv[1][0].index))
    out.steps = sum(r["steps"] for r in results)
    out.examples = sum(r["walks"] for r in results)
    out.reached = dict(sum((r["reached"] for r in results), Counter()))
    out.op_counts = dict(sum((r["ops"] for r in results), Counter()))
    if order and progress is not None:  # shrinking can take a while: say there is a failure
        seen.first_failure_at = time.monotonic()
        sigs.update(found)  # (every worker's, merged: a queue drained late loses none)
        report(out.examples, out.steps)
    ledger = Ledger()
    shrink_end = time.monotonic() + shrink_budget  # a hard bound: split over the failures
    for i, (sig, (walk, n, at)) in enumerate(order):
        first_seen = max(0.0, at - started_wall)
        per = max(0.0, shrink_end - time.monotonic()) / (len(order) - i)
        trace, whole = _shrunk_trace(spec, params, walk, sig, kw, per)
        trace.meta.update({"engine": "native", "seed": seed, "walk": walk.index,
                           "walk_steps": walk.steps, "shrunk": whole,
                           "examples": out.examples, "seconds_to_first_failure": first_seen})
        if not whole:
            trace.meta["note"] = ("interrupted" if stop_requested() else
                                  "partly shrunk: the time budget ran out while shrinking")
        f = ledger.record(trace, first_seen, engine="native", count=n)
        if out_dir is not None and f.trace is trace:
            f.trace_path = trace.save(out_dir)
    out.failures = [label(f) for f in ledger]
    if out.failures:
        out.trace, out.trace_path = out.failures[0].trace, out.failures[0].trace_path
        out.first_failure_seconds = out.failures[0].first_seen
    out.seconds = time.monotonic() - started
    return out


def _shrunk_trace(spec, params, walk: WalkResult, sig: Signature, kw: dict,
                  budget: float) -> tuple[Trace, bool]:
    """A failing walk shrunk (keeping its signature) and replayed into a trace; and whether
    the shrink finished within ``budget``."""
    raw_ops = [spec.ops.parse(o) for o in walk.ops]  # (checked as a trace's ops are)
    run_kw = {k: v for k, v in kw.items() if k != "swarm"}
    trace, whole = shrink_to_trace(spec, params, raw_ops, sig, budget=budget, **run_kw)
    if trace is None:  # cannot normally happen: keep the unshrunk walk
        trace = Trace(spec.name, params, raw_ops, run_kw["fault"], run_kw["target"],
                      {**walk.violation}, known_findings=run_kw["known_findings"],
                      src=run_kw["src"])
    return trace, whole
