"""The continuation-state variant: its op table, parameters, and ``ContinuationStateMachine``.

One History group and one State group (window 4 tokens), 2 tokens per page (so L = 2), 10 pages
per pool.  Requests draw from a two-token alphabet and often continue an earlier conversation
(multi-turn), branch from an interior point of one, or join a live request at its current
terminal (``share``: the joiner borrows the continuation window, then one of the two may be
retracted and the other advanced past the window -- the C2/C3 situations), so snapshots are
shared, adopted and superseded; chunks of 2/4/8 tokens make several commits per request; the
pools are small, so admissions prune.  Batch admission (``state_machines/lifecycle.py``):
``enqueue`` + ``schedule`` (one round of TokenSpeed's scheduler: each waiting request secures
its pages, its first chunk cut to the round's token budget), driven in the machine by the
``burst`` scenario alone (one rule, not three, beside the seven that find C1-C5); the
lifecycle's ``decode`` and ``retract`` are not taken (requests end with their prompt; this
variant's retract keeps the tables).  Regimes: State continuation-only (production shape)
and State required.  ``alphabet`` + ``small_params`` opt the variant in to ``kvcheck check``.
"""

from __future__ import annotations

from state_machines.gen import Arg, Drawn, Gen, Ints, Sampled, Scenario
from state_machines.lifecycle import lifecycle
from state_machines.machine import KVMachine
from state_machines.ops import INT, TOKENS, OpSpec, OpTable
from state_machines.spec import Param, VariantSpec

MAX_TOKENS, MAX_EXTRA = 10, 6


def tokens_of(n: int, bits: int) -> list[int]:
    return [(bits >> i) & 1 for i in range(n)]


CHUNK = Drawn(Sampled((4, 2, 8)), small=(4,))  # shrinks towards 4
# requests live in numbered slots (rid = slot).  An op draws a slot and acts on the nearest
# slot (cyclically upwards) whose request can take it, so almost every drawn op does
# something, and deleting an unrelated request from a failing run rarely changes what the
# other ops act on (unlike a position among the live requests) -- short shrunk runs
SLOTS = 3
SLOT = Ints(1, SLOTS)
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
# the exhaustive search (``kvcheck check continuation-state``): request ids {1, 2}, chunks of
# 4, and three token sequences over the L = 2 blocks: ``a`` = [0]*8 (a long turn: two
# commits, the second releasing the first's State), ``b`` = [0]*5 (a second request hitting
# ``a``'s terminal at 4, borrowing its window) and ``c`` = [0, 0] (a short one: C4's branch
# under a History-only anchor, C5's single commit).  Every lifecycle op for each id; ops that
# do not apply are skipped.
SEQS = ([0] * 8, [0] * 5, [0, 0])


def _arrivals(params) -> list[list[int]]:
    """The exhaustive search's arrivals: ``b`` (hits ``a``'s terminal) and ``c``."""
    return [SEQS[1], SEQS[2]]


_LIFECYCLE, BURST = lifecycle(2, _arrivals, retract=False, max_len=MAX_TOKENS,
                              batch_rules=False)
ENQUEUE_SCHEDULE = tuple(s for s in _LIFECYCLE if s.name in ("enqueue", "schedule"))


def _nearest(slot: int, candidates) -> int | None:
    """The smallest candidate at or above ``slot``, else the smallest (None: no candidate)."""
    above = [c for c in candidates if c >= slot]
    return min(above) if above else min(candidates, default=None)


class FreeSlot(Arg):
    """The nearest free slot to the drawn one (the drawn one when all are busy: a no-op --
    ``share`` admits through it so).  As a rule's argument it is ready only while a slot is
    free: with every slot busy an admission was a no-op, and on the TokenSpeed target, whose
    requests live for several scheduler iterations, that was six admissions in ten --
    examples spent where TokenSpeed's F1 (a forced retraction, a restore, a request left
    waiting) needs length (``docs/benchmarks.md``, time to find)."""

    draws = {"rid": SLOT}
    small = (1, 2)

    def ready(self, d) -> bool:
        return len(d.subject.requests) < SLOTS

    def value(self, d, raw):
        reqs = d.subject.requests
        free = [s for s in range(1, SLOTS + 1) if s not in reqs]
        return _nearest(raw["rid"], free) or raw["rid"]


class Lifecycle(Arg):
    """The nearest slot to the drawn one whose request can take op ``kind`` (else the drawn
    one: a no-op)."""

    draws = {"rid": SLOT}
    small = (1, 2)

    def __init__(self, kind: str):
        self.kind = kind

    def value(self, d, raw):
        can = LIFECYCLE[self.kind]
        return _nearest(raw["rid"], [rid for rid, r in d.subject.requests.items() if can(r)]) \
            or raw["rid"]


class Bits(Arg):
    """A token list as (length, bit pattern): token i = bit i.  Two draws instead of two per
    token (fewer choices for the shrinker), shrinking to short runs of zeros (shared
    prefixes)."""

    small = SEQS

    def __init__(self, max_len: int):
        self.draws = {"n": Ints(1, max_len), "bits": Ints(0, 2 ** max_len - 1)}

    def value(self, d, raw):
        return tokens_of(raw["n"], raw["bits"])


class Continued(Bits):
    """A turn of an earlier conversation (the one last admitted in slot ``src``) plus new
    tokens: with ``blocks == 0`` the next turn (all of it), else a branch from an interior
    L-block boundary ``blocks`` blocks before its end."""

    def __init__(self):
        super().__init__(MAX_EXTRA)
        self.draws = {"src": SLOT, "blocks": Ints(0, 4), **self.draws}

    def value(self, d, raw):
        convo = d.notes.setdefault("convo", {})
        base = convo[_nearest(raw["src"], convo)] if convo else []
        if raw["blocks"]:
            base = base[:max(0, (len(base) - 1) // 2 - raw["blocks"]) * 2]
        return base + super().value(d, raw)


def _note_convo(d, args, _result) -> None:
    d.notes.setdefault("convo", {})[args["rid"]] = list(args["tokens"])


def _admit(d, slot, toks, chunk) -> None:
    args = {"rid": FreeSlot().value(d, {"rid": slot}), "tokens": toks, "chunk": chunk}
    _note_convo(d, args, None)
    d.do("admit", **args)


def share(d, src, n, bits, chunk, then, k):
    """A second request joins a live one at its current terminal: it is admitted with that
    request's computed prefix plus new tokens (so it hits the terminal and borrows its
    continuation window), then ``then`` retracts one of the two, and the other active one of
    the pair takes ``k`` steps (its commits may pass the window) -- the situations the #460
    release gates exist for."""
    reqs = d.subject.requests
    joined = _nearest(src, [r for r in reqs if reqs[r].node.depth])
    a = reqs[joined]
    joiner = _nearest(src, [s for s in range(1, SLOTS + 1) if s not in reqs])
    _admit(d, joiner, a.tokens[:a.node.depth] + tokens_of(n, bits), chunk)
    if joiner not in reqs:
        return  # refused
    mover = joined
    if then == "retract-joiner":
        d.do("retract", rid=joiner)
    elif then == "retract-joined" and reqs[joined].active:
        d.do("retract", rid=joined)
        mover = joiner
    for _ in range(k):
        if not LIFECYCLE["step"](reqs[mover]):
            break
        d.do("step", rid=mover)


def other(d, kind, rid):
    """Recover or abort the nearest request that can take it; a recover with nothing
    retracted is an idle tick instead: OnKVEvict of up to ``rid`` leaves.  (Evict rides on
    a draw that was a no-op: a rule of its own changed what the ci budget finds -- C4 was
    missed and C1/C2 shrank worse.)"""
    reqs = d.subject.requests
    if kind == "recover" and not any(LIFECYCLE["recover"](r) for r in reqs.values()):
        d.do("evict", n=rid)
    else:
        d.do(kind, rid=Lifecycle(kind).value(d, {"rid": rid}))


# step, finish and retract are rules of their own (recover/abort share one, ``other``): with
# every lifecycle op behind one rule, retract-then-step-another (C3) was reached in ~1% of
# examples and finished requests blocked the slots
OPS = OpTable(
    OpSpec("admit", {"rid": INT, "tokens": TOKENS, "chunk": INT},
           "admit r{rid} with tokens {tokens} in chunks of {chunk} (match, lock, acquire)",
           gen=(Gen(rid=FreeSlot(), tokens=Bits(MAX_TOKENS), chunk=CHUNK, after=_note_convo),
                Gen("turn", rid=FreeSlot(), tokens=Continued(), chunk=CHUNK,
                    after=_note_convo))),
    OpSpec("step", {"rid": INT},
           "step r{rid}: compute its chunk, CommitChunk, acquire the next chunk",
           gen=Gen(rid=Lifecycle("step"))),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (release its tables)",
           gen=Gen(rid=Lifecycle("finish"))),
    OpSpec("abort", {"rid": INT}, "abort r{rid}", gen=Gen(rid=Lifecycle("abort"), rule=False)),
    OpSpec("retract", {"rid": INT}, "retract r{rid} to host (keeps its tables)",
           gen=Gen(rid=Lifecycle("retract"))),
    OpSpec("recover", {"rid": INT}, "recover r{rid} from host",
           gen=Gen(rid=Lifecycle("recover"), rule=False)),
    OpSpec("evict", {"n": INT}, "evict up to {n} unreferenced leaves (OnKVEvict)",
           gen=Gen(n=Drawn(Ints(1, SLOTS), small=(64,)), rule=False)),  # by ``other``
    *ENQUEUE_SCHEDULE,
    scenarios=(
        Scenario("share", share, {"src": SLOT, "n": Ints(1, MAX_EXTRA),
                                  "bits": Ints(0, 2 ** MAX_EXTRA - 1), "chunk": CHUNK.draw,
                                  "then": Sampled(THEN), "k": Ints(0, 2)},
                 when=lambda d: len(d.subject.requests) < SLOTS
                 and any(r.node.depth for r in d.subject.requests.values())),
        Scenario("other", other, {"kind": Sampled(("recover", "abort")), "rid": SLOT}),
        BURST,
    ),
)


class ContinuationStateMachine(KVMachine, ops=OPS):
    """Whole request lifecycles over the hybrid prefix cache (rules: one per generator and
    scenario in ``OPS``)."""


SPEC = VariantSpec(
    name="continuation-state",
    summary="TokenSpeed paged radix tree with History/State cache groups and "
            "continuation-state snapshots",
    ops=OPS,
    params={"state_required": Param(0, 0, 1, "1: the State group is required (checkpointed "
                                             "at every L boundary), 0: continuation-only"),
            "pool_pages": Param(10, 2, 256, "pages in each group's pool"),
            "window": Param(4, 2, 64, "State window in tokens (a multiple of the page, 2)")},
    machine=ContinuationStateMachine,
    regimes=({"state_required": 0}, {"state_required": 1}),
    # tiny pools: four pages per group hold one 8-token request; a second one prunes
    small_params=({"state_required": 0, "pool_pages": 4},
                  {"state_required": 1, "pool_pages": 4}),
    # reached in both regimes under the ci profile (the rarer ones -- admission-refused,
    # chunk-refused, prune-state, adopt-filled-state, release-kept-borrowed,
    # release-kept-for-retracted -- in one of them)
    sometimes=("prefix-hit", "adopted", "prune-snapshot", "retract", "recover",
               "state-released", "release-kept-shared", "release-kept-window",
               "terminal-complete", "terminal-state-present", "batch-admitted"),
)
