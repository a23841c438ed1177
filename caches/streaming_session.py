"""Reference streaming-session cache (SGLang ``StreamingSession`` over ``RadixCache``).

SGLang 0.5.12.post1, ``session/streaming_session.py`` (SS) with PR #22862's ``_free_tail``;
line numbers below are for that wheel.  A multi-turn *streaming* session keeps its KV in a
``SessionSlot`` between turns instead of re-inserting every turn into the radix tree:

* the slot keeps a request-pool row (``req_to_token``), ``kv_committed_len`` C (positions with
  computed KV), ``kv_allocated_len`` A (positions with allocated slots, A >= C under
  speculative decoding), ``cache_protected_len`` P (the page-aligned prefix the tree owns) and
  ``last_node`` (the node the session's *first* turn locked; the lock is held until
  ``release_session``).  The tree owns ``row[0:P)``; the slot owns the pages of ``row[P:A)``,
  including the rest of the last partial page (SS:39-109, 414-429).
* ``try_match_prefix`` (SS:225-264): restore the slot into the request, ``prefix_len =
  min(C, T)`` where T = len(token_ids) already carries the 1-token logit reserve, assert
  ``prefix_len >= P`` (append-only), and ``_free_tail``: free ``[ceil_align(prefix_len, ps),
  A)`` -- the orphaned tail the extension would overwrite -- and clamp A (and C) to
  ``prefix_len`` (SS:494-506, 521-535).  Turns >= 2 get a virtual last node, so lock ops on it
  are no-ops (SS:182-194).  Without a slot (first turn, or after an abort) the request is a
  plain radix request.
* ``try_cache_finished_req`` (SS:266-321): a finish (and a retract, which goes through the same
  path) trims the speculative overshoot past the finished length (``_trim_overshoot``,
  SS:508-519) and saves the slot (C, A, row; ``last_node`` and P only on the first turn).
  Nothing is inserted into the tree.  A mid-turn abort releases the whole slot (an ephemeral
  one built from the request if the session had none, ``A = max(slot.A, req.A)``).
* ``release_session`` (SS:380-412): unlock the first turn's node, free ``row[P:A)`` (whole
  pages) and the row.
* ``alloc_extend`` mirrors the paged allocator's ``alloc_extend_naive`` (allocator.py:180-237):
  positions in the partial page after ``row[p-1]`` continue in that same physical page (no
  allocation), then whole fresh pages; ``row[i] % ps == i % ps``.
* ``build_turn_input`` is the session controller's rule (session_controller.py:118-133): a
  streaming session only accepts plain appends (offset / replace are rejected).

Everything else (match, insert, locks, eviction, the plain request paths) is the reference
``RadixCache``.  Faults S1-S7 override the small hooks ``_tail_range``, ``_tail_start``,
``_prefix_len``, ``_check_append_only``, ``build_turn_input``, ``admission_evictable`` and
``_detaches_pre_aborted``.

* ``find_active_slot``: a turn marked to finish before it runs (``to_finish``,
  ``Req.set_finish_with_abort``: a 1-token stub) is detached from its session and never lent
  the slot (SGLang 0.5.23 ``session/streaming_session.py`` ``find_active_slot``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from caches.pools import PagedAllocator, StatePool
from caches.radix import RadixCache
from caches.request import Req


def ceil_align(n: int, page_size: int) -> int:
    return -(-n // page_size) * page_size


class VirtualNode:
    """The sentinel ``last_node`` of turns >= 2: lock ops on it are no-ops (SS:182-194)."""

    id = -1

    def __repr__(self) -> str:
        return "VirtualNode"


class PrefixShrank(AssertionError):
    """The append-only assert (SS:242-245): a turn's prefix_len dropped below the slot's
    cache_protected_len.  Carries the numbers so a driver can name the property."""

    def __init__(self, prefix_len: int, cache_protected_len: int):
        super().__init__(f"streaming session prefix shrank: prefix_len={prefix_len} < "
                         f"cache_protected_len={cache_protected_len}")
        self.prefix_len = prefix_len
        self.cache_protected_len = cache_protected_len


class Rejected(Exception):
    """The session controller refuses a request (streaming sessions are append-only)."""


@dataclass
class SessionReq(Req):
    """A turn of a streaming session.  ``tokens`` is ``fill = origin + output``; ``filled`` is
    ``kv_committed_len``; ``kv_indices`` *is* the request-pool row (the same list object the
    slot keeps), so ``len(kv_indices)`` is ``kv_allocated_len``."""

    session_id: int | None = None
    row: int | None = None
    # marked to finish before it runs (``Req.set_finish_with_abort``: input too long, a
    # controller rejection, an abort while waiting for its grammar): a 1-token stub
    to_finish: bool = False

    @property
    def kv_allocated_len(self) -> int:
        return len(self.kv_indices)


@dataclass
class SessionSlot:
    row: int | None = None
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    cache_protected_len: int = 0
    last_node: object = None


@dataclass
class SessionMatch:
    indices: list[int]
    prefix_len: int
    last_node: object
    cache_protected_len: int
    freed: list = field(default_factory=list)


class StreamingSessionCache(RadixCache):
    def __init__(self, allocator: PagedAllocator, page_size: int = 1,
                 req_pool: StatePool | None = None):
        super().__init__(allocator, page_size)
        self.req_pool = req_pool if req_pool is not None else StatePool(16, name="req_to_token")

    def reset(self) -> None:
        super().reset()
        self.virtual_node = VirtualNode()
        self.slots: dict[int, SessionSlot] = {}
        self.req_to_token: dict[int, list[int]] = {}  # row -> pool ids of positions [0, A)

    # -- request-pool rows (ReqToTokenPool, memory_pool.py:128-192) ---------------------
    def alloc_row(self) -> int | None:
        got = self.req_pool.alloc(1)
        if got is None:
            return None
        self.req_to_token[got[0]] = []
        return got[0]

    def free_row(self, row: int) -> None:
        self.req_to_token.pop(row, None)
        self.req_pool.free([row])

    # -- locks: no-ops on the virtual node --------------------------------------------------
    def inc_lock_ref(self, node) -> None:
        if node is not self.virtual_node:
            super().inc_lock_ref(node)

    def dec_lock_ref(self, node) -> None:
        if node is not self.virtual_node:
            super().dec_lock_ref(node)

    # -- allocation with page continuation (alloc_extend / alloc_decode) ---------------------
    def alloc_extend(self, row: list[int], end: int) -> bool:
        """Allocate positions ``[len(row), end)`` of a row; False (nothing changed) if short.

        The rest of the page holding ``row[start-1]`` continues in place (``last_loc + 1``,
        no allocation); the remaining positions get whole fresh pages (with eviction)."""
        start, ps = len(row), self.page_size
        if end <= start:
            return True
        boundary = min(end, ceil_align(start, ps)) if ps > 1 else start
        new_pages = -(-end // ps) - -(-start // ps)
        fresh: list[int] = []
        if new_pages:
            got = self.alloc_with_eviction(new_pages * ps)
            if got is None:
                return False
            fresh = got
        row.extend(row[start - 1] + 1 + i for i in range(boundary - start))
        row.extend(fresh[: end - boundary])
        return True

    # -- the session controller -----------------------------------------------------------
    def build_turn_input(self, history: Sequence[int], append: Sequence[int],
                         rewind: int = 0) -> list[int]:
        """Next turn's input: the last successful turn's ``origin + output`` plus the new
        tokens.  Streaming sessions accept only plain appends (SC:118-133)."""
        if rewind:
            raise Rejected("streaming sessions accept only plain appends (offset/replace "
                           "rejected)")
        return list(history) + list(append)

    # -- match -----------------------------------------------------------------------------
    def find_active_slot(self, req) -> SessionSlot | None:
        """The slot a turn resumes; None without one.  A turn marked to finish before it
        runs (``to_finish``) is detached from its session and gets None: it runs as a plain
        1-token request and the slot stays for the next turn (SGLang 0.5.23
        ``StreamingSession.find_active_slot``; SGLang #22273: 0.5.10.post1's
        ``SessionAwareCache.match_prefix`` lends the stub the slot, fault S7)."""
        sid = getattr(req, "session_id", None)
        if sid is None:
            return None
        slot = self.slots.get(sid)
        if slot is None or slot.row is None:
            return None
        if self._detaches_pre_aborted(req):
            req.session_id = None
            return None
        return slot

    def _detaches_pre_aborted(self, req) -> bool:
        return getattr(req, "to_finish", False)

    def restore_to_req(self, slot: SessionSlot, req: SessionReq) -> None:
        req.row = slot.row
        req.kv_indices = self.req_to_token[slot.row]
        req.filled = slot.kv_committed_len
        req.cache_protected_len = slot.cache_protected_len
        req.last_node = self.virtual_node

    def try_match_prefix(self, req: SessionReq, token_ids: Sequence[int]) -> SessionMatch | None:
        """A session turn's match; None when the session holds no slot (plain radix match)."""
        slot = self.find_active_slot(req)
        if slot is None:
            return None
        self.restore_to_req(slot, req)
        prefix_len = self._prefix_len(req.filled, len(token_ids))
        self._check_append_only(prefix_len, slot)
        self._free_tail(slot, req, prefix_len)
        return SessionMatch(list(req.kv_indices[:prefix_len]), prefix_len, self.virtual_node,
                            slot.cache_protected_len)

    def _prefix_len(self, committed: int, num_token_ids: int) -> int:
        # token_ids = fill[:len(fill)-1]: the logit reserve is already applied (SS:235-238)
        return min(committed, num_token_ids)

    def _check_append_only(self, prefix_len: int, slot: SessionSlot) -> None:
        if prefix_len < slot.cache_protected_len:
            raise PrefixShrank(prefix_len, slot.cache_protected_len)

    def _free_tail(self, slot: SessionSlot, req: SessionReq, prefix_len: int) -> None:
        """Free the orphaned tail ``[prefix_len, A)`` the extension would overwrite."""
        start, end = self._tail_range(slot, prefix_len)
        self._free_kv_aligned(req.kv_indices, start, end)
        slot.kv_allocated_len = prefix_len
        del req.kv_indices[prefix_len:]  # req.kv_allocated_len = prefix_len
        slot.kv_committed_len = min(slot.kv_committed_len, prefix_len)
        req.filled = min(req.filled, prefix_len)

    def _tail_range(self, slot: SessionSlot, prefix_len: int) -> tuple[int, int]:
        return prefix_len, slot.kv_allocated_len

    def _free_kv_aligned(self, row: list[int], target: int, end: int) -> None:
        """Free ``row[ceil_align(target):end)``: the allocator frees whole pages, so the
        partial page ``[target, ceil_align(target))`` stays with the slot (SS:521-535)."""
        if end <= target:
            return
        start = self._tail_start(target)
        if start < end:
            self.allocator.free(row[start:end])

    def _tail_start(self, target: int) -> int:
        return ceil_align(target, self.page_size) if self.page_size > 1 else target

    # -- after prefill --------------------------------------------------------------------
    def cache_unfinished_req(self, req: Req) -> None:
        """Turns >= 2 never touch the tree (SS:333-341); a first turn is a plain request."""
        if self.find_active_slot(req) is not None:
            return
        super().cache_unfinished_req(req)

    # -- finish / retract / abort ---------------------------------------------------------
    def try_cache_finished_req(self, req: Req, *, aborted: bool = False) -> bool:
        """A session turn finished (or was retracted, or aborted mid-turn); False for a plain
        request (the caller runs the radix path)."""
        sid = getattr(req, "session_id", None)
        if sid is None:
            return False
        slot = self.slots.get(sid)
        if aborted:
            if slot is None:  # first-turn mid-abort: an ephemeral slot from the request
                slot = SessionSlot(row=req.row, kv_allocated_len=req.kv_allocated_len,
                                   last_node=req.last_node,
                                   cache_protected_len=req.cache_protected_len)
                self.slots[sid] = slot
            slot.kv_allocated_len = max(slot.kv_allocated_len, req.kv_allocated_len)
            self.release_session(sid)
            req.row = None
            return True
        is_first = slot is None
        if is_first:
            slot = self.slots[sid] = SessionSlot()
        self._trim_overshoot(req, len(req.tokens))
        self.save_from_req(slot, req, is_first)
        return True

    def _trim_overshoot(self, req: SessionReq, target: int) -> None:
        """Free what speculative decoding allocated past the finished length (SS:508-519)."""
        self._free_kv_aligned(req.kv_indices, target, req.kv_allocated_len)
        del req.kv_indices[target:]
        req.filled = min(req.filled, target)

    def save_from_req(self, slot: SessionSlot, req: SessionReq, is_first: bool) -> None:
        slot.row = req.row
        slot.kv_committed_len = req.filled
        slot.kv_allocated_len = req.kv_allocated_len
        if is_first:
            slot.last_node = req.last_node
            slot.cache_protected_len = req.cache_protected_len
        req.row = None  # the row now belongs to the slot

    def release_session(self, sid: int) -> None:
        """Close a session: unlock the first turn's node, free ``row[P:A)`` and the row."""
        slot = self.slots.pop(sid, None)
        if slot is None:
            return
        if slot.last_node is not None:
            self.dec_lock_ref(slot.last_node)
        if slot.row is not None:
            row = self.req_to_token[slot.row]
            if slot.cache_protected_len < slot.kv_allocated_len:
                self.allocator.free(row[slot.cache_protected_len:slot.kv_allocated_len])
            self.free_row(slot.row)

    # -- batch admission ----------------------------------------------------------------------
    def admission_evictable(self) -> int:
        """What the batch budget reads as evictable: the tree's evictable tokens
        (``evictable_size()``; SGLang 0.5.23 ``mem_cache/prefill_budget.py`` lines 90-97).
        A session slot's KV is neither free nor evictable: a budget that counted it would
        admit a batch whose allocation cannot evict it."""
        return self.evictable_size_

    # -- accounting (SS:414-429) ------------------------------------------------------------
    def session_held_tokens(self, sid: int, in_flight: SessionReq | None = None) -> int:
        """Tokens a session holds outside the tree: ``ceil_align(A) - P`` (whole pages)."""
        slot = self.slots.get(sid)
        if slot is None or slot.row is None:
            return 0
        allocated = slot.kv_allocated_len
        if in_flight is not None:
            allocated = max(allocated, in_flight.kv_allocated_len)
        return max(0, ceil_align(allocated, self.page_size) - slot.cache_protected_len)
