"""``--target sglang``: SGLang's real StreamingSession (over its RadixCache, allocators and
ReqToTokenPool) under the streaming-session machine.

Run with the upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream``.  Anywhere sglang is not importable
(the core install) the whole module skips, saying why.
"""

from pathlib import Path

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.12.post1")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from caches.adapters.sglang.streaming_faults import (NOT_INJECTABLE,  # noqa: E402
                                                     UPSTREAM_FAULTS, upstream_fault)
from caches.adapters.sglang.streaming_session import make_subject  # noqa: E402
from caches.faults import get_fault  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines.diff import format_diff, run_diff  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.replay import replay  # noqa: E402
from state_machines.streaming_session import SPEC  # noqa: E402
from state_machines.trace import load_trace  # noqa: E402
from tests.harness import assert_caught_on_upstream  # noqa: E402

FINDINGS = Path(__file__).resolve().parents[1] / "upstream_findings"
F1 = FINDINGS / "sglang-streaming-session-F1-retract-twice-detaches.json"
REGIMES = [SPEC.check_params(r) for r in SPEC.regimes]
IDS = [f"ps{r['page_size']}" for r in REGIMES]


def _apply(s):
    return lambda name, **args: SPEC.ops.apply(s, Op(name, args))


# -- clean runs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_fuzz_clean_under_ci_profile(params):
    out = fuzz(SPEC, params, target="sglang")
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 1000
    for name in ("slot-resumed", "tail-freed", "retract-retry", "abort-with-slot"):
        assert out.reached.get(name), f"the machine never reached {name} on SGLang's class"


def test_request_paths_pin_upstream_behaviour():
    """page_size 4: a first turn puts its aligned prompt in the tree and keeps the lock; a
    speculative step continues in the partial page; the finish trims to the finished length;
    the next turn resumes at min(C, T); a retract-retry frees the re-written page and takes it
    again; the close unlocks the prompt and frees the slot's pages and row."""
    s = make_subject({"page_size": 4, "pool_pages": 10, "req_rows": 6})
    apply, ss = _apply(s), s.cache.session
    row = s.cache.req_to_token_pool.req_to_token
    apply("open_session", sid=1)
    assert apply("turn", sid=1, tokens=[0, 1, 2, 0, 1]) == \
        "first turn: tree hit 0, computed 5 of 5 tokens"
    assert s.cache.allocator.free_pages.tolist() == list(range(3, 11))
    assert (s.cache.evictable_size_, s.cache.protected_size_) == (0, 4)
    assert apply("spec_decode", sid=1, draft=2, accepted=0) == "committed 6, allocated 8"
    assert row[1, :8].tolist() == [4, 5, 6, 7, 8, 9, 10, 11]  # no new page: continuation
    apply("finish_turn", sid=1)
    slot = ss.slots[1]
    assert (slot.req_pool_idx, slot.kv_committed_len, slot.kv_allocated_len,
            slot.cache_protected_len) == (1, 6, 7, 4)
    assert slot.last_node.lock_ref == 1 and s.cache.req_to_token_pool.free_slots == [2, 3, 4, 5, 6]
    assert apply("turn", sid=1, tokens=[2]) == \
        "resumed slot at 6 (protected 4), computed 2 of 8 tokens"
    assert (slot.kv_committed_len, slot.kv_allocated_len) == (6, 6)  # _free_tail clamps
    assert apply("retract", sid=1) == ("retracted with 9 committed; retry: resumed slot at 8 "
                                       "(protected 4), computed 1 of 9 tokens")
    assert (slot.kv_committed_len, slot.kv_allocated_len) == (8, 8)
    assert row[1, 8].item() == 12 and s.cache.allocator.free_pages.tolist() == list(range(4, 11))
    apply("finish_turn", sid=1)
    assert (slot.kv_committed_len, slot.kv_allocated_len) == (9, 9)
    s.check()
    apply("release_session", sid=1)
    assert 1 not in ss.slots and s.cache.req_to_token_pool.free_slots == [2, 3, 4, 5, 6, 1]
    assert (s.cache.evictable_size_, s.cache.protected_size_) == (4, 0)
    assert s.cache.allocator.free_pages.tolist() == list(range(2, 11))
    s.quiesce()


def test_plain_requests_share_the_session_prompt():
    """A plain request hits the session's first-turn prompt in the tree (lock stacks), takes
    its own request-pool row, and gives it back at its finish."""
    s = make_subject(REGIMES[0])
    apply = _apply(s)
    apply("open_session", sid=1)
    apply("turn", sid=1, tokens=[0, 1, 2])
    apply("finish_turn", sid=1)
    assert apply("admit", rid=7, tokens=[0, 1, 2, 2]) == "hit 3 of 4 tokens, allocated 1, prefilled"
    node = s.cache.session.slots[1].last_node
    assert node.lock_ref == 2 and s.cache.req_to_token_pool.available_size() == 4
    apply("finish", rid=7)
    assert node.lock_ref == 1 and s.cache.req_to_token_pool.available_size() == 5
    s.check()
    s.quiesce()


# -- faults on the real class --------------------------------------------------------------------
@pytest.mark.parametrize("fid", sorted(UPSTREAM_FAULTS))
def test_fault_on_real_class_caught_on_its_property(fid, tmp_path):
    params = SPEC.check_params({**SPEC.regimes[0], **get_fault(fid).params})
    assert_caught_on_upstream(SPEC, params, fid, tmp_path)


def test_batch_admission_is_declined_with_the_reason():
    s = make_subject(SPEC.check_params({}))
    for name, args in (("enqueue_turn", {"sid": 1, "tokens": [0], "max_new": 1}),
                       ("enqueue", {"rid": 1, "tokens": [0], "max_new": 1}),
                       ("schedule", {"n": 1})):
        out = SPEC.ops.apply(s, Op(name, args))
        assert "not driven" in out and "sync_row" in out, out


@pytest.mark.parametrize("fid", sorted(NOT_INJECTABLE))
def test_faults_without_an_upstream_form_say_why(fid):
    with pytest.raises(KeyError, match="no upstream form"):
        make_subject(SPEC.check_params({}), fault=fid)


def test_fault_patch_leaves_the_real_class_alone():
    real = loader.load_streaming_session().StreamingSession
    cls = upstream_fault("S1")
    assert cls.__mro__[1] is real and cls._free_tail is not real._free_tail


# -- differential mode ---------------------------------------------------------------------------
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_diff_reference_and_sglang_agree(params):
    res = run_diff("streaming-session", "sglang", params, max_examples=60)
    assert res.error is None, res.error
    assert not res.diverged, format_diff(res)
    assert res.steps > 500


# -- the known upstream finding ------------------------------------------------------------------
def test_known_finding_F1_still_present():
    """A request retracted twice is detached from its streaming session.  This test FAILS
    when a release stops that: then retire the finding (tests/upstream_findings/README.md)."""
    trace = load_trace(F1)
    for params in REGIMES:
        s = make_subject(params, skip_known_findings=False)
        with pytest.raises(Violation) as exc:
            for op in trace.ops:
                SPEC.ops.apply(s, op)
                s.check()
        assert exc.value.prop == trace.violation["property"] == "session-prefix"
        assert "no longer attached to the session" in exc.value.message
        # the mechanism, on SGLang's own objects: the second save ran Session.finish_req with
        # the request itself as the previous history request
        req = s.cache._turns[1]
        assert req.session is None and req.retraction_count == 2
        assert 1 in s.cache.session.slots


def test_known_finding_is_declined_by_default():
    result = replay(load_trace(F1), known_findings="decline")  # as a fuzz run would
    assert result.ok
    last = result.steps[-1].result
    assert last.startswith("skipped: ") and "sglang-streaming-session-F1" in last
