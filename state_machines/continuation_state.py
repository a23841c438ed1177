"""The continuation-state variant: its op table, parameters, and ``ContinuationStateMachine``.

One History group and one State group (window 4 tokens), 2 tokens per page (so L = 2), 10 pages
per pool.  Requests draw from a two-token alphabet and often continue an earlier conversation
(multi-turn), branch from an interior point of one, or join a live request at its current
terminal (``share``: the joiner borrows the continuation window, then one of the two may be
retracted and the other advanced past the window -- the C2/C3 situations), so snapshots are
shared, adopted and superseded; chunks of 2/4/8 tokens make several commits per request; the
pools are small, so admissions prune.  Regimes: State continuation-only (production shape)
and State required.  ``alphabet`` + ``small_params`` opt the variant in to ``kvcheck check``.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from caches.continuation_state import ContinuationStateCache
from caches.subjects.continuation_state import ContinuationStateSubject
from state_machines.machine import KVMachine
from state_machines.ops import INT, TOKENS, Op, OpSpec, OpTable
from state_machines.variants import Param, VariantSpec

OPS = OpTable(
    OpSpec("admit", {"rid": INT, "tokens": TOKENS, "chunk": INT},
           "admit r{rid} with tokens {tokens} in chunks of {chunk} (match, lock, acquire)"),
    OpSpec("step", {"rid": INT},
           "step r{rid}: compute its chunk, CommitChunk, acquire the next chunk"),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (release its tables)"),
    OpSpec("abort", {"rid": INT}, "abort r{rid}"),
    OpSpec("retract", {"rid": INT}, "retract r{rid} to host (keeps its tables)"),
    OpSpec("recover", {"rid": INT}, "recover r{rid} from host"),
    OpSpec("evict", {"n": INT}, "evict up to {n} unreferenced leaves (OnKVEvict)"),
)

MAX_TOKENS, MAX_EXTRA = 10, 6
# a token list is (length, bit pattern): token i = bit i.  Two draws instead of two per token
# (fewer choices for the shrinker), shrinking to short runs of zeros (shared prefixes)
LEN_ST = st.integers(1, MAX_TOKENS)
BITS_ST = st.integers(0, 2 ** MAX_TOKENS - 1)
EXTRA_LEN_ST = st.integers(1, MAX_EXTRA)
EXTRA_BITS_ST = st.integers(0, 2 ** MAX_EXTRA - 1)


def tokens_of(n: int, bits: int) -> list[int]:
    return [(bits >> i) & 1 for i in range(n)]


CHUNK_ST = st.sampled_from([4, 2, 8])  # shrinks towards 4
# requests live in numbered slots (rid = slot).  An op draws a slot and acts on the nearest
# slot (cyclically upwards) whose request can take it, so almost every drawn op does
# something, and deleting an unrelated request from a failing run rarely changes what the
# other ops act on (unlike a position among the live requests) -- short shrunk runs
SLOTS = 3
SLOT = st.integers(1, SLOTS)
# which live requests each lifecycle op applies to
LIFECYCLE = {
    "step": lambda r: r.active and r.computed < len(r.tokens),
    "retract": lambda r: r.active,
    "finish": lambda r: r.active and r.computed == len(r.tokens),
    "recover": lambda r: not r.active,
    "abort": lambda r: True,
}
# after ``share`` admits the joiner: retract nobody, the joiner, or the request it joined
THEN = ("none", "retract-joiner", "retract-joined")


def _nearest(slot: int, candidates) -> int | None:
    cands = sorted(candidates)
    if not cands:
        return None
    return next((c for c in cands if c >= slot), cands[0])


class ContinuationStateMachine(KVMachine):
    """Whole request lifecycles over the hybrid prefix cache."""

    def __init__(self):
        super().__init__()
        self.convo: dict[int, list[int]] = {}  # slot -> the tokens last admitted there

    def _admit(self, slot, tokens, chunk):
        free = [s for s in range(1, SLOTS + 1) if s not in self.subject.requests]
        rid = _nearest(slot, free) or slot  # all slots busy: the op is a no-op
        self.convo[rid] = list(tokens)
        self.do("admit", rid=rid, tokens=tokens, chunk=chunk)

    def _base(self, src: int) -> list[int]:
        return self.convo[_nearest(src, self.convo)] if self.convo else []

    # -- admissions -----------------------------------------------------------------------
    @rule(rid=SLOT, n=LEN_ST, bits=BITS_ST, chunk=CHUNK_ST)
    def admit(self, rid, n, bits, chunk):
        self._admit(rid, tokens_of(n, bits), chunk)

    @rule(rid=SLOT, src=SLOT, blocks=st.integers(0, 4), n=EXTRA_LEN_ST, bits=EXTRA_BITS_ST,
          chunk=CHUNK_ST)
    def turn(self, rid, src, blocks, n, bits, chunk):
        """A turn of an earlier conversation (the one last admitted in slot ``src``): with
        ``blocks == 0`` the next turn (all of it plus new tokens), else a branch from an
        interior L-block boundary ``blocks`` blocks before its end."""
        base = self._base(src)
        if blocks:
            base = base[:max(0, (len(base) - 1) // 2 - blocks) * 2]
        self._admit(rid, base + tokens_of(n, bits), chunk)

    @precondition(lambda self: len(self.subject.requests) < SLOTS
                  and any(r.node.depth for r in self.subject.requests.values()))
    @rule(src=SLOT, n=EXTRA_LEN_ST, bits=EXTRA_BITS_ST, chunk=CHUNK_ST,
          then=st.sampled_from(THEN), k=st.integers(0, 2))
    def share(self, src, n, bits, chunk, then, k):
        """A second request joins a live one at its current terminal: it is admitted with
        that request's computed prefix plus new tokens (so it hits the terminal and borrows its
        continuation window), then ``then`` retracts one of the two, and the other active one
        of the pair takes ``k`` steps (its commits may pass the window) -- the situations the
        #460 release gates exist for."""
        reqs = self.subject.requests
        joined = _nearest(src, [r for r in reqs if reqs[r].node.depth])
        a = reqs[joined]
        free = [s for s in range(1, SLOTS + 1) if s not in reqs]
        joiner = _nearest(src, free)
        self._admit(joiner, a.tokens[:a.node.depth] + tokens_of(n, bits), chunk)
        if joiner not in reqs:
            return  # refused
        mover = joined
        if then == "retract-joiner":
            self.do("retract", rid=joiner)
        elif then == "retract-joined" and reqs[joined].active:
            self.do("retract", rid=joined)
            mover = joiner
        for _ in range(k):
            if not LIFECYCLE["step"](reqs[mover]):
                break
            self.do("step", rid=mover)

    # -- lifecycle (on the nearest slot whose request can take the op; else a no-op) -------
    # step, finish and retract are rules of their own (recover/abort share one): with every
    # lifecycle op behind one rule, retract-then-step-another (C3) was reached in ~1% of
    # examples and finished requests blocked the slots
    @rule(rid=SLOT)
    def step(self, rid):
        self._act("step", rid)

    @rule(rid=SLOT)
    def finish(self, rid):
        self._act("finish", rid)

    @rule(rid=SLOT)
    def retract(self, rid):
        self._act("retract", rid)

    @rule(kind=st.sampled_from(("recover", "abort")), rid=SLOT)
    def other(self, kind, rid):
        self._act(kind, rid)

    def _act(self, kind, rid):
        reqs = self.subject.requests
        cands = [r for r in reqs if LIFECYCLE[kind](reqs[r])]
        self.do(kind, rid=_nearest(rid, cands) or rid)


def alphabet(params) -> list[Op]:
    """The exhaustive search's ops (``kvcheck check continuation-state``): request ids {1, 2},
    chunks of 4, and three token sequences over the L = 2 blocks: ``a`` = [0]*8 (a long turn:
    two commits, the second releasing the first's State), ``b`` = [0]*5 (a second request
    hitting ``a``'s terminal at 4, borrowing its window) and ``c`` = [0, 0] (a short one:
    C4's branch under a History-only anchor, C5's single commit).  Every lifecycle op for
    each id; ops that do not apply are skipped."""
    seqs = ([0] * 8, [0] * 5, [0, 0])
    rids = (1, 2)
    ops = [Op("admit", {"rid": r, "tokens": t, "chunk": 4}) for r in rids for t in seqs]
    ops += [Op(name, {"rid": r}) for name in ("step", "finish", "abort", "retract", "recover")
            for r in rids]
    ops += [Op("evict", {"n": 64})]
    return ops


def _build(params, cache_cls, device):
    return ContinuationStateSubject(cache_cls or ContinuationStateCache,
                                    state_required=bool(params["state_required"]),
                                    pool_pages=params["pool_pages"], window=params["window"],
                                    device=device)


SPEC = VariantSpec(
    name="continuation-state",
    summary="TokenSpeed paged radix tree with History/State cache groups and "
            "continuation-state snapshots",
    ops=OPS,
    params={"state_required": Param(0, 0, 1, "1: the State group is required (checkpointed "
                                             "at every L boundary), 0: continuation-only"),
            "pool_pages": Param(10, 2, 256, "pages in each group's pool"),
            "window": Param(4, 2, 64, "State window in tokens (a multiple of the page, 2)")},
    build=_build,
    machine=ContinuationStateMachine,
    regimes=({"state_required": 0}, {"state_required": 1}),
    alphabet=alphabet,
    # tiny pools: four pages per group hold one 8-token request; a second one prunes
    small_params=({"state_required": 0, "pool_pages": 4},
                  {"state_required": 1, "pool_pages": 4}),
    # reached in both regimes under the ci profile (the rarer ones -- admission-refused,
    # chunk-refused, prune-state, adopt-filled-state, release-kept-borrowed,
    # release-kept-for-retracted -- in one of them)
    sometimes=("prefix-hit", "adopted", "prune-snapshot", "retract", "recover",
               "state-released", "release-kept-shared", "release-kept-window",
               "terminal-complete", "terminal-state-present"),
)
