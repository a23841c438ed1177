"""Session-slot invariants (streaming sessions): the per-turn prefix contract and the
session-held share of the token accounting.

* ``check_session_prefix`` -- property ``session-prefix``: a turn resuming from a session slot
  reuses exactly ``min(kv_committed_len, T)`` positions, where ``T = len(fill) - 1`` already
  carries the 1-token logit reserve (the abstract model's expectation).
* ``check_append_only`` -- property ``append-only``: a turn's ``prefix_len`` never drops below
  the slot's ``cache_protected_len`` (the tree-owned prefix the session locked).
* ``check_session_accounting`` -- property ``conservation``: ``available + tree tokens +
  sum over sessions of (ceil_align(kv_allocated_len) - cache_protected_len) + in-flight
  requests' own tokens == capacity`` (upstream's own identity, in tokens of whole pages).
"""

from __future__ import annotations

from typing import Mapping

from .violation import fail


def ceil_align(n: int, page_size: int) -> int:
    return -(-n // page_size) * page_size


def check_session_prefix(session: str, prefix_len: int, committed: int, num_token_ids: int,
                         unchanged: int | None = None) -> None:
    """``prefix_len`` must be ``min(committed, num_token_ids)`` (reserve applied once), and
    no more than ``unchanged``: the length of the history the input keeps (an append-only
    input keeps all of it; a rewound one only up to the rewind point)."""
    want = min(committed, num_token_ids)
    if unchanged is not None:
        want = min(want, unchanged)
    if prefix_len != want:
        fail("session-prefix", f"{session}: the turn reuses {prefix_len} positions, expected "
             f"min(kv_committed_len {committed}, len(token_ids) {num_token_ids}"
             + (f", kept history {unchanged}" if unchanged is not None else "")
             + f") = {want}", session=session, prefix_len=prefix_len, expected=want,
             committed=committed, token_ids=num_token_ids, unchanged=unchanged)


def check_append_only(session: str, prefix_len: int, cache_protected_len: int) -> None:
    """A turn never resumes below the tree-owned prefix of its slot."""
    if prefix_len < cache_protected_len:
        fail("append-only", f"{session}: prefix_len {prefix_len} < cache_protected_len "
             f"{cache_protected_len}: the turn would free and overwrite positions the tree "
             "owns", session=session, prefix_len=prefix_len,
             cache_protected_len=cache_protected_len)


def check_session_accounting(pool: str, capacity: int, available: int, tree_tokens: int,
                             sessions: Mapping[str, tuple[int, int]],
                             in_flight: Mapping[str, int], page_size: int) -> None:
    """Token accounting with the session-held share (all counts in tokens).

    ``sessions`` maps a session to ``(kv_allocated_len, cache_protected_len)``; it holds
    ``ceil_align(A) - P`` tokens (negative is itself a violation).  ``in_flight`` maps a
    request that is not a session slot to the tokens of whole pages it owns.
    """
    held = {}
    for name, (allocated, protected) in sessions.items():
        h = ceil_align(allocated, page_size) - protected
        if h < 0:
            fail("conservation", f"pool {pool}: {name} holds ceil_align({allocated}) - "
                 f"{protected} = {h} < 0 tokens", pool=pool, session=name,
                 kv_allocated_len=allocated, cache_protected_len=protected)
        held[name] = max(h, 0)
    total = available + tree_tokens + sum(held.values()) + sum(in_flight.values())
    if total != capacity:
        fail("conservation", f"pool {pool}: available {available} + tree {tree_tokens} + "
             f"session-held {sum(held.values())} {dict(sorted(held.items()))} + in-flight "
             f"{sum(in_flight.values())} = {total} != capacity {capacity}", pool=pool,
             available=available, tree=tree_tokens, sessions=held,
             in_flight=dict(in_flight), capacity=capacity)
