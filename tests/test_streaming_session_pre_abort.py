"""A streaming turn marked to finish before it runs (``pre_abort_turn``; SGLang
``Req.set_finish_with_abort``'s 1-token stub): the reference detaches it and keeps the
session's slot; fault S7 (SGLang #22273) lends it the slot and is caught on session-prefix."""

import pytest

from caches.faults.streaming_session import PreAbortRestoresSlot
from caches.pools import PagedAllocator, StatePool
from caches.streaming_session import SessionReq, StreamingSessionCache
from caches.subjects.base import Skip
from caches.subjects.streaming_session import StreamingSessionSubject
from tests.test_streaming_session_cache import run_ops

REGIMES = [{"page_size": 1, "pool_pages": 40}, {"page_size": 4, "pool_pages": 10}]


def saved_session(cls=StreamingSessionCache, ps=1, pages=10, tokens=(0, 1, 2, 0, 1)):
    s = StreamingSessionSubject(cls, page_size=ps, pool_pages=pages)
    s.open_session(1)
    s.turn(1, list(tokens))
    s.finish_turn(1)
    return s


@pytest.mark.parametrize("regime", REGIMES, ids=["ps1", "ps4"])
def test_pre_aborted_turn_leaves_the_slot_and_the_next_turn_resumes_it(regime):
    s = saved_session(ps=regime["page_size"], pages=regime["pool_pages"])
    before = s._slot_record(1)
    free = s.pool.available_size()
    out = s.pre_abort_turn(1)
    s.check()
    assert "slot kept" in out and "aborted after 1/1" in out, out
    assert s._slot_record(1) == before
    assert s.pool.available_size() == free  # the stub's page came back
    assert s.sessions[1].idle and s.sessions[1].committed == before[1]
    assert s.turn(1, [2]).startswith(f"resumed slot at {before[1]}")
    s.check()
    s.drain()
    s.check_quiescent()


def test_the_reference_detaches_the_stub_only_when_the_session_holds_a_slot():
    c = StreamingSessionCache(PagedAllocator(16, 1), 1, req_pool=StatePool(4))
    stub = SessionReq(-101, [0], session_id=1, to_finish=True)
    assert c.try_match_prefix(stub, []) is None and stub.session_id == 1  # no slot: kept
    s = saved_session()
    stub = SessionReq(-101, [0], session_id=1, to_finish=True)
    assert s.cache.try_match_prefix(stub, []) is None
    assert stub.session_id is None  # detached: a plain request now
    turn = SessionReq(1, list(s.sessions[1].history) + [2], session_id=1)
    assert s.cache.find_active_slot(turn) is s.cache.slots[1]  # the next turn is lent it


def test_a_session_without_a_slot_has_no_pre_abort_to_check():
    s = StreamingSessionSubject(page_size=1, pool_pages=10)
    s.open_session(1)
    with pytest.raises(Skip):
        s.pre_abort_turn(1)


class _ReleasesForStub(StreamingSessionCache):
    """A release that drops the slot for a pre-aborted turn ("abort = wipe KV, keep
    tokens"): allowed -- the next turn re-prefills, nothing is lost or overwritten."""

    def find_active_slot(self, req):
        if getattr(req, "to_finish", False) and req.session_id in self.slots:
            self.release_session(req.session_id)
            req.session_id = None
            return None
        return super().find_active_slot(req)


def test_a_release_that_drops_the_slot_for_the_stub_is_accepted():
    s = saved_session(_ReleasesForStub)
    out = s.pre_abort_turn(1)
    s.check()
    assert "slot released" in out and s.sessions[1].committed is None
    assert s.turn(1, [2]).startswith("first turn")
    s.check()
    s.drain()
    s.check_quiescent()


S7_TRACE = [("open_session", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0]}),
            ("finish_turn", {"sid": 1}), ("pre_abort_turn", {"sid": 1})]


@pytest.mark.parametrize("regime", REGIMES, ids=["ps1", "ps4"])
def test_s7_is_caught_on_session_prefix_at_the_pre_abort(regime):
    """ps1: the slot protects a tree prefix, the append-only assert fires on the lent slot;
    ps4: a one-token prompt protects nothing (P = 0), the match frees the slot's KV from 0
    and returns it."""
    _, clean = run_ops(S7_TRACE, **regime)
    assert clean is None, clean
    _, v = run_ops(S7_TRACE, "S7", **regime)
    assert v is not None and v.prop == "session-prefix" and v.step == 4, v
    how = "append-only assert fired" if regime["page_size"] == 1 else "match returned the slot"
    assert how in v.message and "#22273" in v.message


def test_s7_would_overwrite_the_slot_if_the_driver_did_not_stop_it():
    """What the check guards: with the fault the stub is lent the row of the saved slot, at
    prefix 0 (the driver reports before the stub's prefill writes there)."""
    s = saved_session(PreAbortRestoresSlot, ps=4, pages=10, tokens=(0,))
    stub = SessionReq(-101, [0], session_id=1, to_finish=True)
    m = s.cache.try_match_prefix(stub, [])
    assert m is not None and m.prefix_len == 0 and stub.row == s.sessions[1].row
    assert stub.session_id == 1  # still the session's: its abort would release the slot
