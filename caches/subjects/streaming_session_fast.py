"""The streaming-session subject's fast verdict: every state check of
``StreamingSessionSubject.check`` answered without building a ``TreeView``.

``streaming_session_fast_ok(subject)`` returns True only when every state check ``check``
runs would pass: the tree's (size accounting, ref balance with the sessions' locks, structure,
the eviction set: ``radix_fast.tree_slots_if_ok``), conservation of the KV pool over the tree,
the requests and the sessions' rows, conservation of the request-pool rows, the session
accounting, and (while checking) every session's committed KV reading back its fingerprints.
Anything else -- a check that would fail, or a state too broken to walk -- returns False, and
the subject then builds the view and runs the checks themselves, which find the violation and
say it with the node and the numbers.  The policy checks are not restated: the subject always
runs them.

Each condition restates one pure check of ``invariants/`` over the same fields ``check``
reads; ``tests/test_streaming_session_fast.py`` runs both side by side after every step of
random runs, clean and with every streaming-session fault, and requires the same verdict.
"""

from __future__ import annotations

from functools import lru_cache

from caches.arith import ceil_align
from caches.pools import Fingerprint
from caches.subjects.radix_fast import tree_slots_if_ok


@lru_cache(maxsize=4096)
def _fingerprints(tokens: tuple) -> list[int]:
    """``Fingerprint.of_prefix(tokens)``, once per distinct token list (a session's history
    changes only when a turn ends).  Read only."""
    return Fingerprint.of_prefix(tokens)


def _same(ids):
    return ids


def streaming_session_fast_ok(s) -> bool:
    """True when every state check of ``s.check()`` passes (see the module doc)."""
    try:
        return _ok(s)
    except Exception:  # noqa: BLE001 -- a state too broken to walk: the full check says why
        return False


def _ok(s) -> bool:
    slots = tree_slots_if_ok(s)
    if slots is None:
        return False
    c, pool, ps = s.cache, s.pool, s.page_size
    # check_conservation of the KV pool's pages: tree, requests (own, borrowed), sessions
    # (their row between protected and allocated, and the protected prefix they borrow).
    # ``consistent`` takes each owner's ids as a set, so with one slot per page the slot
    # lists go in as they are (``pages_of`` would only drop repeats first)
    pages = _same if ps == 1 else pool.pages_of
    owners, borrowed, in_flight = {"tree": pages(slots)}, {}, 0
    for rid, req in s.requests.items():
        owners["r", rid] = pages(req.own_indices)
        borrowed["r", rid] = pages(req.borrowed_indices)
        in_flight += ceil_align(len(req.kv_indices), ps) - req.cache_protected_len
    shares = s._session_shares()
    for sid, (row, protected, allocated, _, _) in shares.items():
        owners["s", sid] = pages(row[protected:allocated])
        borrowed["s", sid] = pages(row[:protected])
    if not pool.consistent(owners, borrowed):
        return False
    # check_conservation of the request-pool rows
    rows = {("r", rid): [row] for rid, row in s.plain_rows.items()}
    for sid, sess in s.sessions.items():
        if sess.row is not None:
            rows["s", sid] = [sess.row]
    if not s.rows.consistent(rows):
        return False
    # check_session_accounting: no session holds a negative share, and available + tree +
    # session-held + in-flight tokens == capacity
    held = 0
    for _, protected, allocated, _, _ in shares.values():
        h = ceil_align(allocated, ps) - protected
        if h < 0:
            return False
        held += h
    if pool.available_size() + c.evictable_size_ + c.protected_size_ + held + in_flight != \
            pool.num_pages * ps:
        return False
    if not s.checking:
        return True
    # verify_data / check_fingerprints: each session's committed KV reads back its prefix
    data = None
    for row, _, _, committed, tokens in shares.values():
        ids = row[:committed]
        if not ids:
            continue
        if data is None:
            data = pool.data.tolist()
            at = data.__getitem__
        want = _fingerprints(tuple(tokens))
        m = min(len(ids), len(want))  # check_fingerprints compares the common length (zip)
        if list(map(at, ids[:m])) != want[:m]:
            return False
    return True
