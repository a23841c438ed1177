"""The scheduler-boundary invariants (``invariants/scheduler.py``) on hand-built data: each
holds on a consistent view and fails, naming its property, on a broken one."""

from __future__ import annotations

import pytest

from invariants import Violation
from invariants.scheduler import (apply_kv_events, check_no_shared_write,
                                  check_page_conservation, check_request_tokens,
                                  check_sched_quiescence, check_snapshot_balance)

TOTAL = {"H": 11, "S": 11}  # 10 usable pages in one arena, page 0 null


def prop(fn, *a, **k) -> str:
    with pytest.raises(Violation) as exc:
        fn(*a, **k)
    return exc.value.prop


def test_page_conservation_holds_and_returns_the_cache_share():
    tables = {"r1": {"H": [1, 2, 3], "S": [4, 5]}, "r2": {"H": [1, 2, 6], "S": [7]}}
    # 7 distinct live pages + 2 free = 9 of 10 usable: the cache holds 1
    assert check_page_conservation(TOTAL, {"H": 2, "S": 2}, tables) == 1


def test_page_conservation_fails_when_a_held_page_is_counted_free():
    tables = {"r1": {"H": [1, 2, 3], "S": [4, 5]}}
    assert prop(check_page_conservation, TOTAL, {"H": 6, "S": 6}, tables) == \
        "page-conservation"


def test_page_conservation_fails_on_a_page_outside_the_pool():
    assert prop(check_page_conservation, TOTAL, {"H": 0, "S": 0},
                {"r1": {"H": [11]}}) == "page-conservation"
    assert prop(check_page_conservation, TOTAL, {"H": 11, "S": 0}, {}) == \
        "page-conservation"


def test_page_conservation_per_group_without_a_shared_arena():
    tables = {"r1": {"H": [1, 2, 3, 4, 5, 6, 7, 8]}}
    check_page_conservation(TOTAL, {"H": 2, "S": 10}, tables, shared_arena=False)
    assert prop(check_page_conservation, TOTAL, {"H": 3, "S": 10}, tables,
                shared_arena=False) == "page-conservation"


def test_no_shared_write():
    tables = {"r1": {"H": [1, 2], "S": [3, 4]}, "r2": {"H": [1, 5], "S": [3, 6]}}
    # r2 writes its own pages; reading the shared prefix page 1 / state source 3 is fine
    check_no_shared_write({"r2": {"H": [5], "S": [6]}}, tables)
    assert prop(check_no_shared_write, {"r2": {"H": [1], "S": [6]}}, tables) == \
        "no-shared-write"
    assert prop(check_no_shared_write, {"r1": {"S": [3]}}, tables) == "no-shared-write"


def test_snapshot_balance():
    check_snapshot_balance(7, 15, {"r1": 8})
    assert prop(check_snapshot_balance, 12, 15, {}) == "snapshot-balance"
    assert prop(check_snapshot_balance, 7, 15, {"r1": 8, "r2": 1}) == "snapshot-balance"


def test_kv_event_balance():
    stored = {}
    apply_kv_events(stored, [("stored", 1), ("stored", 2), ("removed", 1), ("stored", 1)])
    assert stored == {1: True, 2: True}
    assert prop(apply_kv_events, dict(stored), [("stored", 2)]) == "kv-event-balance"
    assert prop(apply_kv_events, dict(stored), [("removed", 9)]) == "kv-event-balance"
    assert prop(apply_kv_events, {3: False}, [("removed", 3)]) == "kv-event-balance"


def test_request_tokens():
    check_request_tokens("r1", 2, [1, 0], [0, 0, 1, 0, 7])
    assert prop(check_request_tokens, "r1", 2, [1, 1], [0, 0, 1, 0, 7]) == "request-tokens"
    assert prop(check_request_tokens, "r1", 4, [7, 7], [0, 0, 1, 0, 7]) == "request-tokens"


def test_sched_quiescence():
    queues = {"waiting": 0, "prefilling": 0, "decoding": 0, "retracted": 0}
    full = {"H": 10, "S": 10}
    check_sched_quiescence(TOTAL, full, 15, 15, 0, queues, {1: False})
    bad = [
        (TOTAL, {"H": 9, "S": 10}, 15, 15, 0, queues, {}),
        (TOTAL, full, 14, 15, 0, queues, {}),
        (TOTAL, full, 15, 15, 1, queues, {}),
        (TOTAL, full, 15, 15, 0, {**queues, "retracted": 1}, {}),
        (TOTAL, full, 15, 15, 0, queues, {1: True}),
    ]
    for args in bad:
        assert prop(check_sched_quiescence, *args) == "sched-quiescence"
