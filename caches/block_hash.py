"""The block-hash reference cache: vLLM v1's hash-chained block prefix cache.

Our own model of vLLM 0.33.0's ``KVCacheManager`` over one ``BlockPool`` with a single
full-attention group (read from ``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``,
``kv_cache_utils.py``; no code copied).  The semantics it keeps:

* KV lives in fixed blocks of ``block_size`` tokens; block 0 is the *null block* (never free,
  never held), so ``num_blocks`` blocks give ``num_blocks - 1`` usable ones.
* A full block is identified by a **chained hash**: the hash of block i covers its own tokens
  and the hash of block i-1 (``hash_block_tokens``), so equal contents at a different prefix
  never collide.  A *cached* block carries its hash and sits in the hash -> blocks map
  (several blocks may share a hash: vLLM does not de-duplicate, block tables are append-only).
* Blocks with ref count 0 wait in one **free queue** in eviction order: a request's blocks are
  freed tail first; blocks without a hash go to the front (reused first), cached ones to the
  back (LRU).  Allocation pops from the front, and a popped cached block loses its hash (the
  eviction).  A later hit on a cached block in the queue *revives* it: out of the queue,
  ref count back to 1 (``touch``).
* ``get_computed_blocks`` looks up the longest run of the request's block hashes (at most
  ``len(tokens) - 1`` tokens: the last token is always recomputed for its logits);
  ``allocate_slots`` takes the hit (touch), allocates what the new tokens need or refuses,
  then caches every block that the tokens known so far fill.
* ``free`` releases a request's blocks in reverse order; ``evict_blocks`` drops the hashes of
  the given blocks (the KV connector's invalid blocks; held blocks stay held);
  ``reset_prefix_cache`` clears every hash, only when no block is in use.

**Hybrid mode** (``window > 0``): vLLM's ``HybridKVCacheCoordinator`` over a
``FullAttentionManager`` (group 0) and a ``SlidingWindowManager`` (group 1) sharing the one
pool (``vllm/v1/core/kv_cache_coordinator.py``, ``single_type_kv_cache_manager.py``, 0.33.0):

* each group keeps its own block table per request and caches its blocks under its own keys
  (hash + group id, ``make_block_hash_with_group_id``): the full group under the plain hash,
  the sliding group under ``<hash>:g1``;
* the sliding group's hit (``SlidingWindowManager.find_longest_cache_hit``) scans right to
  left within the full group's hit for ``ceil((W - 1) / block_size)`` consecutive cached
  blocks and fills what lies before them with the null block; with no such run, the run of
  cached blocks from block 0 is the hit.  The coordinator (one pass: the "simple hybrid" of
  one full and one other group, block sizes equal so the alignment is the block size) takes
  the sliding hit's length and truncates the full group's hit to it (``_reconcile``);
* ``allocate_slots`` first releases the sliding blocks that left the window
  (``remove_skipped_blocks``: every block wholly before ``computed - W + 1``, scanned right to
  left, stopping at the first null, each replaced by the null block, freed to the pool -- even
  when the allocation is then refused), counts each group's need
  (``get_num_blocks_to_allocate``: the sliding group needs no block for skipped positions and
  revives no skipped hit block), then per group takes the hit (skipped hit blocks become
  nulls, ``add_local_computed_blocks``) and the new blocks, and caches the full blocks
  (nulls skipped);
* ``free`` frees group 0's table then group 1's, each tail first without its leading nulls;
  the null block is never touched, freed, cached nor handed out.

The fault hooks (``caches/faults/block_hash.py``) are the small methods: ``_pop_victims``,
``_uncache``, ``touch``, ``_free_order``, ``hash_block_tokens``, ``_fits``, and for the hybrid
mode ``blocks_needed``, ``_reconcile``, ``remove_skipped_blocks`` and ``free``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Iterable, Sequence

NONE_HASH = "root"  # the parent hash of a request's first block


def chained_hash(parent: str | None, tokens: Sequence[int]) -> str:
    """The hash of one full block: its tokens and its parent block's hash."""
    raw = repr((parent or NONE_HASH, tuple(tokens))).encode()
    return hashlib.blake2b(raw, digest_size=6).hexdigest()


class Block:
    __slots__ = ("id", "ref_cnt", "block_hash")

    def __init__(self, bid: int):
        self.id, self.ref_cnt, self.block_hash = bid, 0, None


class FreeQueue:
    """Blocks with ref count 0, front = next to be reused (the LRU end)."""

    def __init__(self, blocks: Iterable[Block]):
        self._q: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in blocks)

    def __len__(self) -> int:
        return len(self._q)

    def __contains__(self, block: Block) -> bool:
        return block.id in self._q

    def ids(self) -> list[int]:
        return list(self._q)

    def popleft(self) -> Block:
        return self._q.popitem(last=False)[1]

    def pop_at(self, i: int) -> Block:
        return self._q.pop(list(self._q)[i])

    def remove(self, block: Block) -> None:
        del self._q[block.id]

    def append_n(self, blocks: Sequence[Block]) -> None:
        for b in blocks:
            self._q[b.id] = b

    def prepend_n(self, blocks: Sequence[Block]) -> None:
        for b in reversed(blocks):  # the first of ``blocks`` ends up at the very front
            self._q[b.id] = b
            self._q.move_to_end(b.id, last=False)


class BlockPool:
    """The blocks, the free queue and the hash -> blocks map."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError("a block pool needs the null block and at least one more")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.free_queue = FreeQueue(self.blocks[1:])
        self.hash_to_blocks: dict[str, dict[int, Block]] = {}

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def get_cached_block(self, block_hash: str) -> Block | None:
        blocks = self.hash_to_blocks.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def cache_full_blocks(self, blocks: Sequence[Block], hashes: Sequence[str]) -> None:
        for blk, h in zip(blocks, hashes):
            if blk.block_hash is None:
                blk.block_hash = h
                self.hash_to_blocks.setdefault(h, {})[blk.id] = blk

    def get_new_blocks(self, n: int) -> list[Block]:
        if n > self.num_free:
            raise ValueError(f"cannot get {n} free blocks from the pool ({self.num_free} free)")
        out = self._pop_victims(n)
        for blk in out:
            self._uncache(blk)
            assert blk.ref_cnt == 0, f"block {blk.id} in the free queue with ref {blk.ref_cnt}"
            blk.ref_cnt += 1
        return out

    def _pop_victims(self, n: int) -> list[Block]:
        return [self.free_queue.popleft() for _ in range(n)]

    def _uncache(self, blk: Block) -> bool:
        """Evict ``blk`` from the prefix cache (its hash out of the map); False if uncached."""
        if blk.block_hash is None:
            return False
        blocks = self.hash_to_blocks.get(blk.block_hash, {})
        blocks.pop(blk.id, None)
        if not blocks:
            self.hash_to_blocks.pop(blk.block_hash, None)
        blk.block_hash = None
        return True

    def touch(self, blocks: Sequence[Block]) -> None:
        """A hit: revive blocks waiting in the free queue, take one ref on each."""
        for blk in blocks:
            if blk is self.null_block:  # a sliding table's padding: never pooled
                continue
            if blk.ref_cnt == 0:
                self.free_queue.remove(blk)
            blk.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[Block]) -> None:
        """Drop one ref on each block, given in eviction priority (first = evicted first)."""
        first, last = [], []
        for blk in ordered:
            if blk is self.null_block:  # its ref count is not kept: never freed
                continue
            blk.ref_cnt -= 1
            if blk.ref_cnt == 0:
                (first if blk.block_hash is None else last).append(blk)
        self.free_queue.prepend_n(first)
        self.free_queue.append_n(last)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        for bid in block_ids:
            self._uncache(self.blocks[bid])

    def reset_prefix_cache(self) -> bool:
        if self.num_free != self.num_blocks - 1:
            return False
        self.hash_to_blocks = {}
        for blk in self.blocks:
            blk.block_hash = None
        return True


FULL, SLIDING = 0, 1  # the KV cache groups of the hybrid mode (window > 0)


def group_key(block_hash: str, group: int) -> str:
    """The key a block of ``group`` is cached under (vLLM: hash + group id)."""
    return block_hash if group == FULL else f"{block_hash}:g{group}"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockHashCache:
    """vLLM's ``KVCacheManager``: requests' block tables over a ``BlockPool``.  ``window == 0``:
    one full-attention group (``UnitaryKVCacheCoordinator``); ``window > 0``: a full-attention
    group and a sliding-window group of ``window`` tokens (``HybridKVCacheCoordinator``).

    A hit is a list of blocks (one group) or a tuple of lists, one per group (hybrid)."""

    def __init__(self, num_blocks: int, block_size: int, window: int = 0):
        if block_size < 1:
            raise ValueError("block_size must be positive")
        if window < 0 or window == 1:
            raise ValueError(f"window must be 0 (no sliding group) or at least 2, not {window} "
                             "(a window of 1 token caches no sliding block)")
        self.block_size = block_size
        self.window = window
        self.num_groups = 2 if window else 1
        self.pool = BlockPool(num_blocks)
        self.tables: tuple[dict[int, list[Block]], ...] = tuple(
            {} for _ in range(self.num_groups))
        self.cached: tuple[dict[int, int], ...] = tuple({} for _ in range(self.num_groups))

    @property
    def req_to_blocks(self) -> dict[int, list[Block]]:
        """The full-attention group's block tables."""
        return self.tables[FULL]

    @property
    def num_cached_blocks(self) -> dict[int, int]:
        return self.cached[FULL]

    # -- hashing ------------------------------------------------------------------------
    def hash_block_tokens(self, parent: str | None, tokens: Sequence[int]) -> str:
        return chained_hash(parent, tokens)

    def block_hashes(self, tokens: Sequence[int]) -> list[str]:
        """The hash chain of every full block of ``tokens``."""
        out, parent, bs = [], None, self.block_size
        for i in range(len(tokens) // bs):
            parent = self.hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs])
            out.append(parent)
        return out

    # -- the hit ----------------------------------------------------------------------------
    def get_computed_blocks(self, rid: int, tokens: Sequence[int]):
        """Request ``rid``'s longest cache hit, at most ``len(tokens) - 1`` tokens: (blocks,
        tokens); hybrid: ((full blocks, sliding blocks), tokens)."""
        limit = max(0, len(tokens) - 1) // self.block_size
        hashes = self.block_hashes(tokens)
        hit: list[Block] = []
        for h in hashes[:limit]:
            blk = self.pool.get_cached_block(h)
            if blk is None:
                break
            hit.append(blk)
        if not self.window:
            return hit, len(hit) * self.block_size
        sliding = self._sliding_hit(hashes, len(hit))
        n = self._reconcile(hit, sliding)
        return (hit, sliding), n

    def _sliding_hit(self, hashes: Sequence[str], max_blocks: int) -> list[Block]:
        """``SlidingWindowManager.find_longest_cache_hit`` within ``max_blocks`` blocks: right
        to left, the first run of ``ceil((W - 1) / block_size)`` cached blocks ends the hit,
        nulls before it; no such run: the run of cached blocks from block 0."""
        need = cdiv(self.window - 1, self.block_size)
        out = [self.pool.null_block] * max_blocks
        run = 0
        for i in range(max_blocks - 1, -1, -1):
            blk = self.pool.get_cached_block(group_key(hashes[i], SLIDING))
            if blk is None:
                run = 0
                continue
            out[i] = blk
            run += 1
            if run >= need:
                return out[:i + run]
        return out[:run]

    def _reconcile(self, full: list[Block], sliding: list[Block]) -> int:
        """The coordinator's one pass (full group first, then the sliding group within it):
        the hit is the sliding group's length; the full group's blocks are cut to it."""
        del full[len(sliding):]
        return len(sliding) * self.block_size

    def _groups_of(self, new_computed) -> tuple:
        """A hit as one list per group (``()`` or ``None``: no hit)."""
        if not new_computed:
            return tuple([] for _ in range(self.num_groups))
        if self.window:
            return tuple(list(g) for g in new_computed)
        return (list(new_computed),)

    # -- allocation -------------------------------------------------------------------------
    def skipped_tokens(self, group: int, computed: int) -> int:
        """Tokens wholly out of ``group``'s attention window once ``computed`` are computed
        (``get_num_skipped_tokens``: 0 for full attention)."""
        if group == FULL:
            return 0
        return max(0, computed - self.window + 1)

    def blocks_needed(self, rid: int, num_tokens: int, new_computed, computed: int = 0) -> int:
        """Free blocks an allocation for ``num_tokens`` in all takes, every group: the new
        ones, plus the hit blocks it revives out of the free queue."""
        need = 0
        for g, hit in enumerate(self._groups_of(new_computed)):
            table = self.tables[g].get(rid, ())
            skipped = self.skipped_tokens(g, computed) // self.block_size
            new = max(0, cdiv(num_tokens, self.block_size) - max(skipped, len(table) + len(hit)))
            kept = hit[max(0, skipped - len(table)):]
            need += new + sum(1 for b in kept if b is not self.pool.null_block and b.ref_cnt == 0)
        return need

    def _fits(self, need: int) -> bool:
        return need <= self.pool.num_free

    def allocate_slots(self, rid: int, tokens: Sequence[int], num_computed: int,
                       num_new_tokens: int, new_computed=(), num_new_computed: int | None = None,
                       ) -> list[Block] | None:
        """Room for ``num_new_tokens`` after ``num_computed`` (+ the hit of
        ``num_new_computed`` tokens): the new blocks, or None when the pool is short (nothing
        changed but the out-of-window release, which upstream also does first)."""
        groups = self._groups_of(new_computed)
        if num_new_computed is None:
            num_new_computed = len(groups[FULL]) * self.block_size
        if num_new_tokens < 1 and not num_new_computed:
            raise ValueError("num_new_tokens must be positive when nothing is adopted")
        computed = num_computed + num_new_computed
        total = computed + num_new_tokens
        self.remove_skipped_blocks(rid, computed)
        if not self._fits(self.blocks_needed(rid, total, new_computed, computed)):
            return None
        if any(groups):
            for g, hit in enumerate(groups):
                self._add_hit(g, rid, hit, computed)
        new: list[Block] = []
        for g in range(self.num_groups):
            table = self.tables[g].setdefault(rid, [])
            blocks = self.pool.get_new_blocks(max(0, cdiv(total, self.block_size) - len(table)))
            table.extend(blocks)
            new.extend(blocks)
        self.cache_blocks(rid, tokens, min(total, len(tokens)))
        return new

    def _add_hit(self, group: int, rid: int, hit: list[Block], computed: int) -> None:
        """``add_local_computed_blocks``: the skipped hit blocks become nulls, the rest are
        touched."""
        skipped = self.skipped_tokens(group, computed) // self.block_size
        kept = hit[skipped:]
        self.pool.touch(kept)
        self.tables[group].setdefault(rid, []).extend([self.pool.null_block] * skipped + kept)

    def remove_skipped_blocks(self, rid: int, computed: int) -> None:
        """The sliding group's blocks wholly before the window: nulls in the table, freed."""
        for g in range(1, self.num_groups):
            table = self.tables[g].get(rid)
            if not table:
                continue
            last = min(self.skipped_tokens(g, computed) // self.block_size, len(table))
            self._release_skipped(rid, table, last)

    def _release_skipped(self, rid: int, table: list[Block], last: int) -> None:
        """``_remove_blocks_in_range(0, last)``: right to left, stopping at the first null
        (what lies before it was released earlier)."""
        freed = []
        for i in range(last - 1, -1, -1):
            if table[i] is self.pool.null_block:
                break
            freed.append(table[i])
            table[i] = self.pool.null_block
        if freed:
            self.pool.free_blocks(freed)

    def cache_blocks(self, rid: int, tokens: Sequence[int], num_tokens: int) -> None:
        """Cache the request's blocks that ``num_tokens`` known tokens fill, every group."""
        hashes = None
        for g in range(self.num_groups):
            table = self.tables[g].get(rid, [])
            done = self.cached[g].get(rid, 0)
            full = min(num_tokens // self.block_size, len(table))
            if full > done:
                if hashes is None:
                    hashes = self.block_hashes(tokens[:full * self.block_size])
                pairs = [(b, group_key(h, g)) for b, h in zip(table[done:full], hashes[done:full])
                         if b is not self.pool.null_block]
                self.pool.cache_full_blocks([b for b, _ in pairs], [k for _, k in pairs])
                self.cached[g][rid] = full

    def free(self, rid: int) -> None:
        for g in range(self.num_groups):
            table = self.tables[g].pop(rid, [])
            self.cached[g].pop(rid, None)
            while table and table[0] is self.pool.null_block:  # trim_null_head
                table = table[1:]
            self.pool.free_blocks(self._free_order(table))

    @staticmethod
    def _free_order(table: list[Block]) -> list[Block]:
        return list(reversed(table))  # the tail is evicted first

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
