"""``--target vllm`` in the hybrid mode (``window > 0``): vLLM 0.33.0's ``KVCacheManager`` built
with a full-attention and a sliding-window KV cache group, i.e. its ``HybridKVCacheCoordinator``
over ``FullAttentionManager`` + ``SlidingWindowManager`` on one ``BlockPool`` (env: ``bash
ci/upstream/vllm-setup.sh``, run with ``.venv-vllm/bin/python``; skipped without it).

* the hand-driven cases of ``tests/test_block_hash_hybrid.py`` give the very same block ids on
  the real classes (the reference was written from vLLM's rules, not copied);
* a short fuzz run and the differential run against the reference are clean;
* faults K9-K11 patched into the real instances are caught on their property, and refused
  outside the hybrid mode.
"""

from __future__ import annotations

import pytest

from caches.adapters.vllm import loader
from caches.target import FaultNotInjectable
from state_machines.block_hash import HYBRID
from state_machines.ops import Op
from state_machines.variants import get_variant
from tests.test_block_hash_hybrid import LONG, SIBLING, run
from tests.test_block_hash_hybrid import test_hybrid_faults_on_fixed_traces as fault_case

REASON = loader.unavailable_reason()
needs_vllm = pytest.mark.skipif(bool(REASON), reason=f"vllm not usable here: {REASON}")
SPEC = get_variant("block-hash")


@needs_vllm
def test_the_real_coordinator_is_hybrid():
    r, v = run(LONG[:1], target="vllm")
    coordinator = r.subject.cache.manager.coordinator
    assert v is None and type(coordinator).__name__ == "HybridKVCacheCoordinator"
    assert [type(m).__name__ for m in coordinator.single_type_managers] == [
        "FullAttentionManager", "SlidingWindowManager"]


@needs_vllm
def test_release_free_order_and_hit_match_the_reference():
    r, v = run(LONG[:1], target="vllm")
    s = r.subject
    assert v is None and s.tables(1) == ([1, 2, 3, 4], [5, 6, 7, 8])
    r.step(Op("step", {"rid": 1}))
    assert s.tables(1) == ([1, 2, 3, 4, 9], [0, 0, 7, 8, 10])
    assert s.free_ids() == [11, 12, 13, 6, 5]
    r.step(Op("finish", {"rid": 1}))
    assert s.free_ids() == [10, 9, 11, 12, 13, 6, 5, 4, 3, 2, 1, 8, 7]
    r.step(Op(*SIBLING))
    assert s.tables(2) == ([1, 2, 3, 4, 10], [0, 0, 7, 8, 9])


@needs_vllm
def test_the_full_hit_is_cut_to_the_sliding_groups_on_the_real_coordinator():
    cache = run(LONG, target="vllm")[0].subject.cache
    cache.evict_blocks({8})
    (full, sliding), n = cache.get_computed_blocks(2, [0] * 8 + [1])
    ids = [[b.block_id for b in g] for g in (full, sliding)]
    assert n == 6 and ids == [[1, 2, 3], [0, 6, 7]]


@needs_vllm
def test_fuzz_and_diff_are_clean_in_the_hybrid_regime():
    from state_machines.diff import run_diff
    from state_machines.fuzz import fuzz

    params = SPEC.check_params(HYBRID)
    out = fuzz(SPEC, params, target="vllm", max_examples=30)
    assert out.error is None and not out.failed, out.trace and out.trace.violation
    d = run_diff("block-hash", "vllm", params, max_examples=30)
    assert d.error is None and d.trace is None and d.steps > 0, d.trace and d.trace.violation


@needs_vllm
@pytest.mark.parametrize("fault", ["K9", "K10", "K11"])
def test_hybrid_faults_in_the_real_classes(fault):
    cases = {c[0]: c for c in _cases()}
    _, ops, prop = cases[fault]
    fault_case(fault, ops, prop, target="vllm")


@needs_vllm
@pytest.mark.parametrize("fault", ["K9", "K10", "K11"])
def test_hybrid_faults_are_refused_with_one_group(fault):
    with pytest.raises(FaultNotInjectable, match="window"):
        SPEC.make_subject({}, fault=fault, target="vllm")


def _cases():
    mark = next(m for m in fault_case.pytestmark if m.name == "parametrize")
    return mark.args[1]
