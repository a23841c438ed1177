"""kvcheck's own shrinker: a failing op sequence made short and simple, keeping its failure.

Delta debugging over the ops (chunks, then single ops), then, between further rounds of it,
dropping one request's (lock's, session's) ops at once, replacing ops by a simpler op of the
table that takes a subset of their arguments (``admit`` r1 ``[0]`` -> ``insert [0]``, the
request lifecycle a plain insert stands for, which op deletion alone cannot reach), argument
simplification (shorter token lists, smaller values, ids and counts), and last a count made
larger where that lets ops go (shorter before smaller, as Hypothesis orders it).  Every
candidate is re-run through ``Run`` and kept only if it fails the same way (property, or whole
signature).  Bounded by a time budget; a cut leaves the shortest failing ops so far.

Both engines use it: the native engine on its walks (``native.py``), the Hypothesis engine on
the failure Hypothesis found (``fuzz.py``: measured against Hypothesis's own shrinker it is as
short or shorter and one to two orders of magnitude faster, ``docs/benchmarks.md``), and
``kvcheck shrink`` on a saved trace.
"""

from __future__ import annotations

import time

from caches.target import DECLINE
from invariants import Violation
from state_machines.deadline import HANG_SHRINK_LIMIT, Ticker, op_deadline
from state_machines.ops import Op
from state_machines.run import Run
from state_machines.signature import Signature
from state_machines.stopping import stop_requested
from state_machines.trace import Trace


def fails_on(spec, params, ops: list[Op], prop, *, fault=None, target="reference",
             device=None, src=None, known_findings=DECLINE) -> list[Op] | None:
    """Replay ``ops`` on a fresh subject; the ops up to the failing step if it breaks ``prop``
    (a property name, or a ``failures.Signature``: then the same property, op and masked
    message), else None.  (A candidate that crashes the harness itself is not kept.)"""
    try:
        run = Run(spec, params, fault, target, device, src=src, known_findings=known_findings)
    except Exception:  # noqa: BLE001
        return None
    for op in ops:
        try:
            run.apply(op)
        except Violation as v:
            same = (v.prop == prop if isinstance(prop, str) else
                    Signature.of(v.prop, op.name, v.message) == prop)
            return list(run.ops) if same else None
        except Exception:  # noqa: BLE001  not a property: not the failure we shrink
            return None
    return None


def shrink(spec, params, ops: list[Op], prop: str, *, budget: float = 60.0,
           **run_kwargs) -> list[Op]:
    """Delta debugging over ``ops``, then argument simplification, keeping only candidates that
    fail on ``prop``; stops improving after ``budget`` seconds (returns the best so far)."""
    return shrink_within(spec, params, ops, prop, budget=budget, **run_kwargs)[0]


def shrink_within(spec, params, ops: list[Op], prop, *, budget: float = 60.0,
                  **run_kwargs) -> tuple[list[Op], bool]:
    """``shrink``, and whether it finished (False: the budget or a stop cut it short, and the
    ops are the shortest failing ones so far -- ``kvcheck shrink`` goes on from them)."""
    deadline = time.monotonic() + budget
    cut = []

    def test(cand):
        if time.monotonic() > deadline or stop_requested():
            cut.append(True)
            return None
        return fails_on(spec, params, cand, prop, **run_kwargs)

    best = test(ops) or list(ops)
    best = _ddmin(best, test)
    while not cut:
        simpler = _drop_by_id(best, test) or _substitute_ops(best, test, spec.ops) \
            or _simplify_args(best, test) or _grow_to_shorten(best, test)
        if simpler is None:
            break
        best = _ddmin(simpler, test)
    return best, not cut


ID_ARGS = ("rid", "hid", "lid", "sid", "pid")  # arguments naming a request, lock, session, ...


def _drop_by_id(ops: list[Op], test) -> list[Op] | None:
    """Every op of one request (lock, session, prefetch) removed at once -- a lifecycle that
    single-op deletion cannot take apart (its later ops skip without their admission, which
    keeps them in the trace) -- or None if no such removal keeps the failure."""
    groups: dict = {}
    for i, op in enumerate(ops):
        for k in ID_ARGS:
            if k in op.args:
                groups.setdefault((k, op.args[k]), []).append(i)
    for idx in sorted(groups.values(), key=len, reverse=True):
        if len(idx) < 2 or len(idx) == len(ops):
            continue
        drop = set(idx)
        got = test([op for i, op in enumerate(ops) if i not in drop])
        if got is not None:
            return got
    return None


def _substitute_ops(ops: list[Op], test, table) -> list[Op] | None:
    """Ops replaced by a simpler op of ``table`` -- one taking a strict subset of their
    arguments, of the same types, with the same values (``admit(rid, tokens)`` ->
    ``insert(tokens)``): first every op of one name at once (two admissions a failure needs
    together become two inserts together), then one op at a time; the first replacement that
    keeps the failure, or None.  Each replacement drops an argument, so repeating it ends."""
    specs = table.specs

    def simpler(name):
        mine = specs[name].params
        for other in specs.values():
            theirs = other.params
            if theirs and len(theirs) < len(mine) and \
                    all(mine.get(k) == kind for k, kind in theirs.items()):
                yield other

    def swap(op, other):
        return Op(other.name, {k: op.args[k] for k in other.params})

    names = list(dict.fromkeys(op.name for op in ops))
    for name in names:
        if sum(op.name == name for op in ops) < 2:
            continue
        for other in simpler(name):
            got = test([swap(op, other) if op.name == name else op for op in ops])
            if got is not None:
                return got
    for i, op in enumerate(ops):
        for other in simpler(op.name):
            got = test(ops[:i] + [swap(op, other)] + ops[i + 1:])
            if got is not None:
                return got
    return None


def _ddmin(ops: list[Op], test) -> list[Op]:
    """Zeller's ddmin, on the complement: remove chunks while the failure stays."""
    n = 2
    while len(ops) >= 2:
        size = max(1, len(ops) // n)
        chunks = [ops[i:i + size] for i in range(0, len(ops), size)]
        for i in range(len(chunks)):
            cand = [op for j, c in enumerate(chunks) if j != i for op in c]
            got = test(cand) if cand else None
            if got is not None:
                ops, n = got, max(n - 1, 2)
                break
        else:
            if size == 1:
                break
            n = min(len(ops), n * 2)
    return ops


def _simpler_values(v):
    """Candidate simplifications of one argument, simplest first."""
    if isinstance(v, bool):
        return []
    if isinstance(v, int):
        return [x for x in dict.fromkeys((0, 1, v // 2, v - 1)) if 0 <= x < v]
    if isinstance(v, list):
        out = []
        if len(v) > 1:
            out += [v[:1], v[: len(v) // 2], v[:-1], v[1:]]
        if any(t != 0 for t in v):
            out.append([0 if i == next(j for j, t in enumerate(v) if t != 0) else t
                        for i, t in enumerate(v)])
        return out
    return []


def _simplify_args(ops: list[Op], test) -> list[Op] | None:
    """One argument of one op made simpler (the first that keeps the failure), or None."""
    for i, op in enumerate(ops):
        for k, v in op.args.items():
            for simpler in _simpler_values(v):
                cand = ops[:i] + [Op(op.name, {**op.args, k: simpler})] + ops[i + 1:]
                got = test(cand)
                if got is not None:
                    return got
    return None


def _grow_to_shorten(ops: list[Op], test) -> list[Op] | None:
    """One argument of one op made larger -- a count to ``v + 1``, ``2v`` or the length of a
    token list the op takes; a token list by one token or twice as many -- where that lets
    delta debugging drop ops: ``admit`` with a ``chunk`` that covers its whole prompt needs no
    ``step`` after it, one longer prompt can stand for two short ones (a count that was the
    list's length grows with it).  A shorter trace comes
    before smaller values (as in Hypothesis's shortlex order), so the first such candidate
    whose shrunk form is strictly shorter is returned; None if none is.  (Each success
    shortens the trace, so repeating it ends.)"""
    for i, op in enumerate(ops):
        lengths = [len(v) for v in op.args.values() if isinstance(v, list)]
        for k, v in op.args.items():
            if isinstance(v, list):  # a longer token list: one more token, or twice as many
                grown = [v + [0], v + [0] * len(v)] if v else [[0]]
            elif k in ID_ARGS or not isinstance(v, int) or isinstance(v, bool) or v < 0:
                continue
            else:
                grown = [x for x in dict.fromkeys([v + 1, 2 * v, *lengths]) if x > v]
            for bigger in grown:
                args = {**op.args, k: bigger}
                if isinstance(v, list):  # a count that was the list's length stays its length
                    args.update({a: len(bigger) for a, x in op.args.items() if a not in ID_ARGS
                                 and type(x) is int and x == len(v)})
                cand = ops[:i] + [Op(op.name, args)] + ops[i + 1:]
                got = test(cand)
                if got is not None:
                    got = _ddmin(got, test)
                    if len(got) < len(ops):
                        return got
    return None


def shrink_to_trace(spec, params, ops: list[Op], sig: Signature, *, budget: float,
                    fault=None, target="reference", device=None, src=None,
                    known_findings=DECLINE) -> tuple[Trace | None, bool]:
    """``ops`` shrunk within ``budget`` seconds (``shrink_within``) and replayed into a trace
    of the failure; and whether the shrink finished.  None if the shrunk ops no longer fail
    (cannot normally happen: only failing candidates are kept)."""
    run_kw = {"fault": fault, "target": target, "device": device, "src": src,
              "known_findings": known_findings}
    if sig.prop == "hang":  # every hanging candidate costs a whole per-op deadline
        budget = min(budget, HANG_SHRINK_LIMIT * op_deadline())
    with Ticker(op_deadline()):
        small, whole = shrink_within(spec, params, ops, sig, budget=budget, **run_kw)
    run = Run(spec, params, fault, target, device, src=src, known_findings=known_findings)
    for op in small:
        try:
            run.step(op)
        except Violation:
            break
    trace = run.trace()
    return (trace if trace.violation is not None else None), whole
