"""The paged-bigpage variant: LightLLM's linear-attention paged radix cache.

Prompts draw from a two-token vocabulary and often extend a prompt seen before, so hash pages
are shared, small and big nodes coexist, and matches hit, miss and trim; the KV pool and the
small-buffer pool are tiny, so eviction and small-buffer stealing are routine.  Prefill goes
chunk by chunk (a chunk stops at the next big boundary and at the cache length), so big-page
buffers accumulate on a request before it inserts, and pause/abort can land mid-prefill.
Past the prefill (``state_machines/lifecycle.py``): ``decode`` (a KV slot per token, the
output never cached), ``enqueue`` + ``schedule`` (LightLLM's router admits a batch against its
peak-token estimate, then each is matched, prefilled and decoded a step) and the ``burst``
scenario; ``retract`` is declined (LightLLM retracts by pause / resume).

Regimes: small pages only (upstream's default ``big_page_num`` = 10^7) and big pages on
(``big_page_num`` = 2, a big page = 4 tokens with ``hash_page_size`` 2).
"""

from __future__ import annotations

from state_machines.gen import (Among, Drawn, Fresh, Gen, Ints, Scenario, Seq, Shared, Live,
                                remember, tokens)
from state_machines.lifecycle import lifecycle
from state_machines.machine import KVMachine
from state_machines.ops import INT, TOKENS, OpSpec, OpTable
from state_machines.spec import Param, VariantSpec

VOCAB = 2
MAX_PROMPT = 12
WHOLE = 64  # "the rest": up to the next big boundary / the cache length; evict everything
PROMPT = tokens(VOCAB, 1, MAX_PROMPT)
# chunk sizes shrink towards the largest chunk (a chunk stops at big boundaries anyway)
CHUNK = Ints(0, 7).map(lambda k: 8 - k)


def prompts(params) -> list[list[int]]:
    """The exhaustive search's prompts (``kvcheck check paged-bigpage``): a few all-zero
    prompts (so they share hash pages) plus one branch, over ``P`` = hash_page_size and
    ``BT`` = P * big_page_num:

    * ``z(P+1)``: one hashed page (a small node with the tail buffer; with big pages on, a
      small hit that copies its tail and derefs to the root -- L4; a miss under a big node);
    * ``z(2P+1)``: two hashed pages; its first page is bufferless, so ``z(P+1)`` then trims to
      empty (L3); with ``BT`` = 2P a big node, and a big-page hit;
    * ``[1]*(P+1)``: a second child of the root (LRU order across subtrees, the tree
      emptying only after both go);
    * ``z(P) + [1]*(P+1)``: shares page 1 with the others, branches at page 2;
    * with big pages on, ``z(2BT+1)`` if it fits: two big boundaries, so pause/abort after
      the first leaves a pending big id for branch C (L5).

    With request ids {1, 2}, prefill n in {P, 64} (one page, or up to the next big boundary /
    the cache length), match of each distinct page-aligned key (``keys``), evict n in
    {1, 64}."""
    P, N, max_len = params["hash_page_size"], params["big_page_num"], params["max_req_total_len"]
    BT = P * N

    def z(n):
        return [0] * n

    out: list[list[int]] = []
    cands = [z(P + 1), z(2 * P + 1), z(P) + [1] * (P + 1), [1] * (P + 1)]
    if BT <= max_len:
        cands.append(z(2 * BT + 1))
    for t in cands:
        if 1 <= len(t) <= max_len and t not in out:
            out.append(t)
    return out


def keys(params) -> list[list[int]]:
    """The page-aligned keys of ``prompts`` (the exhaustive search's matches)."""
    P, out = params["hash_page_size"], []
    for t in prompts(params):
        k = t[:len(t) // P * P]
        if k and k not in out:
            out.append(k)
    return out


def arrivals(params) -> list[list[int]]:
    """The exhaustive search's arrivals: one hashed page plus the last token (``z(P+1)``,
    which shares its page with the prompts above)."""
    return [[0] * (params["hash_page_size"] + 1)]


LIFECYCLE, BURST = lifecycle(VOCAB, arrivals, retract=False)


def running(d) -> list[int]:
    return [r for r in d.live() if not d.subject.requests[r].paused]


def paused(d) -> list[int]:
    return [r for r in d.live() if d.subject.requests[r].paused]


# a request op acts on pick 0 = the newest request: a shrunk trace keeps working on the
# request it just admitted when earlier ones are deleted
RUNNING = Among(running, newest=True)


def _prefill(d, rid: int, chunks: int) -> None:
    for _ in range(chunks):
        req = d.subject.requests.get(rid)
        if req is None or req.cur_kv_len >= req.total_len:
            break
        if d.do("prefill", rid=rid, n=8).startswith("waits"):
            break


def serve(d, tokens):
    """A whole request: admit, prefill chunk by chunk, finish (grows the tree quickly)."""
    remember(d, tokens)
    rid = d.new_id()
    d.do("admit", rid=rid, tokens=tokens)
    _prefill(d, rid, len(tokens))
    d.do("finish", rid=rid)


def hold(d, tokens, chunks):
    """Admit a long prompt and prefill up to ``chunks`` chunks of it, leaving it live (mid
    prefill, or waiting to decode): steers towards KV pressure (prefills wait, resumes stay
    paused) and towards requests holding pending big-page buffers."""
    remember(d, tokens)
    rid = d.new_id()
    d.do("admit", rid=rid, tokens=tokens)
    _prefill(d, rid, chunks)


OPS = OpTable(
    OpSpec("admit", {"rid": INT, "tokens": TOKENS},
           "admit r{rid} with prompt {tokens} (match the hashed pages, hold the hit)",
           gen=(Gen(rid=Fresh(), tokens=Seq(PROMPT, small=prompts, remember=True)),
                Gen("admit_sharing", rid=Fresh(), tokens=Shared(
                    Ints(0, MAX_PROMPT), tokens(VOCAB, 0, 6), small=prompts, remember=True,
                    clip=MAX_PROMPT, empty=[0])))),
    OpSpec("prefill", {"rid": INT, "n": INT},
           "prefill one chunk of up to {n} tokens of r{rid} (state copied at boundaries)",
           gen=Gen(rid=RUNNING, n=Drawn(CHUNK, small=lambda p: sorted(
               {p["hash_page_size"], WHOLE})))),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (free_a_req_mem: insert, release)",
           gen=Gen(rid=RUNNING)),
    OpSpec("abort", {"rid": INT}, "abort r{rid} (free_a_req_mem)",
           gen=Gen(rid=Live(newest=True))),
    OpSpec("pause", {"rid": INT}, "pause r{rid} (free_a_req_mem, keep it waiting)",
           gen=Gen(rid=RUNNING)),
    OpSpec("resume", {"rid": INT}, "resume paused r{rid} (match again)",
           gen=Gen(rid=Among(paused, newest=True))),
    OpSpec("match", {"tokens": TOKENS}, "match {tokens} and release what it holds",
           gen=Gen(tokens=Seq(PROMPT, small=keys))),
    OpSpec("evict", {"n": INT}, "evict {n} tokens",
           gen=Gen(n=Drawn(Ints(1, 16), small=(1, WHOLE)))),
    OpSpec("evict_small_buffer", {},
           "free one small state buffer under buffer pressure (free_one_small_page_...)",
           gen=Gen()),
    *LIFECYCLE,
    scenarios=(BURST,
               Scenario("serve", serve, {"tokens": PROMPT}),
               Scenario("hold", hold, {"tokens": tokens(VOCAB, MAX_PROMPT // 2, MAX_PROMPT),
                                       "chunks": Ints(1, 3)})),
)


class PagedBigPageMachine(KVMachine, ops=OPS):
    """Request lifecycles (chunked prefill, pause/resume) and the bare cache API (rules: one
    per generator in ``OPS``)."""


# tiny pools for the exhaustive search: 8 KV slots (two big pages), one small buffer (every
# tail buffer after the first steals), prompts up to 9 tokens; small pages only, and big pages on
SMALL = {"hash_page_size": 2, "kv_tokens": 8, "small_buffers": 1, "max_req_total_len": 9}


SPEC = VariantSpec(
    name="paged-bigpage",
    summary="LightLLM linear-attention paged radix cache (small pages, big pages, state "
            "buffers)",
    ops=OPS,
    params={
        "hash_page_size": Param(2, 1, 64, "tokens per hash page (P)"),
        "big_page_num": Param(10_000_000, 1, 10_000_000,
                              "pages per big page (N); upstream default 10^7 = big pages off"),
        "kv_tokens": Param(24, 4, 4096, "KV token slots"),
        "small_buffers": Param(2, 1, 1024, "small-page state buffers"),
        "max_req_total_len": Param(16, 2, 4096,
                                   "longest request; big pages are off when P*N exceeds it"),
    },
    machine=PagedBigPageMachine,
    regimes=({}, {"big_page_num": 2}),
    small_params=({**SMALL, "big_page_num": 10_000_000}, {**SMALL, "big_page_num": 2}),
    sometimes=("match-miss", "trim-to-empty", "small-page-hit", "big-page-hit",
               "small-hit-tail-copied", "deref-to-big-node", "deref-to-root",
               "big-boundary-crossed", "tail-small-buffer", "small-buffer-stolen",
               "evict-for-room", "cascade-eviction", "tree-emptied", "insert-to-big-boundary",
               "free-pending-big-pages", "paused-resumed", "out-of-memory", "batch-admitted",
               "admission-refused"),
)
