"""The block-hash subject: vLLM v1's KV cache manager driven the way its scheduler drives it.

Caller order as vLLM 0.33.0's ``v1/core/sched/scheduler.py``:

* ``admit`` (a waiting request scheduled): ``get_computed_blocks`` (the hit, never the last
  token), then ``allocate_slots(request, num_new_tokens, num_new_computed_tokens,
  new_computed_blocks)`` for its first chunk; ``None`` leaves it waiting (refused here).
* ``step`` (a running request scheduled): ``allocate_slots(request, num_new_tokens)`` for the
  next prefill chunk or the one decode token; the forward pass then writes the chunk's KV, and
  when it reaches the end of the known tokens the sampled token is appended (greedy: a
  function of the sequence, so equal sequences decode alike and share blocks).
* ``finish`` / ``abort``: ``free(request)``; ``preempt``: ``free(request)`` and
  ``num_computed_tokens = 0`` (the request waits with all its tokens); ``resume``: the
  ``admit`` path again for the preempted request.
* ``evict``: ``evict_blocks({block})`` (the KV connector's invalid-block report); ``reset``:
  ``reset_prefix_cache()``.
* ``enqueue`` / ``schedule`` (``caches/subjects/lifecycle.py``): the waiting half of one
  ``Scheduler.schedule()`` step (scheduler.py lines 1050-1610), FCFS over the arrivals:
  while ``token_budget > 0`` and fewer than ``max_num_seqs`` run (``StepTokenBudget``,
  ``caches/admission.py``), the head request's hit (``get_computed_blocks``, its
  ``num_computed_tokens`` being 0: line 1110), its chunk ``min(num_tokens - hit,
  token_budget)`` (lines 1306, 1346), then ``allocate_slots`` with the hit (lines
  1435-1452); None ends the pass with the request still waiting (lines 1454-1461).  The
  admitted batch's chunks are then computed (one forward pass).  There is no separate
  estimate: admission *is* the allocation, and ``allocate_slots`` checks the free blocks
  before it touches the hit (kv_cache_manager.py lines 582-588, then
  ``allocate_new_computed_blocks`` -> ``BlockPool.touch``, line 596 and
  single_type_kv_cache_manager.py line 305).  So ``admission-sound`` here is: a refused
  admission leaves the pool exactly as it was (no ref, no revived block, no hash, no table
  entry: it is re-judged next step and must not leak), and an admitted request's table holds
  a slot for every token of its chunk.  The next decode step is *not* promised: it is the
  next step's running loop (the ``step`` op), where ``allocate_slots`` failing makes vLLM
  preempt the last running request and retry (scheduler.py lines 912-980,
  ``_preempt_request`` line 1799) -- legal, so not checked.  The running loop of the same
  step and the waiting queue's preempted requests (``resume``) are the other ops; this step
  takes the whole token budget.

The cache interface it drives (``caches/block_hash.py``; an adapter provides the same names):
``block_size``, ``pool`` (``blocks`` with ``id``/``ref_cnt``/``block_hash``, ``free_queue``
with ``ids()``, ``hash_to_blocks``, ``num_free``, ``get_new_blocks``), ``req_to_blocks``,
``get_computed_blocks(rid, tokens) -> (blocks, num_tokens)``, ``allocate_slots(rid, tokens,
num_computed, num_new_tokens, new_computed) -> blocks | None``, ``free(rid)``,
``evict_blocks(ids)``, ``reset_prefix_cache() -> bool``.

The subject keeps its own ledger of each free block's declared eviction key
(``policy.vllm_free_key``: which ``free_blocks`` call released it, at which position of the
declared order -- a request's table tail first, a sliding table's out-of-window run right to
left -- with or without a hash) -- never read from the cache under test.

Hybrid mode (``window > 0``, vLLM's ``HybridKVCacheCoordinator``): the cache also keeps a
sliding-window group; a hit is one block list per group, ``allocate_slots`` is given the hit's
token count as the scheduler gives it (``num_new_computed_tokens``), each request's KV is
written to both groups' blocks (nulls skipped), and every computed chunk first reads the
window before it back from the sliding table.  Checked besides: ``window-hit`` (on every
hit), ``window-release`` (every running request, after every op), ``sentinel`` (the null
block) and the per-pool ``conservation`` over both groups' tables
(``invariants/window_blocks.py``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from caches.admission import StepTokenBudget
from caches.block_hash import BlockHashCache
from caches.pools import Fingerprint, _DataTensor, resolve_device
from caches.subjects.base import Skip, Subject
from caches.subjects.lifecycle import Lifecycle
from invariants import PoolView, check_conservation, check_held_once, fail
from invariants.blocks import check_block_refs, check_blocks_quiescent, check_hash_map
from invariants.integrity import check_fingerprints
from invariants.policy import (check_no_spurious_oom, check_queue_order, check_queue_victims,
                               vllm_free_key)
from invariants.window_blocks import (check_groups_disjoint, check_sentinel,
                                      check_window_hit, check_window_release)

VOCAB = 2


def greedy(tokens: list[int]) -> int:
    """The token the model samples after ``tokens`` (deterministic)."""
    return (sum(tokens) + len(tokens)) % VOCAB


@dataclass
class BReq:
    rid: int
    tokens: list
    prompt_len: int
    chunk: int
    computed: int = 0
    running: bool = True  # False: preempted (waiting, holds no block)
    max_new: int = 0  # (an enqueued request's max_tokens; vLLM's admission never reads it)
    output: int = 0
    retracted: int = 0  # (never: vLLM's retract is preempt)
    base: int = 0  # computed tokens (hit included) at its last allocate_slots


class BlockHashSubject(Lifecycle, Subject):
    variant = "block-hash"
    # vLLM's scheduler knobs for ``schedule`` (tiny, like the pool): max_num_scheduled_tokens,
    # max_num_seqs
    max_num_scheduled_tokens = 8
    max_num_seqs = 3

    def __init__(self, cache_cls=BlockHashCache, *, block_size: int = 2, num_blocks: int = 8,
                 max_len: int = 16, device: str | None = None, cache=None, window: int = 0):
        super().__init__()
        if cache is None:
            cache = cache_cls(num_blocks, block_size, window) if window else \
                cache_cls(num_blocks, block_size)
        self.cache = cache
        self.window = getattr(cache, "window", 0)
        self.bs = self.cache.block_size
        self.capacity = len(self.cache.pool.blocks) - 1
        self.max_len = max_len
        self.data = _DataTensor((self.capacity + 1) * self.bs, resolve_device(device))
        self.data.name = "blocks"
        self.requests: dict[int, BReq] = {}
        self.waiting: dict[int, BReq] = {}  # vLLM's waiting queue (enqueue / schedule)
        self.clock = 0
        # the declared eviction key of each block while free (initially: call 0, id order)
        self.keys = {b: vllm_free_key(False, 0, b) for b in self.free_ids()}
        self._policy_events: list[tuple] = []  # checked after the step by check_policy
        self._free_rank: dict[int, int] = {}  # the declared free order of the next free call
        self._watch_allocations()
        self._watch_frees()

    # -- plain reads of the cache (an adapter over other classes overrides these) ---------
    def refs(self) -> dict[int, int]:
        return {b.id: b.ref_cnt for b in self.cache.pool.blocks[1:]}

    def block_hashes(self) -> dict[int, object]:
        return {b.id: b.block_hash for b in self.cache.pool.blocks[1:]}

    def free_ids(self) -> list[int]:
        return self.cache.pool.free_queue.ids()

    def hash_map(self) -> dict[object, tuple]:
        return {h: tuple(blocks) for h, blocks in self.cache.pool.hash_to_blocks.items()}

    def table(self, rid: int) -> list[int]:
        return [b.id for b in self.cache.req_to_blocks.get(rid, ())]

    def tables(self, rid: int) -> tuple[list[int], ...]:
        """Request ``rid``'s block table in every KV cache group (full first)."""
        return tuple([b.id for b in t.get(rid, ())] for t in self.cache.tables)

    def null_hash(self) -> object:
        return self.cache.pool.null_block.block_hash

    @staticmethod
    def block_id(block) -> int:
        return block.id

    def _watch_allocations(self) -> None:
        pool, orig = self.cache.pool, self.cache.pool.get_new_blocks

        def get_new_blocks(n):
            if not self.checking:
                return orig(n)
            before = self.free_ids()
            out = orig(n)
            if n:
                self._policy_events.append(("victims", f"get_new_blocks({n})",
                                            [self.block_id(b) for b in out], before))
            return out

        pool.get_new_blocks = get_new_blocks

    def _watch_frees(self) -> None:
        """The ledger: after each ``free_blocks`` call, every block it brought to ref 0 gets
        its declared key, ranked by the declared order (``_declare_free_order``), never by
        the order the cache passed."""
        pool, orig = self.cache.pool, self.cache.pool.free_blocks

        def free_blocks(ordered):
            ordered = list(ordered)
            orig(ordered)
            self.clock += 1
            ids = {self.block_id(b) for b in ordered} - {0}
            refs, hashes = self.refs(), self.block_hashes()
            rank = self._free_rank
            for pos, bid in enumerate(sorted(ids, key=lambda b: (rank.get(b, 0), b))):
                if refs.get(bid) == 0:
                    self.keys[bid] = vllm_free_key(hashes[bid] is not None, self.clock, pos)

        pool.free_blocks = free_blocks

    def _declare_free_order(self, rid: int) -> None:
        """What request ``rid``'s blocks are freed in: each table tail first (a free, and the
        out-of-window run ``remove_skipped_blocks`` releases right to left)."""
        self._free_rank = {b: -i for t in self.tables(rid) for i, b in enumerate(t)}

    # -- serving operations ---------------------------------------------------------------
    def admit(self, rid: int, tokens: list[int], chunk: int) -> str:
        if rid in self.requests or rid in self.waiting:
            raise Skip(f"r{rid} is already live or waiting")
        if not tokens or chunk < 1:
            raise Skip("a request needs tokens and a positive chunk")
        req = BReq(rid, list(tokens)[:self.max_len], min(len(tokens), self.max_len), chunk)
        out = self._schedule_waiting(req)
        if req.computed:
            self.requests[rid] = req
        return out

    def resume(self, rid: int) -> str:
        req = self.req(rid)
        if req.running:
            raise Skip(f"r{rid} is running")
        out = self._schedule_waiting(req)
        if req.computed:
            req.running = True
            self.reached("resumed")
        return out

    def _hit(self, req: BReq):
        """``get_computed_blocks`` for a request with nothing computed: (blocks, tokens)."""
        hit, n = self.cache.get_computed_blocks(req.rid, req.tokens)
        groups = [[self.block_id(b) for b in g] for g in (hit if self.window else (hit,))]
        hit_ids = [b for g in groups for b in g if b != 0]
        if self.window:
            if n:
                self.reached("window-hit")
                if 0 in groups[1]:
                    self.reached("window-hit-nulls")
            check_window_hit(req.rid, n, groups, self.window, self.bs, self.block_hashes())
        if hit_ids:
            self.reached("prefix-hit")
            refs = self.refs()
            if any(refs[b] == 0 for b in hit_ids):
                self.reached("revive")
            if any(refs[b] > 0 for b in hit_ids):
                self.reached("shared-hit")
        return hit, n

    def _schedule_waiting(self, req: BReq) -> str:
        hit, n = self._hit(req)
        num_new = min(req.chunk, len(req.tokens) - n)
        new = self._allocate(req, num_new, hit, n)
        if new is None:
            return f"out of blocks: r{req.rid} stays waiting (hit {n} tokens)"
        self.verify_data(self.data, self._slots(req.rid, n), req.tokens, f"r{req.rid}'s hit: ")
        self._compute(req, n, num_new)
        return f"hit {n} tokens, computed {num_new} more, r{req.rid} holds {self.table(req.rid)}"

    def step(self, rid: int) -> str:
        req = self.req(rid)
        if not req.running:
            raise Skip(f"r{rid} is preempted")
        if req.computed >= len(req.tokens):
            raise Skip(f"r{rid} reached its max length; finish it")
        num_new = min(req.chunk, len(req.tokens) - req.computed)
        new = self._allocate(req, num_new, [])
        if new is None:
            return f"out of blocks for r{rid} (the scheduler would preempt)"
        self._compute(req, req.computed, num_new)
        return f"computed {num_new} more, r{rid} holds {self.table(rid)}"

    def finish(self, rid: int) -> str:
        req = self.req(rid)
        if not req.running or req.computed < req.prompt_len:
            raise Skip(f"r{rid} has not finished its prefill")
        return self._release(rid, "finished")

    def abort(self, rid: int) -> str:
        req = self.req(rid)
        if not req.running:
            del self.requests[rid]
            return f"aborted waiting r{rid} (held nothing)"
        return self._release(rid, "aborted")

    def preempt(self, rid: int) -> str:
        req = self.req(rid)
        if not req.running:
            raise Skip(f"r{rid} is already preempted")
        self._free(rid)
        req.computed, req.running = 0, False
        self.reached("preempt")
        return f"preempted r{rid}: its blocks freed, it waits with {len(req.tokens)} tokens"

    def evict(self, n: int) -> str:
        cached = sorted(b for b, h in self.block_hashes().items() if h is not None)
        if not cached:
            raise Skip("no cached block")
        bid = cached[n % len(cached)]
        if self.refs()[bid]:
            self.reached("evict-held")
        self.cache.evict_blocks({bid})
        return f"evict_blocks({{{bid}}}): {len(self.hash_map())} hash(es) left"

    def reset(self) -> str:
        ok = self.cache.reset_prefix_cache()
        self.reached("reset" if ok else "reset-refused")
        return "prefix cache reset" if ok else "refused: blocks in use"

    # -- batch admission: the Lifecycle hooks (see the module doc) ---------------------------
    lifecycle_declined = {
        "decode": "vLLM decodes through the running loop's allocate_slots, the step op",
        "retract": "vLLM's retract is preemption (free, recompute later), the preempt and "
                   "resume ops"}

    def _new_waiting(self, rid: int, tokens: list[int], max_new: int) -> BReq:
        if not tokens:
            raise Skip("a request needs tokens")
        toks = list(tokens)[:self.max_len]
        return BReq(rid, toks, len(toks), self.max_num_scheduled_tokens, running=False,
                    max_new=max_new)

    def _budget(self) -> StepTokenBudget:
        running = sum(1 for r in self.requests.values() if r.running)
        return StepTokenBudget(self.max_num_scheduled_tokens, self.max_num_seqs, running)

    def _pool_state(self, rid: int) -> tuple:
        return (self.refs(), self.block_hashes(), self.free_ids(), self.hash_map(),
                self.table(rid))

    def admit_one(self, req: BReq, budget: StepTokenBudget, admitted: int):
        """One turn of the waiting loop: its guards, the hit, the chunk, ``allocate_slots``
        (None: refused, and it must have left no trace)."""
        if not budget.room():
            return None
        before = self._pool_state(req.rid)
        hit, n = self._hit(req)
        num_new = budget.chunk(len(req.tokens) - n)
        if self._allocate(req, num_new, hit, n) is None:
            if hit:
                self.reached("admission-refused-hit")
            after = self._pool_state(req.rid)
            if after != before:
                what = [name for name, b, a in zip(
                    ("block refs", "block hashes", "the free queue", "the hash map",
                     f"r{req.rid}'s block table"), before, after) if a != b]
                fail("admission-sound", f"allocate_slots refused r{req.rid} (hit {n} tokens + "
                     f"{num_new} new) but changed {', '.join(what)}: a request left waiting "
                     f"must hold nothing", rid=req.rid)
            return None
        budget.take(num_new)
        return n, num_new

    def _extend(self, req: BReq, pinned) -> str | None:
        """The forward pass over the admitted chunk: its hit read back, its KV written."""
        n, num_new = pinned
        req.running, req.chunk = True, self.max_num_scheduled_tokens
        self.requests[req.rid] = req
        if len(self.table(req.rid)) * self.bs < n + num_new:
            return (f"r{req.rid}'s chunk of {num_new} tokens after {n} (its table holds "
                    f"{len(self.table(req.rid))} block(s))")
        self.verify_data(self.data, self._slots(req.rid, n), req.tokens, f"r{req.rid}'s hit: ")
        self._compute(req, n, num_new)
        return None

    def _first_decode(self, batch) -> str:
        return "their chunks computed (the next decode is the running loop's: step)"

    def _free_and_evictable(self) -> int:
        return len(self.free_ids()) * self.bs

    # -- the steps the ops share ------------------------------------------------------------
    def _allocate(self, req: BReq, num_new: int, hit, n: int = 0):
        """``allocate_slots`` for ``num_new`` tokens after the computed ones and the hit of
        ``n`` tokens; on refusal, check the refusal was not spurious."""
        refs = self.refs()
        self._declare_free_order(req.rid)
        computed = req.computed + n
        if req.running and req.rid in self.requests:
            req.base = computed  # remove_skipped_blocks runs even when it is refused
        # the hit's token count as the scheduler passes it (num_new_computed_tokens); one
        # group's is its blocks' length, and a cache of the one-group interface takes none
        kw = {"num_new_computed": n} if self.window else {}
        new = self.cache.allocate_slots(req.rid, req.tokens, req.computed, num_new, hit, **kw)
        if new is None:
            self.reached("out-of-blocks")
            need = self._declared_need(req.rid, computed, computed + num_new, hit, refs)
            if self.checking:
                # the free blocks when it was judged: after the out-of-window release
                self._policy_events.append(("oom", f"allocate_slots for r{req.rid}", need,
                                            len(self.free_ids())))
        else:
            req.base = computed
        return new

    def _declared_need(self, rid: int, computed: int, total: int, hit, refs) -> int:
        """The free blocks ``allocate_slots`` needs, every group (``get_num_blocks_to_allocate``):
        a group's missing blocks (none for positions out of the sliding window), plus the hit
        blocks it revives out of the free queue (not the null, not the skipped ones)."""
        groups = hit if self.window else (hit,)
        need = 0
        for g, (table, blocks) in enumerate(zip(self.tables(rid), groups or ((),) * 2)):
            ids = [self.block_id(b) for b in blocks]
            skipped = max(0, computed - self.window + 1) // self.bs if g else 0
            need += max(0, -(-total // self.bs) - max(skipped, len(table) + len(ids)))
            need += sum(1 for b in ids[max(0, skipped - len(table)):] if b and refs[b] == 0)
        return need

    def _compute(self, req: BReq, start: int, n: int) -> None:
        """The forward pass: KV for positions [start, start + n) lands in the request's
        blocks (every group's; a sliding table first reads the window before ``start``
        back); at the end of the known tokens the sampled token is appended."""
        req.computed = start + n
        fps = Fingerprint.of_prefix(req.tokens)
        self.data.write(self._slots(req.rid, req.computed)[start:], fps[start:req.computed])
        if self.window:
            sliding = self.tables(req.rid)[1]
            if start and self.checking:
                pos = range(max(0, start - self.window + 1), start)
                ids = [sliding[p // self.bs] * self.bs + p % self.bs for p in pos]
                check_fingerprints(self.data.name, ids, self.data.read(ids),
                                   [fps[p] for p in pos],
                                   what=f"r{req.rid}'s sliding window before token {start}: ")
            pos = [p for p in range(start, req.computed) if sliding[p // self.bs]]
            self.data.write([sliding[p // self.bs] * self.bs + p % self.bs for p in pos],
                            [fps[p] for p in pos])
        if req.computed == len(req.tokens) and len(req.tokens) < self.max_len:
            req.tokens.append(greedy(req.tokens))

    def _slots(self, rid: int, n: int) -> list[int]:
        table = self.table(rid)
        return [table[p // self.bs] * self.bs + p % self.bs for p in range(n)]

    def _release(self, rid: int, how: str) -> str:
        self._free(rid)
        del self.requests[rid]
        return f"{how} r{rid}: {len(self.free_ids())} blocks free"

    def _free(self, rid: int) -> None:
        """``free(request)``; the ledger (``_watch_frees``) keys what it frees, each table
        tail first."""
        self._declare_free_order(rid)
        self.cache.free(rid)

    # -- checks ---------------------------------------------------------------------------
    def holders(self) -> dict[int, list[str]]:
        """Each block's holders: one per (request, group) table position (a null is none)."""
        out: dict[int, list[str]] = defaultdict(list)
        for rid in self.live():
            for g, table in enumerate(self.tables(rid)):
                for bid in table:
                    if bid or not g:
                        out[bid].append(f"r{rid}" if not g else f"r{rid}/sliding")
        return out

    def pool_view(self) -> PoolView:
        return PoolView("blocks", "block", self.capacity, tuple(self.free_ids()), (0,))

    def check(self) -> None:
        live = self.live()
        if self.window:
            self._check_windows(live)
        holders = self.holders()
        check_block_refs(self.refs(), holders)
        borrowed = {f"r{rid}": self.table(rid) for rid in live}
        if self.window:
            borrowed.update({f"r{rid}/sliding": [b for b in self.tables(rid)[1] if b]
                             for rid in live})
        pool = self.pool_view()
        check_conservation(pool, {"live requests": list(holders)}, borrowed)
        # each block at one position of a request's table: its blocks hold chained hashes, so
        # no two positions share one (the ref count and conservation both allow it, a ref per
        # position); there is no tree here -- a table is what holds blocks at positions
        for who, table in borrowed.items():
            check_held_once(pool.name, f"{who}'s block table", table, pool.unit)
        if self.window:
            check_groups_disjoint({f"r{rid}": self.tables(rid) for rid in live})
        hashes = self.block_hashes()
        check_hash_map(self.hash_map(), hashes)
        if len(set(hashes.values()) - {None}) < sum(h is not None for h in hashes.values()):
            self.reached("duplicate-hash")
        self.check_policy()

    def _check_windows(self, live) -> None:
        """The hybrid mode's own checks, before the pool's: the null block (``sentinel``) and
        each running request's sliding table (``window-release``)."""
        handed = [b for ev in self._policy_events if ev[0] == "victims" for b in ev[2]]
        check_sentinel(0, self.free_ids(), self.null_hash(), self.hash_map(), handed,
                       {f"r{rid}": self.table(rid) for rid in live})
        for rid in live:
            req = self.requests[rid]
            if req.running:
                sliding = self.tables(rid)[1]
                if sliding and not sliding[0]:
                    self.reached("window-released")
                check_window_release(rid, sliding, req.base, self.window, self.bs)

    def check_policy(self) -> None:
        """The policy properties of the step: no spurious out-of-blocks, every allocation
        took the free blocks with the smallest declared keys (``victim``), and the free
        queue runs in declared order (``lru-order``)."""
        events, self._policy_events = self._policy_events, []
        keys = self._keys_now()
        for ev in events:
            if ev[0] == "oom":
                check_no_spurious_oom(ev[1], ev[2], ev[3], 0, unit="blocks")
            else:
                _, what, victims, before = ev
                if any(keys[b][0] for b in victims):
                    self.reached("cached-evicted")
                check_queue_victims(what, victims, before, keys)
        check_queue_order(self.free_ids(), keys)

    def _keys_now(self) -> dict[int, tuple]:
        """The ledger, with a neutral key for a block the ledger never saw freed (only a
        broken cache puts one in the queue; conservation reports that first)."""
        return defaultdict(lambda: (0, 0, 0), self.keys)

    def drain(self) -> None:
        self.waiting.clear()  # a waiting request holds nothing
        for rid in self.live():
            self.abort(rid)
        self.reset()

    def check_quiescent(self) -> None:
        check_blocks_quiescent(self.free_ids(), self.capacity, self.refs(),
                               len(self.hash_map()))

    # -- for people -----------------------------------------------------------------------
    def outline(self) -> str:
        hashes = self.block_hashes()
        queue = " ".join(f"{b}{'*' if hashes.get(b) else ''}" for b in self.free_ids())
        lines = [f"free queue (LRU first, * cached): {queue or '-'}"]
        for rid in self.live():
            req = self.requests[rid]
            state = "running" if req.running else "preempted"
            sliding = f", sliding {self.tables(rid)[1]}" if self.window else ""
            lines.append(f"r{rid} {state} computed {req.computed}/{len(req.tokens)}: "
                         f"blocks {self.table(rid)}{sliding}")
        lines.extend(self.waiting_lines())
        return "\n".join(lines)

    def counters(self) -> dict:
        hashes = self.block_hashes()
        out = {"free": len(self.free_ids()), "cached": sum(h is not None for h in
                                                           hashes.values()),
               "hashes": len(self.hash_map())}
        if self.window:  # the hybrid mode: compared block for block (kvcheck diff)
            out["queue"] = " ".join(map(str, self.free_ids()))
            out["tables"] = "; ".join(f"r{rid} {self.tables(rid)}" for rid in self.live())
        return out
