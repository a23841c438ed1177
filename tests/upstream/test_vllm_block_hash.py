"""``--target vllm``: vLLM 0.33.0's real ``KVCacheManager`` + ``BlockPool`` behind the
block-hash machine (env: ``bash ci/upstream/vllm-setup.sh``, run with ``.venv-vllm/bin/python``).

* a missing install is one line with how to get it (runs everywhere);
* hand-driven: a finished request's blocks go tail first to the queue's back, a later hit
  revives them; a short fuzz run and the differential run against the reference are clean;
* faults K1-K5 and K8 patched into the real instances are caught on their own property;
  K6/K7 refused;
* batch admission (``enqueue`` + ``schedule``, vLLM's waiting loop): the token budget cuts the
  second chunk, a refused ``allocate_slots`` leaves the real pool untouched and the request
  waiting, and it is admitted with its hit once blocks are free.
"""

from __future__ import annotations

import pytest

from caches.adapters.vllm import loader
from caches.target import FaultNotInjectable
from state_machines.variants import get_variant
from state_machines.ops import Op
from tests.test_block_hash_cache import run as run_on
from tests.test_block_hash_schedule import FULL_POOL, K8_TRACE

REASON = loader.unavailable_reason()
needs_vllm = pytest.mark.skipif(bool(REASON), reason=f"vllm not usable here: {REASON}")
SPEC = get_variant("block-hash")


def run(ops, fault=None):
    return run_on(ops, fault, "vllm")


def test_unavailable_reason_is_one_line_with_the_setup_hint():
    if REASON:
        assert "\n" not in REASON and "vllm-setup.sh" in REASON
    else:
        assert loader.version() == loader.PINNED


@needs_vllm
def test_free_goes_tail_first_and_a_hit_revives():
    r, v = run([("admit", {"rid": 1, "tokens": [0, 0, 0, 0, 0], "chunk": 8}),
                ("finish", {"rid": 1})])
    assert v is None and r.subject.free_ids() == [3, 4, 5, 6, 7, 2, 1]
    r, v = run([("admit", {"rid": 1, "tokens": [0, 0, 0, 0, 0], "chunk": 8}),
                ("finish", {"rid": 1}),
                ("admit", {"rid": 2, "tokens": [0, 0, 0, 0, 1], "chunk": 8})])
    assert v is None and r.subject.table(2) == [1, 2, 3]
    assert r.subject.reached_counts["revive"] == 1


@needs_vllm
def test_fuzz_and_diff_are_clean():
    from state_machines.diff import run_diff
    from state_machines.fuzz import fuzz

    params = SPEC.check_params({})
    out = fuzz(SPEC, params, target="vllm", max_examples=30)
    assert out.error is None and not out.failed, out.trace and out.trace.violation
    d = run_diff("block-hash", "vllm", params, max_examples=30)
    assert d.error is None and d.trace is None and d.steps > 0, d.trace and d.trace.violation


@needs_vllm
@pytest.mark.parametrize("fault,ops,prop", [
    ("K1", [("admit", {"rid": 1, "tokens": [0, 0], "chunk": 4}), ("preempt", {"rid": 1}),
            ("resume", {"rid": 1})], "conservation"),
    ("K2", [("admit", {"rid": 1, "tokens": [0, 0], "chunk": 4}), ("evict", {"n": 0})],
     "hash-map"),
    ("K3", [("admit", {"rid": 1, "tokens": [0, 0], "chunk": 4}), ("abort", {"rid": 1}),
            ("admit", {"rid": 2, "tokens": [0, 0, 0], "chunk": 4})], "ref-balance"),
    ("K4", [("admit", {"rid": 1, "tokens": [0], "chunk": 4})], "victim"),
    ("K5", [("admit", {"rid": 1, "tokens": [0] * 5, "chunk": 4}),
            ("admit", {"rid": 2, "tokens": [0] * 5, "chunk": 4})], "data-integrity"),
    ("K8", K8_TRACE, "admission-sound"),
])
def test_faults_in_the_real_classes(fault, ops, prop):
    _, v = run(ops, fault)
    assert v is not None and v.prop == prop, v
    assert run(ops)[1] is None


@needs_vllm
@pytest.mark.parametrize("fault", ["K6", "K7"])
def test_faults_without_a_form_are_refused(fault):
    with pytest.raises(FaultNotInjectable):
        SPEC.make_subject({}, fault=fault, target="vllm")


@needs_vllm
def test_schedule_drives_the_waiting_loop_on_the_real_manager():
    r, v = run([("enqueue", {"rid": 1, "tokens": [0] * 5, "max_new": 2}),
                ("enqueue", {"rid": 2, "tokens": [1] * 6, "max_new": 2}),
                ("schedule", {"n": 3})])
    assert v is None and r.subject.requests[2].computed == 3 and len(r.subject.table(2)) == 2
    r, v = run(FULL_POOL)
    s = r.subject
    assert v is None and list(s.waiting) == [3] and s.table(3) == []
    assert sorted(s.free_ids()) == [1, 2] and s.refs()[1] == 0
    r.step(Op("finish", {"rid": 2}))
    r.step(Op("schedule", {"n": 1}))
    assert not s.waiting and s.table(3)[:2] == [1, 2] and s.requests[3].computed == 8


@needs_vllm
def test_allocate_slots_gets_the_hit_count_get_computed_blocks_returned():
    """As vLLM's ``Scheduler.schedule``: ``num_new_computed_tokens`` is the count
    ``get_computed_blocks`` returned with its blocks (equal to blocks x block size on 0.33; a
    branch that changes it must be driven with its own count, not one derived here)."""
    r, v = run([("admit", {"rid": 1, "tokens": [0, 0, 0, 0, 0], "chunk": 8}),
                ("finish", {"rid": 1})])
    assert v is None
    manager, seen = r.subject.cache.manager, []
    real_get, real_alloc = manager.get_computed_blocks, manager.allocate_slots

    def get(request):
        blocks, n, *rest = real_get(request)
        return (blocks, n - 1, *rest)  # a branch that recomputes a hit's last token

    def alloc(request, num_new_tokens, *args, **kwargs):
        seen.append(kwargs.get("num_new_computed_tokens"))
        return real_alloc(request, num_new_tokens, *args, **kwargs)

    manager.get_computed_blocks, manager.allocate_slots = get, alloc
    r.subject.cache.get_computed_blocks(2, [0, 0, 0, 0, 1])
    hit, n = r.subject.cache.get_computed_blocks(2, [0, 0, 0, 0, 1])
    assert len(hit) == 2 and n == 2 * r.subject.cache.block_size - 1
    r.subject.cache.allocate_slots(2, [0, 0, 0, 0, 1], 0, 1, hit)
    assert seen == [n]
