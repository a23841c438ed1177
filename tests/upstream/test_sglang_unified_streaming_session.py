"""``--target sglang`` / ``--target sglang-rust`` for streaming-session on SGLang 0.5.23:
``UnifiedRadixCache``'s own ``StreamingSession`` over the Python and the Rust tree core, driven
the way 0.5.23's scheduler does (``caches/adapters/sglang/unified_streaming_session.py``).

Run with the default upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream/test_sglang_unified_streaming_session.py``.
Where sglang is not importable, or another release is installed, the module skips, saying why.
"""

import dataclasses
from pathlib import Path

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.23")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from caches.adapters.sglang.patching import patched_subclass  # noqa: E402
from caches.adapters.sglang.streaming_faults import (UNIFIED_FAULTS,  # noqa: E402
                                                     UNIFIED_GUARDED, UNIFIED_NOT_INJECTABLE)
from caches.adapters.sglang.unified_streaming_session import make_subject  # noqa: E402
from caches.faults import get_fault  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines.diff import format_diff, run_diff  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.replay import replay  # noqa: E402
from state_machines.streaming_session import SPEC  # noqa: E402
from state_machines.targets import get_target  # noqa: E402
from state_machines.trace import load_trace  # noqa: E402
from tests.harness import assert_caught_on_upstream, logged_evict_for_alloc  # noqa: E402

FINDINGS = Path(__file__).resolve().parents[1] / "upstream_findings"
F1 = FINDINGS / "sglang-0.5.23-streaming-session-F1-retract-twice-detaches.json"
F1_0512 = FINDINGS / "sglang-streaming-session-F1-retract-twice-detaches.json"
REGIMES = [SPEC.check_params(r) for r in SPEC.regimes]
IDS = [f"ps{r['page_size']}" for r in REGIMES]
CORES = {"sglang": ("python", "UnifiedTreeCore"), "sglang-rust": ("rust", "RustUnifiedTreeCore")}


def _apply(s):
    return lambda name, **args: SPEC.ops.apply(s, Op(name, args))


def test_both_cores_drive_the_caches_own_streaming_session():
    assert loader.load().version == "0.5.23"
    for target, (_, core) in CORES.items():
        s = get_target(target).build("streaming-session", REGIMES[0])
        assert type(s.cache.tree).__name__ == "UnifiedRadixCache"
        assert type(s.cache.tree.tree_core).__name__ == core
        assert s.cache.session is s.cache.tree.session
        assert type(s.cache.session).__name__ == "StreamingSession"


# -- clean runs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("target", sorted(CORES))
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_fuzz_clean(target, params):
    out = fuzz(SPEC, params, target=target, max_examples=60, seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 1000
    for name in ("slot-resumed", "tail-freed", "retract-retry", "abort-with-slot",
                 "inflight-verify-at-finish", "pre-abort-detached"):
        assert out.reached.get(name), f"the machine never reached {name} on {target}"


@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_session_turn_and_a_plain_request_are_admitted_in_one_schedule(core):
    """One ``get_new_batch_prefill`` pass over the real cache: s1's waiting turn borrows its
    slot's record (resumed at C), r5 matches the tree; both are prefilled and decode a step."""
    s = make_subject({"page_size": 1, "pool_pages": 40, "req_rows": 4}, core=core)
    apply, ss = _apply(s), s.cache.session
    apply("open_session", sid=1)
    apply("turn", sid=1, tokens=[0, 1, 2])
    apply("finish_turn", sid=1)
    apply("enqueue_turn", sid=1, tokens=[1, 1], max_new=1)
    apply("enqueue", rid=5, tokens=[0, 1, 2, 2], max_new=1)
    out = apply("schedule", n=3)
    assert out.startswith("admitted s1's turn, r5 of 2 waiting"), out
    turn = s.sessions[1].turn
    assert ss.slots[1].kv is s.cache._turns[1].kv  # the turn borrows the slot's record
    assert turn.output == 1 and s.requests[5].output == 1 and not s.waiting
    s.check()
    apply("finish_turn", sid=1)
    apply("finish", rid=5)
    s.check()
    s.drain()
    s.check_quiescent()


@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_refused_turn_keeps_its_req_for_the_next_pass(core):
    """Pool of 12: the slot's 3 tree tokens are locked and r5 holds 5, so s1's turn (extend 5
    + 1 decode + 1 page = 7 against 4 free) is refused; once r5 finished (its 5 tokens
    evictable) the next pass admits the same ``Req``, which borrows the slot record again."""
    s = make_subject({"page_size": 1, "pool_pages": 12, "req_rows": 4}, core=core)
    apply = _apply(s)
    apply("open_session", sid=1)
    apply("turn", sid=1, tokens=[0, 1, 2])
    apply("finish_turn", sid=1)
    apply("admit", rid=5, tokens=[2, 2, 2, 2, 2])
    apply("enqueue_turn", sid=1, tokens=[1, 1, 1, 1], max_new=1)
    assert apply("schedule", n=3) == "nothing admitted (no budget)"
    refused = s.cache._turns[1]
    s.check()
    apply("finish", rid=5)
    assert apply("schedule", n=3).startswith("admitted s1's turn of 1 waiting")
    assert s.cache._turns[1] is refused and refused.kv is s.cache.session.slots[1].kv
    s.check()
    s.drain()
    s.check_quiescent()


@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_python_and_rust_cores_agree_step_by_step(params):
    res = run_diff("streaming-session", "sglang", params, max_examples=40, seed=0,
                   against="sglang-rust")
    assert res.error is None, res.error
    assert not res.diverged, format_diff(res)
    assert res.steps > 500


@pytest.mark.parametrize("core", ["python", "rust"])
def test_request_paths_pin_upstream_behaviour(core):
    """page_size 4: the first turn's row is taken by the session (record + lock) and its
    prompt published; the finish after a speculative step saves C = the finished length (the
    in-flight verify wrote the bonus position); the next turn borrows the record at
    min(C, T); a retract-retry resumes at C - 1; an abort hands the record back and the turn's
    KV goes into the tree (checkpoint=True); the close gives everything back."""
    s = make_subject({"page_size": 4, "pool_pages": 10, "req_rows": 6}, core=core)
    apply, ss = _apply(s), s.cache.session
    apply("open_session", sid=1)
    assert apply("turn", sid=1, tokens=[0, 1, 2, 0, 1]) == \
        "first turn: tree hit 0, computed 5 of 5 tokens"
    slot = ss.slots[1]
    assert slot.lock is not None and slot.kv.cache_protected_len == 4  # published, locked
    assert (s.cache.evictable_size_, s.cache.protected_size_) == (0, 4)
    assert apply("spec_decode", sid=1, draft=2, accepted=0) == "committed 6, allocated 8"
    assert apply("finish_turn", sid=1) == "saved slot: committed 7 of 7 tokens"
    assert (slot.kv.kv_committed_len, slot.kv.kv_allocated_len) == (7, 7)  # overshoot trimmed
    assert apply("turn", sid=1, tokens=[2]) == \
        "resumed slot at 7 (protected 4), computed 1 of 8 tokens"
    assert apply("retract", sid=1) == ("retracted with 9 committed; retry: resumed slot at 8 "
                                       "(protected 4), computed 1 of 9 tokens")
    apply("finish_turn", sid=1)
    s.check()
    assert apply("turn", sid=1, tokens=[1]) == \
        "resumed slot at 9 (protected 4), computed 2 of 11 tokens"
    assert apply("abort_turn", sid=1).startswith("aborted")
    assert 1 not in ss.slots and s.cache.protected_size_ == 0
    assert s.cache.evictable_size_ == 8  # the aborted turn's two full pages went to the tree
    s.check()
    apply("release_session", sid=1)
    assert len(s.cache.req_to_token_pool.free_slots) == 6
    s.quiesce()


@pytest.mark.parametrize("core", ["python", "rust"])
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_a_pre_aborted_turn_is_detached_and_the_slot_kept(core, params):
    """0.5.23's path for a turn marked to finish before it runs: the real
    ``Req.set_finish_with_abort`` stub is matched through ``StreamingSession.try_match_prefix``,
    whose ``find_active_slot`` detaches it (``req.session = None``); it runs as a plain request
    and the slot's record is untouched, so the next turn resumes it."""
    s = make_subject(params, core=core)
    apply = _apply(s)
    apply("open_session", sid=1)
    apply("turn", sid=1, tokens=[0, 1, 2, 0, 1])
    apply("finish_turn", sid=1)
    kv = s.cache.session.slots[1].kv
    before = (kv.req_pool_idx, kv.kv_committed_len, kv.kv_allocated_len,
              kv.cache_protected_len, list(s.cache.req_to_token_pool.req_to_token[
                  kv.req_pool_idx, :kv.kv_allocated_len].tolist()))
    seen = []
    real = s.cache.session.find_active_slot
    s.cache.session.find_active_slot = lambda req: (seen.append(req), real(req))[1]
    assert "slot kept" in apply("pre_abort_turn", sid=1)
    s.check()
    stub = seen[0]
    assert stub.to_finish is not None and list(stub.origin_input_ids) == [0]
    assert stub.session is None  # detached by the real find_active_slot
    kv = s.cache.session.slots[1].kv
    assert before == (kv.req_pool_idx, kv.kv_committed_len, kv.kv_allocated_len,
                      kv.cache_protected_len, list(s.cache.req_to_token_pool.req_to_token[
                          kv.req_pool_idx, :kv.kv_allocated_len].tolist()))
    assert apply("turn", sid=1, tokens=[2]).startswith(f"resumed slot at {before[1]}")
    s.check()
    s.quiesce()


def test_a_lost_slot_unlock_is_caught():
    """The checks can fail: a close that never returns the slot's tree lock leaves the
    session's prompt locked -- ref-balance on the Python core, quiescence on the Rust one."""
    for core, prop in (("python", "ref-balance"), ("rust", "quiescence")):
        s = make_subject(REGIMES[0], core=core)
        apply = _apply(s)
        apply("open_session", sid=1)
        apply("turn", sid=1, tokens=[0, 1])
        apply("finish_turn", sid=1)
        s.cache.tree.unlock = lambda lock: None
        apply("release_session", sid=1)
        with pytest.raises(Violation) as exc:
            s.check()
            s.quiesce()
        assert exc.value.prop == prop


# -- faults on the real class --------------------------------------------------------------------
@pytest.mark.parametrize("fid", sorted(UNIFIED_FAULTS))
def test_fault_on_real_class_caught_on_its_property(fid, tmp_path):
    params = SPEC.check_params({**SPEC.regimes[0], **get_fault(fid).params})
    assert_caught_on_upstream(SPEC, params, fid, tmp_path, target="sglang")


@pytest.mark.parametrize("fid", ["S2", "S7"])
def test_fault_on_the_rust_core_session_too(fid, tmp_path):
    """The faults live in ``StreamingSession`` (Python, over either core)."""
    params = SPEC.check_params({**SPEC.regimes[0], **get_fault(fid).params})
    assert_caught_on_upstream(SPEC, params, fid, tmp_path, target="sglang-rust")


@pytest.mark.parametrize("fid", sorted(UNIFIED_NOT_INJECTABLE))
def test_faults_without_a_0_5_23_form_say_why(fid):
    with pytest.raises(KeyError, match="no upstream form"):
        make_subject(SPEC.check_params({}), fault=fid)


def test_s3_is_refused_by_the_paged_allocators_alignment_guard():
    """S3's patch applies to 0.5.23's ``_free_kv_aligned``, but the unaligned free it makes
    is refused by the allocator before anything is freed: the retract that would free a page
    still holding committed KV raises the upstream assertion instead."""
    s = make_subject({"page_size": 4, "pool_pages": 10, "req_rows": 6})
    cls = patched_subclass(loader.load_streaming_session().StreamingSession,
                           UNIFIED_GUARDED["S3"])
    s.cache.tree.session = s.cache.session = cls(s.cache.tree)
    apply = _apply(s)
    apply("open_session", sid=1)
    apply("turn", sid=1, tokens=[0])
    with pytest.raises(AssertionError, match="is not page-aligned"):
        apply("retract", sid=1)


# -- the known upstream finding ------------------------------------------------------------------
@pytest.mark.parametrize("core", ["python", "rust"])
def test_known_finding_F1_still_present_on_0_5_23(core):
    """A request retracted twice is detached from its streaming session on 0.5.23 too.  This
    test FAILS when a release stops that: then retire the finding
    (tests/upstream_findings/README.md)."""
    for path in (F1, F1_0512):  # the 0.5.23 trace (page 1) and the 0.5.12.post1 one (page 4)
        trace = load_trace(path)
        s = make_subject(trace.params, core=core, skip_known_findings=False)
        with pytest.raises(Violation) as exc:
            for op in trace.ops:
                SPEC.ops.apply(s, op)
                s.check()
        assert exc.value.prop == trace.violation["property"] == "session-prefix"
        assert "no longer attached to the session" in exc.value.message
        req = s.cache._turns[1]  # the mechanism, on SGLang's own objects
        assert req.session is None and req.retraction_count == 2
        assert s.cache.session.slots[1].kv.holds_kv


def test_known_finding_is_declined_by_default():
    result = replay(load_trace(F1), known_findings="decline")  # as a fuzz run would
    assert result.ok
    last = result.steps[-1].result
    assert last.startswith("skipped: ") and "sglang-streaming-session-F1" in last


# -- eviction policy (invariants/policy.py): the radix subject's checks on the session's tree ----
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_policy_checks_see_every_victim_and_a_wrong_key_fails(monkeypatch, params):
    """Python core (the tree and Full walk of ``unified_radix.py``, whose seam the subject
    shares): every eviction pass has its victims recorded, adding up to what upstream reports
    evicting, a clean run passes every policy check, and a declared MRU key fails on
    ``victim``."""
    from caches.adapters.sglang.unified_streaming_session import UnifiedStreamingSessionSubject
    from tests.upstream.test_sglang_unified_radix import _victims_recorded

    log = _victims_recorded(monkeypatch, UnifiedStreamingSessionSubject)
    out = fuzz(SPEC, params, target="sglang", max_examples=60, seed=0)
    assert out.error is None and not out.failed, out.trace and out.trace.violation
    assert log["passes"] > 20 and log["victims"] > 40, log
    monkeypatch.setattr(UnifiedStreamingSessionSubject, "policy", dataclasses.replace(  # MRU: not upstream's
        UnifiedStreamingSessionSubject.policy, key=lambda n: (-n.extra["time"],)))
    out = fuzz(SPEC, params, target="sglang", max_examples=60, seed=0)
    assert out.failed and out.prop == "victim", out.trace and out.trace.violation


def test_an_upstream_on_the_mru_strategy_is_caught_on_victim(monkeypatch):
    """Upstream patched to evict the most recently used leaf first (``LRUStrategy`` answering
    as SGLang's own ``MRUStrategy``, the Full heap's key): caught on ``victim``."""
    from sglang.srt.mem_cache import evict_policy

    monkeypatch.setattr(evict_policy.LRUStrategy, "get_priority",
                        evict_policy.MRUStrategy.get_priority)
    out = fuzz(SPEC, REGIMES[0], target="sglang", max_examples=60, seed=0)
    assert out.error is None, out.error
    assert out.failed and out.prop == "victim", out.trace and out.trace.violation


# -- allocation: 0.5.23's scheduler evicts the shortfall, through evict_for_alloc ---------------
def _turn_on_a_nearly_full_pool(params):
    """Plain requests leave leaves of ``L`` tokens (2 on page 1, a page when paged) in the
    tree until ``L`` tokens are free, then a first turn of 4 tokens is scheduled: the
    scheduler's request is 4 (+ a page when paged), ``L`` short.  Returns (subject, L, the
    ``(asked, evicted)`` of each upstream ``evict_for_alloc``)."""
    s = make_subject(params, core="python")
    apply, ps = _apply(s), params["page_size"]
    leaf = 2 if ps == 1 else ps
    for rid in range(params["pool_pages"] * ps // leaf - 1):
        apply("admit", rid=rid, tokens=[100 + rid] * leaf)
        apply("finish", rid=rid)
        s.check()
    assert s.cache.allocator.available_size() == leaf
    results = logged_evict_for_alloc(s.cache.tree)
    apply("open_session", sid=1)
    assert apply("turn", sid=1, tokens=[7] * 4).startswith("first turn")
    return s, leaf, results


@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_a_turn_on_a_nearly_full_pool_evicts_only_the_shortfall(params):
    """0.5.23 (``evict_from_tree_cache`` -> ``evict_to_free_tokens`` -> ``evict_for_alloc``)
    evicts the shortfall of the turn's request, one leaf, where 0.5.12 evicted the whole
    request (two); the allocation is checked against that need and passes."""
    s, leaf, results = _turn_on_a_nearly_full_pool(params)
    assert results == [(leaf, leaf)], results
    allocs = [ev for ev in s._policy_events if ev[0] == "alloc"]
    assert [ev[1][1] for ev in allocs] == [leaf] and len(allocs[0][3]) == 1, allocs
    s.check()


@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_a_turn_evicting_the_whole_request_is_over_eviction(monkeypatch, params):
    """The 0.5.12.post1 allocation (``SessionDriving._alloc_pages``: all of ``extend + page``
    through ``evict`` once short) on 0.5.23 is caught on ``over-eviction``."""
    from caches.adapters.sglang.streaming_session import SessionDriving
    from caches.adapters.sglang.unified_streaming_session import UnifiedStreamingSessionCache

    monkeypatch.setattr(UnifiedStreamingSessionCache, "_alloc_pages",
                        SessionDriving._alloc_pages)
    s, leaf, results = _turn_on_a_nearly_full_pool(params)
    assert results == []  # (the old path never calls evict_for_alloc)
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "over-eviction", exc.value
