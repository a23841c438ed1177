"""The paged-bigpage variant: LightLLM's linear-attention paged radix cache.

Prompts draw from a two-token vocabulary and often extend a prompt seen before, so hash pages
are shared, small and big nodes coexist, and matches hit, miss and trim; the KV pool and the
small-buffer pool are tiny, so eviction and small-buffer stealing are routine.  Prefill goes
chunk by chunk (a chunk stops at the next big boundary and at the cache length), so big-page
buffers accumulate on a request before it inserts, and pause/abort can land mid-prefill.

Regimes: small pages only (upstream's default ``big_page_num`` = 10^7) and big pages on
(``big_page_num`` = 2, a big page = 4 tokens with ``hash_page_size`` 2).
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from caches.paged_bigpage import LinearAttPagedRadixCache
from caches.subjects.paged_bigpage import PagedBigPageSubject
from state_machines.machine import PICK, KVMachine
from state_machines.ops import INT, TOKENS, Op, OpSpec, OpTable
from state_machines.variants import Param, VariantSpec

OPS = OpTable(
    OpSpec("admit", {"rid": INT, "tokens": TOKENS},
           "admit r{rid} with prompt {tokens} (match the hashed pages, hold the hit)"),
    OpSpec("prefill", {"rid": INT, "n": INT},
           "prefill one chunk of up to {n} tokens of r{rid} (state copied at boundaries)"),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (free_a_req_mem: insert, release)"),
    OpSpec("abort", {"rid": INT}, "abort r{rid} (free_a_req_mem)"),
    OpSpec("pause", {"rid": INT}, "pause r{rid} (free_a_req_mem, keep it waiting)"),
    OpSpec("resume", {"rid": INT}, "resume paused r{rid} (match again)"),
    OpSpec("match", {"tokens": TOKENS}, "match {tokens} and release what it holds"),
    OpSpec("evict", {"n": INT}, "evict {n} tokens"),
    OpSpec("evict_small_buffer", {},
           "free one small state buffer under buffer pressure (free_one_small_page_...)"),
)

VOCAB = 2
MAX_PROMPT = 12
TOKENS_ST = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=MAX_PROMPT)
# chunk sizes shrink towards the largest chunk (a chunk stops at big boundaries anyway)
CHUNK = st.integers(0, 7).map(lambda k: 8 - k)


class PagedBigPageMachine(KVMachine):
    def __init__(self):
        super().__init__()
        self.seen: list[list[int]] = []

    def _remember(self, tokens):
        if tokens not in self.seen:
            self.seen.append(list(tokens))

    def _shared(self, pick, cut, extra):
        base = self.seen[pick % len(self.seen)]
        return (base[: max(0, len(base) - cut)] + extra)[:MAX_PROMPT]

    @staticmethod
    def _newest(rids, pick):
        """Pick 0 is the newest request: a shrunk trace keeps working on the request it just
        admitted when earlier ones are deleted."""
        return rids[-1 - pick % len(rids)]

    def _running(self):
        return [r for r in self.live() if not self.subject.requests[r].paused]

    def _paused(self):
        return [r for r in self.live() if self.subject.requests[r].paused]

    # -- request lifecycle --------------------------------------------------------------------
    @rule(tokens=TOKENS_ST)
    def admit(self, tokens):
        self._remember(tokens)
        self.do("admit", rid=self.new_id(), tokens=tokens)

    @precondition(lambda self: self.seen)
    @rule(pick=PICK, cut=st.integers(0, MAX_PROMPT),
          extra=st.lists(st.integers(0, VOCAB - 1), max_size=6))
    def admit_sharing(self, pick, cut, extra):
        tokens = self._shared(pick, cut, extra) or [0]
        self._remember(tokens)
        self.do("admit", rid=self.new_id(), tokens=tokens)

    @rule(tokens=TOKENS_ST)
    def serve(self, tokens):
        """A whole request: admit, prefill chunk by chunk, finish (grows the tree quickly)."""
        self._remember(tokens)
        rid = self.new_id()
        self.do("admit", rid=rid, tokens=tokens)
        for _ in range(len(tokens)):
            req = self.subject.requests.get(rid)
            if req is None or req.cur_kv_len >= req.total_len:
                break
            if self.do("prefill", rid=rid, n=8).startswith("waits"):
                break
        self.do("finish", rid=rid)

    @rule(tokens=st.lists(st.integers(0, VOCAB - 1), min_size=MAX_PROMPT // 2,
                          max_size=MAX_PROMPT), chunks=st.integers(1, 3))
    def hold(self, tokens, chunks):
        """Admit a long prompt and prefill up to ``chunks`` chunks of it, leaving it live (mid
        prefill, or waiting to decode): steers towards KV pressure (prefills wait, resumes
        stay paused) and towards requests holding pending big-page buffers."""
        self._remember(tokens)
        rid = self.new_id()
        self.do("admit", rid=rid, tokens=tokens)
        for _ in range(chunks):
            req = self.subject.requests.get(rid)
            if req is None or req.cur_kv_len >= req.total_len:
                break
            if self.do("prefill", rid=rid, n=8).startswith("waits"):
                break

    @precondition(lambda self: self._running())
    @rule(pick=PICK, n=CHUNK)
    def prefill(self, pick, n):
        running = self._running()
        self.do("prefill", rid=self._newest(running, pick), n=n)

    @precondition(lambda self: self._running())
    @rule(pick=PICK)
    def finish(self, pick):
        running = self._running()
        self.do("finish", rid=self._newest(running, pick))

    @precondition(lambda self: self.live())
    @rule(pick=PICK)
    def abort(self, pick):
        self.do("abort", rid=self._newest(self.live(), pick))

    @precondition(lambda self: self._running())
    @rule(pick=PICK)
    def pause(self, pick):
        running = self._running()
        self.do("pause", rid=self._newest(running, pick))

    @precondition(lambda self: self._paused())
    @rule(pick=PICK)
    def resume(self, pick):
        paused = self._paused()
        self.do("resume", rid=self._newest(paused, pick))

    # -- bare cache API -----------------------------------------------------------------------
    @rule(tokens=TOKENS_ST)
    def match(self, tokens):
        self.do("match", tokens=tokens)

    @rule(n=st.integers(1, 16))
    def evict(self, n):
        self.do("evict", n=n)

    @rule()
    def evict_small_buffer(self):
        self.do("evict_small_buffer")


def alphabet(params) -> list[Op]:
    """The exhaustive search's ops (``kvcheck check paged-bigpage``): request ids {1, 2} and a
    few all-zero prompts (so they share hash pages) plus one branch, over ``P`` =
    hash_page_size and ``BT`` = P * big_page_num:

    * ``z(P+1)``: one hashed page (a small node with the tail buffer; with big pages on, a
      small hit that copies its tail and derefs to the root -- L4; a miss under a big node);
    * ``z(2P+1)``: two hashed pages; its first page is bufferless, so ``z(P+1)`` then trims to
      empty (L3); with ``BT`` = 2P a big node, and a big-page hit;
    * ``[1]*(P+1)``: a second child of the root (LRU order across subtrees, the tree
      emptying only after both go);
    * ``z(P) + [1]*(P+1)``: shares page 1 with the others, branches at page 2;
    * with big pages on, ``z(2BT+1)`` if it fits: two big boundaries, so pause/abort after
      the first leaves a pending big id for branch C (L5).

    Ops: admit (each id x each prompt), prefill n in {P, 64} (one page, or up to the next
    big boundary / the cache length), finish, abort, pause, resume, match of each distinct
    page-aligned key, evict n in {1, 64}, evict_small_buffer."""
    P, N, max_len = params["hash_page_size"], params["big_page_num"], params["max_req_total_len"]
    BT = P * N

    def z(n):
        return [0] * n

    prompts: list[list[int]] = []
    cands = [z(P + 1), z(2 * P + 1), z(P) + [1] * (P + 1), [1] * (P + 1)]
    if BT <= max_len:
        cands.append(z(2 * BT + 1))
    for t in cands:
        if 1 <= len(t) <= max_len and t not in prompts:
            prompts.append(t)
    keys: list[list[int]] = []
    for t in prompts:
        k = t[:len(t) // P * P]
        if k and k not in keys:
            keys.append(k)
    rids, whole = (1, 2), 64
    ops = [Op("admit", {"rid": r, "tokens": t}) for r in rids for t in prompts]
    ops += [Op("prefill", {"rid": r, "n": n}) for r in rids for n in sorted({P, whole})]
    ops += [Op(name, {"rid": r}) for name in ("finish", "abort", "pause", "resume")
            for r in rids]
    ops += [Op("match", {"tokens": k}) for k in keys]
    ops += [Op("evict", {"n": n}) for n in (1, whole)]
    ops += [Op("evict_small_buffer")]
    return ops


# tiny pools for the exhaustive search: 8 KV slots (two big pages), one small buffer (every
# tail buffer after the first steals), prompts up to 9 tokens; small pages only, and big pages on
SMALL = {"hash_page_size": 2, "kv_tokens": 8, "small_buffers": 1, "max_req_total_len": 9}


def _build(params, cache_cls, device):
    return PagedBigPageSubject(cache_cls or LinearAttPagedRadixCache,
                               hash_page_size=params["hash_page_size"],
                               big_page_num=params["big_page_num"],
                               kv_tokens=params["kv_tokens"],
                               small_buffers=params["small_buffers"],
                               max_req_total_len=params["max_req_total_len"], device=device)


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
    build=_build,
    machine=PagedBigPageMachine,
    regimes=({}, {"big_page_num": 2}),
    alphabet=alphabet,
    small_params=({**SMALL, "big_page_num": 10_000_000}, {**SMALL, "big_page_num": 2}),
    sometimes=("match-miss", "trim-to-empty", "small-page-hit", "big-page-hit",
               "small-hit-tail-copied", "deref-to-big-node", "deref-to-root",
               "big-boundary-crossed", "tail-small-buffer", "small-buffer-stolen",
               "evict-for-room", "cascade-eviction", "tree-emptied", "insert-to-big-boundary",
               "free-pending-big-pages", "paused-resumed", "out-of-memory"),
)
