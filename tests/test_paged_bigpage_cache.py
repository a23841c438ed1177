"""Unit tests of the paged-bigpage reference cache (LightLLM's linear-attention paged radix
cache), its subject, its faults, and the ``invariants.linear_att`` checks."""

import pytest

from caches.faults import get_fault
from caches.paged_bigpage import LinearAttPagedRadixCache, chained_hashes
from caches.subjects.paged_bigpage import PagedBigPageSubject
from invariants import NodeView, TreeView, Violation
from invariants.linear_att import (
    check_matched_tail,
    check_paged_structure,
    check_pending_buffers,
    check_sort_keys,
)

BIG = {"big_page_num": 2}


def subject(fault=None, **params):
    cls = get_fault(fault).cls if fault else LinearAttPagedRadixCache
    return PagedBigPageSubject(cls, device="cpu", **params)


def run(s, *ops):
    """Apply ops as (name, kwargs), checking every invariant after each (like a Run)."""
    out = []
    for name, kw in ops:
        out.append(getattr(s, name)(**kw))
        s.check()
    return out


def serve(s, rid, tokens, *, finish=True):
    s.admit(rid=rid, tokens=tokens)
    s.check()
    while s.requests[rid].cur_kv_len < len(tokens):
        assert not s.prefill(rid=rid, n=8).startswith("waits")
        s.check()
    if finish:
        s.finish(rid=rid)
        s.check()


# -- the reference cache ------------------------------------------------------------------------
def test_small_pages_only_insert_match_and_trim():
    s = subject()
    serve(s, 1, [0, 1, 1, 0, 1])  # cache_len 4: pages [01] [10], tail buffer on [10]
    c = s.cache
    assert c.tree_total_tokens_num == 4 and c.refed_tokens_num == 0
    assert c.root_node.ref_counter == 1
    # full hit at 4: the tail node has a buffer
    assert s.match(tokens=[0, 1, 1, 0]) == "hit 4 tokens"
    # hit on [01] only: that node has no buffer -> trimmed to empty; the root ref comes back
    assert s.match(tokens=[0, 1]) == "miss"
    assert c.root_node.ref_counter == 1
    s.check()
    s.quiesce()


def test_admit_holds_the_hit_and_root_counts_holders():
    s = subject()
    serve(s, 1, [0, 1, 1, 0, 1])
    res = s.admit(rid=2, tokens=[0, 1, 1, 0, 0, 0])
    s.check()
    assert res == "small-page hit of 4 tokens"
    r2 = s.requests[2]
    assert r2.cur_kv_len == 4 and r2.shared_kv_node.node_prefix_total_len == 4
    assert s.cache.root_node.ref_counter == 2  # baseline + one holder
    s.abort(rid=2)
    s.check()
    assert s.cache.root_node.ref_counter == 1
    s.quiesce()


def test_big_pages_chunked_prefill_accumulates_then_inserts():
    s = subject(**BIG)  # P=2, N=2: big page = 4 tokens
    s.admit(rid=1, tokens=list(range(2)) * 5)  # 10 tokens, cache_len 8
    s.check()
    r = s.requests[1]
    got = run(s, ("prefill", {"rid": 1, "n": 8}), ("prefill", {"rid": 1, "n": 8}))
    assert "big_state" in got[0] and sorted(r.linear_att_len_to_big_page_id) == [4, 8]
    assert r.cur_kv_len == 8 and r.tail_linear_att_small_page_buffer_id is None
    run(s, ("prefill", {"rid": 1, "n": 8}), ("finish", {"rid": 1}))
    c = s.cache
    assert c.tree_total_tokens_num == 8
    bigs = [n for n in s._nodes() if n is not c.root_node]
    assert all(n.is_big_page_node() and n.big_page_buffer_idx for n in bigs) and len(bigs) == 2
    # a big-page hit restores the state from the big buffer (read back in admit)
    assert s.admit(rid=2, tokens=list(range(2)) * 5) == "big-page hit of 8 tokens"
    s.check()
    s.quiesce()


def test_small_hit_with_big_pages_copies_tail_and_holds_big_ancestor():
    s = subject(**BIG)
    serve(s, 1, [0, 1, 0, 1, 1, 1, 0])  # cache_len 6: big [0101] + small [11] with buffer
    res = s.admit(rid=2, tokens=[0, 1, 0, 1, 1, 1, 1, 1])
    s.check()
    assert "tail 2 copied" in res
    r = s.requests[2]
    assert r.cur_kv_len == 6 and r.shared_kv_node.node_prefix_total_len == 4
    small = next(n for n in s._nodes() if n.node_prefix_total_len == 6)
    assert small.ref_counter == 0  # deref'd back
    assert r.slots[4:6] != small.value  # the request owns a copy of the tail
    s.quiesce()


def test_small_hit_at_first_page_with_big_pages_gives_back_root_ref():
    s = subject(**BIG)
    serve(s, 1, [0, 1, 0])  # cache_len 2: one small page with its buffer under the root
    s.admit(rid=2, tokens=[0, 1, 1])
    s.check()
    assert s.requests[2].shared_kv_node is None
    assert s.cache.root_node.ref_counter == 1
    s.quiesce()


def test_pause_mid_prefill_frees_pending_big_buffers_and_resume_rematches():
    s = subject(**BIG)
    s.admit(rid=1, tokens=[1] * 10)
    run(s, ("prefill", {"rid": 1, "n": 8}))
    assert s.requests[1].linear_att_len_to_big_page_id
    free_before = s.big.available_size()
    run(s, ("pause", {"rid": 1}))
    r = s.requests[1]
    assert r.paused and not r.linear_att_len_to_big_page_id and r.cur_kv_len == 0
    assert s.big.available_size() == free_before + 1
    run(s, ("resume", {"rid": 1}), ("prefill", {"rid": 1, "n": 8}))
    s.quiesce()


def test_eviction_order_and_small_buffer_steal():
    s = subject(small_buffers=1)
    serve(s, 1, [0, 0, 0])  # [00] with the only small buffer
    serve(s, 2, [1, 1, 1])  # steals it (pool empty) for [11]
    c = s.cache
    holders = [n for n in s._nodes() if n.small_page_buffer_idx is not None]
    assert [tuple(n.key) for n in holders] == [(1, 1)]
    # the unusable (bufferless) leaf goes first
    assert s.evict(n=1) == "evicted 2 tokens"
    assert [tuple(n.key) for n in c.root_node.children.values()] == [(1, 1)]
    s.check()
    assert s.evict_small_buffer().startswith("no-op") is False  # pool empty: strips [11]
    s.check()
    s.quiesce()


def test_every_node_big_when_big_page_num_is_1():
    s = subject(big_page_num=1)
    serve(s, 1, [0, 1, 1, 0, 1])
    assert all(n.is_big_page_node() for n in s._nodes())
    assert s.small.available_size() == s.small.size
    s.quiesce()


def test_out_of_kv_prefill_waits():
    s = subject(kv_tokens=4)
    s.admit(rid=1, tokens=[0] * 8)
    run(s, ("prefill", {"rid": 1, "n": 8}), ("prefill", {"rid": 1, "n": 8}))
    assert s.prefill(rid=1, n=8).startswith("waits")
    s.quiesce()


def test_chained_hashes_encode_the_prefix():
    assert chained_hashes([1, 2, 3, 4, 5], 2, 2) == [(1, 2), (1, 2, 3, 4)]


# -- faults: each one breaks its property -----------------------------------------------------
def violation(s, *ops):
    with pytest.raises(Violation) as exc:
        run(s, *ops)
    return exc.value


def test_L1_root_enters_the_eviction_set():
    v = violation(subject("L1"), ("match", {"tokens": [0, 0]}))
    assert v.prop == "eviction-set" and v.details["extra"] == [0]


def test_L2_miss_leaks_a_root_ref():
    v = violation(subject("L2"), ("match", {"tokens": [0, 0]}))
    assert v.prop == "ref-balance" and v.details["ref"] == 2


def test_L3_trim_to_empty_leaks_a_root_ref():
    s = subject("L3")
    serve(s, 1, [0, 1, 1, 0, 1])
    v = violation(s, ("match", {"tokens": [0, 1]}))
    assert v.prop == "ref-balance"


def test_L4_deref_to_root_leaks_a_root_ref():
    s = subject("L4", **BIG)
    serve(s, 1, [0, 1, 0])
    v = violation(s, ("admit", {"rid": 2, "tokens": [0, 1, 1]}))
    assert v.prop == "ref-balance"


@pytest.mark.parametrize("release", ["abort", "pause"])
def test_L5_pending_big_buffers_leak_on_abort_or_pause(release):
    s = subject("L5", **BIG)
    s.admit(rid=1, tokens=[1] * 10)
    run(s, ("prefill", {"rid": 1, "n": 8}))
    v = violation(s, (release, {"rid": 1}))
    assert v.prop == "conservation"


@pytest.mark.parametrize("fid", ["L4", "L5"])
def test_faults_need_their_regime(fid):
    """L4/L5 are unreachable with big pages off (upstream default): walks that catch them
    within their regime (``big_page_num=2``) stay clean without it, and the hand-written
    ops pass."""
    from state_machines.native import native_fuzz
    from state_machines.variants import get_variant

    spec = get_variant("paged-bigpage")
    fault = get_fault(fid)
    off = spec.check_params({k: v for k, v in fault.params.items() if k != "big_page_num"})
    on = spec.check_params(fault.params)
    caught = native_fuzz(spec, on, fault=fid, max_walks=400, seed=1, shrink_budget=5)
    assert caught.failed and caught.prop in fault.properties, caught.prop
    clean = native_fuzz(spec, off, fault=fid, max_walks=400, seed=1)
    assert not clean.failed, clean.trace and clean.trace.violation
    s = subject(fid)
    serve(s, 1, [0, 1, 0])
    s.admit(rid=2, tokens=[1] * 10)
    run(s, ("prefill", {"rid": 2, "n": 8}), ("abort", {"rid": 2}),
        ("admit", {"rid": 3, "tokens": [0, 1, 1]}))
    s.quiesce()


# -- invariants.linear_att ----------------------------------------------------------------------
def _tree(bad=None):
    """root -> big node 1 [0 1 2 3] (P=2, N=2) -> small node 2 [4 5]."""
    ex1 = {"prefix": 4, "hash": (0, 1, 2, 3), "small": None, "big": 1}
    ex2 = {"prefix": 6, "hash": (0, 1, 2, 3, 4, 5), "small": 3, "big": None}
    if bad:
        (ex1 if bad[0] == 1 else ex2).update(bad[1])
    nodes = {
        0: NodeView(0, None, (), (), {"ref": 1}, {(0, 1, 2, 3): 1},
                    {"prefix": 0, "hash": None, "small": None, "big": None}),
        1: NodeView(1, 0, (0, 1, 2, 3), (5, 6, 7, 8), {"ref": 0}, {(0, 1, 2, 3, 4, 5): 2}, ex1),
        2: NodeView(2, 1, (4, 5), (9, 10), {"ref": 0}, {}, ex2),
    }
    return TreeView(nodes, 0, 2)


def test_paged_structure_passes_on_a_good_tree():
    check_paged_structure(_tree(), 2, 2)


@pytest.mark.parametrize("bad", [
    (1, {"big": None}),  # a big node without its big buffer
    (1, {"small": 4}),  # a big node with a small buffer
    (2, {"big": 2}),  # a small node with a big buffer
    (2, {"hash": (4, 5)}),  # indexed by a hash that is not chained
    (2, {"prefix": 8}),  # wrong prefix length
])
def test_paged_structure_fails(bad):
    with pytest.raises(Violation) as exc:
        check_paged_structure(_tree(bad), 2, 2)
    assert exc.value.prop == "structure"


def test_paged_structure_rejects_a_big_page_below_a_small_one():
    t = _tree()
    nodes = dict(t.nodes)
    nodes[2] = nodes[2]._replace(children={(0, 1, 2, 3, 4, 5, 6, 7, 8, 9): 3})
    nodes[3] = NodeView(3, 2, (6, 7, 8, 9), (11, 12, 13, 14), {"ref": 0}, {},
                        {"prefix": 10, "hash": (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), "small": None,
                         "big": 5})
    with pytest.raises(Violation) as exc:
        check_paged_structure(TreeView(nodes, 0, 2), 2, 2)
    assert exc.value.prop == "structure"


def test_sort_keys():
    check_sort_keys("s", {1: (0, 1, 5)}, {1: (0, 1, 5)})
    with pytest.raises(Violation) as exc:
        check_sort_keys("s", {1: (0, 1, 5)}, {1: (1, 1, 5)})
    assert exc.value.prop == "eviction-set"


def test_pending_buffers():
    check_pending_buffers("r1", {4: 1, 8: 2}, 0, 8, 8, 4, None)
    check_pending_buffers("r1", {8: 2}, 4, 9, 8, 4, 3)
    for pending, shared, cur, tail in (({4: 1}, 0, 0, None),  # paused with pending ids
                                       ({4: 1}, 4, 8, None),  # at the shared prefix
                                       ({6: 1}, 0, 8, None),  # not on a big boundary
                                       ({}, 0, 6, 3)):  # tail before the cache length
        with pytest.raises(Violation) as exc:
            check_pending_buffers("r1", pending, shared, cur, 8, 4, tail)
        assert exc.value.prop == "conservation"


def test_matched_tail():
    check_matched_tail(4, None, 0, None)
    check_matched_tail(4, 2, 4, [1, 2, 3, 4], small=7, prefix=4, path_value=[1, 2, 3, 4])
    check_matched_tail(4, 2, 4, [1, 2, 3, 4], big=True, prefix=4, path_value=[1, 2, 3, 4])
    for args, kw in (((4, 2, 4, [1, 2, 3, 4]), {"prefix": 4, "path_value": [1, 2, 3, 4]}),
                     ((4, 2, 2, [1, 2]), {"big": True, "prefix": 4, "path_value": [1, 2]}),
                     ((4, 2, 4, [1, 2, 3, 9]), {"big": True, "prefix": 4,
                                                "path_value": [1, 2, 3, 4]}),
                     ((4, None, 2, [1, 2]), {})):
        with pytest.raises(Violation) as exc:
            check_matched_tail(*args, **kw)
        assert exc.value.prop == "match-contract"


def test_data_integrity_catches_a_corrupted_state_buffer():
    s = subject()
    serve(s, 1, [0, 1, 1, 0, 1])
    tail = next(n for n in s._nodes() if n.small_page_buffer_idx is not None)
    s.small.write([tail.small_page_buffer_idx], [12345])
    with pytest.raises(Violation) as exc:
        s.match(tokens=[0, 1, 1, 0])
    assert exc.value.prop == "data-integrity"
