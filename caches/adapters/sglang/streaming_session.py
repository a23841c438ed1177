"""``--target sglang`` for the streaming-session variant: SGLang's real ``StreamingSession``
wrapped around its real ``RadixCache``, allocators and ``ReqToTokenPool``, under our machine.

SGLang 0.5.12.post1, ``session/streaming_session.py`` (SS), ``session/session_controller.py``
(SC), ``managers/schedule_batch.py`` (SB), ``mem_cache/common.py`` (CM).  With
``--enable-streaming-session`` the scheduler's ``tree_cache`` is ``StreamingSession(RadixCache)``
(scheduler.py:959-963): every cache call of a request goes through the wrapper, which keeps a
``SessionSlot`` per streaming session and falls through to the inner tree otherwise.

Three pieces, from the inside out:

* ``SglangStreamingSessionCache`` -- ``SglangRadixCache`` (the radix adapter: the inner
  ``RadixCache``, ``TokenToKVPoolAllocator``/``PagedTokenToKVPoolAllocator``, node proxies,
  fingerprint pool) plus the wrapper (``self.session``), a ``ReqToTokenPool`` of ``req_rows``
  rows, one real ``Session`` (session_controller) per open session, and one real
  ``schedule_batch.Req`` per in-flight turn and per plain request.  It offers the reference
  ``StreamingSessionCache``'s interface, so ``StreamingSessionSubject`` -- the same ops, driver
  and invariants -- drives it unchanged:

  ====================================  ===================================================
  reference                             here (SGLang)
  ====================================  ===================================================
  ``try_match_prefix(req, token_ids)``  ``StreamingSession.try_match_prefix`` with the turn's
                                        ``Req`` (restore, ``min(C, T)``, append-only assert,
                                        ``_free_tail``); ``PrefixShrank`` from its assert
  ``cache_unfinished_req``              ``StreamingSession.cache_unfinished_req`` (a first
                                        turn: the inner tree's; later turns: nothing)
  ``try_cache_finished_req``            ``release_kv_cache`` -> ``StreamingSession.
                                        cache_finished_req`` (finish / retract save the slot,
                                        ``FINISH_ABORT`` releases it)
  ``release_session``                   ``SessionController._close`` -> ``StreamingSession.
                                        release_session``
  ``slots[sid]``                        the wrapper's ``SessionSlot`` (row =
                                        ``req_pool_idx``, C, A, P, ``last_node``)
  ``req_to_token[row]``                 ``ReqToTokenPool.req_to_token[row, :A]`` (a list
                                        re-read from the tensor after every call that moves it)
  ``alloc_row`` / ``free_row``          ``ReqToTokenPool.alloc`` / ``free``
  ``alloc_extend(row, end)``            the scheduler's allocation (see below)
  ``inc/dec_lock_ref``                  ``StreamingSession.inc/dec_lock_ref`` (virtual: no-op)
  plain ``cache_finished_req``          ``release_kv_cache`` -> ``StreamingSession.
                                        cache_finished_req`` -> inner ``RadixCache``
  ====================================  ===================================================

  Which of the subject's requests is which SGLang ``Req``: a turn's ``Req`` is made at its
  match (``origin_input_ids`` = the turn's input, ``session`` = the session's ``Session``), gets
  its row from ``alloc_row`` (first turn) or the slot (later turns), and carries the driver's
  committed/allocated lengths and sampled tokens (``output_ids``) into each cache call; a plain
  request's ``Req`` is bound to its row at admission.

* ``SglangStreamingSessionSubject`` -- ``StreamingSessionSubject`` over that adapter, with
  SGLang's allocator as ``pool``, its ``ReqToTokenPool`` as ``rows``, SGLang's tree read
  directly for the checks, and ``prepare_for_diff``.

Where the adapter stands in for scheduler code that cannot run here (all marked ``upstream:``):

* allocation -- ``alloc_for_extend`` / ``alloc_for_decode`` (CM:429-562): ``evict_from_tree_cache``
  of the extension (plus one page when paged, as ``alloc_paged_token_slots_extend`` over-
  estimates; the adapter uses this extend rule for decode steps too, where
  ``alloc_paged_token_slots_decode`` evicts one page), then the allocator's plain ``alloc`` of
  the whole new pages; the positions left
  in the page of ``row[p-1]`` continue in place (``last_loc + 1 ...``), exactly as
  ``alloc_extend_naive`` (AL:180-237) lays them out -- the Triton ``alloc_extend``/
  ``alloc_decode`` kernels are GPU-only.  ``write_cache_indices`` writes the prefix and the new
  slots into the row.
* ``release_kv_cache`` (CM:566-619): the wrapper's ``cache_finished_req``; for a plain request
  then the over-allocated tail and the row (freed by the driver's ``free_row`` right after).
* the session controller: ``Session.create_req``'s streaming rule (SC:118-133: offset/replace
  rejected, input = the last successful turn's ``origin + output`` plus the new tokens) -- its
  rejection path calls ``set_finish_with_abort``, which needs a tensor-parallel group; the
  ``Session`` objects themselves are real (``finish_req``/``abort_req`` run inside the wrapper),
  and ``release_session`` does what ``SessionController._close`` does for an idle session.
* ``init_next_round_input`` (SB:988-1060): the turn's ``token_ids`` (``fill[:-1]``) come from
  the driver; the match result is stored on the ``Req`` as it does.
"""

from __future__ import annotations

import re
import sys

import torch

from caches.adapters import KnownUpstreamFinding, declined_findings
from caches.adapters.sglang import loader, versions
from caches.adapters.sglang.radix import (SglangRadixCache, SglangRadixSubject,
                                          _Unslotted)
from caches.streaming_session import (PrefixShrank, Rejected, SessionMatch, SessionReq,
                                      VirtualNode, ceil_align)
from caches.subjects.streaming_session import StreamingSessionSubject
from invariants import PoolView, fail
from invariants.policy import sglang_scheduler_need, shortfall_need

PRE_ABORT_MESSAGE = "kvcheck: marked to finish before it runs (input too long)"
# 0.5.12.post1: "slot.cache_protected_len=4"; 0.5.23: "slot.kv.cache_protected_len=4"
_SHRANK = re.compile(r"prefix_len=(\d+) < slot\.(?:kv\.)?cache_protected_len=(\d+)")


class _Row(list):
    """The harness's copy of one ``req_to_token`` row's positions ``[0, kv_allocated_len)``;
    ``owner`` is the SGLang ``Req`` that holds the row while a turn or plain request runs."""

    def __init__(self, row: int):
        super().__init__()
        self.row = row
        self.owner = None


class _Holder:
    """What ``ReqToTokenPool.free`` reads off a request (a row nobody's ``Req`` holds)."""

    def __init__(self, row: int):
        self.req_pool_idx = row


class SlotView:
    """One SGLang ``SessionSlot`` through the reference ``SessionSlot``'s field names (the
    slot's KV record is ``cache.kv_of(slot)``: the slot itself on 0.5.12.post1, its
    ``ReqKvInfo`` on 0.5.23)."""

    __slots__ = ("raw", "_cache")

    def __init__(self, raw, cache: "SessionDriving"):
        self.raw, self._cache = raw, cache

    @property
    def row(self):
        return self._cache.kv_of(self.raw).req_pool_idx

    @property
    def kv_committed_len(self) -> int:
        return self._cache.kv_of(self.raw).kv_committed_len

    @property
    def kv_allocated_len(self) -> int:
        return self._cache.kv_of(self.raw).kv_allocated_len

    @property
    def cache_protected_len(self) -> int:
        return self._cache.kv_of(self.raw).cache_protected_len

    @property
    def last_node(self):
        return self._cache.slot_node(self.raw)


class RowPool:
    """SGLang's ``ReqToTokenPool`` as the harness's row pool (what ``StatePool`` offers)."""

    name, unit = "req_to_token", "slot"

    def __init__(self, pool, reserved: tuple = (0,), base: int = 1):
        self.pool = pool
        self.size = pool.size
        self.reserved, self.base = reserved, base  # versions.reserved_request_rows, _base

    @property
    def free_slots(self) -> list[int]:
        return list(self.pool.free_slots)

    def available_size(self) -> int:
        return self.pool.available_size()

    def view(self) -> PoolView:
        return PoolView(name=self.name, unit=self.unit, capacity=self.size,
                        free=tuple(self.pool.free_slots), reserved=self.reserved,
                        base=self.base)


class SessionDriving:
    """What the streaming-session adapters of every release share: the request-pool rows as
    the driver sees them, the scheduler's allocation of a session's positions, the session
    controller's streaming rule and the bookkeeping of which SGLang ``Req`` is which.  A
    release's adapter mixes it in front of its radix adapter and names where its objects keep
    the KV record (``kv_of``), what holds a row nobody's ``Req`` holds (``row_holder``) and
    the node a slot locks (``slot_node``)."""

    def _init_sessions(self, req_rows: int, session) -> None:
        self.rows = RowPool(self.req_to_token_pool,
                            versions.reserved_request_rows(self.sg.version),
                            versions.request_rows_base(self.sg.version))
        self.session = session  # the release's StreamingSession
        self.virtual_node = VirtualNode()  # every SGLang _VirtualNode, seen from the driver
        self.req_to_token: dict[int, _Row] = {}
        self.controller: dict[int, object] = {}  # sid -> SGLang Session (SessionController)
        self._turns: dict[int, object] = {}  # sid -> the SGLang Req of its current turn
        self._plain: dict[int, object] = {}  # rid -> the SGLang Req of a plain request
        self._unrowed = None  # a first turn's Req between its match and its row
        self._retracted: dict[int, object] = {}  # sid -> its retracted Req, queued for retry
        self._refused: dict[int, object] = {}  # sid -> its waiting turn's Req, refused a pass
        self.retracting = False  # the driver's next save is a retract (release_req)
        self._turn_no = 0

    # -- release hooks ----------------------------------------------------------------------
    @staticmethod
    def kv_of(obj):
        """The KV record (``req_pool_idx``, C, A, P) of an SGLang ``Req`` or ``SessionSlot``."""
        return obj

    def row_holder(self, row: int | None = None):
        """What ``ReqToTokenPool.alloc``/``free`` read off a request that holds ``row``."""
        raise NotImplementedError

    def slot_node(self, raw_slot):
        raise NotImplementedError

    # -- slots and rows ---------------------------------------------------------------------
    @property
    def slots(self) -> dict:
        return {sid: SlotView(slot, self) for sid, slot in self.session.slots.items()}

    def _refresh(self, row: int, length: int) -> _Row:
        """Re-read the harness's copy of ``row`` (positions ``[0, length)``) from SGLang."""
        mirror = self.req_to_token.setdefault(row, _Row(row))
        mirror[:] = self.req_to_token_pool.req_to_token[row, :length].tolist()
        return mirror

    def alloc_row(self) -> int | None:
        """upstream: ``alloc_req_slots`` -> ``ReqToTokenPool.alloc`` (for a first turn, with its
        own ``Req``, which then carries the row)."""
        owner, self._unrowed = self._unrowed, None
        holder = owner if owner is not None else self.row_holder()
        got = self.req_to_token_pool.alloc([holder])
        if got is None:
            return None
        row = _Row(got[0])
        row.owner = holder
        self.req_to_token[row.row] = row
        return row.row

    def free_row(self, row: int) -> None:
        """upstream: ``ReqToTokenPool.free(req)`` (release_kv_cache's last step), unless
        ``release_kv_cache`` already gave the row back itself."""
        mirror = self.req_to_token.pop(row, None)
        owner = mirror.owner if mirror is not None else None
        if owner is not None and self.kv_of(owner).req_pool_idx is None \
                and row in self.req_to_token_pool.free_slots:
            return
        if owner is None or self.kv_of(owner).req_pool_idx != row:
            owner = self.row_holder(row)
        self.req_to_token_pool.free(owner)

    # -- allocation (the scheduler's part) ------------------------------------------------------
    def alloc_extend(self, row: _Row, end: int) -> bool:
        """Positions ``[len(row), end)`` of a session's row; False (nothing changed) when the
        pool cannot hold them.

        upstream: ``alloc_for_extend`` / ``alloc_for_decode`` -- the rest of the page of
        ``row[start-1]`` continues in place (``last_loc + 1``, no allocation), then whole new
        pages from the allocator (``alloc_extend_naive``'s layout, ``row[i] % ps == i % ps``);
        ``write_cache_indices`` writes the prefix and the new slots into the row."""
        start, ps = len(row), self.page_size
        if end <= start:
            return True
        new_pages = -(-end // ps) - -(-start // ps)
        fresh: list[int] = []
        if new_pages:
            got = self._alloc_pages(new_pages, end - start)
            if got is None:
                return False
            fresh = got
        boundary = min(end, ceil_align(start, ps)) if ps > 1 else start
        new = [row[start - 1] + 1 + i for i in range(boundary - start)] + fresh[:end - boundary]
        self.req_to_token_pool.write(
            (row.row, slice(0, end)),
            torch.tensor(list(row) + new, dtype=torch.int32, device=self.device))
        row.extend(new)
        if row.owner is not None:
            self.kv_of(row.owner).kv_allocated_len = end
        return True

    def _alloc_pages(self, pages: int, extend: int) -> list[int] | None:
        ps = self.page_size
        if self.alloc_policy == "scheduler":
            # upstream: alloc_token_slots / alloc_paged_token_slots_extend (CM:302-395) --
            # evict_from_tree_cache for the extension (+ one page per request when paged), once
            need = extend + (ps if ps > 1 else 0)
            if self.allocator.available_size() < need:
                self.evict(need)
            got = self.allocator.alloc(pages * ps)
            return None if got is None else got.tolist()
        return self.alloc_with_eviction(pages * ps)  # the reference's loop (kvcheck diff)

    # -- the session controller ---------------------------------------------------------------
    def build_turn_input(self, history, append, rewind: int = 0) -> list[int]:
        """upstream: ``Session.create_req`` for a streaming session (SC:118-133, 188-199) --
        only plain appends; the input is the last successful turn's ``origin + output`` plus
        the new tokens.  A rewind is an ``offset`` (``replace`` when it keeps nothing): both
        are refused ("Streaming sessions do not support offset/replace."; the result words
        are the reference's, so ``kvcheck diff`` compares the caches, not the phrasing)."""
        if rewind:
            raise Rejected("streaming sessions accept only plain appends (offset/replace "
                           "rejected)")
        return list(history) + list(append)

    def _controller_session(self, sid: int):
        sess = self.controller.get(sid)
        if sess is None:  # upstream: SessionController.open(streaming=True)
            sess = self.controller[sid] = self.built.make("session_state", self.ss.Session,
                                                          1 << 20, sid, streaming=True)
        return sess

    def _turn_req(self, req):
        """The SGLang ``Req`` of ``req``'s turn: the retracted one re-queued for its retry
        (upstream: the scheduler re-queues the retracted ``Req`` itself, scheduler.py:2969),
        or the waiting one a scheduling pass refused (it stays queued and is matched again),
        else a new one from the session controller."""
        sid = req.session_id
        s = self._retracted.pop(sid, None)
        if s is None:
            s = self._refused.pop(sid, None)
        if s is None or list(s.origin_input_ids) + list(s.output_ids) != list(req.tokens):
            self._turn_no += 1
            s = self._new_req(f"s{sid}.{self._turn_no}", req.tokens,
                              self._controller_session(sid))
        self._turns[sid], self._unrowed = s, None
        return s

    def turn_refused(self, sid: int) -> None:
        """A scheduling pass refused ``sid``'s waiting turn after its match: the same ``Req``
        stays in the waiting queue and is matched again by a later pass (0.5.23
        ``session/streaming_session.py`` ``try_match_prefix``: "A rejected chunked request
        matches again next cycle and borrows the same record"); it takes no row now."""
        self._unrowed = None
        self._refused[sid] = self._turns[sid]

    def row_for(self, sid: int | None) -> None:
        """The next ``alloc_row`` is ``sid``'s first turn's (its ``Req`` carries the row), or,
        with None, a plain request's: a pass matches every candidate before any extend
        allocates its row (``scheduler.py`` ``get_new_batch_prefill``, then
        ``prepare_for_extend`` -> ``alloc_req_slots``)."""
        self._unrowed = self._turns[sid] if sid is not None else None

    def _slot_not_resumed(self, s, sid: int, num_ids: int) -> None:
        """The wrapper handed the turn no slot: fine for a first turn, a ``session-prefix``
        failure while the session still holds its KV (the turn would re-prefill from the tree
        as a plain request next to its own slot)."""
        slot = self.session.slots.get(sid)
        if slot is not None and self.kv_of(slot).req_pool_idx is not None:
            kv = self.kv_of(slot)
            fail("session-prefix", f"session s{sid}: the turn's request "
                 f"{'is no longer attached to the session' if s.session is None else 'missed'}"
                 f" (Req.session is {'None' if s.session is None else 'set'}, retracted "
                 f"{s.retraction_count}x), so StreamingSession does not resume the slot "
                 f"(kv_committed_len {kv.kv_committed_len}, row {kv.req_pool_idx}): it "
                 f"reuses 0 of the expected min({kv.kv_committed_len}, {num_ids}) "
                 "positions and runs as a plain request", session=f"s{sid}",
                 retraction_count=s.retraction_count, slot_committed=kv.kv_committed_len)
        self._unrowed = s

    # -- a turn marked to finish before it runs (the driver's ``pre_abort_turn``) ------------
    def _pre_abort(self, req, s):
        """upstream: ``Req.set_finish_with_abort`` on the turn's real ``Req`` (1-token
        stub, ``to_finish`` set), as ``handle_generate_request`` does for an input too long;
        the slot's row as it was, for ``_pre_abort_not_lent``.  The call reads the
        tensor-parallel rank only to log: it is stated as 0 (the 0.5.23 way:
        ``get_parallel().override(tp_rank=0)``; before: ``get_tensor_model_parallel_rank``)."""
        slot = self.session.slots.get(req.session_id)
        row = self.kv_of(slot).req_pool_idx if slot is not None else None
        mod = sys.modules[type(s).__module__]  # managers/schedule_batch.py
        rank = getattr(mod, "get_tensor_model_parallel_rank", None)
        log, quiet = mod.logger, mod.logger.disabled  # its error line is no verdict
        log.disabled = True
        try:
            if rank is None:
                with mod.get_parallel().override(tp_rank=0):
                    s.set_finish_with_abort(PRE_ABORT_MESSAGE)
            else:
                mod.get_tensor_model_parallel_rank = lambda: 0
                s.set_finish_with_abort(PRE_ABORT_MESSAGE)
        finally:
            log.disabled = quiet
            if rank is not None:
                mod.get_tensor_model_parallel_rank = rank
        return row

    def _pre_abort_not_lent(self, req, s, row) -> None:
        """The match lent the stub no slot: it is no turn of the session any more.  Where the
        release detached it (0.5.23 ``find_active_slot``: ``req.session = None``) the
        driver's request is detached too; a slot the release dropped loses its row copy."""
        sid = req.session_id
        self._turns.pop(sid, None)
        self._unrowed = None
        if s.session is None:
            req.session_id = None
        if row is not None and sid not in self.session.slots:
            self.req_to_token.pop(row, None)

    @staticmethod
    def _prefix_shrank(exc: AssertionError) -> PrefixShrank:
        """The wrapper's append-only assert (SS:242-245) as the driver's ``PrefixShrank``."""
        got = _SHRANK.search(str(exc))
        if got is None:
            raise exc
        return PrefixShrank(int(got.group(1)), int(got.group(2)))

    def retried(self, sid: int) -> bool:
        """Whether ``sid``'s in-flight turn is a retracted request being retried."""
        s = self._turns.get(sid)
        return s is not None and s.retraction_count > 0

    def _end_turn(self, req, aborted: bool):
        """The SGLang ``Req`` of the turn ``req`` ends, synced and with the finish reason the
        scheduler sets (none on a retract); None when ``req`` is no session turn."""
        sid = getattr(req, "session_id", None)
        if sid is None:
            return None
        s = self._turns.pop(sid)
        self._sync(req, s)
        if aborted:
            s.finished_reason = self.ss.FINISH_ABORT()
        elif not self.retracting:
            s.finished_reason = self.ss.FINISH_LENGTH(len(s.output_ids))
        return s

    def _forget_session(self, sid: int, row: int | None) -> None:
        if row is not None:
            self.req_to_token.pop(row, None)
        self._turns.pop(sid, None)
        self._retracted.pop(sid, None)


class SglangStreamingSessionCache(SessionDriving, SglangRadixCache):
    """SGLang's ``StreamingSession(RadixCache)`` behind the reference streaming cache's
    interface (see the module docstring for the mapping)."""

    def __init__(self, page_size: int = 1, pool_pages: int = 40, req_rows: int = 6, device=None,
                 *, session_cls=None, alloc_policy: str = "scheduler"):
        super().__init__(page_size, pool_pages, device, alloc_policy=alloc_policy)
        ss = self.ss = loader.load_streaming_session()
        tokens = pool_pages * page_size
        # a row holds at most every slot of the pool (distinct positions, distinct slots)
        self.req_to_token_pool = self.built.make(
            "session_req_to_token_pool", self.sg.ReqToTokenPool, req_rows,
            2 * tokens + page_size, self.device, False)
        self.built.set(self.tree, "req_to_token_pool", self.req_to_token_pool)
        self._init_sessions(req_rows, self.built.make("session",
                                                      session_cls or ss.StreamingSession,
                                                      self.tree))
        # handed to SGLang for the driver's virtual node
        self._virtual = self.built.make("virtual_node", ss.VirtualNode)

    def row_holder(self, row: int | None = None):
        return _Unslotted() if row is None else _Holder(row)

    def slot_node(self, raw_slot):
        return self.node_of(raw_slot.last_node)

    # -- nodes ------------------------------------------------------------------------------
    def node_of(self, raw):
        """An SGLang node (tree node, ``_VirtualNode`` or None) as the driver sees it."""
        if raw is None:
            return None
        if isinstance(raw, self.ss.VirtualNode):
            return self.virtual_node
        return self.node(raw)

    def _raw(self, node):
        if node is None:
            return None
        if node is self.virtual_node:
            return self._virtual
        return node.raw

    def inc_lock_ref(self, node) -> None:
        self.session.inc_lock_ref(self._raw(node))

    def dec_lock_ref(self, node) -> None:
        self.session.dec_lock_ref(self._raw(node))

    def _new_req(self, rid: str, tokens, session=None):
        r = self.built.make("req", self.ss.Req, rid, None, list(tokens),
                            self.built.make("sampling_params", self.ss.SamplingParams),
                            session=session)
        r.fill_ids = list(tokens)
        return r

    # -- match ----------------------------------------------------------------------------------
    def try_match_prefix(self, req, token_ids) -> SessionMatch | None:
        """The wrapper's match for a turn's ``Req``; None when the session holds no slot (the
        driver then runs the inner tree's match, as ``StreamingSession.match_prefix`` does)."""
        sid = req.session_id
        s = self._turn_req(req)
        pre_abort = self._pre_abort(req, s) if req.to_finish else None
        s.fill_ids = list(s.origin_input_ids) + list(s.output_ids)
        params = self.sg.MatchPrefixParams(key=self.sg.RadixKey(list(token_ids)), req=s)
        try:
            m = versions.session_try_match(self.session, params)
        except AssertionError as exc:  # SS:242-245, the append-only assert
            raise self._prefix_shrank(exc) from exc
        if m is None and req.to_finish:
            self._pre_abort_not_lent(req, s, pre_abort)
            return None
        if m is None:
            self._slot_not_resumed(s, sid, len(token_ids))
            return None
        # upstream: init_next_round_input keeps the match on the request
        s.prefix_indices, s.last_node = m.device_indices, m.last_device_node
        s.cache_protected_len = m.cache_protected_len
        row = self._refresh(s.req_pool_idx, s.kv_allocated_len)
        row.owner = s
        req.row, req.kv_indices = s.req_pool_idx, row
        req.filled = s.kv_committed_len
        req.cache_protected_len = m.cache_protected_len
        req.last_node = self.virtual_node
        indices = m.device_indices.tolist()
        return SessionMatch(indices, len(indices), self.virtual_node, m.cache_protected_len)

    def _sync(self, req, s) -> None:
        """The driver's view of a request into its SGLang ``Req`` (the scheduler's fields)."""
        s.kv_committed_len = req.filled
        s.kv_allocated_len = len(req.kv_indices)
        s.output_ids = list(req.tokens[len(s.origin_input_ids):])
        s.cache_protected_len = req.cache_protected_len
        if req.last_node is not self.virtual_node:  # a later turn keeps its slot's sentinel
            s.last_node = self._raw(req.last_node)

    # -- after prefill --------------------------------------------------------------------------
    def cache_unfinished_req(self, req) -> None:
        sid = getattr(req, "session_id", None)
        if sid is None:
            raise NotImplementedError("plain requests are prefilled at admission here")
        s = self._turns[sid]
        self._sync(req, s)
        s.fill_ids = list(req.tokens[:req.filled])
        self.session.cache_unfinished_req(s)
        req.cache_protected_len = s.cache_protected_len
        req.last_node = self.node_of(s.last_node)
        self._refresh(s.req_pool_idx, s.kv_allocated_len)

    # -- finish / retract / abort ---------------------------------------------------------------
    def try_cache_finished_req(self, req, *, aborted: bool = False) -> bool:
        """upstream: ``release_kv_cache`` of a turn -- a finish or a retract (both take the
        wrapper's save path: it reads only ``FINISH_ABORT``), or a mid-turn abort."""
        s = self._end_turn(req, aborted)
        if s is None:
            return False
        sid = req.session_id
        row = s.req_pool_idx
        self._release_kv_cache(s, is_insert=not self.retracting)
        if aborted and sid not in self.session.slots:  # released (0.5.10.post1 saves it)
            self.req_to_token.pop(row, None)
        else:
            slot = self.session.slots[sid]
            self._refresh(slot.req_pool_idx, slot.kv_allocated_len).owner = None
        if self.retracting:  # upstream: ScheduleBatch.release_req, then back to the queue
            s.reset_for_retract()
            self._retracted[sid] = s
        req.row = None
        return True

    def cache_finished_req(self, req, is_insert: bool = True) -> None:
        """A plain request's finish (``is_insert``) or abort; its row goes back by the driver's
        ``free_row`` right after."""
        s = self._plain.pop(req.rid)
        self._sync(req, s)
        s.origin_input_ids, s.output_ids = list(req.tokens), []
        self._release_kv_cache(s, is_insert)

    def _release_kv_cache(self, s, is_insert: bool = True) -> None:
        """upstream: mem_cache/common.py release_kv_cache, up to the row (the driver frees it)."""
        self.session.cache_finished_req(s, is_insert=is_insert)
        if s.req_pool_idx is None:  # the streaming path kept the row in the slot or freed it
            return
        start, end = s.pop_overallocated_kv_cache()
        if self.page_size > 1:
            start = ceil_align(start, self.page_size)
        if start < end:
            self.allocator.free(self.req_to_token_pool.req_to_token[s.req_pool_idx, start:end])

    def bind_plain(self, req, row: int) -> None:
        """A plain request admitted on ``row``: its SGLang ``Req`` (upstream: the request's
        row is written by ``write_cache_indices`` at its prefill)."""
        s = self._new_req(f"r{req.rid}", req.tokens)
        s.req_pool_idx = row
        self.req_to_token_pool.write(
            (row, slice(0, len(req.kv_indices))),
            torch.tensor(req.kv_indices, dtype=torch.int32, device=self.device))
        s.prefix_indices = torch.tensor(req.kv_indices[:req.cache_protected_len],
                                        dtype=torch.int64)
        self._sync(req, s)
        mirror = self._refresh(row, len(req.kv_indices))
        mirror.owner = s
        self._plain[req.rid] = s

    # -- close --------------------------------------------------------------------------------
    def release_session(self, sid: int) -> None:
        """upstream: ``SessionController._close`` of an idle session (SC:311-357): the last
        successful request forgets the session, then ``StreamingSession.release_session``."""
        slot = self.session.slots.get(sid)
        row = slot.req_pool_idx if slot is not None else None
        sess = self.controller.pop(sid, None)
        if sess is not None:
            for node in sess.req_nodes.values():
                node.req.session = None
        self.session.release_session(sid)
        self._forget_session(sid, row)


class SglangStreamingSessionSubject(StreamingSessionSubject):
    """The streaming-session machine's subject over SGLang's real ``StreamingSession``."""

    variant = "streaming-session"
    target = "sglang"

    def __init__(self, *, page_size: int = 1, pool_pages: int = 40, req_rows: int = 6,
                 device=None, fault: str | None = None, alloc_policy: str = "scheduler",
                 skip_known_findings=None):
        session_cls = None
        if fault is not None:
            from caches.adapters.sglang.streaming_faults import upstream_fault

            session_cls = upstream_fault(fault)
        adapter = self._adapter(page_size, pool_pages, req_rows, device,
                                session_cls=session_cls, alloc_policy=alloc_policy)
        self.white_box = getattr(adapter, "white_box", True)
        StreamingSessionSubject.__init__(self, page_size=page_size, pool_pages=pool_pages,
                                         req_rows=req_rows, device=device,
                                         cache=adapter)  # SGLang's allocator, ReqToTokenPool
        version = adapter.sg.version
        self.declined = declined_findings(
            skip_known_findings, versions.known_findings(version, "streaming-session"))
        self.skip_known_findings = "F1" in self.declined
        self.abort_saves_turn = versions.session_abort_saves_turn(version)
        self._tail_from: dict[int, str] = {}  # sid -> the finding its slot's tail would leak as
        self._watch_upstream()  # node splits, cascades on SGLang's tree

    def _adapter(self, page_size, pool_pages, req_rows, device, **options):
        return SglangStreamingSessionCache(page_size, pool_pages, req_rows, device, **options)

    def _watch_upstream(self) -> None:
        SglangRadixSubject._watch_upstream(self)

    tree_view = SglangRadixSubject.tree_view  # straight from SGLang's nodes
    scheduler_need = staticmethod(sglang_scheduler_need)  # (SglangRadixSubject's)

    def alloc_demands(self) -> dict:
        """The declared policy difference of the SGLang targets (README, "Upstream targets"):
        plain admissions allocate as ``SglangRadixSubject`` does; a turn's extension
        ``_alloc_pages(pages, extend)`` evicts ``extend`` (+ a page when paged) once short,
        under ``alloc_policy="scheduler"`` (``scheduler_need``: 0.5.12.post1's
        ``policy.sglang_scheduler_need``)."""
        ps, cache, need = self.page_size, self.cache, self.scheduler_need

        def extend_demand(args, free):
            pages, extend = args[0], args[1]
            if cache.alloc_policy == "scheduler":
                return pages * ps, need(extend, free, ps)
            return pages * ps, shortfall_need(pages * ps, free)

        return {**SglangRadixSubject.alloc_demands(self), "_alloc_pages": extend_demand}

    def admit(self, rid: int, tokens: list[int]) -> str:
        out = super().admit(rid, tokens)
        if rid in self.requests and rid not in self.cache._plain:
            self.cache.bind_plain(self.requests[rid], self.plain_rows[rid])
        return out

    # -- 0.5.10.post1's slot resume (findings S4, S1, F2: versions.KNOWN_FINDINGS) ------------
    def _decline_resume(self, sid: int, committed: int, allocated: int, num_ids: int,
                        tail_from: str) -> None:
        """Decline a turn (or a retract's retry) that would resume a slot of ``committed`` /
        ``allocated`` positions for ``num_ids`` token ids the way 0.5.10.post1 does: at
        ``min(committed, num_ids - 1)`` (S4: one position short once committed >= num_ids),
        the row's tail past that prefix neither kept nor freed (the allocation overwrites it:
        leaked as ``tail_from``, S1 or F2).  Decided before anything changes."""
        if num_ids <= 0 or not self.declined & {"S4", "S1", "F2"}:
            return
        prefix = min(committed, num_ids - 1)
        if "S4" in self.declined and committed >= num_ids:
            raise KnownUpstreamFinding(
                f"the slot would resume at min(kv_committed_len {committed}, len(token_ids) - 1 "
                f"= {num_ids - 1}): one position short (catalogue fault S4, fixed by SGLang PR "
                "#22862: known upstream finding sglang-0.5.10-streaming-session-S4, "
                "tests/upstream_findings/)")
        if tail_from in self.declined and allocated > max(prefix, committed):
            raise KnownUpstreamFinding(
                f"the slot's tail [{committed}, {allocated}) would be overwritten by the next "
                "allocation without being freed (no _free_tail before SGLang PR #22862: known "
                f"upstream finding sglang-0.5.10-streaming-session-{tail_from}, "
                "tests/upstream_findings/)")

    def _decline_turn(self, sid: int, full) -> None:
        slot = self.cache.slots.get(sid)
        if slot is not None and slot.row is not None:
            self._decline_resume(sid, slot.kv_committed_len, slot.kv_allocated_len,
                                 len(full) - 1, self._tail_from.get(sid, "S1"))

    def turn(self, sid: int, tokens: list[int]) -> str:
        sess = self._idle(sid)
        self._decline_turn(sid, self.cache.build_turn_input(sess.history, tokens))
        return super().turn(sid, tokens)

    def rewind_turn(self, sid: int, rewind: int, tokens: list[int]) -> str:
        sess = self._idle(sid)
        if sess.committed is not None:
            try:
                self._decline_turn(sid, self.cache.build_turn_input(sess.history, tokens,
                                                                    rewind))
            except Rejected:
                pass  # the op rejects it before anything is resumed
        return super().rewind_turn(sid, rewind, tokens)

    def finish_turn(self, sid: int) -> str:
        self._tail_from[sid] = "S1"
        return super().finish_turn(sid)

    def abort_turn(self, sid: int) -> str:
        self._tail_from[sid] = "F2"
        return super().abort_turn(sid)

    def pre_abort_turn(self, sid: int) -> str:
        """0.5.10.post1 (finding S7, SGLang #22273): ``SessionAwareCache.match_prefix`` has
        no ``to_finish`` check, so a pre-aborted stub of a session holding a slot is lent
        the slot (``restore_to_req``) -- declined before anything changes."""
        sess = self._idle(sid)
        if "S7" in self.declined and sess.committed is not None:
            raise KnownUpstreamFinding(
                "a turn marked to finish before it runs would be lent its session's slot "
                "(known upstream finding sglang-0.5.10-streaming-session-S7, SGLang #22273, "
                "tests/upstream_findings/)")
        return super().pre_abort_turn(sid)

    def retract(self, sid: int) -> str:
        """As the reference's, with the retract told to the adapter: SGLang's scheduler
        releases a retracted request (``release_req``: ``release_kv_cache(is_insert=False)``,
        ``reset_for_retract``) and re-queues the same ``Req`` for the retry."""
        _, req = self._busy(sid)
        if not self.cache.retried(sid) or not self.skip_known_findings:
            # the retry resumes what the retract saves
            committed = min(req.filled + 1, len(req.tokens))
            self._decline_resume(sid, committed, max(req.kv_allocated_len, req.filled + 1),
                                 len(req.tokens) - 1, "S1")
            self._tail_from[sid] = "S1"
        if self.skip_known_findings and self.cache.retried(sid):
            raise KnownUpstreamFinding(
                "retracting a turn that is itself a retract-retry detaches it from its "
                "session (known upstream finding sglang-streaming-session-F1, "
                "tests/upstream_findings/)")
        self.cache.retracting = True
        try:
            return super().retract(sid)
        finally:
            self.cache.retracting = False

    # -- batch admission (caches/subjects/streaming_session.py: enqueue, enqueue_turn,
    # schedule): the reference's pass over this release's cache; a plain request's SGLang
    # ``Req`` is bound at its extend, as ``admit`` binds it
    lifecycle_declined = {
        "schedule": "not driven on SGLang 0.5.12.post1/0.5.10.post1's streaming-session "
                    "adapters: a plain request's decode step is not copied into the engine's "
                    "request row (no sync_row), so its release would free the prompt's row "
                    "only, and those schedulers' admission was not read; SGLang 0.5.23's "
                    "targets drive it"}

    def _unpin(self, req, pinned) -> None:
        super()._unpin(req, pinned)
        if isinstance(req, SessionReq):
            self.cache.turn_refused(req.session_id)

    def _extend(self, req, pinned) -> str | None:
        turn = isinstance(req, SessionReq)
        self.cache.row_for(req.session_id if turn and pinned[2] is None else None)
        failed = super()._extend(req, pinned)
        if not failed and not turn and req.rid not in self.cache._plain:
            self.cache.bind_plain(req, self.plain_rows[req.rid])
        return failed

    def report_setup(self):
        """``kvcheck report``: the construction, stand-ins and checks in SGLang's terms."""
        from caches.adapters.sglang.report import streaming_session_setup

        return streaming_session_setup(self.cache)

    def prepare_for_diff(self) -> None:
        """``kvcheck diff``: allocate with the reference cache's eviction loop, so the diff
        compares the two caches rather than two allocation policies."""
        self.cache.alloc_policy = "reference"

    def held_locks(self):
        held = super(StreamingSessionSubject, self).held_locks()  # requests and bare locks
        for sess in self.sessions.values():
            for node in (sess.lock if sess.committed is not None else None,
                         sess.turn.last_node if sess.turn is not None else None):
                if node is not None and node is not self.cache.virtual_node:
                    held[node.id] += 1
        return held

    def check(self) -> None:
        self._check_rows_agree()
        super().check()

    def _check_rows_agree(self) -> None:
        """Each session's row, as the driver knows it, is the one SGLang's slot holds."""
        slots = self.cache.slots
        for sid, sess in self.sessions.items():
            slot = slots.get(sid)
            if slot is not None and sess.turn is None and slot.row != sess.row:
                fail("conservation", f"session s{sid}: SGLang's slot holds request-pool row "
                     f"{slot.row}, the session's row is {sess.row}",
                     pool="req_to_token", session=sid)

    def state(self):
        raise NotImplementedError("the exhaustive search runs on the reference cache only")


def make_subject(params, fault=None, device=None, **options) -> SglangStreamingSessionSubject:
    """The factory ``state_machines/streaming_session.py`` lists as target ``sglang``."""
    return SglangStreamingSessionSubject(page_size=params["page_size"],
                                         pool_pages=params["pool_pages"],
                                         req_rows=params["req_rows"], device=device,
                                         fault=fault, **options)
