"""``--target sglang`` / ``--target sglang-rust`` for hybrid-swa at ``--param mamba=1`` on SGLang
0.5.23: ``UnifiedRadixCache`` with the Full, SWA and Mamba components over the real
``SWAKVPool`` / ``SWATokenToKVPoolAllocator`` and ``HybridReqToTokenPool`` / ``MambaPool``, on
the Python and the Rust tree core (``caches/adapters/sglang/unified_swa_mamba.py``).

Run with the default upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream/test_sglang_unified_swa_mamba.py``.
Where sglang is not importable, or another release is installed, the module skips, saying why.
"""

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.23")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from invariants import Violation  # noqa: E402
from state_machines.diff import format_diff, run_diff  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.hybrid_swa import SPEC  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.targets import get_target  # noqa: E402

CORES = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}
TARGETS = {"python": "sglang", "rust": "sglang-rust"}
# the target's mamba regime (its last), and a roomy one for the hand-written scenarios
MAMBA = SPEC.check_params(SPEC.regimes_for("sglang")[-1], "sglang")
ROOMY = {**MAMBA, "pool_pages": 32, "swa_pages": 16}


def subject(core="python", **params):
    return get_target(TARGETS[core]).build("hybrid-swa", SPEC.check_params(
        {**ROOMY, **params}, TARGETS[core]))


def apply(s, name, **args):
    out = SPEC.ops.apply(s, Op(name, args))
    s.check()
    return out


def states(s) -> tuple[int, int, int]:
    """(tree states, request-held states, free slots)."""
    c = s.cache
    return (len(c.tree_mamba_slots()), len(c.request_mamba_slots()), c.mamba.available_size())


def test_the_target_declares_mamba_and_its_regime_the_reference_does_not():
    assert MAMBA["mamba"] == 1 and MAMBA["page_size"] == 1
    assert MAMBA["mamba_slots"] >= 3  # SGLang's rule: mamba_slots // 3 running requests
    for t in TARGETS.values():
        assert SPEC.regimes_for(t)[:len(SPEC.regimes)] == SPEC.regimes
    with pytest.raises(ValueError, match="unknown parameter"):
        SPEC.check_params({"mamba": 1})
    with pytest.raises(ValueError, match="mamba_slots"):
        SPEC.check_params({"mamba": 1, "mamba_slots": 2}, "sglang")


def test_paged_mamba_is_refused_with_the_reason():
    from caches.target import TargetUnavailable

    with pytest.raises(TargetUnavailable, match="page_size 1 only"):
        subject(page_size=2)


@pytest.mark.parametrize("core", sorted(CORES))
def test_both_cores_build_full_swa_and_mamba_over_the_real_pools(core):
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    sg = loader.load()
    s = get_target(TARGETS[core]).build("hybrid-swa", MAMBA)
    assert type(s.cache.tree.tree_core).__name__ == CORES[core]
    assert s.cache.tree.tree_components == (sg.ComponentType.FULL, sg.ComponentType.SWA,
                                            sg.ComponentType.MAMBA)
    assert s.cache.tree.supports_swa() and s.cache.tree.supports_mamba()
    assert isinstance(s.cache.allocator, SWATokenToKVPoolAllocator)
    assert isinstance(s.cache.req_to_token_pool, HybridReqToTokenPool)
    assert s.cache.tree.req_to_token_pool is s.cache.req_to_token_pool
    assert states(s) == (0, 0, MAMBA["mamba_slots"])
    # mamba=0 keeps the plain Full + SWA construction
    plain = get_target(TARGETS[core]).build("hybrid-swa", {**MAMBA, "mamba": 0})
    assert plain.cache.tree.tree_components == (sg.ComponentType.FULL, sg.ComponentType.SWA)


@pytest.mark.parametrize("core", sorted(CORES))
def test_a_request_takes_a_state_at_admission_forks_at_a_chunk_and_donates_at_finish(core):
    s = subject(core)
    apply(s, "admit", rid=1, tokens=[1, 2, 3, 4, 5])
    assert states(s) == (0, 1, 5)  # HybridReqToTokenPool.alloc at admission
    apply(s, "prefill", rid=1, n=2)
    assert states(s) == (1, 1, 4)  # the chunk's checkpoint forked a state for the tree
    apply(s, "prefill", rid=1, n=10)
    apply(s, "decode", rid=1, n=4)
    apply(s, "finish", rid=1)
    assert states(s) == (2, 0, 4)  # the finished request's own state is the tree's
    apply(s, "admit", rid=2, tokens=[1, 2, 3, 4, 5, 6])
    assert states(s) == (2, 1, 3)
    apply(s, "abort", rid=2)
    assert states(s) == (2, 0, 4)  # an abort frees it
    assert "tree already had" in apply(s, "insert", tokens=[7, 8, 9])
    assert states(s) == (3, 0, 3)  # a bare insert donates a fresh state
    assert "tree already had 3" in apply(s, "insert", tokens=[7, 8, 9])
    assert states(s) == (3, 0, 3)  # ... given back when the tree had one
    s.drain()
    s.check_quiescent()
    assert states(s) == (0, 0, MAMBA["mamba_slots"])


@pytest.mark.parametrize("core", sorted(CORES))
def test_running_requests_are_capped_at_a_third_of_the_states(core):
    s = subject(core)
    assert s.cache.max_running == MAMBA["mamba_slots"] // 3 == 2
    apply(s, "admit", rid=1, tokens=[1, 2])
    apply(s, "admit", rid=2, tokens=[3, 4])
    assert "not admitted" in apply(s, "admit", rid=3, tokens=[5, 6])
    assert 3 not in s.requests
    apply(s, "prefill", rid=1, n=2)
    apply(s, "finish", rid=1)
    for rid in (4, 5):
        apply(s, "enqueue", rid=rid, tokens=[rid, rid + 1], max_new=2)
    assert "admitted r4 of 2 waiting" in apply(s, "schedule", n=2)
    assert sorted(s.requests) == [2, 4] and list(s.waiting) == [5]


def test_an_admission_whose_state_bare_locks_pin_is_declined():
    s = subject("python")
    for i in range(6):
        apply(s, "insert", tokens=[10 + i, 20 + i])
        apply(s, "lock", hid=i, tokens=[10 + i, 20 + i])
    assert states(s) == (6, 0, 0)
    out = apply(s, "admit", rid=1, tokens=[1, 2, 3])
    assert out.startswith("skipped:") and "bare locks pin every state" in out
    assert not s.requests and states(s) == (6, 0, 0)


def test_an_early_window_release_drops_the_mamba_lock_and_the_unlock_skips_it():
    """``dec_swa_lock_only`` releases Mamba's co-located lock with the SWA part; the final
    ``unlock`` (``skip_swa_and_below``) leaves it: the lock counts stay with the holders."""
    s = subject("python")
    apply(s, "admit", rid=1, tokens=[1, 2, 3, 4, 5])
    apply(s, "prefill", rid=1, n=10)
    apply(s, "finish", rid=1)
    apply(s, "admit", rid=2, tokens=[1, 2, 3, 4, 5, 6, 7, 8, 9])
    apply(s, "prefill", rid=2, n=10)
    node = s.cache.tree.tree_core.node_by_id(s.cache._reqs[2].lock.node)
    mamba = node.component_data[s.cache.MAMBA]
    assert mamba.lock_ref == 1
    apply(s, "decode", rid=2, n=3)
    assert "released" in apply(s, "release_window", rid=2)
    assert mamba.lock_ref == 0
    apply(s, "finish", rid=2)
    s.drain()
    s.check_quiescent()


@pytest.mark.parametrize("core", sorted(CORES))
def test_a_state_freed_behind_the_trees_back_breaks_conservation(core):
    s = subject(core)
    apply(s, "admit", rid=1, tokens=[1, 2, 3])
    apply(s, "prefill", rid=1, n=10)
    apply(s, "finish", rid=1)
    s.check()
    s.cache.mamba.free(s.cache.tree_mamba_slots()[:1])
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "conservation"


@pytest.mark.parametrize("method, setup, op, prop, says", [
    # the release's cleanup skipped: the aborted request's state is lost
    ("cleanup_after_caching_req", [("admit", {"rid": 1, "tokens": [1, 2, 3]})],
     ("abort", {"rid": 1}), "conservation", "lost"),
    # a Mamba lock never released: the node's count outlives its holder
    ("release_component_lock", [("insert", {"tokens": [1, 2, 3]}),
                                ("lock", {"hid": 1, "tokens": [1, 2, 3]})],
     ("unlock", {"hid": 1}), "ref-balance", "mamba ref is 1")])
def test_a_broken_mamba_component_is_caught(monkeypatch, method, setup, op, prop, says):
    """``MambaComponent.<method>`` made a no-op for this test (Python core): the same ops
    pass on the real class and fail on ``prop`` with it."""
    from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

    for broken in (False, True):
        s = subject("python")
        for name, args in setup:
            apply(s, name, **args)
        if not broken:
            apply(s, op[0], **op[1])
            continue
        monkeypatch.setattr(MambaComponent, method, lambda self, *a, **k: None)
        with pytest.raises(Violation) as exc:
            apply(s, op[0], **op[1])
        assert exc.value.prop == prop and says in str(exc.value)


@pytest.mark.parametrize("core", sorted(CORES))
def test_fuzz_clean(core):
    out = fuzz(SPEC, MAMBA, target=TARGETS[core], max_examples=30, seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 300


def test_python_and_rust_cores_agree_step_by_step():
    res = run_diff("hybrid-swa", "sglang", MAMBA, max_examples=30, seed=0,
                   against="sglang-rust")
    assert res.error is None, res.error
    assert not res.diverged, format_diff(res)
    assert res.steps > 300
