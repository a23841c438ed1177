"""Unit tests of the streaming-session reference cache, its subject, and the session invariants."""

import pytest

from caches.faults.streaming_session import FreeTailUnaligned
from caches.pools import PagedAllocator, StatePool
from caches.streaming_session import (PrefixShrank, Rejected, SessionReq, SessionSlot,
                                      StreamingSessionCache, ceil_align)
from caches.subjects.streaming_session import StreamingSessionSubject
from invariants import Violation
from invariants.session import (check_append_only, check_session_accounting,
                                check_session_prefix)
from state_machines.ops import Op
from state_machines.run import Run
from state_machines.variants import get_variant

SPEC = get_variant("streaming-session")


def cache(ps=1, pages=16):
    return StreamingSessionCache(PagedAllocator(pages, ps), ps, req_pool=StatePool(4))


def run_ops(ops, fault=None, **params):
    """Apply ops (name, args) to a fresh run; returns (run, violation or None)."""
    run = Run(SPEC, SPEC.check_params({**SPEC.regimes[0], **params}), fault)
    try:
        for name, args in ops:
            run.step(Op(name, args))
        run.step(Op("quiesce", {}))
    except Violation as v:
        return run, v
    return run, None


# -- pure helpers and the cache -------------------------------------------------------------
def test_ceil_align():
    assert [ceil_align(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 4, 4, 8, 8]
    assert ceil_align(7, 1) == 7


def test_alloc_extend_continues_the_partial_page():
    c = cache(ps=4, pages=8)
    row = []
    assert c.alloc_extend(row, 5)  # one whole page + one slot of a second page
    free_before = len(c.allocator.free_pages)
    assert c.alloc_extend(row, 8)  # positions 5..7 continue in row[4]'s page: no allocation
    assert len(c.allocator.free_pages) == free_before
    assert all(row[i] % 4 == i % 4 for i in range(8))
    assert len({r // 4 for r in row[4:8]}) == 1
    assert c.alloc_extend(row, 9)  # position 8 starts a fresh page
    assert len(c.allocator.free_pages) == free_before - 1


def test_alloc_extend_out_of_memory_changes_nothing():
    c = cache(ps=1, pages=3)
    row = []
    assert not c.alloc_extend(row, 4)
    assert row == [] and len(c.allocator.free_pages) == 3


def test_free_tail_keeps_the_partial_page():
    c = cache(ps=4, pages=8)
    row_id = c.alloc_row()
    row = c.req_to_token[row_id]
    c.alloc_extend(row, 11)  # pages for positions 0-3, 4-7, 8-10
    slot = SessionSlot(row=row_id, kv_committed_len=11, kv_allocated_len=11)
    c.slots[1] = slot
    req = SessionReq(1, list(range(12)), session_id=1)
    m = c.try_match_prefix(req, list(range(6)))  # T = 6 -> prefix 6
    assert m.prefix_len == 6
    # [ceil_align(6) = 8, 11) freed: only the third page; the page of positions 4-7 stays
    assert slot.kv_allocated_len == 6 and slot.kv_committed_len == 6
    assert len(c.allocator.free_pages) == 8 - 2
    assert row[5] // 4 not in c.allocator.free_pages


def test_prefix_keeps_the_reserve_once_and_asserts_append_only():
    c = cache()
    assert c._prefix_len(6, 5) == 5  # retract retry: committed exceeds len(token_ids) by 1
    assert c._prefix_len(4, 7) == 4
    row_id = c.alloc_row()
    c.alloc_extend(c.req_to_token[row_id], 5)
    c.slots[1] = SessionSlot(row=row_id, kv_committed_len=5, kv_allocated_len=5,
                             cache_protected_len=4)
    with pytest.raises(PrefixShrank):
        c.try_match_prefix(SessionReq(1, [0] * 3, session_id=1), [0, 0])


def test_controller_rejects_a_rewind():
    c = cache()
    assert c.build_turn_input([1, 2], [3]) == [1, 2, 3]
    with pytest.raises(Rejected):
        c.build_turn_input([1, 2], [3], rewind=1)


def test_release_session_returns_whole_pages_and_the_row():
    c = cache(ps=4, pages=4)
    row_id = c.alloc_row()
    row = c.req_to_token[row_id]
    c.alloc_extend(row, 6)
    c.slots[7] = SessionSlot(row=row_id, kv_committed_len=5, kv_allocated_len=6)
    c.release_session(7)
    assert sorted(c.allocator.free_pages) == [1, 2, 3, 4]
    assert c.req_pool.available_size() == 4 and 7 not in c.slots


# -- the subject: whole turns ----------------------------------------------------------------
def subject(ps=1, pages=16):
    return StreamingSessionSubject(page_size=ps, pool_pages=pages)


def test_first_turn_locks_its_prompt_and_later_turns_resume_the_slot():
    s = subject()
    s.open_session(1)
    s.turn(1, [0, 1, 2])
    s.check()
    slot_lock = s.sessions[1].turn.last_node
    assert slot_lock.lock_ref == 1  # the prompt is in the tree, locked by the turn
    s.decode(1, 2)
    s.finish_turn(1)
    slot = s.cache.slots[1]
    assert (slot.cache_protected_len, slot.kv_committed_len) == (3, 5)
    assert slot_lock.lock_ref == 1  # still held by the slot between turns
    out = s.turn(1, [2])
    assert "resumed slot at 5" in out
    s.check()
    s.finish_turn(1)
    s.release_session(1)
    s.check()
    s.quiesce()


def test_speculative_gap_is_freed_by_the_next_turn():
    s = subject()
    s.open_session(1)
    s.turn(1, [0, 0, 0])
    s.spec_decode(1, 3, 0)  # allocates up to C + 4, commits 1
    req = s.sessions[1].turn
    assert req.kv_allocated_len - req.filled == 3
    s.finish_turn(1)  # trim to the finished length: a 1-token gap survives
    slot = s.cache.slots[1]
    assert slot.kv_allocated_len - slot.kv_committed_len == 1
    s.turn(1, [1])
    s.check()
    s.quiesce()


def test_retract_retry_resumes_one_token_short_without_leaking():
    s = subject()
    s.open_session(1)
    s.turn(1, [0, 1, 2, 0])
    out = s.retract(1)
    assert "retracted with 5 committed" in out and "resumed slot at 4" in out
    s.check()
    s.finish_turn(1)
    s.quiesce()


def test_abort_releases_the_slot_and_the_next_turn_starts_from_the_tree():
    s = subject()
    s.open_session(1)
    s.turn(1, [0, 1, 2, 0])
    s.finish_turn(1)
    s.turn(1, [1, 1])
    s.abort_turn(1)
    assert 1 not in s.cache.slots
    s.check()
    out = s.turn(1, [2])
    assert out.startswith("first turn: tree hit 4")  # the first turn's prompt, now unlocked
    s.check()
    s.quiesce()


def test_plain_request_shares_the_sessions_prefix():
    s = subject(ps=4, pages=8)
    s.open_session(1)
    s.turn(1, [0, 1, 2, 0, 1])
    s.finish_turn(1)
    out = s.admit(9, [0, 1, 2, 0, 2, 2])
    assert out.startswith("hit 4 of 6")
    s.check()
    s.finish(9)
    s.quiesce()


def test_session_held_accounting_matches_upstream_formula():
    s = subject(ps=4, pages=8)
    s.open_session(1)
    s.turn(1, [0, 1, 2, 0, 1])  # P = 4 after the insert, A = 5
    s.finish_turn(1)
    assert s.cache.session_held_tokens(1) == ceil_align(5, 4) - 4
    c = s.cache
    total = (c.allocator.available_size() + c.evictable_size_ + c.protected_size_
             + c.session_held_tokens(1))
    assert total == 8 * 4


# -- each fault's minimal trace (the hand-written form of what the fuzzer finds) --------------
TURN = [("open_session", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0, 0, 0, 0, 0]})]
SPEC_TURNS = [("open_session", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0, 0, 0]}),
              ("spec_decode", {"sid": 1, "draft": 2, "accepted": 0}),
              ("finish_turn", {"sid": 1}), ("turn", {"sid": 1, "tokens": [1]})]
REWIND = [("open_session", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0, 0, 0, 0]}),
          ("finish_turn", {"sid": 1}),
          ("rewind_turn", {"sid": 1, "rewind": 3, "tokens": [1]})]
CASES = [
    ("S1", SPEC_TURNS, {}, "conservation", 5),
    ("S2", TURN + [("retract", {"sid": 1})], {}, "conservation", 3),
    ("S3", TURN + [("retract", {"sid": 1})], {"page_size": 4, "pool_pages": 8},
     "conservation", 3),
    ("S3", SPEC_TURNS, {"page_size": 4, "pool_pages": 8}, "conservation", 4),
    ("S4", TURN + [("retract", {"sid": 1})], {}, "session-prefix", 3),
    ("S5", REWIND, {}, "append-only", 4),
]


@pytest.mark.parametrize("fid,ops,params,prop,step", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_fault_trace_fails_on_its_property_and_passes_clean(fid, ops, params, prop, step):
    _, clean = run_ops(ops, **params)
    assert clean is None, clean
    _, v = run_ops(ops, fid, **params)
    assert v is not None and v.prop == prop and v.step == step, v


def test_s3_double_free_and_reuse_is_reported_as_corruption():
    """Past the first bad free, the partial page is freed again and handed out while the
    session still reads it: both a page twice in the free list and clobbered fingerprints."""
    c = StreamingSessionSubject(FreeTailUnaligned, page_size=4, pool_pages=8)
    c.open_session(1)
    c.turn(1, [0, 0, 0, 0, 0])
    c.retract(1)  # frees the page of positions 4-5 while they are committed
    with pytest.raises(Violation) as exc:
        c.check()
    assert exc.value.prop == "conservation" and "both free and held" in exc.value.message
    c.admit(5, [1, 1, 1, 1, 1, 1, 1])  # the freed page is handed to a plain request
    with pytest.raises(Violation) as exc:
        c.check()
    assert exc.value.prop in ("conservation", "data-integrity")


# -- the session invariants ------------------------------------------------------------------
def test_check_session_prefix():
    check_session_prefix("s", 5, 6, 5)
    check_session_prefix("s", 4, 4, 7)
    check_session_prefix("s", 2, 4, 7, unchanged=2)
    with pytest.raises(Violation) as exc:
        check_session_prefix("s", 4, 6, 5)
    assert exc.value.prop == "session-prefix" and exc.value.details["expected"] == 5
    with pytest.raises(Violation):
        check_session_prefix("s", 4, 4, 7, unchanged=3)


def test_check_append_only():
    check_append_only("s", 4, 4)
    with pytest.raises(Violation) as exc:
        check_append_only("s", 3, 4)
    assert exc.value.prop == "append-only"


def test_check_session_accounting():
    # 32 tokens: 12 free, 8 in the tree, a session with A=5, P=4 (holds 4), a request with 8
    check_session_accounting("kv", 32, 12, 8, {"s1": (5, 4)}, {"r1": 8}, 4)
    with pytest.raises(Violation) as exc:  # one page lost
        check_session_accounting("kv", 32, 8, 8, {"s1": (5, 4)}, {"r1": 8}, 4)
    assert exc.value.prop == "conservation"
    with pytest.raises(Violation) as exc:  # allocated below the protected prefix
        check_session_accounting("kv", 32, 22, 8, {"s1": (2, 4)}, {}, 1)
    assert exc.value.prop == "conservation" and "< 0" in exc.value.message
