"""``--target sglang`` / ``--target sglang-rust`` for hybrid-swa on SGLang 0.5.23:
``UnifiedRadixCache`` with the Full and SWA components over the real ``SWAKVPool`` /
``SWATokenToKVPoolAllocator``, on the Python and the Rust tree core
(``caches/adapters/sglang/unified_swa.py``).

Run with the default upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream/test_sglang_unified_swa.py``.  Where
sglang is not importable, or another release is installed, the module skips, saying why.
"""

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.23")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

import torch  # noqa: E402

from caches.adapters.sglang.unified_swa import make_subject  # noqa: E402
from caches.target import FaultNotInjectable  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines.diff import format_diff, run_diff  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.hybrid_swa import SPEC  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.targets import get_target  # noqa: E402

CORES = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}
TARGETS = {"python": "sglang", "rust": "sglang-rust"}
# one regime of the variant per page size, and a roomy one for the hand-written scenarios
PARAMS = [SPEC.check_params(r) for r in SPEC.regimes]
ROOMY = SPEC.check_params({"page_size": 1, "pool_pages": 32, "swa_pages": 16, "window": 2})


def subject(core="python", fault=None, **params):
    return make_subject(SPEC.check_params({**ROOMY, **params}), core=core, fault=fault)


def apply(s, name, **args):
    out = SPEC.ops.apply(s, Op(name, args))
    s.check()
    return out


def hit(s, tokens) -> int:
    return int(apply(s, "match", tokens=tokens).split()[1])


def free_windows(s) -> int:
    return len(s.cache.window_free_pages())


def assert_revert_caught(monkeypatch, cls, method, old, new, pr, run, prop):
    """``run()`` passes on the real class, and with SGLang PR ``pr``'s fix reverted in
    ``cls.method`` (``old`` -> ``new``, for this test only) fails on ``prop``."""
    from caches.adapters.sglang.patching import Patch, patch_method

    run()
    monkeypatch.setattr(cls, method, patch_method(cls, method, (Patch(method, old, new),), pr))
    with pytest.raises(Violation) as exc:
        run()
    assert exc.value.prop == prop


def test_both_cores_build_full_and_swa_over_the_real_pools():
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    sg = loader.load()
    for core, name in CORES.items():
        s = get_target(TARGETS[core]).build("hybrid-swa", PARAMS[0])
        assert type(s.cache.tree).__name__ == "UnifiedRadixCache"
        assert type(s.cache.tree.tree_core).__name__ == name
        assert s.cache.tree.tree_components == (sg.ComponentType.FULL, sg.ComponentType.SWA)
        assert isinstance(s.cache.allocator, SWATokenToKVPoolAllocator)
        assert isinstance(s.cache.allocator.get_kvcache(), SWAKVPool)
        assert s.cache.tree.sliding_window_size == PARAMS[0]["window"]
        assert free_windows(s) == PARAMS[0]["swa_pages"]


def test_the_older_releases_refuse_the_variant_saying_why():
    from caches.adapters.sglang import versions

    why = versions.variant_unsupported("0.5.12.post1", "sglang", "hybrid-swa")
    assert "no unified SWA component" in why and "SWARadixCache" in why
    assert versions.variant_unsupported("0.5.23", "sglang-rust", "hybrid-swa") is None


@pytest.mark.parametrize("core", sorted(CORES))
def test_a_request_slides_its_window_leaves_tombstones_and_a_later_insert_recovers_them(core):
    """Prefill in chunks, decode past the window (upstream's ``maybe_evict_swa`` frees the
    out-of-window slots), finish; ``evict_swa`` tombstones the prompt's nodes (the full KV
    stays, the window KV goes: a match can no longer end there), and an insert of the prompt
    recovers them -- every step checked."""
    s = subject(core)
    prompt = [1, 2, 1, 2, 1, 2]
    apply(s, "admit", rid=1, tokens=prompt)
    apply(s, "prefill", rid=1, n=4)
    apply(s, "prefill", rid=1, n=2)
    before = free_windows(s)
    apply(s, "decode", rid=1, n=6)
    req = s.requests[1]
    assert req.swa_evicted_seqlen > 0, "no out-of-window slot was released"
    assert s.frontiers[1] > 0
    assert free_windows(s) > before - 6, "the decode steps freed no window slot"
    seq = list(req.tokens)
    apply(s, "finish", rid=1)
    assert hit(s, seq) >= len(seq) - 1  # the tail's window is live (the last page may go)
    freed = int(apply(s, "evict_swa", n=100).split()[1])
    assert freed > 0
    assert s.cache.swa_evictable_size_ == 0
    assert hit(s, seq) == 0, "a hit over tombstones"
    if core == "python":
        nodes = s.window_state().nodes.values()
        assert any(n.window is None and n.full for n in nodes), "no tombstone left"
    apply(s, "insert", tokens=prompt)
    assert hit(s, prompt + [0]) == len(prompt), "the insert recovered nothing"
    if core == "python":
        assert s.reached_counts["tombstone-recovered"] >= 1
    apply(s, "quiesce")


@pytest.mark.parametrize("core", sorted(CORES))
def test_the_sentinel_page_in_the_free_list_is_caught(core):
    """SGLang's window page 0 is the padding sink: once it is on the window allocator's free
    list, ``sentinel`` (white and black box, the check reads the real free list)."""
    s = subject(core)
    apply(s, "admit", rid=1, tokens=[1, 2, 3])
    s.cache.allocator.swa_attn_allocator.free(torch.tensor([0], dtype=torch.int64))
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "sentinel"


@pytest.mark.parametrize("core, prop", [("python", "tombstone"), ("rust", "size-accounting")])
def test_window_kv_freed_under_the_tree_is_caught(core, prop):
    """A cached node's window slots freed behind the tree's back (the map cleared, the node
    not tombstoned): white box, the node lists window slots its full slots no longer map;
    black box, the core's window counters exceed the live window slots the tree maps."""
    s = subject(core)
    apply(s, "insert", tokens=[1, 2, 3, 4])
    slots = s.cache.tree_slots()
    s.cache.allocator.free_swa(torch.tensor(slots[:2], dtype=torch.int64))
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == prop


@pytest.mark.parametrize("core", sorted(CORES))
def test_decode_frees_through_upstreams_own_gate(core):
    """The decode-time release is upstream's ``ScheduleBatch.maybe_evict_swa``: at
    ``SGLANG_SWA_EVICTION_INTERVAL`` 1 (the adapter's setting) the window slides; at its
    default, 128, nothing slides out of a short request (``_swa_eviction_trigger``), and the
    subject, which expects the release at every step past the window, reports
    ``window-release``."""
    def run(interval):
        s = subject(core)
        s.cache.eviction_interval = interval
        apply(s, "admit", rid=1, tokens=[1, 2, 3, 4])
        apply(s, "prefill", rid=1, n=4)
        apply(s, "decode", rid=1, n=6)
        return s.requests[1]

    assert run(1).swa_evicted_seqlen > 0
    with pytest.raises(Violation) as exc:
        run(128)
    assert exc.value.prop == "window-release"


@pytest.mark.parametrize("core", sorted(CORES))
def test_a_hit_ending_over_tombstoned_tokens_breaks_window_hit(core):
    """The match contract for a window: a hit whose last W tokens include a tombstone is a
    ``window-hit`` violation -- white box per node, black box (Rust core) per matched token
    through the full -> window map.  Upstream's own match never returns one (fuzz); here
    a match result is forged over the tombstoned prompt."""
    from caches.adapters.raw_radix import MatchResult

    s = subject(core)
    prompt = [1, 2, 3, 4, 5, 6]
    apply(s, "insert", tokens=prompt)
    apply(s, "evict_swa", n=100)
    if core == "python":
        core_ = s.cache.tree.tree_core
        leaf = next(iter(core_.root_node.children.values()))
        while leaf.children:
            leaf = next(iter(leaf.children.values()))
        last = s.cache.node(leaf.id)
    else:
        last = s.cache.root_node  # (the black-box spans read the slots only)
    forged = MatchResult(s.cache.tree_slots()[:len(prompt)], last)
    with pytest.raises(Violation) as exc:
        s._check_match(prompt, forged)
    assert exc.value.prop == "window-hit"


def test_release_window_is_upstreams_release_swa_prefix_lock():
    """``release_window`` releases the SWA part of the request's own lock once
    (``TreeLock.swa_released``); a lock whose window segment reached the root carries no SWA
    stamp and upstream releases nothing (the op is skipped)."""
    s = subject("python")
    apply(s, "insert", tokens=[1, 2, 3, 4])
    apply(s, "admit", rid=1, tokens=[1, 2, 3, 4, 5])
    apply(s, "prefill", rid=1, n=1)
    apply(s, "decode", rid=1, n=3)
    assert "released r1's window lock" in apply(s, "release_window", rid=1)
    assert s.cache._reqs[1].lock.swa_released
    assert apply(s, "release_window", rid=1).startswith("skipped")
    short = subject("python", window=8)
    apply(short, "insert", tokens=[1, 2])
    apply(short, "admit", rid=1, tokens=[1, 2, 3])
    apply(short, "prefill", rid=1, n=1)
    apply(short, "decode", rid=1, n=8)
    assert "no SWA stamp" in apply(short, "release_window", rid=1)
    assert not short.cache._reqs[1].lock.swa_released


@pytest.mark.parametrize("core", sorted(CORES))
@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"page{p['page_size']}")
def test_fuzz_clean(core, params):
    out = fuzz(SPEC, params, target=TARGETS[core], max_examples=30, seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 300


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"page{p['page_size']}")
def test_python_and_rust_cores_agree_step_by_step(params):
    res = run_diff("hybrid-swa", "sglang", params, max_examples=30, seed=0,
                   against="sglang-rust")
    assert res.error is None, res.error
    assert not res.diverged, format_diff(res)
    assert res.steps > 300


def test_the_rust_core_takes_no_fault():
    with pytest.raises(FaultNotInjectable, match="compiled"):
        subject("rust", fault="SW5")


def test_a_fault_without_an_upstream_form_says_so():
    with pytest.raises(FaultNotInjectable, match="no upstream form"):
        subject("python", fault="R4")


@pytest.mark.parametrize("fid", ["SW1", "SW2", "SW3", "SW4", "SW5", "SW6", "SW7", "SW8",
                                 "SW9", "SW10"])
def test_fault_in_the_real_classes_caught_on_its_property(fid, tmp_path):
    """The catalogued fault patched into 0.5.23's ``SWAComponent``, ``UnifiedRadixCache``
    (SW9) or ``free_swa_out_of_window_slots`` (through its two callers), Python core: caught
    on one of its catalogue properties, shrunk, replayed, and the same ops pass on the real
    class.  (SW1, ``_set_swa`` keeping the incoming ids' map entries, is seen by the stale-map
    check: the entries sit on full slots the recovery freed, ``check_stale_map``.)"""
    from tests.harness import assert_caught_on_upstream

    assert_caught_on_upstream(SPEC, PARAMS[0], fid, tmp_path, target="sglang")


def test_reverting_the_duplicate_free_split_frees_the_sentinel(monkeypatch):
    """SGLang PR #37481 reverted (``ci/engine-gate/reverts/sglang-37481-...patch``): an
    insert frees its duplicate slice with ``FreeDeviceKV`` both sides, also below the
    request's SWA cursor, whose map reads 0 -- the padding page goes to the free list.  Two
    requests with one prompt in flight, the first caches it, the second slides out of its
    window and finishes: ``sentinel``; the same ops pass on the real class."""
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    def run():
        s = subject("python")
        prompt = [1, 2, 3, 1, 2, 3]
        for rid in (1, 2):
            apply(s, "admit", rid=rid, tokens=prompt)
            apply(s, "prefill", rid=rid, n=6)
        apply(s, "finish", rid=1)
        apply(s, "decode", rid=2, n=6)
        assert s.requests[2].swa_evicted_seqlen > 0
        apply(s, "finish", rid=2)

    assert_revert_caught(
        monkeypatch, UnifiedTreeCore, "_insert_overlap_step",
        "            # Below the request's SWA eviction floor only FULL is still ours.\n"
        "            dup = value_slice[dup_start:consumed_from]\n",
        "            state.pending_actions.append(\n"
        "                FreeDeviceKV([value_slice[dup_start:consumed_from]])\n"
        "            )\n"
        "            dup = value_slice[0:0]  # kvcheck: PR #37481 reverted\n",
        "37481", run, "sentinel")


def test_reverting_the_full_only_free_of_a_recovered_tombstone_frees_the_sentinel(monkeypatch):
    """SGLang PR #36637 reverted (``ci/engine-gate/reverts/sglang-36637-...patch``): a
    tombstone healed by an insert (its Full unlocked) frees its old Full ids with
    ``FreeDeviceKV`` both sides again; their map reads 0 after the SWA eviction, and the
    segment free hands the padding page to the free list.  A cached prompt, ``evict_swa``
    tombstones it, the same prompt inserted again: ``sentinel``; the same ops pass on the real
    class."""
    from sglang.srt.mem_cache.unified_cache.components.swa import SWAComponent

    def run():
        s = subject("python")
        prompt = [1, 2, 3, 1, 2, 3]
        apply(s, "insert", tokens=prompt)
        apply(s, "match", tokens=prompt)
        apply(s, "insert", tokens=prompt + [4, 4])
        apply(s, "evict_swa", n=6)
        apply(s, "insert", tokens=prompt)
        apply(s, "quiesce")

    assert_revert_caught(
        monkeypatch, SWAComponent, "_recover_from_incoming",
        "        cache_actions.append(FreeDeviceKVFullOnly([old_full]))\n",
        "        from sglang.srt.mem_cache.unified_cache.cache_action import FreeDeviceKV\n"
        "\n"
        "        cache_actions.append(FreeDeviceKV([old_full]))  # kvcheck: #36637 reverted\n",
        "36637", run, "sentinel")
