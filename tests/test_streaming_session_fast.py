"""The streaming-session fast verdict (``caches/subjects/streaming_session_fast.py``) against
the full view-based state checks, side by side after every step of random walks: clean, and
with every streaming-session fault, in every regime.  The two must agree on every step -- the
fast path passes exactly when the state checks do -- and the faulty runs must reach failing
steps on the fault's property (else the comparison proves nothing).  (The tree's conditions are
``radix_fast``'s, corrupted one by one in ``test_radix_fast``; here the sessions' own.)"""

from __future__ import annotations

import random

import pytest

from caches.faults import faults_of
from caches.subjects.streaming_session import StreamingSessionSubject
from caches.subjects.streaming_session_fast import streaming_session_fast_ok
from state_machines.variants import all_variants
from tests.side_by_side import FastVerdictSuite, SideBySide, tree_nodes

SPEC = all_variants()["streaming-session"]
SBS = SideBySide(StreamingSessionSubject, streaming_session_fast_ok, SPEC)


class TestSideBySide(FastVerdictSuite):
    SBS = SBS
    FAULTS = faults_of("streaming-session")
    STATE_PROPS = {"size-accounting", "ref-balance", "structure", "eviction-set", "conservation",
                   "data-integrity"}


# -- corrupted states: the sessions' conditions -------------------------------------------------
def _live(s):
    return bool(s.sessions) or bool(s.requests)


def _session_rows(s):
    return [sess for sess in s.sessions.values() if sess.row is not None]


def _row_entry(s, rnd):  # a page of a session's row swapped for a free one (or another's)
    sess = _session_rows(s)
    row = s.cache.req_to_token.get(sess[0].row) if sess else None
    if not row:
        return _free_page(s, rnd)
    row[rnd.randrange(len(row))] = rnd.randrange(1, s.pool.num_pages + 1) * s.page_size


def _free_page(s, rnd):
    free = s.pool.free_pages
    if free and rnd.random() < 0.5:
        free.pop(rnd.randrange(len(free)))
    else:
        free.append(rnd.randrange(1, s.pool.num_pages + 1))


def _free_row(s, rnd):
    free = s.rows.free_slots
    if free and rnd.random() < 0.5:
        free.pop(rnd.randrange(len(free)))
    else:
        free.append(rnd.randrange(1, s.rows.size + 1))


def _slot_len(field, by):
    def corrupt(s, rnd):
        slots = list(s.cache.slots.values())
        if not slots:
            return _free_page(s, rnd)
        slot = rnd.choice(slots)
        setattr(slot, field, getattr(slot, field) + by)
    return corrupt


def _borrowed_free(s, rnd):  # a plain request's tree prefix read from a free page instead:
    # nothing owns it twice and no session reads it back, only "borrowed, not free" says so
    reqs = [r for r in s.requests.values() if r.cache_protected_len]
    free = s.pool.free_pages
    if not reqs or not free:
        return _free_page(s, rnd)
    req = rnd.choice(reqs)
    req.kv_indices[rnd.randrange(req.cache_protected_len)] = rnd.choice(free) * s.page_size


def _alias(s, rnd):  # a tree node's slot becomes another node's: two positions, one slot
    held = [(n, i) for n in tree_nodes(s.cache.root_node)[1:] for i in range(len(n.value))]
    if len(held) < 2:
        return _free_page(s, rnd)
    (a, i), (b, j) = rnd.sample(held, 2)
    b.value[j] = a.value[i]


def _data(s, rnd):
    s.pool.data[rnd.randrange(1, len(s.pool.data))] += 1


def _counter(s, rnd):
    s.cache.evictable_size_ += rnd.choice([-1, 1])


def _committed(s, rnd):  # the model thinks more KV was committed than was written
    sess = [x for x in s.sessions.values() if x.committed is not None and x.turn is None]
    if not sess:
        return _data(s, rnd)
    rnd.choice(sess).committed += 1


CORRUPTIONS = {
    "row-entry": _row_entry, "free-page": _free_page, "borrowed-free": _borrowed_free,
    "free-row": _free_row, "alias": _alias,
    "allocated": _slot_len("kv_allocated_len", 1),
    "unallocated": _slot_len("kv_allocated_len", -1),
    "protected": _slot_len("cache_protected_len", 1),
    "unprotected": _slot_len("cache_protected_len", -1),
    "data": _data, "counter": _counter, "committed": _committed,
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupted_states_get_the_same_verdict(monkeypatch, kind):
    """Walks in every regime; at a random step the state is corrupted in one way, then both
    checks judge it.  They must agree every time, and the corruption must break the state
    checks at least once."""
    seen = SBS.corrupted(monkeypatch, CORRUPTIONS[kind], random.Random(kind), _live)
    assert any(prop is not None for _, prop in seen), f"{kind} never broke the state check"


# -- verify_data's one-comparison shortcut: the verdict and words of check_fingerprints ----------
@pytest.mark.parametrize("bad, keep", [(None, None), (1, None), (0, 2), (2, 2), (None, 2)])
def test_verify_data_says_what_check_fingerprints_says(bad, keep):
    """``Subject.verify_data`` compares the read-back in one go; it must pass and fail where
    ``check_fingerprints`` over the read-back does (fewer tokens than ids: the common length),
    with the same report."""
    from invariants import Violation, check_fingerprints

    def by_the_check(s, pool, ids, tokens, what):
        check_fingerprints(pool.name, ids, pool.read(ids),
                           s.expected_data(tokens)[:len(ids)], what=what)

    said = []
    for verify in (StreamingSessionSubject.verify_data, by_the_check):
        s = StreamingSessionSubject(page_size=1, pool_pages=10)
        s.open_session(1)
        s.turn(1, [0, 1, 2])
        s.finish_turn(1)
        row = s.cache.req_to_token[s.sessions[1].row]
        if bad is not None:
            s.pool.data[row[bad]] += 1
        try:
            verify(s, s.pool, row[:3], s.sessions[1].history[:keep], "x, ")
            said.append(None)
        except Violation as v:
            said.append((v.prop, str(v)))
    assert said[0] == said[1]
    assert (said[0] is None) == (bad is None or (keep is not None and bad >= keep))
