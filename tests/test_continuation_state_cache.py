"""The continuation-state reference cache (TokenSpeed hybrid prefix cache) on hand-driven cases,
its group tables and pools, the cache-group invariants (pass and fail), and the FAULTS.md
traces of C1-C5 (caught on their property, clean on the reference)."""

import pytest

from caches.cache_groups import HISTORY, STATE, CacheGroup, GroupTable, PagePool
from invariants import PoolView, Violation
from invariants.cache_groups import (check_commit_complete, check_group_pages,
                                     check_owned_bounded, check_snapshot_placement,
                                     check_superseded)
from state_machines.ops import Op
from state_machines.run import Run
from state_machines.variants import get_variant

SPEC = get_variant("continuation-state")
A = [0, 1, 0, 1, 0, 1, 0, 1]


def run(ops, fault=None, **params):
    """Apply (name, args) ops; returns (run, violation or None)."""
    r = Run(SPEC, SPEC.check_params(params), fault, device="cpu")
    for name, args in ops:
        try:
            r.step(Op(name, args))
        except Violation as v:
            return r, v
    return r, None


def node_at(subject, tokens, depth):
    node = subject.cache.root
    for s in range(0, depth, 2):
        node = node.children[tuple(tokens[s:s + 2])]
    return node


def broken(prop, fn, *args, **kw):
    with pytest.raises(Violation) as err:
        fn(*args, **kw)
    assert err.value.prop == prop, err.value
    return err.value


# -- pools and group tables ----------------------------------------------------------------

def test_page_pool_is_lifo():
    pool = PagePool(4, "cpu", "S")
    assert pool.alloc(2) == [1, 2]
    pool.free([2])
    assert pool.alloc(1) == [2]  # the page freed last is handed out first
    assert pool.alloc(3) is None and pool.alloc(2) == [3, 4]


def table(family=HISTORY, window=0, pages=8):
    g = CacheGroup("S" if family == STATE else "H", family, 2, window)
    return GroupTable(g, PagePool(pages, "cpu", g.gid))


def test_history_commit_and_adopt():
    t = table()
    t.acquire(5)
    assert t.owned == [1, 2, 3] and t.cursor == 5
    seg = t.commit_history(4)
    assert (seg.pages, seg.base) == ([1, 2], 0) and t.borrowed == [1, 2] and t.owned == [3]
    t2 = table()
    t2.acquire(4)
    t2.adopt_history([7, 8], 4)  # someone else committed [0,4) first: ours go back
    assert t2.borrowed == [7, 8] and t2.owned == [] and sorted(t2.pool.free_slots) == list(
        range(1, 9))


def test_state_checkpoint_moves_only_the_owned_delta_and_slides():
    t = table(STATE, 4)
    t.acquire(4)
    assert t.checkpoint_state(4).pages == [1, 2]
    t.release_skipped(max(0, 4 - 4 + 1))  # page 0 still in the window: nothing dropped
    assert t.base == 0
    t.acquire(8)
    seg = t.checkpoint_state(8)  # window [4,8): drops borrowed 1, 2 (index only)
    assert (seg.pages, seg.base) == ([3, 4], 2) and t.base == 2 and t.borrowed == [3, 4]
    assert t.checkpoint_state(8) is None  # nothing new: EMPTY
    assert t.plan(9, 12) == (0, 2)  # the slide drops a borrowed page only; two to allocate


def test_adopt_state_replaces_the_segment_range():
    t = table(STATE, 4)
    t.acquire(4)
    t.adopt_state([9], 0, 2)
    assert t.borrowed == [9] and t.owned == [2] and 1 in t.pool.free_slots


# -- the cache, hand-driven ------------------------------------------------------------------

def test_commit_releases_superseded_interior_state():
    r, v = run([("admit", dict(rid=1, tokens=A, chunk=4)), ("step", dict(rid=1)),
                ("step", dict(rid=1))])
    assert v is None
    s = r.subject
    n4, n8 = node_at(s, A, 4), node_at(s, A, 8)
    assert "S" not in n4.snapshot.groups and "H" in n4.snapshot.groups  # History chain kept
    assert s.cache.continuation_complete(n8) and s.cache.assemble(n8, "S") is not None


def test_sharer_and_retracted_borrower_keep_the_window():
    for extra in ([], [("retract", dict(rid=2))]):
        r, v = run([("admit", dict(rid=1, tokens=A, chunk=4)), ("step", dict(rid=1)),
                    ("admit", dict(rid=2, tokens=A[:4] + [1, 1], chunk=4))] + extra +
                   [("step", dict(rid=1))])
        assert v is None
        n4 = node_at(r.subject, A, 4)
        assert "S" in n4.snapshot.groups  # devref 2, or borrowed by the retracted table
    r, v = run([("admit", dict(rid=1, tokens=A, chunk=4)), ("step", dict(rid=1)),
                ("admit", dict(rid=2, tokens=A[:4] + [1, 1], chunk=4)),
                ("retract", dict(rid=2)), ("step", dict(rid=1)), ("recover", dict(rid=2)),
                ("step", dict(rid=2)), ("finish", dict(rid=2)), ("step", dict(rid=1))])
    assert v is None, v


def test_hit_imports_history_chain_and_state_window():
    r, v = run([("admit", dict(rid=1, tokens=A[:4], chunk=4)), ("step", dict(rid=1)),
                ("finish", dict(rid=1)), ("admit", dict(rid=2, tokens=A[:4] + [1], chunk=4))])
    assert v is None
    tabs = r.subject.cache.tables[2]
    assert len(tabs["H"].borrowed) == 2 and len(tabs["S"].borrowed) == 2
    assert r.subject.requests[2].computed == 4


def test_required_state_adoption_fills_a_history_only_anchor():
    ops = [("admit", dict(rid=1, tokens=A, chunk=4)), ("step", dict(rid=1)),
           ("step", dict(rid=1)), ("admit", dict(rid=2, tokens=A[:4] + [1, 1, 1, 1], chunk=8)),
           ("step", dict(rid=2))]
    r, v = run(ops, state_required=1)
    assert v is None, v
    assert "S" in node_at(r.subject, A, 2).snapshot.groups  # filled from r2's table
    r, v = run(ops, "C4", state_required=1)
    assert v is not None and v.prop == "commit-complete"


def test_prune_under_pressure_skips_pinned_paths():
    # a finished request's snapshots are pruned to admit a big fresh one
    r, v = run([("admit", dict(rid=1, tokens=A, chunk=8)), ("step", dict(rid=1)),
                ("finish", dict(rid=1)),
                ("admit", dict(rid=2, tokens=[1] * 20, chunk=20))], pool_pages=10)
    assert v is None
    assert 2 in r.subject.requests
    # but not while a live request locks the path
    r, v = run([("admit", dict(rid=1, tokens=A, chunk=8)), ("step", dict(rid=1)),
                ("admit", dict(rid=2, tokens=[1] * 20, chunk=20))], pool_pages=10)
    assert v is None and 2 not in r.subject.requests


def test_quiescence_after_a_busy_run():
    r, v = run([("admit", dict(rid=1, tokens=A, chunk=2)), ("step", dict(rid=1)),
                ("admit", dict(rid=2, tokens=A + [1, 1], chunk=4)), ("retract", dict(rid=1)),
                ("step", dict(rid=2)), ("quiesce", {})])
    assert v is None, v


# -- the FAULTS.md traces ----------------------------------------------------------------------

C_TRACES = {
    "C1": ([("admit", dict(rid=1, tokens=A, chunk=4)), ("step", dict(rid=1)),
            ("step", dict(rid=1))], {}, "superseded-state"),
    "C2": ([("admit", dict(rid=1, tokens=A, chunk=4)), ("step", dict(rid=1)),
            ("admit", dict(rid=2, tokens=A[:4] + [1, 1], chunk=4)), ("step", dict(rid=1))],
           {}, "dangling-borrow"),
    "C3": ([("admit", dict(rid=1, tokens=A, chunk=4)), ("step", dict(rid=1)),
            ("admit", dict(rid=2, tokens=A[:4] + [1, 1], chunk=4)), ("retract", dict(rid=2)),
            ("step", dict(rid=1))], {}, "dangling-borrow"),
    "C4": ([("admit", dict(rid=1, tokens=A, chunk=4)), ("step", dict(rid=1)),
            ("step", dict(rid=1)), ("admit", dict(rid=2, tokens=A[:4] + [1] * 4, chunk=8)),
            ("step", dict(rid=2))], {"state_required": 1}, "commit-complete"),
    "C5": ([("admit", dict(rid=1, tokens=A[:4], chunk=4)), ("step", dict(rid=1))], {},
           "commit-complete"),
}


@pytest.mark.parametrize("fid", sorted(C_TRACES))
def test_fault_trace_from_the_catalog(fid):
    ops, params, prop = C_TRACES[fid]
    _, v = run(ops, fid, **params)
    assert v is not None and v.prop == prop and v.step == len(ops), v
    _, v = run(ops + [("quiesce", {})], None, **params)
    assert v is None, v


def test_c3_freed_page_goes_to_the_next_request():
    """Bug-report tail: after the release, a fresh request is handed the freed page (LIFO)."""
    ops, params, _ = C_TRACES["C3"]
    r = Run(SPEC, SPEC.check_params(params), "C3", device="cpu")
    r.subject.check = lambda: None  # let the damage happen
    for name, args in ops + [("admit", dict(rid=3, tokens=[1, 1, 1], chunk=4))]:
        r.step(Op(name, args))
    s = r.subject
    stolen = set(s.cache.tables[2]["S"].borrowed) & set(s.cache.tables[3]["S"].owned)
    assert stolen


# -- the invariants on hand-built data ----------------------------------------------------------

def test_group_pages():
    pool = PoolView("S", "page", 4, free=(4,))
    check_group_pages(pool, {"node 1": [1, 2]}, {"r1": [3]}, {"r1": [1], "r2": [2]})
    v = broken("dangling-borrow", check_group_pages, PoolView("S", "page", 4, free=(2, 4)),
               {"node 1": [1]}, {"r1": [3]}, {"r2": [2]})
    assert "free" in v.message and v.details["reader"] == "r2"
    v = broken("dangling-borrow", check_group_pages, pool, {"node 1": [1]}, {"r1": [3, 2]},
               {"r2": [2]})
    assert "owned by r1" in v.message
    broken("conservation", check_group_pages, pool, {"node 1": [1]}, {"r1": [3]}, {})
    broken("conservation", check_group_pages, pool, {"node 1": [1, 2], "node 2": [2]},
           {"r1": [3]}, {})


def test_snapshot_placement():
    check_snapshot_placement([(1, 2, 2, 2), (2, 4, 4, 2)], 2)
    broken("snapshot-placement", check_snapshot_placement, [(1, 2, 4, 2)], 2)
    broken("snapshot-placement", check_snapshot_placement, [(1, 3, 3, 3)], 2)
    broken("snapshot-placement", check_snapshot_placement, [(1, 4, 4, 4)], 2)  # split edge


def test_commit_complete():
    args = (["H"], ["H"], ["S"])
    check_commit_complete(1, 4, ["H", "S"], *args, {"S": True})
    broken("commit-complete", check_commit_complete, 1, 4, None, *args, {})
    broken("commit-complete", check_commit_complete, 1, 4, ["H"], *args, {})
    broken("commit-complete", check_commit_complete, 1, 4, ["H", "S"], ["H"], ["H", "S2"],
           ["S"], {})
    broken("commit-complete", check_commit_complete, 1, 4, ["H", "S"], *args, {"S": False})


def test_superseded_and_owned_bounded():
    ok = [(1, 2, 1, 2, False), (2, 4, 1, 1, True), (3, 6, 1, 1, False), (4, 4, 0, 1, False)]
    check_superseded(1, 8, 4, ok)  # shared / borrowed / inside the window / no pages
    v = broken("superseded-state", check_superseded, 1, 8, 4, [(2, 4, 2, 1, False)])
    assert v.details["node"] == 2
    check_owned_bounded(1, "H", 4, 4, 2, 8, 2)
    broken("owned-bounded", check_owned_bounded, 1, "H", 4, 0, 4, 8, 2)
    broken("owned-bounded", check_owned_bounded, 1, "H", 4, 4, 3, 8, 2)


# -- the exhaustive search's canonical state ---------------------------------------------------

def test_canonical_merges_renamings_and_separates_behaviour():
    # the same state reached with different page ids and clocks: equal canonical states
    a, _ = run([("admit", dict(rid=1, tokens=[1, 1, 1], chunk=4)), ("abort", dict(rid=1)),
                ("admit", dict(rid=1, tokens=A[:4], chunk=4))])
    b, _ = run([("admit", dict(rid=1, tokens=A[:4], chunk=4))])
    assert a.subject.cache.tables[1]["H"].owned != b.subject.cache.tables[1]["H"].owned
    assert a.subject.canonical() == b.subject.canonical()
    # a retracted request (host ref, kept tables) is not the active one
    c, _ = run([("admit", dict(rid=1, tokens=A[:4], chunk=4)), ("retract", dict(rid=1))])
    assert c.subject.canonical() != b.subject.canonical()
    # a snapshot page's content is part of the state (a check reads it back)
    d, _ = run([("admit", dict(rid=1, tokens=A[:4], chunk=4)), ("step", dict(rid=1))])
    e, _ = run([("admit", dict(rid=1, tokens=A[:4], chunk=4)), ("step", dict(rid=1))])
    page = node_at(e.subject, A, 2).snapshot.groups["H"].pages[0]
    e.subject.pools["H"].write([page], [12345])
    assert d.subject.canonical() != e.subject.canonical()
