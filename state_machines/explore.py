"""Exhaustive bounded search (``kvcheck check``): every op sequence up to a depth, breadth first.

Like TLC or stateright, but over the same op table the Hypothesis machines use:

* a variant opts in by declaring ``VariantSpec.small_params`` (tiny pools); its alphabet
  (a small finite op set: a few token sequences, a fixed set of request ids, ops that do not
  apply are ``Skip``-ped) comes from the ``small`` values of its op table's generators
  (``OpTable.alphabet``), and its subject declares ``state()``, which the one shared
  canonicaliser (``caches/subjects/canon.py``) turns into a hashable state up to renaming of
  node ids, pool ids and clocks (``subject.canonical()``);
* the search runs level by level from the initial state; every (state, op) pair is applied
  through ``Run.apply`` -- so every invariant is checked after every op, exactly as in a
  fuzz run -- and the successor's ``canonical()`` is hashed: a state seen before (at this or a
  shallower depth) is not expanded again;
* the first violation is the shortest counterexample (breadth first), returned as a normal
  ``Trace`` (and saved with ``Trace.save``) that ``kvcheck replay`` re-runs.

States are not copied: a state is its path (the ops that reached it), and a fresh subject is
rebuilt by replaying the path (invariants off: the path already passed with them on, and the
subject is deterministic).  A replayed subject is reused for the next op while ops turn out to
be no-ops (the canonical state did not change), so the cost per state is about one replay per
distinct successor.  Replaying instead of ``deepcopy`` keeps the engine generic: subjects hold
torch pools and closures (the progress wrapper) that do not deep-copy correctly.

Most transitions are skips (an op whose precondition does not hold: finish a request that is
not live).  On our own subjects (the reference target) a skip of an op its ``OpSpec`` declares
``pure_skips`` (the default) is taken as a no-op without canonicalising the state; an op that
may change the state before it skips (a match that touches access times, first) declares
``pure_skips=False`` and is compared like any other.  ``verify_skips=True`` checks the
contract (the CI depth tests run with it): a declared-pure skip that changed the state is an
``AssertionError`` naming the op.

Quiescence: every *new* distinct state is also drained (``quiesce``, the op the machines run in
``teardown``) on the subject that just reached it -- that subject is thrown away afterwards,
so no copy is needed.  A quiesce violation found at level d has d + 1 steps; a step violation
at level d has d, so a level is finished before a quiesce violation is reported, and a step
violation of that level wins.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from caches.subjects.base import Subject
from invariants import Violation
from state_machines.deadline import Ticker, op_deadline
from state_machines.ops import Op
from state_machines.run import Run
from state_machines.trace import Trace

QUIESCE = Op("quiesce")
SKIPPED = "skipped: "  # OpTable.apply's result for an op whose precondition failed


class NotOptedIn(ValueError):
    """The variant declares no alphabet / small params / canonical state."""


@dataclass
class LevelStats:
    depth: int
    frontier: int  # distinct states expanded at this level (reached at depth - 1)
    transitions: int  # (state, op) pairs applied
    new: int  # distinct states first reached at this depth


@dataclass
class ExploreResult:
    variant: str
    params: dict
    fault: str | None
    depth: int  # asked for
    depth_reached: int = 0  # deepest level fully explored (or the violation's level)
    transitions: int = 0  # (state, op) pairs applied = states explored
    distinct: int = 1  # distinct canonical states (the initial one included)
    noops: int = 0  # ops that changed nothing (skipped or moot)
    seconds: float = 0.0
    exhausted: bool = False  # no new state at some level: the whole reachable space is done
    truncated: bool = False  # stopped at max_states
    trace: Trace | None = None  # the shortest counterexample
    trace_path: Path | None = None
    levels: list[LevelStats] = field(default_factory=list)
    alphabet_size: int = 0

    @property
    def failed(self) -> bool:
        return self.trace is not None

    @property
    def prop(self) -> str | None:
        return self.trace.violation["property"] if self.trace else None

    @property
    def states_per_second(self) -> float:
        return self.transitions / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict:
        return {"variant": self.variant, "params": self.params, "fault": self.fault,
                "depth": self.depth, "depth_reached": self.depth_reached,
                "states_explored": self.transitions, "distinct_states": self.distinct,
                "noops": self.noops, "seconds": round(self.seconds, 3),
                "states_per_second": round(self.states_per_second, 1),
                "exhausted": self.exhausted, "truncated": self.truncated,
                "alphabet": self.alphabet_size,
                "violation": self.trace.violation if self.trace else None,
                "trace_steps": len(self.trace.ops) if self.trace else None,
                "trace_path": str(self.trace_path) if self.trace_path else None}


def small_regimes(spec) -> list[dict]:
    """The variant's small regimes for exhaustive search (``small_params``: dict or tuple)."""
    opted_in(spec)
    small = spec.small_params
    regimes = [small] if isinstance(small, dict) else list(small)
    return [spec.check_params(r) for r in regimes]


def opted_in(spec) -> None:
    missing = [n for n in ("alphabet", "small_params") if getattr(spec, n, None) is None]
    if missing:
        raise NotOptedIn(f"variant {spec.name!r} has not opted in to exhaustive search "
                         f"(no {' / '.join(missing)} in its VariantSpec); see "
                         "docs/model-checking.md")


def fault_params(spec, params: dict, fault: str | None) -> dict:
    """``params`` with the regime a fault needs (its ``params``) laid over them."""
    if fault is None:
        return spec.check_params(params)
    from caches.faults import get_fault

    return spec.check_params({**params, **get_fault(fault).params})


def _digest(state) -> bytes:
    return hashlib.blake2b(repr(state).encode(), digest_size=16).digest()


def explore(spec, params: dict, **kwargs) -> ExploreResult:
    """Breadth-first search over ``spec.alphabet(params)`` up to ``depth`` ops (``_explore``
    has the arguments), under one shared per-op deadline ticker: the search applies hundreds
    of thousands of ops, and a timer system call around each cost a tenth of its time."""
    with Ticker(op_deadline()):
        return _explore(spec, params, **kwargs)


def _explore(spec, params: dict, *, depth: int, fault: str | None = None,
            device: str | None = None, out_dir: str | Path | None = None,
            quiescence: bool = True, max_states: int | None = None,
            dedup: bool = True, verify_skips: bool = False,
            progress: Callable[[ExploreResult, LevelStats], None] | None = None,
            target: str = "reference", src: str | None = None) -> ExploreResult:
    """The search of ``explore``.

    ``dedup=False`` turns canonicalisation off (every path is its own state): only for
    testing that canonicalisation loses nothing on small depths.  ``verify_skips``: check
    the contract the search relies on -- a skip of an op declared ``pure_skips`` changed
    nothing -- by comparing its state anyway (``AssertionError`` naming the op if it did).
    """
    opted_in(spec)
    params = spec.check_params(params, target)
    alphabet = list(spec.alphabet(params))
    res = ExploreResult(spec.name, params, fault, depth, alphabet_size=len(alphabet))
    started = time.perf_counter()

    def fresh(path) -> Run:
        run = Run(spec, params, fault, target, device=device, src=src)
        if type(run.subject).state is Subject.state:
            raise NotOptedIn(f"the {spec.name} subject of target {target} declares no "
                             "state(); see "
                             "docs/model-checking.md")
        if path:
            # the path's states were each checked when the search first reached them: it is
            # re-walked to rebuild the state, without the checks, and beside Run's step (whose
            # per-op deadline and bookkeeping would only repeat); its new ops go through it
            run.subject.checking = False
            for i in path:
                spec.ops.apply(run.subject, alphabet[i])
            run.subject.checking = True
            run.ops = [alphabet[i] for i in path]
        return run

    def key(run: Run, path):
        if not dedup:
            return path
        try:
            return _digest(run.subject.canonical())
        except Exception:  # noqa: BLE001  a (faulty) state canonical() cannot describe:
            return path  # keep it as its own state rather than merge it wrongly

    def finish(trace: Trace | None) -> ExploreResult:
        res.seconds = time.perf_counter() - started
        if trace is not None:
            trace.meta.update({"found_by": "explore", "depth": len(trace.ops),
                               "states_explored": res.transitions,
                               "distinct_states": res.distinct})
            res.trace = trace
            if out_dir is not None:
                res.trace_path = trace.save(out_dir)
        return res

    # the initial state: invariants, then quiescence
    root = fresh(())
    try:
        root.subject.check()
    except Violation as v:
        root._fail(v, 0)
        return finish(root.trace())
    root_key = key(root, ())
    seen = {root_key}
    if quiescence:
        try:
            root.step(QUIESCE)
        except Violation:
            return finish(root.trace())

    # a skip of an op declared ``pure_skips`` is a no-op without canonicalising (most of the
    # search's transitions are such skips); only on our own subjects, where the contract is
    # tested (an engine's adapter may call into the engine before it skips)
    trusted = dedup and target == "reference"
    pure = {name for name, s in spec.ops.specs.items() if s.pure_skips}
    frontier: list[tuple] = [((), root_key)]  # (path, its key)
    for level in range(1, depth + 1):
        stats = LevelStats(level, len(frontier), 0, 0)
        nxt: list[tuple] = []
        quiesce_trace: Trace | None = None
        for path, base in frontier:
            run = None
            for i, op in enumerate(alphabet):
                if run is None:
                    run = fresh(path)
                stats.transitions += 1
                res.transitions += 1
                try:
                    result = run.apply(op)
                except Violation:
                    res.depth_reached = level
                    res.levels.append(stats)
                    return finish(run.trace())
                child = path + (i,)
                if trusted and op.name in pure and result.startswith(SKIPPED):
                    if verify_skips and key(run, child) != base:
                        raise AssertionError(
                            f"{spec.name}: '{spec.ops.describe(op)}' skipped ({result}) but "
                            "changed the state; declare its OpSpec pure_skips=False")
                    res.noops += 1  # a skip changed nothing: no state to compare
                    run.ops.pop()
                    continue
                k = key(run, child)
                if dedup and k == base:  # nothing changed: reuse this subject
                    res.noops += 1
                    run.ops.pop()
                    continue
                used, run = run, None
                if k in seen:
                    continue
                seen.add(k)
                nxt.append((child, k))
                stats.new += 1
                if quiescence and quiesce_trace is None:
                    try:
                        used.apply(QUIESCE)
                    except Violation:
                        quiesce_trace = used.trace()
                if max_states is not None and len(seen) >= max_states:
                    res.truncated = True
        res.distinct = len(seen)
        res.levels.append(stats)
        res.depth_reached = level
        res.seconds = time.perf_counter() - started
        if progress is not None:
            progress(res, stats)
        if quiesce_trace is not None:
            return finish(quiesce_trace)
        if not nxt:
            res.exhausted = True
            break
        if res.truncated:
            break
        frontier = nxt
    res.distinct = len(seen)
    return finish(None)


def format_levels(res: ExploreResult) -> str:
    lines = [f"  depth {s.depth}: expanded {s.frontier:,} states, {s.transitions:,} "
             f"transitions, {s.new:,} new" for s in res.levels]
    return "\n".join(lines)
