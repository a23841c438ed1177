"""The hybrid-swa reference: SGLang's Full + SWA radix cache rules, one at a time, through the
subject (every op checked) and on the cache directly."""

from __future__ import annotations

import pytest

from caches.faults import get_fault
from caches.hybrid_swa import HybridSWARadixCache
from caches.subjects.hybrid_swa import HybridSWASubject, release_frontier
from caches.window_pool import SENTINEL, SWAPagedAllocator
from invariants import Violation


def subject(fault=None, **kw):
    params = {"page_size": 1, "pool_pages": 24, "swa_pages": 12, "window": 2, **kw}
    cls = get_fault(fault).cls if fault else HybridSWARadixCache
    return HybridSWASubject(cls, **params)


def decoded(s, rid, tokens, n):
    s.admit(rid, tokens)
    s.check()
    s.prefill(rid, 64)
    s.check()
    s.decode(rid, n)
    s.check()
    return s.requests[rid]


def walk(cache):
    out, stack = [], [cache.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node is not cache.root_node:
            out.append(node)
    return out


def test_pool_pairs_pages_and_never_frees_the_sentinel():
    pool = SWAPagedAllocator(4, 2, page_size=2)
    got = pool.alloc(3)
    assert len(got) == 3 and len(pool.free_pages) == 2 and len(pool.window.free_pages) == 0
    assert all(pool.mapping[s] // 2 != SENTINEL for s in got)
    assert pool.alloc(1) is None  # the window pool is the smaller: available == min
    pool.free_swa(got)
    assert len(pool.window.free_pages) == 2 and not any(s in pool.mapping for s in got)
    pool.free_swa(got)  # unmapped slots map to the sentinel: skipped, nothing freed twice
    assert sorted(pool.window.free_pages) == [1, 2]
    pool.free(got)
    assert len(pool.free_pages) == 4


def test_decode_frees_out_of_window_and_the_finish_leaves_a_tombstone_below_it():
    s = subject()
    req = decoded(s, 1, [0, 1, 2], 5)  # 8 tokens computed, window 2
    # the release before the 5th step ran at pre_len 7: frontier 7 - 2 = 5
    assert req.swa_evicted_seqlen == release_frontier(7, 2, 1) == 5
    assert all(s.pool.mapping.get(slot, 0) == 0 for slot in req.kv_indices[:5])
    assert all(s.pool.mapping.get(slot, 0) != 0 for slot in req.kv_indices[5:])
    s.finish(1)
    s.check()
    (leaf,) = [n for n in walk(s.cache) if not n.children]
    path = [leaf.parent.parent, leaf.parent, leaf]
    assert path[0].parent is s.cache.root_node
    assert [len(n.key) for n in path] == [5, 1, 2]  # the live part capped at one window
    assert path[0].swa_value is None  # below the window: a tombstone
    assert path[1].swa_value is not None and leaf.swa_value is not None


def test_a_match_stops_before_a_tombstone_unless_a_window_of_live_kv_follows():
    s = subject()
    req = decoded(s, 1, [0, 1, 2], 5)
    seq = list(req.tokens)
    s.finish(1)
    whole = s.cache.match_prefix(seq)
    assert len(whole.indices) == 8  # tombstone (5) + a live run of 3 >= window 2
    short = s.cache.match_prefix(seq[:6] + [0, 0])  # one live token past the tombstone
    assert len(short.indices) == 0 and short.last_node is s.cache.root_node


def test_an_insert_over_a_tombstone_within_the_window_recovers_it():
    s = subject()
    req = decoded(s, 1, [0, 1, 2], 5)
    seq = list(req.tokens)
    s.finish(1)
    s.check()
    s.admit(2, seq[:6] + [0, 0])  # the hit stops before the tombstone: computes it again
    s.prefill(2, 64)
    s.finish(2)
    s.check()
    assert all(n.swa_value is not None for n in walk(s.cache)), s.outline()
    assert s.reached_counts["tombstone-recovered"] >= 1


def test_evict_swa_tombstones_inner_nodes_and_drops_unheld_leaves():
    s = subject(window=3)
    s.insert([0, 0, 0])
    s.insert([0, 0, 0, 1, 1])
    inner = next(n for n in walk(s.cache) if n.children)
    s.check()
    freed = s.cache.evict_swa(1)  # the least recent node with window KV: the inner one
    s.check()
    assert freed == len(inner.key) and inner.swa_value is None
    assert s.cache.evict_swa(64) == 2  # the leaf goes whole, full KV with it
    s.check()
    assert [n.swa_value for n in walk(s.cache)] == [None]


def test_a_fresh_leaf_is_capped_at_one_page_aligned_window():
    s = subject(page_size=2, window=3)
    s.insert([0, 1, 2, 0, 1, 2, 0, 1])
    s.check()
    (leaf,) = [n for n in walk(s.cache) if not n.children]
    assert len(leaf.key) == 4 and len(leaf.parent.key) == 4  # ceil_page(3) == 4
    assert leaf.parent.swa_value is not None


def test_a_lock_covers_only_the_trailing_window_and_its_stamp_survives_a_split():
    s = subject(window=3)
    s.insert([0, 0, 0, 0])
    s.insert([0, 0, 0, 0, 1, 1])
    s.lock(1, [0, 0, 0, 0, 1, 1])
    leaf = next(n for n in walk(s.cache) if not n.children)
    parent = leaf.parent
    assert leaf.swa_lock_ref == 1 and parent.swa_lock_ref == 1 and parent.swa_uuid
    s.insert([0, 0, 0, 2])  # splits the stamped parent: the stamp moves to the new head
    s.check()
    head = parent.parent
    assert head.swa_uuid and parent.swa_uuid is None
    s.unlock(1)
    s.check()
    assert all(n.swa_lock_ref == 0 for n in walk(s.cache))


def test_recovery_adopts_incoming_full_slots_unless_a_holder_reads_them():
    for locked in (False, True):
        s = subject()
        req = decoded(s, 1, [0, 1, 2], 5)
        seq = list(req.tokens)
        s.finish(1)
        tomb = next(n for n in walk(s.cache) if n.swa_value is None)
        old = list(tomb.value)
        if locked:
            s.lock(9, seq)
        s.admit(2, seq[:6] + [0, 0])
        incoming = s.requests[2].kv_indices[:5]
        s.prefill(2, 64)
        s.finish(2)
        s.check()
        assert tomb.swa_value is not None
        assert tomb.value == (old if locked else incoming)


def test_release_window_tombstones_the_released_leaf():
    s = subject()
    s.insert([0, 1, 2, 0])
    req = decoded(s, 1, [0, 1, 2, 0, 1], 2)
    node = req.last_node
    assert node.swa_lock_ref == 1
    s.release_window(1)
    s.check()
    assert node.swa_lock_ref == 0 and node.swa_value is None  # a leaf: tombstoned at once
    s.finish(1)
    s.check()


@pytest.mark.parametrize("fault, prop, steps", [
    ("SW1", "conservation", "recover"),
    ("SW3", "tombstone", "chunked"),
    ("SW4", "sentinel", "tombstone-leaf"),
    ("SW5", "window-hit", "tombstone-hit"),
    ("SW8", "window-release", "decode"),
])
def test_faults_break_their_property_on_a_hand_trace(fault, prop, steps):
    s = subject(fault)
    with pytest.raises(Violation) as err:
        if steps == "decode":
            decoded(s, 1, [0, 1, 2], 5)
        elif steps == "chunked":  # a chunk the tree caches, then decode past the window
            s.admit(1, [0, 1, 2, 0])
            s.prefill(1, 2)
            s.check()
            s.prefill(1, 64)
            s.decode(1, 6)
            s.check()
        else:
            req = decoded(s, 1, [0, 1, 2], 5)
            seq = list(req.tokens)
            s.finish(1)
            s.check()
            if steps == "recover":  # a holder locks the tombstone's full KV meanwhile
                s.lock(9, seq)
                s.admit(2, seq[:6] + [0, 0])
                s.prefill(2, 64)
                s.finish(2)
                s.check()
            elif steps == "tombstone-hit":
                s.match(seq[:6] + [0])
                s.check()
            else:  # tombstone-leaf: evict everything, the tombstone goes last as a leaf
                s.evict(64)
                s.check()
                s.check_quiescent()
    assert err.value.prop == prop, err.value
