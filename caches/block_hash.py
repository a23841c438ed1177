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

The fault hooks (``caches/faults/block_hash.py``) are the small methods: ``_pop_victims``,
``_uncache``, ``touch``, ``_free_order``, ``hash_block_tokens``, ``_fits``.
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
            if blk.ref_cnt == 0:
                self.free_queue.remove(blk)
            blk.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[Block]) -> None:
        """Drop one ref on each block, given in eviction priority (first = evicted first)."""
        first, last = [], []
        for blk in ordered:
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


class BlockHashCache:
    """vLLM's ``KVCacheManager`` for one full-attention group: requests' block tables over a
    ``BlockPool``."""

    def __init__(self, num_blocks: int, block_size: int):
        if block_size < 1:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[int, list[Block]] = {}
        self.num_cached_blocks: dict[int, int] = {}

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

    # -- the manager's API --------------------------------------------------------------
    def get_computed_blocks(self, rid: int, tokens: Sequence[int]) -> tuple[list[Block], int]:
        """Request ``rid``'s longest cached run of full blocks, at most ``len(tokens) - 1``
        tokens."""
        limit = max(0, len(tokens) - 1) // self.block_size
        hit: list[Block] = []
        for h in self.block_hashes(tokens)[:limit]:
            blk = self.pool.get_cached_block(h)
            if blk is None:
                break
            hit.append(blk)
        return hit, len(hit) * self.block_size

    def blocks_needed(self, rid: int, num_tokens: int, new_computed: Sequence[Block]) -> int:
        """Free blocks an allocation for ``num_tokens`` in all takes: the new ones, plus the
        hit blocks it revives out of the free queue."""
        held = len(self.req_to_blocks.get(rid, ())) + len(new_computed)
        new = max(0, -(-num_tokens // self.block_size) - held)
        return new + sum(1 for b in new_computed if b.ref_cnt == 0)

    def _fits(self, need: int) -> bool:
        return need <= self.pool.num_free

    def allocate_slots(self, rid: int, tokens: Sequence[int], num_computed: int,
                       num_new_tokens: int, new_computed: Sequence[Block] = (),
                       ) -> list[Block] | None:
        """Room for ``num_new_tokens`` after ``num_computed`` (+ the hit): the new blocks, or
        None (nothing changed) when the pool is short."""
        if num_new_tokens < 1 and not new_computed:
            raise ValueError("num_new_tokens must be positive when nothing is adopted")
        total = num_computed + len(new_computed) * self.block_size + num_new_tokens
        if not self._fits(self.blocks_needed(rid, total, new_computed)):
            return None
        table = self.req_to_blocks.setdefault(rid, [])
        if new_computed:
            self.pool.touch(new_computed)
            table.extend(new_computed)
        n = max(0, -(-total // self.block_size) - len(table))
        new = self.pool.get_new_blocks(n)
        table.extend(new)
        self.cache_blocks(rid, tokens, min(total, len(tokens)))
        return new

    def cache_blocks(self, rid: int, tokens: Sequence[int], num_tokens: int) -> None:
        """Cache the request's blocks that ``num_tokens`` known tokens fill."""
        table = self.req_to_blocks.get(rid, [])
        done = self.num_cached_blocks.get(rid, 0)
        full = min(num_tokens // self.block_size, len(table))
        if full > done:
            hashes = self.block_hashes(tokens[:full * self.block_size])
            self.pool.cache_full_blocks(table[done:full], hashes[done:full])
            self.num_cached_blocks[rid] = full

    def free(self, rid: int) -> None:
        table = self.req_to_blocks.pop(rid, [])
        self.num_cached_blocks.pop(rid, None)
        self.pool.free_blocks(self._free_order(table))

    @staticmethod
    def _free_order(table: list[Block]) -> list[Block]:
        return list(reversed(table))  # the tail is evicted first

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
