"""The block-hash reference's hybrid mode (``window > 0``: vLLM 0.33.0's
``HybridKVCacheCoordinator`` over a full-attention and a sliding-window group sharing one pool):
hand-driven cases with the block ids worked out from vLLM's rules, the window checks on
hand-built data, and faults K9-K11 on short fixed traces.  The same traces on vLLM's real
classes: ``tests/upstream/test_vllm_hybrid.py``."""

from __future__ import annotations

import pytest

from caches.block_hash import BlockHashCache
from invariants.window_blocks import (check_groups_disjoint, check_sentinel,
                                      check_window_hit, check_window_release, window_blocks)
from state_machines.block_hash import HYBRID
from state_machines.ops import Op
from state_machines.variants import get_variant
from tests.test_block_hash_cache import broken, run as run_on

SPEC = get_variant("block-hash")

# r1: a 9-token prompt in one chunk of 8 (4 blocks per group), one step (the 9th token: the
# sliding blocks 5 and 6 leave the window of 4), finished; then a sibling prompt hits.
LONG = [("admit", {"rid": 1, "tokens": [0] * 9, "chunk": 8}), ("step", {"rid": 1}),
        ("finish", {"rid": 1})]
SIBLING = ("admit", {"rid": 2, "tokens": [0] * 8 + [1], "chunk": 8})


def run(ops, fault=None, target="reference"):
    return run_on(ops, fault, target, **HYBRID)


def test_window_param_defaults_to_one_group_and_rejects_a_window_of_one():
    assert SPEC.check_params({})["window"] == 0 and HYBRID in SPEC.regimes
    assert BlockHashCache(8, 2).num_groups == 1 and BlockHashCache(8, 2, 4).num_groups == 2
    with pytest.raises(ValueError, match="window"):
        BlockHashCache(8, 2, 1)
    with pytest.raises(ValueError, match="window must be 0"):  # a clear error, exit 2
        SPEC.check_params({"window": 1})


def test_out_of_window_blocks_are_released_to_the_pool():
    r, v = run(LONG[:1])
    s = r.subject
    assert v is None and s.tables(1) == ([1, 2, 3, 4], [5, 6, 7, 8])
    r.step(Op("step", {"rid": 1}))
    # allocate_slots with 8 computed: tokens 0..4 are out of the window of the 9th token, so
    # blocks 0 and 1 of the sliding table (5, 6) are nulls, freed right to left (6 then 5:
    # cached, to the queue's back); the new token's blocks come from the front (9, 10)
    assert s.tables(1) == ([1, 2, 3, 4, 9], [0, 0, 7, 8, 10])
    assert s.free_ids() == [11, 12, 13, 6, 5]
    assert s.reached_counts["window-released"] >= 1
    r.step(Op("finish", {"rid": 1}))
    # each group freed tail first in its own call (full, then sliding), leading nulls trimmed:
    # uncached tails to the front (the sliding one last, so first), cached to the back
    assert s.free_ids() == [10, 9, 11, 12, 13, 6, 5, 4, 3, 2, 1, 8, 7]


def test_a_hit_takes_the_window_and_pads_the_rest_with_the_null_block():
    r, v = run(LONG + [SIBLING])
    s = r.subject
    assert v is None and s.requests[2].computed == 9
    # 8 tokens hit: the full group's 4 blocks; the sliding group's run of ceil(3/2) = 2
    # blocks at the end (7, 8), nulls before it
    assert s.tables(2) == ([1, 2, 3, 4, 10], [0, 0, 7, 8, 9])
    assert s.reached_counts["window-hit-nulls"] == 1


def test_the_full_hit_is_cut_to_the_sliding_groups():
    cache = run(LONG)[0].subject.cache
    cache.evict_blocks({8})  # the last sliding block of the prompt: no longer cached
    (full, sliding), n = cache.get_computed_blocks(2, [0] * 8 + [1])
    # full attention alone would hit 8 tokens; the sliding run now ends at block 2 (6, 7)
    assert n == 6 and [b.id for b in full] == [1, 2, 3] and [b.id for b in sliding] == [0, 6, 7]
    cache.evict_blocks({7})
    (full, sliding), n = cache.get_computed_blocks(2, [0] * 8 + [1])
    assert n == 4 and [b.id for b in sliding] == [5, 6] and len(full) == 2
    cache.evict_blocks({5})  # no run of 2 anywhere: the run from block 0 is empty
    assert cache.get_computed_blocks(2, [0] * 8 + [1]) == (([], []), 0)


def test_refused_admission_still_releases_nothing_of_a_waiting_request():
    """A waiting request holds no table: ``remove_skipped_blocks`` has nothing to release
    before the free-block check, so a refusal leaves the pool as it was."""
    cache = BlockHashCache(4, 2, 4)
    assert cache.allocate_slots(1, [0] * 9, 0, 8) is None
    assert cache.pool.num_free == 3 and cache.tables == ({}, {})


# -- the checks on hand-built data --------------------------------------------------------------

def test_window_blocks_are_the_blocks_of_the_last_w_minus_1_tokens():
    assert list(window_blocks(8, 4, 2)) == [2, 3]
    assert list(window_blocks(8, 3, 2)) == [3]
    assert list(window_blocks(2, 4, 2)) == [0] and list(window_blocks(0, 4, 2)) == []


def test_check_window_hit():
    hashes = {1: "a", 2: "b", 7: "c", 8: "d"}
    check_window_hit(1, 4, ([1, 2], [0, 8]), 3, 2, hashes)  # block 0 is out of the window
    v = broken("window-hit", check_window_hit, 1, 4, ([1, 2], [0, 8]), 4, 2, hashes)
    assert "sliding-window block 0" in str(v) and "null block" in str(v)
    v = broken("window-hit", check_window_hit, 1, 4, ([1, 2], [7]), 4, 2, hashes)
    assert "not reconciled" in str(v)
    v = broken("window-hit", check_window_hit, 1, 4, ([1, 2], [7, 9]), 4, 2, hashes)
    assert "block 9, which is not cached" in str(v)
    broken("window-hit", check_window_hit, 1, 4, ([0, 2], [7, 8]), 4, 2, hashes)


def test_check_window_release():
    check_window_release(1, [0, 0, 7, 8], 8, 4, 2)
    check_window_release(1, [5, 6, 7, 8], 4, 4, 2)  # only token 0 is out: no whole block
    v = broken("window-release", check_window_release, 1, [0, 6, 7, 8], 8, 4, 2)
    assert "block 6 at position 1" in str(v)


def test_check_sentinel():
    check_sentinel(0, [3, 4], None, {"h": (3,)}, [3], {"r1": [1, 2]})
    assert "free queue" in str(broken("sentinel", check_sentinel, 0, [3, 0], None, {}, [], {}))
    broken("sentinel", check_sentinel, 0, [], "h", {}, [], {})
    broken("sentinel", check_sentinel, 0, [], None, {"h": (0,)}, [], {})
    broken("sentinel", check_sentinel, 0, [], None, {}, [4, 0], {})
    broken("sentinel", check_sentinel, 0, [], None, {}, [], {"r1": [1, 0]})


def test_check_groups_disjoint():
    check_groups_disjoint({"r1": ([1, 2], [0, 3]), "r2": ([1], [0, 3])})
    v = broken("conservation", check_groups_disjoint, {"r1": ([1, 2], [0]), "r2": ([4], [2])})
    assert "block 2" in str(v)


# -- the hybrid faults on fixed traces ----------------------------------------------------------

# r5 (9 tokens with its sampled one) preempted and resumed: its hit pads the sliding group
# with two nulls, and the pool has just the blocks the resume needs (found by the fuzzer)
RESUME_TIGHT = [("enqueue", {"rid": 0, "tokens": [0, 1, 0], "max_new": 0}),
                ("enqueue", {"rid": 5, "tokens": [0] * 8, "max_new": 0}),
                ("schedule", {"n": 2}), ("step", {"rid": 5}), ("preempt", {"rid": 5}),
                ("resume", {"rid": 5})]


@pytest.mark.parametrize("fault,ops,prop", [
    # the nulls padding the resumed request's sliding hit are no blocks to revive
    ("K9", RESUME_TIGHT, "spurious-oom"),
    # the sliding blocks 5, 6 released at the step are freed again at finish (ref -1)
    ("K10", LONG, "ref-balance"),
    # the sliding run ends at block 2: the full group's 8-token hit is not cut to 6
    ("K11", LONG + [("evict", {"n": 7}), SIBLING], "window-hit"),
])
def test_hybrid_faults_on_fixed_traces(fault, ops, prop, target="reference"):
    _, v = run(ops, fault, target)
    assert v is not None and v.prop == prop, v
    assert run(ops, None, target)[1] is None
