"""The streaming-session subject: a ``StreamingSessionCache`` over the reference radix tree, a
paged token pool, a request-pool of rows, and a scheduler-like driver for multi-turn sessions
next to plain (non-session) requests.

It extends ``RadixSubject`` (whose admit / finish / abort / evict ops drive the plain requests
on the same tree and pools; a plain request here also takes a request-pool row and is prefilled
at admission) with the session ops:

* ``open_session`` / ``release_session`` -- the session controller's open and close;
* ``turn`` -- the next turn's input is the last successful turn's ``origin + output`` plus the
  appended tokens; match (the slot, or the tree for a first turn) with the 1-token logit
  reserve, allocate ``[prefix_len, len(fill))``, prefill it (fingerprints), sample one token;
  a first turn is then ``cache_unfinished_req``'d into the tree (and keeps its lock);
* ``rewind_turn`` -- a turn that drops history tokens (offset/replace): must be rejected;
* ``decode`` / ``spec_decode`` -- plain steps (allocate 1, commit 1) and speculative steps
  (allocate up to ``C + draft + 1``, commit ``accepted + 1``);
* ``finish_turn`` -- trim the overshoot, save the slot; ``retract`` -- the overlap forward
  commits KV for the last sampled token (C = len(fill)), the slot is saved through the finish
  path, and the request resumes at once with the same tokens (``T = C - 1``);
* ``abort_turn`` -- mid-turn abort: the whole slot is released (a target whose release keeps
  an aborted turn as the session's slot declares it: ``abort_saves_turn``).
* ``enqueue`` / ``enqueue_turn`` / ``schedule`` -- batch admission: plain requests and session
  turns wait in one queue and one pass admits both against SGLang's ``PrefillBudget`` (the
  shared pass of ``caches/subjects/lifecycle.py`` over this subject's hooks, "batch
  admission" below).

The driver keeps its own model of each session (history, committed length, the lock the first
turn left, the row) and checks every resumed turn against it in the op: ``session-prefix``
(``prefix_len == min(C, T)``), then ``append-only`` (``prefix_len >= cache_protected_len``).
``check`` adds the session slots to conservation (page sets, then the session-held count) and
reads every session's committed positions back.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from caches.admission import running_reservation
from caches.pools import StatePool
from caches.radix import TreeNode
from caches.streaming_session import (PrefixShrank, Rejected, SessionReq,
                                      StreamingSessionCache, ceil_align)
from caches.subjects.base import Skip
from caches.subjects.canon import IdMap, Ref, Time, TreeState, Unordered, ids, one
from caches.subjects.radix import RadixSubject
from caches.subjects.streaming_session_fast import streaming_session_fast_ok
from invariants import check_conservation, check_held_once, check_quiescence, fail
from invariants.session import (check_append_only, check_session_accounting,
                                check_session_prefix)

VOCAB = 3
POISON = -7  # what a rejected draft position holds (never read as committed KV)


@dataclass
class Session:
    """The driver's model of one open session."""

    sid: int
    history: list[int] = field(default_factory=list)  # last successful turn's origin + output
    committed: int | None = None  # the slot's kv_committed_len per the model; None = no slot
    lock: object = None  # node the first turn left locked (held while the slot lives)
    row: int | None = None  # request-pool row held by the slot / in-flight turn
    turn: SessionReq | None = None  # the in-flight turn
    queued: SessionReq | None = None  # a turn waiting in the scheduler's queue

    @property
    def idle(self) -> bool:
        """No turn in flight or waiting (a new turn may start: ``Session.create_req``
        refuses a second active request of a streaming session)."""
        return self.turn is None and self.queued is None


class StreamingSessionSubject(RadixSubject):
    variant = "streaming-session"
    # ``kvcheck diff`` compares sessions by result words and counters, as before (the radix
    # abstract state does not say what a session holds)
    abstract_state = None

    def __init__(self, cache_cls=StreamingSessionCache, *, page_size: int = 1,
                 pool_pages: int = 24, req_rows: int = 6, device: str | None = None,
                 cache=None):
        """``cache_cls`` over a token pool and request rows built here, or ``cache``: an
        engine's session cache already built over the pools it owns (``cache.pool``,
        ``cache.rows``)."""
        rows = StatePool(req_rows, device, name="req_to_token") if cache is None else cache.rows
        super().__init__(lambda pool, ps: cache_cls(pool, ps, req_pool=rows),
                         page_size=page_size, pool_pages=pool_pages, device=device,
                         cache=cache)
        self.rows = rows
        self.sessions: dict[int, Session] = {}
        self.plain_rows: dict[int, int] = {}

    # -- plain requests also take a request-pool row ------------------------------------------
    def admit(self, rid: int, tokens: list[int]) -> str:
        if rid in self.requests or rid in self.waiting:
            raise Skip(f"r{rid} is already live or waiting")
        row = self.cache.alloc_row()
        if row is None:
            return f"no free request row, r{rid} not admitted"
        out = super().admit(rid, tokens)
        if rid not in self.requests:
            self.cache.free_row(row)
            return out
        self.plain_rows[rid] = row
        req = self.requests[rid]  # prefill it whole: a plain request is finishable at once
        self.pool.write(req.kv_indices[req.filled:],
                        self.expected_data(req.tokens)[req.filled:])
        req.filled = len(req.tokens)
        return out + ", prefilled"

    def finish(self, rid: int) -> str:
        out = super().finish(rid)
        self.cache.free_row(self.plain_rows.pop(rid))
        return out

    def abort(self, rid: int) -> str:
        out = super().abort(rid)
        self.cache.free_row(self.plain_rows.pop(rid))
        return out

    # -- sessions -------------------------------------------------------------------------
    def _session(self, sid: int) -> Session:
        if sid not in self.sessions:
            raise Skip(f"s{sid} is not open")
        return self.sessions[sid]

    def _idle(self, sid: int) -> Session:
        sess = self._session(sid)
        if not sess.idle:
            raise Skip(f"s{sid} has a turn in flight or waiting")
        return sess

    def _busy(self, sid: int) -> tuple[Session, SessionReq]:
        sess = self._session(sid)
        if sess.turn is None:
            raise Skip(f"s{sid} has no turn in flight")
        return sess, sess.turn

    def open_session(self, sid: int) -> str:
        if sid in self.sessions:
            raise Skip(f"s{sid} is already open")
        self.sessions[sid] = Session(sid)
        return "opened"

    def release_session(self, sid: int) -> str:
        sess = self._idle(sid)
        self.cache.release_session(sid)
        del self.sessions[sid]
        return "closed, slot released" if sess.committed is not None else "closed (no slot)"

    def turn(self, sid: int, tokens: list[int]) -> str:
        sess = self._idle(sid)
        return self._schedule(sess, self.cache.build_turn_input(sess.history, tokens))

    def rewind_turn(self, sid: int, rewind: int, tokens: list[int]) -> str:
        sess = self._idle(sid)
        if sess.committed is None:
            # a rewind drops tokens of a saved turn: only a session holding a slot has one (the
            # machine's precondition; the exhaustive search draws the op in any state)
            raise Skip(f"s{sid} holds no slot to rewind into")
        try:
            full = self.cache.build_turn_input(sess.history, tokens, rewind)
        except Rejected as why:
            self.reached("rewind-rejected")
            return f"rejected: {why}"
        return "accepted: " + self._schedule(sess, full, max(0, len(sess.history) - rewind))

    def _schedule(self, sess: Session, full: list[int], kept: int | None = None) -> str:
        """Match, allocate, prefill ``full`` and sample one token: the turn is in flight.
        ``kept``: how much of the history the input keeps (all of it unless rewound)."""
        sid = sess.sid
        req = SessionReq(sid, list(full), session_id=sid)
        allocated_before = self._slot_allocated(sid)
        prefix = self._resume(sess, req, kept)
        if prefix is None:  # no slot: a plain radix request (first turn, or after an abort)
            row = self.cache.alloc_row()
            if row is None:
                return "no free request row, turn not scheduled"
            match = self._lock_tree_prefix(sess, req)
            prefix = self._take_row(req, row, match.indices, match.last_node)
            if not self._prefill_turn(sess, req, prefix):
                self.cache.dec_lock_ref(match.last_node)
                self.cache.free_row(row)
                return (f"out of memory: {len(full) - prefix} tokens needed, turn not "
                        "scheduled")
            self._first_turn_placed(sess, row, prefix)
            how = f"first turn: tree hit {prefix}"
        else:
            self._note_resumed(prefix, allocated_before)
            if not self._prefill_turn(sess, req, prefix):
                self.reached("resume-out-of-memory")
                return (f"out of memory: turn not scheduled (slot kept, tail freed to "
                        f"{prefix})")
            how = f"resumed slot at {prefix} (protected {req.cache_protected_len})"
        return f"{how}, computed {len(full) - prefix} of {len(full)} tokens"

    def _slot_allocated(self, sid: int) -> int:
        slot = self.cache.slots.get(sid)
        return slot.kv_allocated_len if slot is not None else 0

    def _resume(self, sess: Session, req: SessionReq, kept: int | None = None) -> int | None:
        """The session-aware match of ``req`` (``fill[:-1]``: the 1-token logit reserve): the
        slot restored and its tail past the prefix freed, checked against the driver's model;
        the prefix length, or None when the session holds no slot."""
        sid, full = sess.sid, req.tokens
        kept = len(sess.history) if kept is None else kept
        num_ids = len(full) - 1  # token_ids = fill[:len(fill)-1], the 1-token logit reserve
        try:
            m = self.cache.try_match_prefix(req, full[:num_ids])
        except PrefixShrank as shrank:  # the cache's own assert: name what it guards
            if self.checking:
                check_session_prefix(f"session s{sid}", shrank.prefix_len,
                                     sess.committed or 0, num_ids, kept)
                check_append_only(f"session s{sid}", shrank.prefix_len,
                                  shrank.cache_protected_len)
            raise
        if m is None:
            if sess.committed is not None and self.checking:
                fail("session-prefix", f"session s{sid}: the cache holds no slot for the "
                     f"session, whose last turn saved {sess.committed} committed positions: "
                     "the turn re-prefills everything past the tree prefix", session=f"s{sid}")
            return None
        prefix = m.prefix_len
        if sess.committed is None:
            fail("session-prefix", f"session s{sid}: the cache resumed a slot (prefix "
                 f"{prefix}) although the session's last turn was aborted or it never "
                 "saved one: the turn reuses KV of a turn that did not finish",
                 session=f"s{sid}", prefix_len=prefix)
        if self.checking:
            check_session_prefix(f"session s{sid}", prefix, sess.committed, num_ids, kept)
            check_append_only(f"session s{sid}", prefix, m.cache_protected_len)
        if len(req.kv_indices) > prefix:
            # the scheduler allocates [prefix_len, len(fill)) afresh and writes it over the
            # row (write_cache_indices): whatever the cache left in the row past the prefix
            # is dropped from it -- a cache that did not free it has lost those slots, and
            # conservation says so (a driver never computes on the cache's word)
            self.reached("stale-tail-overwritten")
            del req.kv_indices[prefix:]
        self.verify_data(self.pool, m.indices, full, f"s{sid} slot hit, ")
        sess.committed = min(sess.committed, prefix)
        return prefix

    def _note_resumed(self, prefix: int, allocated_before: int) -> None:
        self.reached("slot-resumed")
        if allocated_before > prefix:
            self.reached("tail-freed")
        if prefix % self.page_size:
            self.reached("partial-page-continued")

    def _lock_tree_prefix(self, sess: Session, req: SessionReq):
        """A turn without a slot matches the tree like a plain request and locks the match."""
        full = req.tokens
        match = self._match(full[:len(full) - 1])
        self.verify_data(self.pool, match.indices, full, f"s{sess.sid} prefix hit, ")
        self.cache.inc_lock_ref(match.last_node)
        return match

    def _take_row(self, req: SessionReq, row: int, indices: list[int], node) -> int:
        """The turn's fresh request-pool row, holding the locked tree prefix; its length."""
        req.row, req.kv_indices = row, self.cache.req_to_token[row]
        req.kv_indices.extend(indices)
        req.filled = req.cache_protected_len = prefix = len(indices)
        req.last_node = node
        return prefix

    def _first_turn_placed(self, sess: Session, row: int, prefix: int) -> None:
        sess.row = row  # the first turn's row becomes the session's
        if prefix:
            self.reached("first-turn-tree-hit")

    def _prefill_turn(self, sess: Session, req: SessionReq, prefix: int) -> bool:
        """Allocate ``[prefix, len(fill))``, compute it and sample one token: the turn is in
        flight (a first turn is ``cache_unfinished_req``'d into the tree).  False (nothing
        allocated) when the pool is short."""
        full = req.tokens
        self.cache.evict.reset()
        if not self.cache.alloc_extend(req.kv_indices, len(full)):
            return False
        self.pool.write(req.kv_indices[prefix:], self.expected_data(full)[prefix:])
        req.filled = len(full)
        req.tokens.append(self._sample(req))
        self.cache.cache_unfinished_req(req)
        sess.turn = req
        return True

    def _sample(self, req) -> int:
        if not isinstance(req, SessionReq):  # a plain request's decode step
            return super()._sample(req)
        return (len(req.tokens) * 2 + req.session_id) % VOCAB

    def _forward(self, req: SessionReq, draft: int, accepted: int) -> bool:
        """One (speculative) decode step: KV for the last token + ``draft`` drafts; commits
        ``accepted + 1`` positions and appends ``accepted + 1`` tokens."""
        c = req.filled
        if req.kv_allocated_len < c + draft + 1:
            self.cache.evict.reset()
            if not self.cache.alloc_extend(req.kv_indices, c + draft + 1):
                return False
        for _ in range(accepted + 1):
            req.tokens.append(self._sample(req))
        req.output += accepted + 1
        row = req.kv_indices
        self.pool.write(row[c:c + accepted + 1],
                        self.expected_data(req.tokens)[c:c + accepted + 1])
        self.pool.write(row[c + accepted + 1:c + draft + 1], [POISON] * (draft - accepted))
        req.filled = c + accepted + 1
        return True

    def decode(self, sid: int, n: int) -> str:
        _, req = self._busy(sid)
        for step in range(n):
            if not self._forward(req, 0, 0):
                return f"out of memory after {step} step(s)"
        return f"decoded {n}: committed {req.filled}, allocated {req.kv_allocated_len}"

    def spec_decode(self, sid: int, draft: int, accepted: int) -> str:
        _, req = self._busy(sid)
        accepted = min(accepted, draft)
        if not self._forward(req, draft, accepted):
            return "out of memory, step not run"
        if accepted < draft:
            self.reached("spec-draft-rejected")
        return f"committed {req.filled}, allocated {req.kv_allocated_len}"

    def finish_turn(self, sid: int) -> str:
        sess, req = self._busy(sid)
        if req.kv_allocated_len > len(req.tokens):
            self.reached("spec-overshoot-trimmed")
        self.verify_data(self.pool, req.kv_indices[:req.filled], req.tokens,
                         f"s{sid} at finish, ")
        self._save(sess, req)
        return f"saved slot: committed {sess.committed} of {len(sess.history)} tokens"

    def _save(self, sess: Session, req: SessionReq, aborted: bool = False) -> None:
        if sess.committed is None:  # the first turn's lock stays with the slot
            sess.lock = req.last_node
        committed = min(req.filled, len(req.tokens))
        self.cache.try_cache_finished_req(req, aborted=aborted)
        sess.history, sess.committed, sess.turn = list(req.tokens), committed, None

    def retract(self, sid: int) -> str:
        sess, req = self._busy(sid)
        # overlap scheduling: the forward for the last sampled token ran (its KV is committed)
        # but the token it sampled is dropped with the retract, so C == len(fill)
        if not self._forward_last(req):
            return "out of memory, nothing retracted"
        k = req.filled
        self._save(sess, req)
        self.reached("retract-retry")  # retract goes through the streaming finish path
        return f"retracted with {k} committed; retry: " + self._schedule(sess, sess.history)

    def _forward_last(self, req: SessionReq) -> bool:
        c = req.filled
        if req.kv_allocated_len < c + 1:
            self.cache.evict.reset()
            if not self.cache.alloc_extend(req.kv_indices, c + 1):
                return False
        self.pool.write(req.kv_indices[c:c + 1], self.expected_data(req.tokens)[c:c + 1])
        req.filled = c + 1
        return True

    # the release's abort rule: False -- an aborted turn releases the slot (SGLang from PR
    # #22790 on); True -- it is saved as the session's slot and its tokens are the session's
    # history, as a finished turn (SGLang 0.5.10.post1: caches/adapters/sglang/versions.py)
    abort_saves_turn = False

    def abort_turn(self, sid: int) -> str:
        sess, req = self._busy(sid)
        self.reached("abort-with-slot" if sess.committed is not None else "abort-first-turn")
        if self.abort_saves_turn:
            self._save(sess, req, aborted=True)
            return f"aborted: saved as the session's slot (this release's rule): committed " \
                   f"{sess.committed} of {len(sess.history)} tokens"
        self.cache.try_cache_finished_req(req, aborted=True)
        sess.turn, sess.committed, sess.lock, sess.row = None, None, None, None
        return "aborted: the session's slot is released (next turn starts from the tree)"

    # -- a turn marked to finish before it runs ------------------------------------------------
    # SGLang 0.5.23: ``Req.set_finish_with_abort`` (managers/schedule_batch.py) marks a request
    # to finish before it runs -- its input is too long (``validate_input_length`` at intake),
    # the session controller rejects it, or it is aborted while waiting for its grammar -- and
    # turns it into a 1-token stub (``origin_input_ids = [0]``, ``to_finish`` set) that still
    # goes through one scheduling pass: ``init_next_round_input`` -> the cache's match ->
    # ``StreamingSession.find_active_slot`` (session/streaming_session.py), which detaches a
    # ``to_finish`` request from its session (``session.abort_req()``, ``req.session = None``)
    # and hands it no slot; the stub is admitted as a plain request, runs its one forward and
    # is finished with its ``FINISH_ABORT`` (a plain release).  The session's slot must come
    # out of it as it went in (SGLang #22273: 0.5.10.post1 lends the stub the slot).
    PRE_ABORT_RID = -100  # the stub's request id: PRE_ABORT_RID - sid (plain ids are >= 0)

    def pre_abort_turn(self, sid: int) -> str:
        sess = self._idle(sid)
        if sess.committed is None:
            raise Skip(f"s{sid} holds no slot for a pre-aborted turn to restore")
        stub = SessionReq(self.PRE_ABORT_RID - sid, [0], session_id=sid, to_finish=True)
        before = self._slot_record(sid)
        try:
            m = self.cache.try_match_prefix(stub, [])  # token_ids = fill[:-1] of a 1-token stub
        except PrefixShrank as shrank:  # the append-only assert fired on the lent slot
            self._slot_lent(sid, shrank.prefix_len, before,
                            f"the append-only assert fired (prefix_len {shrank.prefix_len} < "
                            f"cache_protected_len {shrank.cache_protected_len})")
        if m is not None:
            self._slot_lent(sid, m.prefix_len, before, "the match returned the slot")
        after = self._slot_record(sid)
        if after is None:  # the release dropped the slot for the stub: the next turn
            self.reached("pre-abort-released")  # re-prefills (it holds nothing, see check)
            sess.committed, sess.lock, sess.row = None, None, None
        elif after != before:
            self._slot_lent(sid, 0, before, f"the slot changed to {after}")
        else:
            self.reached("pre-abort-detached")
        out = self.admit(stub.rid, list(stub.tokens))  # the stub: a plain 1-token request
        if stub.rid in self.requests:
            out += "; " + self.abort(stub.rid)  # finished with its FINISH_ABORT
        if after is not None and self._slot_record(sid) != before:
            self._slot_lent(sid, 0, before, f"the stub's run changed the slot to "
                            f"{self._slot_record(sid)}")
        kept = "slot kept" if after is not None else "slot released"
        return f"pre-aborted turn detached from s{sid} ({kept}); stub: {out}"

    def _slot_record(self, sid: int) -> tuple | None:
        """(row, C, A, P, the row's first A pool ids) of ``sid``'s slot; None without one."""
        slot = self.cache.slots.get(sid)
        if slot is None or slot.row is None:
            return None
        row = self.cache.req_to_token.get(slot.row, [])
        return (slot.row, slot.kv_committed_len, slot.kv_allocated_len,
                slot.cache_protected_len, tuple(row[:slot.kv_allocated_len]))

    def _slot_lent(self, sid: int, prefix_len: int, before, how: str) -> None:
        row, c, a, p, _ = before
        fail("session-prefix", f"session s{sid}: a turn marked to finish before it runs "
             f"(to_finish, a 1-token stub) was matched against the session's slot (row {row}, "
             f"kv_committed_len {c}, kv_allocated_len {a}, cache_protected_len {p}) -- {how}: "
             f"the stub resumes the slot at {prefix_len} and its prefill overwrites the slot's "
             "row from there, so the next turn would not resume the last finished turn's "
             f"{c} committed positions (SGLang #22273)", session=f"s{sid}",
             prefix_len=prefix_len, slot_committed=c)

    # -- batch admission (caches/subjects/lifecycle.py's enqueue / schedule) ------------------
    # A streaming turn is a ``Req`` of the scheduler's waiting queue like any other: SGLang
    # 0.5.23 ``session/session_controller.py`` ``Session.create_req`` (lines 205-300) builds
    # its input (history + appended tokens) on arrival and marks the session busy; a later
    # ``get_new_batch_prefill`` (``managers/scheduler.py`` lines 4079-4300) matches it in
    # ``init_next_round_input`` -- the session-aware match: slot restored, tail past the prefix
    # freed (``session/streaming_session.py`` ``try_match_prefix``, lines 97-155) -- and
    # ``PrefillAdder.add_one_req`` judges it against the same budget as the plain requests
    # (its extend = len(fill) - prefix_len).  The budget's evictable count is the tree's
    # (``mem_cache/prefill_budget.py`` lines 90-97): a slot's KV is neither free nor
    # evictable.  Request-pool rows: before each candidate is matched the pass stops when
    # the admitted requests already fill the free rows plus the rows they hold themselves
    # (``scheduler.py`` lines 4027-4050 and 4222-4233: a resumed turn borrows its slot's
    # row, a first turn or a plain request takes a fresh one at its extend).
    def enqueue_turn(self, sid: int, tokens: list[int], max_new: int) -> str:
        self._takes("schedule")
        sess = self._idle(sid)
        req = SessionReq(-sid, self.cache.build_turn_input(sess.history, tokens),
                         max_new=max_new, session_id=sid)
        sess.queued = self.waiting[req.rid] = req
        return f"s{sid}'s turn waits with {len(req.tokens)} tokens ({len(self.waiting)} waiting)"

    def _label(self, req) -> str:
        sid = getattr(req, "session_id", None)
        return super()._label(req) if sid is None else f"s{sid}'s turn"

    def _budget(self):
        budget = self.admission_rule()(
            self.page_size, self._free_and_evictable,
            running_reservation(list(self.requests.values())
                                + [s.turn for s in self.sessions.values() if s.turn]))
        budget.fresh_rows = 0  # rows the pass's admissions take at their extend
        return budget

    def _free_and_evictable(self) -> int:
        """What the budget reads: free tokens + the tree's evictable tokens (the cache's
        ``admission_evictable``; an engine's session cache: its ``evictable_size_``)."""
        evictable = getattr(self.cache, "admission_evictable", None)
        return self.free_tokens() + (evictable() if evictable is not None
                                     else self.cache.evictable_size_)

    def admit_one(self, req, budget, admitted: int):
        if budget.fresh_rows >= self.rows.available_size():
            self.reached("rows-full")  # SGLang: batch_is_full, the pass stops
            return None
        pinned = super().admit_one(req, budget, admitted)
        if pinned is not None and pinned[2] is None:
            budget.fresh_rows += 1
        return pinned

    def _pin(self, req, admitted: int):
        """(prefix KV ids, locked node, the resumed slot's prefix length -- None: the
        request takes a fresh row --, the slot's allocated length before the match)."""
        if not isinstance(req, SessionReq):
            return (*super()._pin(req, admitted), None, 0)
        sess = self.sessions[req.session_id]
        before = self._slot_allocated(sess.sid)
        prefix = self._resume(sess, req)
        if prefix is None:
            match = self._lock_tree_prefix(sess, req)
            return match.indices, match.last_node, None, before
        return req.kv_indices[:prefix], None, prefix, before

    def _unpin(self, req, pinned) -> None:
        if pinned[2] is None:  # a resumed slot's KV stays the slot's (tail already freed)
            self.cache.dec_lock_ref(pinned[1])

    def _extend(self, req, pinned) -> str | None:
        row = None
        if pinned[2] is None:
            row = self.cache.alloc_row()
            if row is None:
                return f"{self._label(req)}'s request-pool row"
        if not isinstance(req, SessionReq):
            failed = super()._extend(req, pinned[:2])
            if not failed:
                self.plain_rows[req.rid] = row
            return failed
        sess = self.sessions[req.session_id]
        sess.queued = None
        self.reached("turn-scheduled")
        if row is None:
            prefix = pinned[2]
            self._note_resumed(prefix, pinned[3])
        else:
            prefix = self._take_row(req, row, pinned[0], pinned[1])
        if not self._prefill_turn(sess, req, prefix):
            return f"{self._label(req)}'s prefill of {len(req.tokens) - prefix} tokens"
        if row is not None:
            self._first_turn_placed(sess, row, prefix)
        return None

    def _decode_step(self, req) -> bool:
        if isinstance(req, SessionReq):
            return self._forward(req, 0, 0)
        return super()._decode_step(req)

    def _first_decode(self, batch) -> str:
        if len(batch) > 1 and any(isinstance(r, SessionReq) for r, _ in batch):
            self.reached("batch-with-turn")
        return super()._first_decode(batch)

    # -- views and checks -----------------------------------------------------------------
    def held_locks(self) -> Counter:
        held = super().held_locks()
        for sess in self.sessions.values():  # a saved slot's lock, then the turn's node
            if sess.committed is not None:
                node = sess.lock
                if isinstance(node, TreeNode):
                    held[node.id] += 1
            turn = sess.turn
            if turn is not None:
                node = turn.last_node
                if isinstance(node, TreeNode):
                    held[node.id] += 1
        return held

    def _session_shares(self):
        """Per session: (row list, protected len, allocated len, committed len, tokens)."""
        out = {}
        for sid, sess in self.sessions.items():
            if sess.row is None:
                continue
            row = self.cache.req_to_token.get(sess.row, [])
            slot = self.cache.slots.get(sid)
            req = sess.turn
            if slot is not None:
                protected = slot.cache_protected_len
                allocated = max(slot.kv_allocated_len, len(row) if req is not None else 0)
            else:
                protected = req.cache_protected_len if req is not None else 0
                allocated = len(row)
            if req is not None:
                committed, tokens = req.filled, req.tokens
            else:
                committed, tokens = sess.committed or 0, sess.history
            out[sid] = (row, protected, allocated, committed, tokens)
        return out

    def check(self) -> None:
        """Every invariant after every op.  On the reference cache the fast verdict
        (``streaming_session_fast.py``) answers first, and then only the policy checks run;
        when it sees anything wrong the view is built and every check runs, to say what
        broke."""
        if self.fast_check and isinstance(self.cache, StreamingSessionCache) \
                and streaming_session_fast_ok(self):
            self.check_policy()
            return
        tree = self.tree_view()
        self.check_tree(tree)
        slots = self.tree_slots(tree)
        check_held_once(self.pool.name, "the tree", slots)
        pages = self.pool.pages_of
        owners = {"tree": pages(slots)}
        borrowed = {}
        in_flight = {}
        ps = self.page_size
        for rid, req in self.requests.items():
            owners[f"request r{rid}"] = pages(req.own_indices)
            borrowed[f"request r{rid}"] = pages(req.borrowed_indices)
            in_flight[f"request r{rid}"] = (ceil_align(len(req.kv_indices), ps)
                                            - req.cache_protected_len)
        shares = self._session_shares()
        for sid, (row, protected, allocated, _, _) in shares.items():
            owners[f"session s{sid}"] = pages(row[protected:allocated])
            borrowed[f"session s{sid}"] = pages(row[:protected])
        check_conservation(self.pool.view(), owners, borrowed)
        row_owners = {f"request r{rid}": [row] for rid, row in self.plain_rows.items()}
        row_owners.update({f"session s{sid}": [s.row] for sid, s in self.sessions.items()
                           if s.row is not None})
        check_conservation(self.rows.view(), row_owners)
        check_session_accounting(
            self.pool.name, self.pool.num_pages * ps, self.pool.available_size(),
            self.cache.evictable_size_ + self.cache.protected_size_,
            {f"session s{sid}": (a, p) for sid, (_, p, a, _, _) in shares.items()},
            in_flight, ps)
        if self.checking:
            for sid, (row, _, _, committed, tokens) in shares.items():
                self.verify_data(self.pool, row[:committed], tokens,
                                 f"session s{sid} committed KV, ")

    def drain(self) -> None:
        for sess in self.sessions.values():  # a waiting turn holds nothing
            if sess.queued is not None:
                del self.waiting[sess.queued.rid]
                sess.queued = None
        for sid in sorted(self.sessions):
            if self.sessions[sid].turn is not None:
                self.finish_turn(sid)
            self.release_session(sid)
        super().drain()

    def check_quiescent(self) -> None:
        check_quiescence(self.tree_view(), [self.pool.view(), self.rows.view()], {"lock": 1})

    # -- the exhaustive search's state (kvcheck check) ------------------------------------------
    # cache attributes state() describes itself; any other scalar attribute (a fault's
    # private state) is kept as it is
    _CANON_SKIP = frozenset({"_next_id", "_clock", "page_size", "evictable_size_",
                             "protected_size_"})

    def state(self) -> TreeState:
        """The exhaustive search's state (``canon.py``): the radix part as
        ``RadixSubject.state``, and what the sessions add: request-pool rows (renamed by first
        appearance: plain requests, then sessions, then the cache's slots, then any other row,
        then the row free list), every row's contents (pages + offsets) and the fingerprints
        of its committed positions, each cache ``SessionSlot`` (row, C, A, P, locked node),
        the driver's model of each session (history, committed length, lock, row) and its
        in-flight turn (tokens, committed, allocated row, protected length, held node), the
        plain requests' rows, both free lists in order, both size counters, the
        evictable-leaf set, and any other scalar the cache carries (a fault's private state).
        Uncommitted positions (rejected drafts, the rest of a partial page) are left out:
        they are always written before they are committed or read."""
        cache, ps = self.cache, self.page_size
        virtual = getattr(cache, "virtual_node", None)
        data = self.pool.data.tolist()

        def node(n):
            return "virtual" if n is virtual and n is not None else Ref(n)

        def kv(xs):
            return ids("kv", xs, ps)

        committed: dict = {}  # row -> how many of its positions some owner counts committed

        def commit(r, c):
            if r is not None and c:
                committed[r] = max(committed.get(r, 0), c)

        sess = []
        for sid in sorted(self.sessions):
            s, t = self.sessions[sid], self.sessions[sid].turn
            turn = None if t is None else (
                tuple(t.tokens), t.filled, kv(t.kv_indices), t.cache_protected_len,
                node(t.last_node), one("rows", t.row), t.session_id, t.max_new, t.output)
            sess.append((s.sid, tuple(s.history), s.committed, node(s.lock), one("rows", s.row),
                         turn, s.queued is not None))
            commit(s.row, s.committed)
            if t is not None:
                commit(t.row, t.filled)
        slots = sorted(cache.slots.items())
        for _, x in slots:
            commit(x.row, x.kv_committed_len)
        rows = {r: (kv(xs), tuple(data[v] for v in xs[:committed.get(r, 0)]))
                for r, xs in cache.req_to_token.items()}
        return TreeState(
            cache.root_node,
            lambda n: (n.key, kv(n.value), tuple(data[v] for v in n.value), n.lock_ref,
                       Time((n.last_access_time, n.id))),
            (tuple((rid, tuple(r.tokens), kv(r.kv_indices),
                    tuple(data[v] for v in r.kv_indices[:r.filled]), r.filled,
                    r.cache_protected_len, node(r.last_node), one("rows", self.plain_rows.get(rid)),
                    r.max_new, r.output)
                   for rid, r in sorted(self.requests.items())),
             tuple((hid, node(n)) for hid, n in sorted(self.locks.items())),
             self.waiting_state(),
             tuple(sess),
             tuple((sid, one("rows", x.row), x.kv_committed_len, x.kv_allocated_len,
                    x.cache_protected_len, node(x.last_node)) for sid, x in slots),
             IdMap("rows", rows), ids("rows", self.rows.free_slots),
             ids("kv", self.pool.free_pages),
             Unordered(Ref(n) for n in cache.evictable_leaves),
             cache.evictable_size_, cache.protected_size_,
             tuple(sorted((k, v) for k, v in vars(cache).items()
                          if k not in self._CANON_SKIP and v is not None
                          and isinstance(v, (bool, int, float, str))))),
            is_node=lambda n: isinstance(n, TreeNode))

    def counters(self) -> dict:
        return {**super().counters(), "sessions": len(self.sessions),
                "slots": len(self.cache.slots), "free_rows": len(self.rows.free_slots)}

    def outline(self) -> str:
        lines = [super().outline()]
        for sid in sorted(self.sessions):
            sess = self.sessions[sid]
            slot = self.cache.slots.get(sid)
            desc = (f"slot row={slot.row} C={slot.kv_committed_len} A={slot.kv_allocated_len} "
                    f"P={slot.cache_protected_len} lock=#{getattr(slot.last_node, 'id', None)}"
                    f" row={list(self.cache.req_to_token.get(slot.row, []))}"
                    if slot is not None else "no slot")
            if sess.turn is not None:
                t = sess.turn
                desc += (f"; turn in flight: {t.filled}/{len(t.tokens)} committed, allocated "
                         f"{t.kv_allocated_len}, row={list(t.kv_indices)}")
            lines.append(f"s{sid}: {desc}; history {len(sess.history)} tokens")
        return "\n".join(lines)

