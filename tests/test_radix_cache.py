"""The reference radix cache behaves like the upstream algorithm (hand-driven cases)."""

import pytest

from caches.pools import PagedAllocator
from caches.radix import LockUnderflow, RadixCache
from caches.request import Req


def cache(page_size=1, pages=16):
    pool = PagedAllocator(pages, page_size, device="cpu")
    return RadixCache(pool, page_size), pool


def insert(c, pool, tokens):
    slots = pool.alloc(len(tokens))
    prefix = c.insert(tokens, slots)
    pool.free(slots[:prefix])
    return slots


def test_insert_split_and_match():
    c, pool = cache()
    a = insert(c, pool, [1, 2, 3])
    assert c.insert([1, 2, 3], [9, 9, 9]) == 3
    b = insert(c, pool, [1, 2, 4])
    m = c.match_prefix([1, 2, 4, 5])
    assert m.indices == a[:2] + b[2:] and list(m.last_node.key) == [4]
    split = m.last_node.parent
    assert list(split.key) == [1, 2] and len(split.children) == 2
    assert c.evictable_size_ == 4 and c.protected_size_ == 0


def test_match_splits_inside_a_node():
    c, pool = cache()
    insert(c, pool, [1, 2, 3, 4])
    m = c.match_prefix([1, 2, 9])
    assert len(m.indices) == 2 and list(m.last_node.key) == [1, 2]
    assert list(next(iter(m.last_node.children.values())).key) == [3, 4]


def test_lock_moves_tokens_and_split_keeps_the_lock():
    c, pool = cache()
    insert(c, pool, [1, 2, 3])
    node = c.match_prefix([1, 2, 3]).last_node
    c.inc_lock_ref(node)
    assert (c.evictable_size_, c.protected_size_) == (0, 3)
    m = c.match_prefix([1, 2])  # splits the locked node
    assert m.last_node.lock_ref == 1 and node.lock_ref == 1
    c.dec_lock_ref(node)
    assert (c.evictable_size_, c.protected_size_) == (3, 0)
    with pytest.raises(LockUnderflow):
        c.dec_lock_ref(node)
    assert node.lock_ref == 0 and c.evictable_size_ == 3


def test_evict_lru_with_cascade_and_locks():
    c, pool = cache(pages=8)
    insert(c, pool, [1, 2])
    insert(c, pool, [1, 2, 3])
    insert(c, pool, [5])
    locked = c.match_prefix([5]).last_node
    c.inc_lock_ref(locked)
    assert c.evict(10) == 3  # [3] then its parent [1 2] cascade; [5] is locked
    assert c.evictable_size_ == 0 and c.protected_size_ == 1
    assert c.evictable_leaves == set()
    assert pool.available_size() == 7


def test_page_aligned_match_and_insert():
    c, pool = cache(page_size=2, pages=8)
    slots = pool.alloc(5)
    assert c.insert([1, 2, 3, 4, 5], slots) == 0
    assert c.evictable_size_ == 4  # the loose fifth token is not cached
    assert c.match_prefix([1, 2, 3]).indices == slots[:2]
    assert c.match_prefix([1]).indices == [] and c.match_prefix([1]).last_node is c.root_node


def test_request_paths_move_lock_and_free_duplicates():
    c, pool = cache()
    insert(c, pool, [1, 2, 3])
    m = c.match_prefix([1, 2])
    c.inc_lock_ref(m.last_node)
    own = pool.alloc(3)
    req = Req(1, [1, 2, 7, 8, 9], m.indices + own, filled=4, cache_protected_len=2,
              last_node=m.last_node)
    c.cache_unfinished_req(req)
    assert req.cache_protected_len == 4 and list(req.last_node.key) == [7, 8]
    assert req.last_node.lock_ref == 1 and m.last_node.lock_ref == 1  # path lock moved down
    req.filled = 5
    free_before = pool.available_size()
    c.cache_finished_req(req)
    assert req.last_node.lock_ref == 0 and c.protected_size_ == 0
    assert c.evictable_size_ == 6 and pool.available_size() == free_before


def test_finish_frees_the_copy_the_tree_already_had():
    c, pool = cache()
    own = pool.alloc(3)
    req = Req(1, [1, 2, 3], own, filled=3, last_node=c.root_node)
    insert(c, pool, [1, 2, 3])  # another request cached the same tokens meanwhile
    before = pool.available_size()
    c.cache_finished_req(req)
    assert pool.available_size() == before + 3


def test_alloc_with_eviction_reports_oom():
    c, pool = cache(pages=4)
    insert(c, pool, [1, 2, 3])
    assert c.alloc_with_eviction(4) is not None  # evicts [1 2 3]
    assert c.alloc_with_eviction(1) is None  # nothing left to evict


# -- diffusion LM blocks (dllm_step; sgl-project/sglang issue #35270) --------------------------
def _dllm_subject(fault=None):
    from state_machines.ops import Op
    from state_machines.radix import SPEC
    from state_machines.targets import get_target

    params = SPEC.check_params({"page_size": 4, "pool_pages": 6})
    s = get_target("reference").build("radix", params, fault=fault)
    return s, lambda name, **args: SPEC.ops.apply(s, Op(name, args))


def test_cache_unfinished_req_keys_only_final_tokens():
    c, pool = cache(page_size=4, pages=4)
    slots = pool.alloc(8)
    req = Req(1, [0, 0, 0, 0, 1, 2, 0, 1], slots, filled=8, volatile=4,
              last_node=c.root_node)
    c.cache_unfinished_req(req)  # the trailing page is an in-flight block: not keyed
    assert req.cache_protected_len == 4 and c.protected_size_ == 4
    assert c.match_prefix([0, 0, 0, 0, 1, 2, 0, 1]).indices == slots[:4]
    req.volatile = 0  # resolved: now the whole row is final
    c.cache_unfinished_req(req)
    assert req.cache_protected_len == 8 and c.protected_size_ == 8


def test_dllm_block_rewritten_in_place_stays_the_requests_until_resolved():
    s, apply = _dllm_subject()
    assert apply("dllm_step", rid=1, resolve=0) == "skipped: r1 is not live"
    apply("admit", rid=1, tokens=[0, 0])
    assert apply("dllm_step", rid=1, resolve=0) == "skipped: r1 is still prefilling"
    apply("prefill", rid=1, n=64)
    first = apply("dllm_step", rid=1, resolve=0)
    assert first == "new block: positions 0..3 are [0, 0, 1, 2]; the tree owns 0"
    req = s.requests[1]
    row = list(req.kv_indices)
    s.check()
    again = apply("dllm_step", rid=1, resolve=0)
    assert again == "block rewritten: positions 0..3 are [0, 0, 2, 0]; the tree owns 0"
    assert req.kv_indices == row and req.volatile == 2  # the same slots, still in flight
    assert s.cache.evictable_size_ + s.cache.protected_size_ == 0
    s.check()
    assert s.reached_counts["dllm-block-rewritten"] == 1
    # mid-block a dLLM request neither decodes, finishes nor is retracted
    for op, args in (("decode", {"n": 1}), ("finish", {}), ("retract", {})):
        assert apply(op, rid=1, **args) == "skipped: r1 has an in-flight dLLM block"
    done = apply("dllm_step", rid=1, resolve=1)
    assert done.endswith("the tree owns 4") and req.volatile == 0 and req.output == 2
    assert s.cache.match_prefix([0, 0, 0, 1]).indices == row
    s.check()
    apply("dllm_step", rid=1, resolve=0)  # the next block: a fresh page
    assert len(req.kv_indices) == 8 and req.volatile == 4
    s.drain()  # aborts the request mid-block: its block's slots go back
    s.check_quiescent()


def test_fault_D6_caches_the_in_flight_block_and_two_nodes_own_its_pages():
    from invariants import Violation

    s, apply = _dllm_subject(fault="D6")
    apply("admit", rid=1, tokens=[0, 0])
    apply("prefill", rid=1, n=64)
    assert apply("dllm_step", rid=1, resolve=0).endswith("the tree owns 4")
    s.check()  # one version cached: wrong, but not yet visible
    apply("dllm_step", rid=1, resolve=0)  # the key diverges at the block
    with pytest.raises(Violation) as broke:
        s.check()
    assert broke.value.prop == "conservation"
    assert broke.value.details["ids"] == s.requests[1].kv_indices
    assert "held at two positions by the tree" in str(broke.value)
