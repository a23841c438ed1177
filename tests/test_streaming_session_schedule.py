"""Batch admission in the streaming-session variant (caches/subjects/streaming_session.py):
session turns wait in the same queue as plain requests and one ``schedule`` pass admits both
against SGLang's ``PrefillBudget``; the request-pool row rule; fault S6 on admission-sound."""

from __future__ import annotations

import pytest

from caches.faults import get_fault
from caches.streaming_session import StreamingSessionCache
from caches.subjects.base import Skip
from caches.subjects.streaming_session import StreamingSessionSubject
from invariants import Violation


def subject(cls=StreamingSessionCache, **params):
    return StreamingSessionSubject(cls, device="cpu", **params)


def with_slot(s) -> None:
    """s1 holds a slot: a first turn of 3 tokens (in the tree, locked by the slot) and a
    second of 8 (positions 3-7 in the slot's row only)."""
    s.open_session(1)
    s.turn(1, [0, 1, 2])
    s.finish_turn(1)
    s.turn(1, [1, 1, 1, 1])
    s.finish_turn(1)
    s.check()


def test_a_session_turn_and_a_plain_request_are_admitted_in_one_pass():
    s = subject(page_size=1, pool_pages=40, req_rows=4)
    with_slot(s)
    s.enqueue_turn(1, [2, 2], 1)
    s.enqueue(5, [0, 1, 2, 2, 1], 1)
    assert s.sessions[1].turn is None and 5 not in s.requests
    out = s.schedule(3)
    assert "s1's turn" in out and "r5" in out, out
    turn = s.sessions[1].turn
    assert turn is not None and 5 in s.requests and not s.waiting
    # the turn resumed its slot (only the 2 appended tokens + the logit-reserve position
    # were computed) and both ran their first decode step
    assert turn.filled == len(turn.tokens) - 1 and turn.output == 1
    assert s.requests[5].output == 1 and len(s.requests[5].tokens) == 6
    assert {"turn-scheduled", "batch-with-turn", "batch-admitted",
            "slot-resumed"} <= set(s.reached_counts)
    s.check()
    s.finish_turn(1)
    s.finish(5)
    s.check()
    s.drain()
    s.check_quiescent()


def test_the_budget_does_not_count_the_slots_kv_and_s6_does():
    # pool of 12: the slot holds 8 (3 of them in the tree, locked), 4 free, nothing evictable;
    # r5 costs 4 + 1 decode + 1 page = 6: the clean budget refuses it
    clean = subject(page_size=1, pool_pages=12, req_rows=4)
    with_slot(clean)
    clean.enqueue(5, [2, 0, 2, 0], 1)
    assert clean.schedule(3) == "nothing admitted (no budget)"
    clean.check()
    assert 5 in clean.waiting
    # the fault counts the slot's 5 row-only tokens as evictable: 6 < 4 + 5, admitted, and
    # the first decode step finds no slot
    faulty = subject(get_fault("S6").cls, page_size=1, pool_pages=12, req_rows=4)
    with_slot(faulty)
    faulty.enqueue(5, [2, 0, 2, 0], 1)
    with pytest.raises(Violation) as v:
        faulty.schedule(3)
    assert v.value.prop == "admission-sound"


def test_a_pass_stops_when_the_admitted_fill_the_free_rows():
    # 3 rows: the slot holds one, two are free -- two plain requests fit, the third waits
    s = subject(page_size=1, pool_pages=40, req_rows=3)
    with_slot(s)
    for rid in (5, 6, 7):
        s.enqueue(rid, [rid % 3, 0], 1)
    out = s.schedule(3)
    assert sorted(s.requests) == [5, 6] and list(s.waiting) == [7], out
    assert "rows-full" in s.reached_counts
    s.check()


def test_no_free_row_admits_nothing_not_even_a_turn_that_borrows_its_slots_row():
    # SGLang checks the rows before each candidate is matched (scheduler.py
    # get_num_allocatable_reqs): with every row held, a resumed turn waits as well
    s = subject(page_size=1, pool_pages=40, req_rows=1)
    with_slot(s)
    s.enqueue_turn(1, [2], 1)
    assert s.schedule(3) == "nothing admitted (no budget)"
    assert s.sessions[1].queued is not None and s.sessions[1].turn is None
    s.check()
    s.drain()
    s.check_quiescent()


def test_a_waiting_turn_keeps_its_session_busy():
    s = subject(page_size=1, pool_pages=40, req_rows=4)
    with_slot(s)
    s.enqueue_turn(1, [2], 1)
    for op in (lambda: s.turn(1, [0]), lambda: s.release_session(1),
               lambda: s.enqueue_turn(1, [0], 1)):
        with pytest.raises(Skip):
            op()
