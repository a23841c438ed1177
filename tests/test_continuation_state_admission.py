"""continuation-state's batch admission: ``enqueue`` + ``schedule`` as one round of
TokenSpeed's scheduler (``caches/admission.py`` ``SecuredPagesBudget``): pages secured per
request, a refused newcomer does not end the round, an incomplete first chunk does; fault C6
(the round forgets what it secured) breaks ``admission-sound``."""

from __future__ import annotations

import pytest

from caches.admission import SecuredPagesBudget, UnsecuredPagesBudget
from caches.faults import get_fault
from caches.subjects.continuation_state import ContinuationStateSubject
from invariants import Violation
from state_machines.variants import get_variant


def subject(cache_cls=None, **kw):
    return ContinuationStateSubject(cache_cls, **kw) if cache_cls else \
        ContinuationStateSubject(**kw)


def test_a_batch_is_admitted_and_runs_its_first_chunks():
    s = subject(pool_pages=10)
    s.enqueue(1, [0] * 5, 1)
    s.enqueue(2, [0, 0, 1], 2)
    out = s.schedule(3)
    s.check()
    assert out.startswith("admitted r1, r2 of 2")
    assert s.reached_counts["batch-admitted"] == 1 and not s.waiting
    assert [s.requests[r].computed for r in (1, 2)] == [5, 3]  # the round's forward ran
    assert s.finish(1) and s.finish(2)
    s.drain()
    s.check_quiescent()


def test_a_refused_newcomer_stays_waiting_and_the_round_goes_on():
    s = subject(pool_pages=4)
    s.enqueue(1, [0] * 9, 1)  # 5 pages per group: more than the pool
    s.enqueue(2, [1, 1, 1], 1)
    out = s.schedule(3)
    s.check()
    assert out.startswith("admitted r2 of 2") and list(s.waiting) == [1]
    assert s.reached_counts["admission-refused"] == 1
    assert 1 not in s.cache.tables  # the refusal undid its tables (and its lock: check())


def test_an_incomplete_first_chunk_holds_the_head_of_line():
    s = subject(pool_pages=10)
    s.enqueue(1, [0] * 9, 1)  # the round's 8 tokens leave one of its prompt
    s.enqueue(2, [1], 1)
    out = s.schedule(3)
    s.check()
    assert out.startswith("admitted r1 of 2") and list(s.waiting) == [2]
    assert s.requests[1].computed == 8
    assert s.reached_counts["admission-refused"] == 0  # not refused: the round ended


def test_the_budget_secures_pages_across_the_round():
    free = {"H": 4, "S": 4}
    b = SecuredPagesBudget(8, lambda: free, lambda req, extend, max_new: {"H": 3, "S": 1})
    assert b.fits(5, 1) and b.chunk(5) == 5
    b.reserve(5, 1)
    assert b.secured == {"H": 3, "S": 1} and b.tokens == 3 and not b.sealed
    assert not b.fits(3, 1) and b.short(3, 1) == {"H": 2}
    u = UnsecuredPagesBudget(8, lambda: free, lambda req, extend, max_new: {"H": 3, "S": 1})
    u.reserve(5, 1)
    assert u.fits(3, 1)  # the defect: the first admission's pages are forgotten


def test_round_forgetting_secured_pages_breaks_admission_sound():
    def run(cache_cls=None):
        s = subject(cache_cls, pool_pages=4)
        s.enqueue(1, [0] * 5, 1)
        s.enqueue(2, [1, 1, 1], 1)
        return s, s.schedule(3)

    s, out = run()
    assert out.startswith("admitted r1 of 2")  # clean: r2 does not fit beside r1
    s.check()
    with pytest.raises(Violation) as v:
        run(get_fault("C6").cls)
    assert v.value.prop == "admission-sound"


def test_the_op_table_has_batch_admission():
    ops = get_variant("continuation-state").ops
    assert {"enqueue", "schedule"} <= set(ops.names())
    assert "burst" in {sc.name for sc in ops.scenarios}
