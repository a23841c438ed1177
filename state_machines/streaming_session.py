"""The streaming-session variant: its op table, parameters, and ``StreamingSessionMachine``.

Up to three sessions live at once over one radix tree, one small paged token pool and a few
request-pool rows, next to plain requests that share the tree (they reuse sequences the
sessions produced).  Turns append 1-8 tokens from a three-token vocabulary; in-flight turns
decode plainly or speculatively (draft 1-3, accepted shrinking to 0), are retracted and
retried, finished or aborted; sessions are closed.  Slots are not evictable, so the pool runs
out and eviction, OOM and the tail frees are frequent.  Regimes: ``page_size`` 1 and 4.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from caches.streaming_session import StreamingSessionCache
from caches.subjects.streaming_session import VOCAB, StreamingSessionSubject
from state_machines.machine import PICK, KVMachine
from state_machines.ops import INT, TOKENS, Op, OpSpec, OpTable
from state_machines.variants import Param, VariantSpec

OPS = OpTable(
    OpSpec("open_session", {"sid": INT}, "open streaming session s{sid}"),
    OpSpec("turn", {"sid": INT, "tokens": TOKENS},
           "turn on s{sid}: append {tokens}, match (logit reserve), allocate, prefill"),
    OpSpec("rewind_turn", {"sid": INT, "rewind": INT, "tokens": TOKENS},
           "turn on s{sid} dropping the last {rewind} history tokens, then appending {tokens}"
           " (append-only: must be rejected)"),
    OpSpec("decode", {"sid": INT, "n": INT}, "decode {n} step(s) of s{sid}'s turn"),
    OpSpec("spec_decode", {"sid": INT, "draft": INT, "accepted": INT},
           "speculative step of s{sid}: allocate {draft}+1, accept {accepted} (+1 bonus)"),
    OpSpec("finish_turn", {"sid": INT}, "finish s{sid}'s turn (trim overshoot, save slot)"),
    OpSpec("retract", {"sid": INT},
           "retract s{sid}'s turn (KV committed for the last token, slot saved) and retry it"),
    OpSpec("abort_turn", {"sid": INT}, "abort s{sid}'s turn mid-processing (slot released)"),
    OpSpec("release_session", {"sid": INT}, "close s{sid} (release_session)"),
    OpSpec("admit", {"rid": INT, "tokens": TOKENS},
           "admit plain request r{rid} with tokens {tokens} (match, lock, allocate, prefill)"),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (cache_finished_req)"),
    OpSpec("abort", {"rid": INT}, "abort r{rid}"),
    OpSpec("evict", {"n": INT}, "evict {n} tokens"),
)

TOKENS_ST = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)
MAX_SESSIONS = 2
# decode steps of a whole turn: (draft, accepted); draft 0 is a plain step
STEPS_ST = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=2)
MAX_PLAIN = 2


class StreamingSessionMachine(KVMachine):
    """Multi-turn streaming sessions and plain requests over one radix tree and token pool."""

    def __init__(self):
        super().__init__()
        self.seen: list[list[int]] = []

    def _remember(self, tokens):
        if tokens and tokens not in self.seen:
            self.seen.append(list(tokens))

    def _sessions(self, busy: bool) -> list[int]:
        return sorted(sid for sid, s in self.subject.sessions.items()
                      if (s.turn is not None) == busy)

    def _has_idle(self) -> bool:
        return bool(self._sessions(False))

    def _has_busy(self) -> bool:
        return bool(self._sessions(True))

    def _pick(self, busy: bool, pick: int) -> int:
        sids = self._sessions(busy)
        return sids[pick % len(sids)]

    # -- sessions ---------------------------------------------------------------------------
    def _idle_with_slot(self) -> list[int]:
        return sorted(sid for sid, s in self.subject.sessions.items()
                      if s.turn is None and s.committed is not None)

    @precondition(lambda self: self._has_idle() or len(self.subject.sessions) < MAX_SESSIONS)
    @rule(pick=PICK, tokens=TOKENS_ST)
    def turn(self, pick, tokens):
        """A turn on an idle session (opening one first when none is idle)."""
        if not self._has_idle():
            self.do("open_session", sid=self.new_id())
        self.do("turn", sid=self._pick(False, pick), tokens=tokens)

    @precondition(lambda self: self._has_idle() or len(self.subject.sessions) < MAX_SESSIONS)
    @rule(pick=PICK, tokens=TOKENS_ST, steps=STEPS_ST)
    def whole_turn(self, pick, tokens, steps):
        """A whole turn: start, a few plain or speculative decode steps, finish (several ops;
        the steps shrink away)."""
        if not self._has_idle():
            self.do("open_session", sid=self.new_id())
        sid = self._pick(False, pick)
        self.do("turn", sid=sid, tokens=tokens)
        for draft, accepted in steps:
            if self.subject.sessions[sid].turn is None:
                return
            if draft == 0:
                self.do("decode", sid=sid, n=1)
            else:
                self.do("spec_decode", sid=sid, draft=draft, accepted=min(accepted, draft))
        if self.subject.sessions[sid].turn is not None:
            self.do("finish_turn", sid=sid)
            self._remember(self.subject.sessions[sid].history)

    @precondition(lambda self: self._idle_with_slot())
    @rule(pick=PICK, rewind=st.integers(1, 4), tokens=TOKENS_ST)
    def rewind_turn(self, pick, rewind, tokens):
        sids = self._idle_with_slot()
        self.do("rewind_turn", sid=sids[pick % len(sids)], rewind=rewind, tokens=tokens)

    @precondition(_has_busy)
    @rule(pick=PICK, n=st.integers(1, 4))
    def decode(self, pick, n):
        self.do("decode", sid=self._pick(True, pick), n=n)

    @precondition(_has_busy)
    @rule(pick=PICK, draft=st.integers(1, 3), accepted=st.integers(0, 3))
    def spec_decode(self, pick, draft, accepted):
        self.do("spec_decode", sid=self._pick(True, pick), draft=draft,
                accepted=min(accepted, draft))

    @precondition(_has_busy)
    @rule(pick=PICK)
    def finish_turn(self, pick):
        sid = self._pick(True, pick)
        self.do("finish_turn", sid=sid)
        sess = self.subject.sessions.get(sid)
        if sess is not None:
            self._remember(sess.history)

    @precondition(_has_busy)
    @rule(pick=PICK)
    def retract(self, pick):
        self.do("retract", sid=self._pick(True, pick))

    @precondition(_has_busy)
    @rule(pick=PICK)
    def abort_turn(self, pick):
        self.do("abort_turn", sid=self._pick(True, pick))

    @precondition(lambda self: self._idle_with_slot())
    @rule(pick=PICK)
    def release_session(self, pick):
        sids = self._idle_with_slot()
        self.do("release_session", sid=sids[pick % len(sids)])

    # -- plain requests sharing the tree ------------------------------------------------------
    @precondition(lambda self: len(self.live()) < MAX_PLAIN)
    @rule(pick=PICK, cut=st.integers(0, 12), extra=st.lists(st.integers(0, VOCAB - 1),
                                                            min_size=1, max_size=6))
    def admit(self, pick, cut, extra):
        """A plain request: a sequence seen before (often a session's history) minus its last
        ``cut`` tokens, plus ``extra``; just ``extra`` while nothing was seen."""
        base = self.seen[pick % len(self.seen)] if self.seen else []
        tokens = base[: max(0, len(base) - cut)] + extra
        self._remember(tokens)
        self.do("admit", rid=self.new_id(), tokens=tokens)

    @precondition(lambda self: self.live())
    @rule(pick=PICK)
    def finish(self, pick):
        self.do("finish", rid=self.pick_live(pick))

    @precondition(lambda self: self.live())
    @rule(pick=PICK)
    def abort(self, pick):
        self.do("abort", rid=self.pick_live(pick))

    @precondition(lambda self: self.subject.cache.evictable_size_ > 0)
    @rule(n=st.integers(1, 16))
    def evict(self, n):
        self.do("evict", n=n)


def alphabet(params) -> list[Op]:
    """The exhaustive search's ops (``kvcheck check streaming-session``).

    Two session ids (s1, s2) and one plain request id (r1).  Per session: open; a turn
    appending ``[0]`` (one token, a partial page at page_size > 1) or ``a+[1]`` with ``a`` =
    [0]*page_size (crosses a page, so a first turn puts a whole page in the tree); a plain
    decode step; speculative steps (draft 1 or 2, accepted 0: over-allocation above the
    committed length, and with draft 2 an overshoot past the finished length that finish
    trims); finish, retract-retry, mid-turn abort, close; and a rewinding turn (1 token, or
    all of the history) that the controller must reject.  Plain requests admit a sequence
    the sessions produce (s1's first-turn history ``[0, 0]``, s2's ``[0, 1]``, and ``a+a``),
    finish, abort; evict 1 token or everything.  30 ops at page_size 1 (``a+a`` is
    ``[0, 0]`` there), 31 at page_size 4.  Small regimes (``small_params``): a 4-slot pool at
    page_size 1 and a 3-page pool at page_size 4, both with 2 request-pool rows, so a session
    slot, a plain request and the tree compete for KV and for rows (OOM, eviction, "no free
    request row" are one or two ops away)."""
    ps = params["page_size"]
    a = [0] * ps
    appends = [[0], a + [1]]
    sids, rid, whole = (1, 2), 1, 64
    ops: list[Op] = []
    for sid in sids:
        ops.append(Op("open_session", {"sid": sid}))
        ops += [Op("turn", {"sid": sid, "tokens": t}) for t in appends]
        ops.append(Op("decode", {"sid": sid, "n": 1}))
        ops += [Op("spec_decode", {"sid": sid, "draft": d, "accepted": 0}) for d in (1, 2)]
        ops += [Op(name, {"sid": sid}) for name in ("finish_turn", "retract", "abort_turn",
                                                    "release_session")]
        ops += [Op("rewind_turn", {"sid": sid, "rewind": r, "tokens": [0]})
                for r in (1, whole)]
    seqs: list[list[int]] = []
    for t in ([0, 0], [0, 1], a + a):
        if t not in seqs:
            seqs.append(t)
    ops += [Op("admit", {"rid": rid, "tokens": t}) for t in seqs]
    ops += [Op(name, {"rid": rid}) for name in ("finish", "abort")]
    ops += [Op("evict", {"n": n}) for n in (1, whole)]
    return ops


def _build(params, cache_cls, device):
    return StreamingSessionSubject(cache_cls or StreamingSessionCache,
                                   page_size=params["page_size"],
                                   pool_pages=params["pool_pages"],
                                   req_rows=params["req_rows"], device=device)


SPEC = VariantSpec(
    name="streaming-session",
    summary="SGLang session-aware cache for multi-turn streaming sessions (session slots over "
            "the radix cache)",
    ops=OPS,
    params={"page_size": Param(1, 1, 64, "tokens per page"),
            "pool_pages": Param(40, 1, 4096, "pages in the token pool"),
            "req_rows": Param(6, 1, 1024, "rows in the request pool (req_to_token)")},
    build=_build,
    machine=StreamingSessionMachine,
    regimes=({"page_size": 1, "pool_pages": 40}, {"page_size": 4, "pool_pages": 10}),
    sometimes=("slot-resumed", "tail-freed", "partial-page-continued", "retract-retry",
               "spec-draft-rejected", "spec-overshoot-trimmed", "abort-with-slot",
               "abort-first-turn", "first-turn-tree-hit", "rewind-rejected",
               "resume-out-of-memory", "prefix-hit", "shared-lock", "alloc-evicted",
               "out-of-memory"),
    alphabet=alphabet,
    small_params=({"page_size": 1, "pool_pages": 4, "req_rows": 2},
                  {"page_size": 4, "pool_pages": 3, "req_rows": 2}),
)
