"""The block-hash variant: its op table, parameters, and ``BlockHashMachine``.

Up to three requests at once over vLLM's block prefix cache: prompts from a two-token
vocabulary, often a sequence seen before (a prompt or a finished request's whole sequence,
decoded tokens included) cut and extended, so full blocks hit -- held by a live request or
waiting in the free queue to be revived.  Chunks of 1-8 tokens make several steps per
prefill; decode appends greedy tokens; the pool is small, so allocations evict cached blocks
from the LRU end and run out (the request waits, or is preempted and resumed).  The KV
connector's invalid-block report (``evict``) and ``reset_prefix_cache`` are ops too.
Batch admission (``state_machines/lifecycle.py``): ``enqueue`` + ``schedule`` (the waiting
loop of vLLM's ``Scheduler.schedule()``: a token budget, a running cap, and
``allocate_slots`` as the only KV test) and the ``burst`` scenario; the lifecycle's
``decode`` and ``retract`` are this variant's ``step`` and ``preempt``.
Regimes: block size 2 over 8 blocks, block size 4 over 10, and the hybrid regime (``HYBRID``:
a full-attention and a sliding-window group of window 4, block size 2, 14 blocks).
"""

from __future__ import annotations

from caches.subjects.block_hash import VOCAB
from state_machines.gen import (Among, Drawn, Fresh, Gen, Ints, Live, Sampled, Seq, Shared,
                                remember, tokens)
from state_machines.lifecycle import lifecycle
from state_machines.machine import KVMachine
from state_machines.ops import INT, TOKENS, OpSpec, OpTable
from state_machines.spec import Param, VariantSpec

MAX_LIVE = 3
# the hybrid regime: a full-attention and a sliding-window group (window 4 = two blocks of 2)
# over one pool of 14 blocks (13 usable: three requests of up to 16 tokens do not all fit)
HYBRID = {"block_size": 2, "num_blocks": 14, "window": 4}
CHUNK = Drawn(Sampled((4, 2, 8, 1)))


def _running(d, can_step=False):
    return sorted(r for r, q in d.subject.requests.items() if q.running
                  and (not can_step or q.computed < len(q.tokens)))


def _prefilled(d):
    return sorted(r for r, q in d.subject.requests.items()
                  if q.running and q.computed >= q.prompt_len)


def _preempted(d):
    return sorted(r for r, q in d.subject.requests.items() if not q.running)


def _remember_decoded(d, args, _result) -> None:
    """A request past its prefill: its sequence so far (decoded tokens included) can be
    shared by a later prompt."""
    req = d.subject.requests.get(args["rid"])
    if req is not None and req.computed > req.prompt_len:
        remember(d, req.tokens[:req.computed])


def _room(d) -> bool:
    return len(d.live()) < MAX_LIVE


def _arrivals(params) -> list[list[int]]:
    """An arrival of two full blocks plus a token (shares blocks with ``[0] * n`` prompts)."""
    return [[0] * (2 * params["block_size"] + 1)]


# decode and retract are step and preempt here: only the batch admission is taken
_LIFECYCLE, BURST = lifecycle(VOCAB, _arrivals, retract=False, max_len=10)
ENQUEUE_SCHEDULE = tuple(s for s in _LIFECYCLE if s.name in ("enqueue", "schedule"))


OPS = OpTable(
    OpSpec("admit", {"rid": INT, "tokens": TOKENS, "chunk": INT},
           "admit r{rid} with tokens {tokens} in chunks of {chunk} (get_computed_blocks, "
           "allocate_slots)",
           gen=(Gen(rid=Fresh(), tokens=Seq(tokens(VOCAB, 1, 10), remember=True), chunk=CHUNK,
                    when=_room),
                Gen("admit_sharing", rid=Fresh(), chunk=CHUNK, when=_room,
                    tokens=Shared(Ints(0, 8), tokens(VOCAB, 0, 4), remember=True)))),
    OpSpec("step", {"rid": INT}, "step r{rid}: allocate_slots for its next chunk, compute it",
           gen=Gen(rid=Among(lambda d: _running(d, True)), after=_remember_decoded)),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (free)",
           gen=Gen(rid=Among(_prefilled))),
    OpSpec("abort", {"rid": INT}, "abort r{rid} (free)", gen=Gen(rid=Live())),
    OpSpec("preempt", {"rid": INT}, "preempt r{rid} (free, recompute from 0 later)",
           gen=Gen(rid=Among(_running))),
    OpSpec("resume", {"rid": INT}, "resume preempted r{rid} (get_computed_blocks, "
           "allocate_slots)", gen=Gen(rid=Among(_preempted))),
    OpSpec("evict", {"n": INT}, "evict_blocks: the connector reports cached block #{n} invalid",
           gen=Gen(n=Drawn(Ints(0, 7)))),
    OpSpec("reset", {}, "reset_prefix_cache", gen=Gen()),
    *ENQUEUE_SCHEDULE,
    scenarios=(BURST,),
)


class BlockHashMachine(KVMachine, ops=OPS):
    """Whole request lifecycles over vLLM's hash-chained block prefix cache (rules: one per
    generator in ``OPS``)."""


class _BlockHashSpec(VariantSpec):
    def check_params(self, given, target=None) -> dict:
        """The declared ranges, and a window of 0 or at least 2 (a window of 1 token needs
        ``ceil(0 / block_size) = 0`` cached blocks for a hit: upstream caches no sliding block)."""
        out = super().check_params(given, target)
        if out.get("window") == 1:
            raise ValueError("window must be 0 (one full-attention group) or at least 2, got 1")
        return out


SPEC = _BlockHashSpec(
    name="block-hash",
    summary="vLLM v1 hash-chained block prefix cache (KVCacheManager + BlockPool: hash map, "
            "LRU free queue, revived blocks)",
    ops=OPS,
    params={"block_size": Param(2, 1, 64, "tokens per block"),
            "num_blocks": Param(8, 2, 4096, "blocks in the pool (block 0 is the null block)"),
            "max_len": Param(16, 1, 4096, "tokens per request at most (prompt + decode)"),
            "window": Param(0, 0, 4096, "sliding window in tokens: 0 = one full-attention "
                            "group; >= 2 adds a sliding-window group (vLLM's hybrid "
                            "coordinator)")},
    machine=BlockHashMachine,
    regimes=({"block_size": 2, "num_blocks": 8}, {"block_size": 4, "num_blocks": 10},
             HYBRID),
    sometimes=("prefix-hit", "revive", "shared-hit", "cached-evicted", "out-of-blocks",
               "preempt", "resumed", "evict-held", "reset", "reset-refused",
               "duplicate-hash", "batch-admitted", "admission-refused",
               "admission-refused-hit", "window-hit", "window-hit-nulls", "window-released"),
)
