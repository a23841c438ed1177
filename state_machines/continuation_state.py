"""The continuation-state variant: its op table, parameters, and ``ContinuationStateMachine``.

One History group and one State group (window 4 tokens), 2 tokens per page (so L = 2), 10 pages
per pool.  Requests draw from a two-token alphabet and often continue an earlier conversation
(multi-turn) or branch from an interior point of one, so snapshots are shared, adopted and
superseded; chunks of 2/4/8 tokens make several commits per request; the pools are small, so
admissions prune.  Regimes: State continuation-only (production shape) and State required.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from caches.continuation_state import ContinuationStateCache
from caches.subjects.continuation_state import ContinuationStateSubject
from state_machines.machine import KVMachine
from state_machines.ops import INT, TOKENS, OpSpec, OpTable
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

VOCAB = 2
TOKENS_ST = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10)
EXTRA_ST = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)
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
    @rule(rid=SLOT, tokens=TOKENS_ST, chunk=CHUNK_ST)
    def admit(self, rid, tokens, chunk):
        self._admit(rid, tokens, chunk)

    @rule(rid=SLOT, src=SLOT, blocks=st.integers(0, 4), extra=EXTRA_ST, chunk=CHUNK_ST)
    def turn(self, rid, src, blocks, extra, chunk):
        """A turn of an earlier conversation (the one last admitted in slot ``src``): with
        ``blocks == 0`` the next turn (all of it plus new tokens), else a branch from an
        interior L-block boundary ``blocks`` blocks before its end."""
        base = self._base(src)
        if blocks:
            base = base[:max(0, (len(base) - 1) // 2 - blocks) * 2]
        self._admit(rid, base + extra, chunk)

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
    # reached in both regimes under the ci profile (the rarer ones -- admission-refused,
    # chunk-refused, prune-state, adopt-filled-state, release-kept-borrowed,
    # release-kept-for-retracted -- in one of them)
    sometimes=("prefix-hit", "adopted", "prune-snapshot", "retract", "recover",
               "state-released", "release-kept-shared", "release-kept-window",
               "terminal-complete", "terminal-state-present"),
)
