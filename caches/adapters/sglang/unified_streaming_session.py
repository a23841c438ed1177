"""``--target sglang`` / ``--target sglang-rust`` for the streaming-session variant on SGLang
0.5.23: ``UnifiedRadixCache`` (Full component, Python or Rust tree core) with its own
``StreamingSession`` (``tree.session``), driven the way 0.5.23's scheduler does.

0.5.23 moved the session into the cache: ``StreamingSession`` is no longer a wrapper around the
tree but a record keeper the cache consults first (``session/streaming_session.py``, SS).  A
session *takes* its first turn's KV record (``ReqKvInfo``) and tree lock when the turn gets its
row, and every later turn *borrows* the record (``req.kv is slot.kv``).  The calls, all the
scheduler's:

=====================================  ====================================================
driver                                 SGLang 0.5.23
=====================================  ====================================================
``try_match_prefix`` (a turn)          ``StreamingSession.try_match_prefix`` with the turn's
                                       real ``Req`` (lend the record, ``min(C, T)``, the
                                       append-only assert, ``_free_tail``); None without a slot
first turn's row, allocation           ``ReqToTokenPool.alloc([req])``, then
                                       ``alloc_for_extend``'s last step
                                       ``maybe_hand_to_session`` (SS ``take``: the slot takes
                                       the record and the admission ``TreeLock``)
``cache_unfinished_req`` (a turn)      ``tree.checkpoint(req, up_to)`` -> ``try_checkpoint``
                                       (the first turn publishes its prompt, the lock follows)
finish / retract / abort of a turn     ``release_kv_cache`` (``mem_cache/common.py``) with
                                       ``checkpoint=True`` / ``False`` (``release_req``) /
                                       ``True`` with ``FINISH_ABORT``: ``claim_kv_row`` ->
                                       ``try_cache_finished_req`` (save, or hand the record
                                       and lock back), then the cache's own release steps;
                                       a retract then ``reset_for_retract`` and the same
                                       ``Req`` is re-queued for its retry
``pre_abort_turn``'s stub match        ``Req.set_finish_with_abort`` on the turn's real
                                       ``Req`` (1 token, ``to_finish``), then the same
                                       ``try_match_prefix``: ``find_active_slot`` detaches
                                       it (``req.session = None``); the stub then runs as
                                       a plain request (the radix adapter's path)
``release_session``                    ``SessionController._close`` of an idle session: the
                                       last request forgets the session,
                                       ``release_radix_session``, ``tree.release_session``
plain requests                         the radix adapter's path (``unified_radix.py``)
=====================================  ====================================================

The session turns are real ``schedule_batch.Req`` objects (0.5.23 constructs them on CPU)
with real controller ``Session`` objects; plain requests are ``unified_radix._UReq``.  The
page continuation (``alloc_extend``) and the controller's append-only rule are the
0.5.12.post1 adapter's (``SessionDriving``): unchanged scheduler code.  A turn's new pages
(``_alloc_pages``) evict 0.5.23's way: upstream's ``evict_from_tree_cache(tree, extend +
page)``, only the shortfall, through ``evict_for_alloc`` (allocator/base.py:155-169), checked
against ``policy.sglang_0523_scheduler_need`` (``TreeCoreViews.scheduler_need``; 0.5.12.post1
evicted the whole request).  On the Python core the eviction policy is checked as for
radix (``TreeCoreViews``: victims at the Full walk's ``evict_device_leaf``, LRU by
``last_access_time``, a victim's parent pushed back).  On the
Rust core the tree exposes no nodes, so the subject checks what ``TreeCoreViews`` checks there
(sizes against ``all_values_flatten``, page conservation between tree, requests and sessions,
the core's ``sanity_check``, KV fingerprints, quiescence), and ``kvcheck diff
streaming-session --target sglang --against sglang-rust`` compares the two cores step by step.
"""

from __future__ import annotations

from array import array

from caches.adapters.sglang import loader
from caches.adapters.sglang.streaming_session import (SessionDriving,
                                                      SglangStreamingSessionSubject)
from caches.adapters.sglang.unified_radix import (TreeCoreViews, UnifiedRadixAdapter, _tree_lock,
                                                  _UReq, evict_from_tree_cache)
from caches.streaming_session import SessionMatch
from invariants import check_conservation


class UnifiedStreamingSessionCache(SessionDriving, UnifiedRadixAdapter):
    """0.5.23's ``UnifiedRadixCache`` and its ``StreamingSession`` behind the reference
    streaming cache's interface (module docstring)."""

    def __init__(self, page_size: int = 1, pool_pages: int = 40, req_rows: int = 6, device=None,
                 *, core: str = "python", session_cls=None, alloc_policy: str = "scheduler"):
        UnifiedRadixAdapter.__init__(self, page_size, pool_pages, device, core=core,
                                     alloc_policy=alloc_policy, req_rows=req_rows)
        self.ss = loader.load_streaming_session()
        if session_cls is not None:  # a catalogued fault: the patched subclass, same cache
            self.tree.session = session_cls(self.tree)
        self._init_sessions(req_rows, self.tree.session)

    def _alloc_pages(self, pages: int, extend: int) -> list[int] | None:
        """A turn's new pages.  ``scheduler``: 0.5.23's ``alloc_for_extend`` /
        ``alloc_for_decode`` eviction, the upstream function on the real tree and allocator --
        ``evict_from_tree_cache(tree, extend + page)`` (page 1: ``extend``; mem_cache/
        allocation.py 152-157 / 188-201), which evicts only the shortfall through
        ``evict_for_alloc`` (allocator/base.py:155-169) -- then one ``alloc``.  (The
        0.5.12.post1 adapter, ``SessionDriving._alloc_pages``, evicts all of it through
        ``evict``.)  ``reference``: the reference's loop, as there."""
        if self.alloc_policy != "scheduler":
            return SessionDriving._alloc_pages(self, pages, extend)
        ps = self.page_size
        evict_from_tree_cache(self.tree, extend + (ps if ps > 1 else 0))
        got = self.allocator.alloc(pages * ps)
        return None if got is None else got.tolist()

    # -- release hooks ----------------------------------------------------------------------
    @staticmethod
    def kv_of(obj):
        return obj.kv

    def row_holder(self, row: int | None = None):
        holder = _UReq(None, self._ReqKvInfo())
        holder.kv.req_pool_idx = row
        return holder

    def slot_node(self, raw_slot):
        return None if raw_slot.lock is None else self.node(raw_slot.lock.node)

    # -- nodes and locks ----------------------------------------------------------------------
    def inc_lock_ref(self, node) -> None:
        if node is not self.virtual_node:  # upstream: tree.lock(virtual) takes nothing
            UnifiedRadixAdapter.inc_lock_ref(self, node)

    def dec_lock_ref(self, node) -> None:
        if node is not self.virtual_node:
            UnifiedRadixAdapter.dec_lock_ref(self, node)

    def _new_req(self, rid: str, tokens, session=None):
        return self.ss.Req(rid, None, array("q", tokens), self.ss.SamplingParams(),
                           session=session)

    # -- match ----------------------------------------------------------------------------------
    def try_match_prefix(self, req, token_ids) -> SessionMatch | None:
        """upstream: ``init_next_round_input`` -> ``match_kv_cache`` -> ``UnifiedRadixCache.
        match_prefix``, whose first step is ``StreamingSession.try_match_prefix``; None when it
        hands the turn no slot (the driver then runs the tree's match, the method's second
        step, through the radix adapter)."""
        sid = req.session_id
        s = self._turn_req(req)
        pre_abort = self._pre_abort(req, s) if req.to_finish else None
        s.refresh_fill_ids()
        params = self.sg.MatchPrefixParams(key=self.sg.RadixKey(array("q", token_ids)), req=s)
        try:
            m = self.session.try_match_prefix(params)
        except AssertionError as exc:  # the append-only assert
            raise self._prefix_shrank(exc) from exc
        if m is None and req.to_finish:  # find_active_slot detached the stub
            self._pre_abort_not_lent(req, s, pre_abort)
            return None
        if m is None:
            self._slot_not_resumed(s, sid, len(token_ids))
            return None
        # upstream: match_kv_cache keeps the match on the request; tree.lock(virtual) is None
        s.prefix_len, s.last_node = m.device_prefix_len, m.last_device_node
        s.kv.cache_protected_len = m.cache_protected_len
        s.lock = self.tree.lock(m.last_device_node)
        kv = s.kv
        row = self._refresh(kv.req_pool_idx, kv.kv_allocated_len)
        row.owner = s
        req.row, req.kv_indices = kv.req_pool_idx, row
        req.filled = kv.kv_committed_len
        req.cache_protected_len = m.cache_protected_len
        req.last_node = self.virtual_node
        indices = list(row[:m.device_prefix_len])
        return SessionMatch(indices, len(indices), self.virtual_node, m.cache_protected_len)

    def _sync(self, req, s) -> None:
        """The driver's view of a turn into its SGLang ``Req`` (the scheduler's fields)."""
        s.kv.kv_committed_len = req.filled
        s.kv.kv_allocated_len = len(req.kv_indices)
        s.output_ids = array("q", req.tokens[len(s.origin_input_ids):])
        s.full_untruncated_fill_ids = array("q", req.tokens[:req.filled])

    # -- after prefill --------------------------------------------------------------------------
    def cache_unfinished_req(self, req) -> None:
        """A turn's prefill is checkpointed (``tree.checkpoint``).  A first turn is handed to
        its session first -- upstream ``alloc_for_extend`` ends with ``maybe_hand_to_session``
        once the row is written: the slot takes the record and the admission lock."""
        sid = getattr(req, "session_id", None)
        if sid is None:
            raise NotImplementedError("plain requests are prefilled at admission here")
        s = self._turns[sid]
        self._sync(req, s)
        if self.session.borrowed_slot(s) is None:
            node = req.last_node
            s.kv.cache_protected_len = req.cache_protected_len
            s.prefix_len, s.last_node = req.cache_protected_len, node.raw
            s.lock = _tree_lock(node.raw, self._take_receipt(node.raw))
            self.tree.maybe_hand_to_session(s)
        self.tree.checkpoint(s, up_to=req.filled)
        slot = self.session.slots[sid]
        req.cache_protected_len = slot.kv.cache_protected_len
        if slot.lock is not None and req.last_node is not self.virtual_node:
            req.last_node = self.slot_node(slot)  # the first turn: the lock followed the insert
        self._refresh(slot.kv.req_pool_idx, slot.kv.kv_allocated_len)

    # -- finish / retract / abort ---------------------------------------------------------------
    def try_cache_finished_req(self, req, *, aborted: bool = False) -> bool:
        """upstream: a turn's ``release_kv_cache`` -- a finish (``checkpoint=True``, the batch
        result processor), a retract (``release_req``: ``checkpoint=False``, then
        ``reset_for_retract``; the same ``Req`` is re-queued), or a mid-turn abort (finished
        with ``FINISH_ABORT``, ``checkpoint=True``)."""
        s = self._end_turn(req, aborted)
        if s is None:
            return False
        sid = req.session_id
        row = s.kv.req_pool_idx
        kept = self.release_kv_cache(s, checkpoint=not self.retracting)
        if not kept:  # the slot handed the record back: released like any request
            self.req_to_token.pop(row, None)
        else:
            slot = self.session.slots[sid]
            self._refresh(slot.kv.req_pool_idx, slot.kv.kv_allocated_len).owner = None
        if self.retracting:  # upstream: ScheduleBatch.release_req, then back to the queue
            s.reset_for_retract()
            self._retracted[sid] = s
        req.row = None
        return True

    def cache_finished_req(self, req, is_insert: bool = True) -> None:
        """A plain request's finish (``is_insert``) or abort: the radix adapter's
        ``release_kv_cache``, which gives the row back too (the driver's ``free_row`` after
        it then has nothing to do)."""
        self._plain.pop(req.rid, None)
        UnifiedRadixAdapter.cache_finished_req(self, req, is_insert)

    def bind_plain(self, req, row: int) -> None:
        """A plain request admitted on ``row`` (its holder from ``alloc_row``): the request's
        ``_UReq`` takes the row's indices and the admission lock."""
        s = self.req_to_token[row].owner
        s.rid = str(req.rid)
        self._bind(s, req)
        s.origin_input_ids = array("q", req.tokens)
        self._refresh(row, len(req.kv_indices)).owner = s
        self._plain[req.rid] = s

    # -- close --------------------------------------------------------------------------------
    def release_session(self, sid: int) -> None:
        """upstream: ``SessionController._close`` of an idle session: the last successful
        request forgets the session, ``release_radix_session``, then
        ``tree.release_session`` (unlock, free ``[P, A)`` and the row)."""
        slot = self.session.slots.get(sid)
        row = slot.kv.req_pool_idx if slot is not None else None
        sess = self.controller.pop(sid, None)
        if sess is not None:
            for node in sess.req_nodes.values():
                node.req.session = None
        self.tree.release_radix_session(sid)
        self.tree.release_session(sid)
        self._forget_session(sid, row)


class UnifiedStreamingSessionSubject(TreeCoreViews, SglangStreamingSessionSubject):
    """The streaming-session machine's subject over 0.5.23's ``UnifiedRadixCache`` and its
    ``StreamingSession``, on either tree core."""

    report_setup = None  # kvcheck report: not written for 0.5.23's StreamingSession yet
    lifecycle_declined: dict = {}  # 0.5.23 drives enqueue / enqueue_turn / schedule

    def __init__(self, *, core: str = "python", **options):
        self.core = core
        self.target = "sglang" if core == "python" else "sglang-rust"
        SglangStreamingSessionSubject.__init__(self, **options)

    def _adapter(self, page_size, pool_pages, req_rows, device, **options):
        return UnifiedStreamingSessionCache(page_size, pool_pages, req_rows, device,
                                            core=self.core, **options)

    def _watch_upstream(self) -> None:
        TreeCoreViews._watch_upstream(self)

    def finish_turn(self, sid: int) -> str:
        """0.5.23 saves a finished turn at ``C = len(origin) + finished_len`` (clamped to A):
        "not the req clock (it lags an in-flight verify by ~1 under overlap)" (SS
        ``try_cache_finished_req``).  0.5.23 ships only the overlapped (v2) speculative
        workers, so when a speculative step left the bonus token's position allocated, the
        verify in flight when the finish is processed has computed its KV: the driver runs
        that verify's write first (without it the next turn would read a rejected draft's KV
        there -- docs/engines/sglang.md, "streaming-session on 0.5.23").  A plain decode leaves no
        such position (A == C), so nothing changes there."""
        _, req = self._busy(sid)
        if req.kv_allocated_len > req.filled < len(req.tokens):
            self._forward_last(req)  # allocated already: writes the KV, allocates nothing
            self.reached("inflight-verify-at-finish")
        return super().finish_turn(sid)

    def check_tree(self, tree) -> None:
        if self.white_box:
            super().check_tree(tree)
        else:
            self._check_sizes_black_box()
        self._check_core()

    def check_quiescent(self) -> None:
        if self.white_box:
            super().check_quiescent()
        else:
            self._check_tree_empty()
            check_conservation(self.pool.view(), {})
            check_conservation(self.rows.view(), {})
        self._check_core()


def make_subject(params, fault=None, device=None, core="python", **options):
    """The factory of targets ``sglang`` / ``sglang-rust`` for streaming-session on 0.5.23."""
    return UnifiedStreamingSessionSubject(page_size=params["page_size"],
                                          pool_pages=params["pool_pages"],
                                          req_rows=params["req_rows"], device=device,
                                          fault=fault, core=core, **options)
