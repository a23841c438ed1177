"""The streaming-session variant: its op table, parameters, and ``StreamingSessionMachine``.

Up to three sessions live at once over one radix tree, one small paged token pool and a few
request-pool rows, next to plain requests that share the tree (they reuse sequences the
sessions produced).  Turns append 1-8 tokens from a three-token vocabulary; in-flight turns
decode plainly or speculatively (draft 1-3, accepted shrinking to 0), are retracted and
retried, finished or aborted; sessions are closed.  Turns and plain requests may also wait
and be admitted together by one ``schedule`` pass (``enqueue_turn``, ``enqueue``, the ``burst``
and ``turn_burst`` rules).  Slots are not evictable, so the pool runs
out and eviction, OOM and the tail frees are frequent.  Regimes: ``page_size`` 1 and 4.
"""

from __future__ import annotations

from caches.subjects.streaming_session import VOCAB
from state_machines.gen import (Among, Drawn, Fresh, Gen, Ints, Live, Lists, Scenario, Seq,
                                Shared, Tuples, remember, tokens)
from state_machines.lifecycle import MAX_WAITING, lifecycle, waiting_room
from state_machines.machine import KVMachine
from state_machines.ops import INT, TOKENS, OpSpec, OpTable
from state_machines.spec import Param, VariantSpec

APPEND = tokens(VOCAB, 1, 6)
MAX_SESSIONS = 2
# decode steps of a whole turn: (draft, accepted); draft 0 is a plain step
STEPS = Lists(Tuples((Ints(0, 3), Ints(0, 3))), max_size=2)
MAX_PLAIN = 2
WHOLE = 64  # rewind all of the history; evict everything


# The exhaustive search (``kvcheck check streaming-session``) uses two session ids (s1, s2)
# and one plain request id (r1).  Per session: open; a turn appending ``[0]`` (one token, a
# partial page at page_size > 1) or ``a+[1]`` with ``a`` = [0]*page_size (crosses a page, so a
# first turn puts a whole page in the tree); a plain decode step; speculative steps (draft 1 or
# 2, accepted 0: over-allocation above the committed length, and with draft 2 an overshoot past
# the finished length that finish trims); finish, retract-retry, mid-turn abort, close; and a
# rewinding turn (1 token, or all of the history) that the controller must reject.  Plain
# requests admit a sequence the sessions produce (s1's first-turn history ``[0, 0]``, s2's
# ``[0, 1]``, and ``a+a``), finish, abort; evict 1 token or everything; batch admission: a
# session's next turn ``[0]`` waits (per session), r1/r2 arrive with ``[0, 0]``, schedule.
# 35 ops at page_size 1 (``a+a`` is ``[0, 0]`` there), 36 at page_size 4.  Small regimes
# (``small_params``): a 4-slot pool at page_size 1 and a 3-page pool at page_size 4, both with
# 2 request-pool rows, so a session slot, a plain request and the tree compete for KV and for
# rows (OOM, eviction, "no free request row" are one or two ops away).
def appends(params):
    return [[0], [0] * params["page_size"] + [1]]


def plain_seqs(params):
    out: list[list[int]] = []
    for t in ([0, 0], [0, 1], [0] * (2 * params["page_size"])):
        if t not in out:
            out.append(t)
    return out


def sessions(d, busy: bool) -> list[int]:
    """Sessions with a turn in flight (``busy``), or idle ones (no turn in flight or
    waiting)."""
    # (a list comprehension sorted in place: these run a few times per step)
    out = [sid for sid, s in d.subject.sessions.items()
           if ((s.turn is not None) if busy else s.idle)]
    out.sort()
    return out


def idle_with_slot(d) -> list[int]:
    out = [sid for sid, s in d.subject.sessions.items() if s.idle and s.committed is not None]
    out.sort()
    return out


def _any_session(d, busy: bool) -> bool:
    """``bool(sessions(d, busy))`` without listing them (the preconditions ask this)."""
    for s in d.subject.sessions.values():
        if ((s.turn is not None) if busy else s.idle):
            return True
    return False


class Idle(Among):
    """An idle session to start a turn on (opening one first when none is idle and fewer
    than MAX_SESSIONS are open)."""

    def ready(self, d) -> bool:
        return len(d.subject.sessions) < MAX_SESSIONS or _any_session(d, False)

    def value(self, d, raw):
        if not _any_session(d, False):
            d.do("open_session", sid=d.new_id())
        return super().value(d, raw)


class Busy(Among):
    """A session with a turn in flight."""

    def ready(self, d) -> bool:
        return _any_session(d, True)


IDLE = Idle(lambda d: sessions(d, False))
BUSY = Busy(lambda d: sessions(d, True))
SLOT = Among(idle_with_slot)


def _remember_history(d, args, _result) -> None:
    sess = d.subject.sessions.get(args["sid"])
    if sess is not None:
        remember(d, sess.history)


def whole_turn(d, pick, tokens, steps):
    """A whole turn: start, a few plain or speculative decode steps, finish (several ops;
    the steps shrink away)."""
    sid = IDLE.value(d, {"pick": pick})
    d.do("turn", sid=sid, tokens=tokens)
    for draft, accepted in steps:
        if d.subject.sessions[sid].turn is None:
            return
        if draft == 0:
            d.do("decode", sid=sid, n=1)
        else:
            d.do("spec_decode", sid=sid, draft=draft, accepted=min(accepted, draft))
    if d.subject.sessions[sid].turn is not None:
        d.do("finish_turn", sid=sid)
        remember(d, d.subject.sessions[sid].history)


# batch admission: plain arrivals (the sequences plain requests admit) and waiting turns, one
# ``schedule`` admitting both against SGLang's budget (caches/subjects/streaming_session.py)
BATCH, BURST = lifecycle(VOCAB, lambda p: plain_seqs(p)[:1], retract=False)
BATCH = tuple(spec for spec in BATCH if spec.name in ("enqueue", "schedule"))


def turn_burst(d, pick, tokens, max_new, arrivals) -> None:
    """A session's next turn arrives with plain requests and one scheduling step takes them
    (a batch with a session turn in it)."""
    sid = IDLE.value(d, {"pick": pick})
    d.do("enqueue_turn", sid=sid, tokens=tokens, max_new=max_new)
    for toks in arrivals:
        if not waiting_room(d):
            break
        remember(d, toks)
        d.do("enqueue", rid=d.new_id(), tokens=list(toks), max_new=1)
    d.do("schedule", n=MAX_WAITING)


OPS = OpTable(
    OpSpec("open_session", {"sid": INT}, "open streaming session s{sid}",
           gen=Gen(sid=Fresh(), rule=False)),  # opened by the turns when no session is idle
    OpSpec("turn", {"sid": INT, "tokens": TOKENS},
           "turn on s{sid}: append {tokens}, match (logit reserve), allocate, prefill",
           gen=Gen(sid=IDLE, tokens=Seq(APPEND, small=appends))),
    OpSpec("decode", {"sid": INT, "n": INT}, "decode {n} step(s) of s{sid}'s turn",
           gen=Gen(sid=BUSY, n=Drawn(Ints(1, 4), small=(1,)))),
    OpSpec("spec_decode", {"sid": INT, "draft": INT, "accepted": INT},
           "speculative step of s{sid}: allocate {draft}+1, accept {accepted} (+1 bonus)",
           gen=Gen(sid=BUSY, draft=Drawn(Ints(1, 3), small=(1, 2)),
                   accepted=Drawn(Ints(0, 3), small=(0,)),
                   shape=lambda a: {**a, "accepted": min(a["accepted"], a["draft"])})),
    OpSpec("finish_turn", {"sid": INT}, "finish s{sid}'s turn (trim overshoot, save slot)",
           gen=Gen(sid=BUSY, after=_remember_history)),
    OpSpec("retract", {"sid": INT},
           "retract s{sid}'s turn (KV committed for the last token, slot saved) and retry it",
           gen=Gen(sid=BUSY)),
    OpSpec("abort_turn", {"sid": INT}, "abort s{sid}'s turn mid-processing (slot released)",
           gen=Gen(sid=BUSY)),
    OpSpec("release_session", {"sid": INT}, "close s{sid} (release_session)",
           gen=Gen(sid=SLOT)),
    OpSpec("pre_abort_turn", {"sid": INT},
           "s{sid}'s next turn is marked to finish before it runs (set_finish_with_abort: a "
           "1-token stub) and is scheduled and aborted",
           gen=Gen(sid=SLOT)),
    OpSpec("rewind_turn", {"sid": INT, "rewind": INT, "tokens": TOKENS},
           "turn on s{sid} dropping the last {rewind} history tokens, then appending {tokens}"
           " (append-only: must be rejected)",
           gen=Gen(sid=SLOT, rewind=Drawn(Ints(1, 4), small=(1, WHOLE)),
                   tokens=Seq(APPEND, small=([0],)))),
    # plain requests sharing the tree: a sequence seen before (often a session's history)
    # minus its last ``cut`` tokens, plus ``extra``; just ``extra`` while nothing was seen
    OpSpec("admit", {"rid": INT, "tokens": TOKENS},
           "admit plain request r{rid} with tokens {tokens} (match, lock, allocate, prefill)",
           gen=Gen(rid=Fresh(small=(1,)), tokens=Shared(
               Ints(0, 12), APPEND, small=plain_seqs, remember=True, needs_seen=False),
               when=lambda d: len(d.live()) < MAX_PLAIN)),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (cache_finished_req)",
           gen=Gen(rid=Live(small=(1,)))),
    OpSpec("abort", {"rid": INT}, "abort r{rid}", gen=Gen(rid=Live(small=(1,)))),
    OpSpec("evict", {"n": INT}, "evict {n} tokens",
           gen=Gen(n=Drawn(Ints(1, 16), small=(1, WHOLE)),
                   when=lambda d: d.subject.cache.evictable_size_ > 0)),
    OpSpec("enqueue_turn", {"sid": INT, "tokens": TOKENS, "max_new": INT},
           "s{sid}'s next turn appends {tokens} (max_new_tokens {max_new}) and waits",
           gen=Gen(sid=IDLE, tokens=Seq(APPEND, small=lambda p: appends(p)[:1]),
                   max_new=Drawn(Ints(1, 4), small=(1,)), when=waiting_room)),
    *BATCH,
    scenarios=(Scenario("whole_turn", whole_turn,
                        {"pick": IDLE.draws["pick"], "tokens": APPEND, "steps": STEPS},
                        when=IDLE.ready),
               BURST,
               Scenario("turn_burst", turn_burst,
                        {"pick": IDLE.draws["pick"], "tokens": APPEND,
                         "max_new": Ints(1, 4),
                         "arrivals": Lists(tokens(VOCAB, 1, 8), max_size=MAX_WAITING - 1)},
                        when=lambda d: IDLE.ready(d) and waiting_room(d))),
    alphabet_key=lambda op: op.args.get("sid", MAX_SESSIONS + 1),  # session by session
)


class StreamingSessionMachine(KVMachine, ops=OPS):
    """Multi-turn streaming sessions and plain requests over one radix tree and token pool
    (rules: one per generator in ``OPS``)."""


SPEC = VariantSpec(
    name="streaming-session",
    summary="SGLang session-aware cache for multi-turn streaming sessions (session slots over "
            "the radix cache)",
    ops=OPS,
    params={"page_size": Param(1, 1, 64, "tokens per page"),
            "pool_pages": Param(40, 1, 4096, "pages in the token pool"),
            "req_rows": Param(6, 1, 1024, "rows in the request pool (req_to_token)")},
    machine=StreamingSessionMachine,
    regimes=({"page_size": 1, "pool_pages": 40}, {"page_size": 4, "pool_pages": 10}),
    sometimes=("slot-resumed", "tail-freed", "partial-page-continued", "retract-retry",
               "spec-draft-rejected", "spec-overshoot-trimmed", "abort-with-slot",
               "pre-abort-detached",
               "abort-first-turn", "first-turn-tree-hit", "rewind-rejected",
               "resume-out-of-memory", "prefix-hit", "shared-lock", "alloc-evicted",
               "out-of-memory", "turn-scheduled", "batch-with-turn", "batch-admitted",
               "admission-refused", "rows-full"),
    small_params=({"page_size": 1, "pool_pages": 4, "req_rows": 2},
                  {"page_size": 4, "pool_pages": 3, "req_rows": 2}),
)
