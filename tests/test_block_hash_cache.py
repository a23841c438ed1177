"""The block-hash reference cache (vLLM v1's block prefix cache) on hand-driven cases, its
invariants and policy checks on hand-built data (pass and fail), and the subject's ledger."""

import pytest

from caches.block_hash import BlockHashCache, chained_hash
from invariants import Violation
from invariants.blocks import check_block_refs, check_blocks_quiescent, check_hash_map
from invariants.policy import check_queue_order, check_queue_victims, vllm_free_key
from state_machines.ops import Op
from state_machines.run import Run
from state_machines.variants import get_variant

SPEC = get_variant("block-hash")


def run(ops, fault=None, target="reference", **params):
    """Apply (name, args) ops on ``target``; returns (run, violation or None)."""
    r = Run(SPEC, SPEC.check_params(params), fault, target, "cpu")
    for name, args in ops:
        try:
            r.step(Op(name, args))
        except Violation as v:
            return r, v
    return r, None


def broken(prop, fn, *args, **kw):
    with pytest.raises(Violation) as err:
        fn(*args, **kw)
    assert err.value.prop == prop, err.value
    return err.value


# -- the cache ------------------------------------------------------------------------------

def test_hashes_chain_over_the_prefix():
    c = BlockHashCache(8, 2)
    a, b = c.block_hashes([0, 0, 1, 1]), c.block_hashes([1, 1, 1, 1])
    assert len(a) == 2 and a[0] != b[0]
    assert a[1] != b[1], "equal blocks after different prefixes must not collide"
    assert a[1] == chained_hash(a[0], [1, 1]) and c.block_hashes([0, 0, 1, 1, 0]) == a


def test_null_block_and_the_last_token_is_never_a_hit():
    c = BlockHashCache(8, 2)
    assert c.pool.num_free == 7 and 0 not in c.pool.free_queue.ids()
    toks = [0, 1, 0, 1]
    assert [b.id for b in c.allocate_slots(1, toks, 0, 4)] == [1, 2]
    hit, n = c.get_computed_blocks(1, toks)
    assert n == 2 and [b.id for b in hit] == [1]  # 4 tokens: at most 3 may hit
    hit, n = c.get_computed_blocks(1, toks + [0])
    assert n == 4 and [b.id for b in hit] == [1, 2]


def test_free_is_tail_first_cached_to_the_back_and_a_hit_revives():
    c = BlockHashCache(8, 2)
    c.allocate_slots(1, [0, 0, 0, 0, 0], 0, 5)  # blocks 1, 2 full (cached), 3 partial
    c.free(1)
    # uncached 3 to the front, cached 2 then 1 (tail first) to the back
    assert c.pool.free_queue.ids() == [3, 4, 5, 6, 7, 2, 1]
    hit, n = c.get_computed_blocks(2, [0, 0, 0, 0, 1])
    assert n == 4
    new = c.allocate_slots(2, [0, 0, 0, 0, 1], 0, 1, hit)
    assert [b.id for b in c.req_to_blocks[2]] == [1, 2, 3] and [b.id for b in new] == [3]
    assert c.pool.blocks[1].ref_cnt == c.pool.blocks[2].ref_cnt == 1
    assert c.pool.free_queue.ids() == [4, 5, 6, 7]


def test_allocation_evicts_from_the_lru_end_and_refuses_when_short():
    c = BlockHashCache(4, 2)  # 3 usable blocks
    c.allocate_slots(1, [0, 0, 1, 1], 0, 4)
    c.free(1)  # cached 2, 1 at the back; 3 at the front
    assert c.pool.free_queue.ids() == [3, 2, 1]
    c.allocate_slots(2, [1] * 3, 0, 3)  # takes 3 then 2: block 2's hash leaves the map
    assert c.pool.blocks[2].block_hash is None and c.pool.blocks[1].block_hash is not None
    assert len(c.pool.hash_to_blocks) == 2  # block 1's and block 3's (r2's full block)
    assert c.allocate_slots(3, [0] * 6, 0, 6) is None  # needs 3, 1 free
    assert c.pool.free_queue.ids() == [1] and 3 not in c.req_to_blocks


def test_reset_only_when_nothing_is_held_and_evict_blocks_keeps_held_blocks():
    c = BlockHashCache(8, 2)
    c.allocate_slots(1, [0, 0, 1], 0, 3)
    assert not c.reset_prefix_cache()
    c.evict_blocks({1})  # held: the hash goes, the block stays with r1
    assert c.pool.blocks[1].block_hash is None and c.pool.blocks[1].ref_cnt == 1
    c.free(1)
    assert c.reset_prefix_cache() and c.pool.hash_to_blocks == {}


# -- invariants on hand-built data -----------------------------------------------------------

def test_block_refs():
    check_block_refs({1: 2, 2: 0}, {1: ["r1", "r2"]})
    v = broken("ref-balance", check_block_refs, {1: 1, 2: 0}, {1: ["r1", "r2"]})
    assert v.details["block"] == 1 and v.details["expected"] == 2
    broken("ref-balance", check_block_refs, {1: -1}, {})


def test_hash_map():
    check_hash_map({"h": (1, 2)}, {1: "h", 2: "h", 3: None})
    v = broken("hash-map", check_hash_map, {"h": (1,)}, {1: None})
    assert v.details == {"hash": "h", "block": 1, "block_hash": None}
    v = broken("hash-map", check_hash_map, {}, {1: "h"})
    assert v.details == {"block": 1, "hash": "h"}


def test_blocks_quiescent():
    check_blocks_quiescent([1, 2, 3], 3, {1: 0, 2: 0, 3: 0}, 0)
    broken("quiescence", check_blocks_quiescent, [1, 2], 3, {1: 0, 2: 0, 3: 0}, 0)
    broken("quiescence", check_blocks_quiescent, [1, 2, 3], 3, {1: 1}, 0)
    broken("quiescence", check_blocks_quiescent, [1, 2, 3], 3, {}, 1)


def test_queue_order_and_victims():
    keys = {3: vllm_free_key(False, 2, 0), 4: vllm_free_key(False, 0, 4),
            2: vllm_free_key(True, 1, 0), 1: vllm_free_key(True, 1, 1)}
    check_queue_order([3, 4, 2, 1], keys)  # newest uncached first, then cached by free time
    v = broken("lru-order", check_queue_order, [3, 4, 1, 2], keys)
    assert (v.details["block"], v.details["next"]) == (1, 2)
    check_queue_victims("alloc", [3, 4], [3, 4, 2, 1], keys)
    v = broken("victim", check_queue_victims, "alloc", [2], [3, 4, 2, 1], keys)
    assert (v.details["block"], v.details["better"]) == (2, 3)
    broken("victim", check_queue_victims, "alloc", [5], [3, 4], keys)


# -- the subject's ledger and a few whole traces ----------------------------------------------

def test_a_shared_prefix_is_revived_and_reads_back_its_kv():
    r, v = run([("admit", {"rid": 1, "tokens": [0, 1, 1, 0, 1], "chunk": 8}),
                ("finish", {"rid": 1}),
                ("admit", {"rid": 2, "tokens": [0, 1, 1, 0, 0], "chunk": 8})])
    assert v is None
    assert r.subject.reached_counts["revive"] == 1
    assert r.subject.table(2)[:2] == [1, 2]


def test_preempt_then_resume_hits_its_own_cached_blocks():
    r, v = run([("admit", {"rid": 1, "tokens": [0, 0, 0, 0, 0], "chunk": 8}),
                ("preempt", {"rid": 1}),
                ("resume", {"rid": 1})])
    assert v is None and r.subject.requests[1].running
    assert r.subject.reached_counts["resumed"] == 1 and r.subject.reached_counts["revive"] == 1


def _alias(r, rid, i, j):
    """Position ``j`` of r{rid}'s table takes position ``i``'s block, refs kept in step (the
    block gains a ref, the one it replaced loses one and goes to the free queue at 0): the
    refs and conservation still pass (only the policy's queue order, checked after the state,
    would see the freed block's stale ledger key)."""
    pool, table = r.subject.cache.pool, r.subject.cache.req_to_blocks[rid]
    old, new = table[j], table[i]
    table[j] = new
    new.ref_cnt += 1
    old.ref_cnt -= 1
    if old.ref_cnt == 0:
        pool.free_queue.append_n([old])


def test_a_block_at_two_positions_of_a_table_is_a_conservation_violation():
    """Two positions of one request's table holding one block (each reading the other's KV,
    the block freed twice when the request ends) are reported on conservation
    (``check_held_once``); the same state without the alias passes."""
    ops = [("admit", {"rid": 1, "tokens": [0, 1, 1, 0, 1], "chunk": 8}),
           ("admit", {"rid": 2, "tokens": [1, 1, 0, 0, 1, 1], "chunk": 8})]
    r, v = run(ops)
    assert v is None
    r.subject.check()
    _alias(r, 2, 0, 2)
    v = broken("conservation", r.subject.check)
    assert v.details["owner"] == "r2's block table" and v.details["ids"] == [r.subject.table(2)[0]]


@pytest.mark.parametrize("fault,ops,prop", [
    ("K1", [("admit", {"rid": 1, "tokens": [0, 0, 0], "chunk": 4}), ("preempt", {"rid": 1}),
            ("resume", {"rid": 1})], "conservation"),
    ("K3", [("admit", {"rid": 1, "tokens": [0, 0, 0], "chunk": 4}), ("preempt", {"rid": 1}),
            ("resume", {"rid": 1})], "ref-balance"),
    ("K5", [("admit", {"rid": 1, "tokens": [0] * 5, "chunk": 4}),
            ("admit", {"rid": 2, "tokens": [0] * 5, "chunk": 4})], "data-integrity"),
    ("K6", [("admit", {"rid": 1, "tokens": [0] * 4, "chunk": 4}), ("abort", {"rid": 1})],
     "lru-order"),
])
def test_fault_traces_break_their_property_and_pass_clean(fault, ops, prop):
    _, v = run(ops, fault)
    assert v is not None and v.prop == prop, v
    assert run(ops)[1] is None
