"""Faults K1-K11 of the block-hash cache, each the smallest mutation of ``BlockHashCache``
(vLLM 0.33.0's ``BlockPool`` / ``KVCacheManager`` semantics; ids K for KV blocks: B is taken
by the TokenSpeed boundary faults).  Each is caught only on the property it names.  K9-K11
live in the hybrid mode (a sliding-window group beside the full-attention one) and declare
its regime (``HYBRID``)."""

from __future__ import annotations

from caches.block_hash import BlockHashCache, BlockPool
from caches.faults import fault

V = "block-hash"
HYBRID = {"block_size": 2, "num_blocks": 14, "window": 4}  # state_machines/block_hash.py's


def _with_pool(pool_cls):
    """A ``BlockHashCache`` whose block pool is ``pool_cls`` (the faulty one)."""

    class Cache(BlockHashCache):
        def __init__(self, num_blocks, block_size, window=0):
            super().__init__(num_blocks, block_size, window)
            self.pool = pool_cls(num_blocks)

    Cache.__name__ = Cache.__qualname__ = pool_cls.__name__ + "Cache"
    return Cache


class _RevivedLeftInQueue(BlockPool):
    def touch(self, blocks):
        for blk in blocks:
            blk.ref_cnt += 1  # the defect: no free_queue.remove for a block at ref 0


@fault("K1", "revived-left-in-queue", variant=V,
       upstream="vLLM v1 BlockPool.touch (vllm/v1/core/block_pool.py)",
       properties=("conservation",),
       summary="a hit revives a cached block waiting in the free queue (ref 0 -> 1) but leaves "
               "it in the queue: a later allocation hands the held block to another request")
class RevivedLeftInQueue(_with_pool(_RevivedLeftInQueue)):
    pass


class _EvictedHashLeftInMap(BlockPool):
    def _uncache(self, blk):
        if blk.block_hash is None:
            return False
        blk.block_hash = None  # the defect: the hash -> block entry stays in the map
        return True


@fault("K2", "evicted-hash-left-in-map", variant=V,
       upstream="vLLM v1 BlockPool._maybe_evict_cached_block (vllm/v1/core/block_pool.py)",
       properties=("hash-map",),
       summary="reusing a cached block from the free queue resets its hash but leaves the "
               "hash -> block entry: a later hit on that hash reads a block holding other "
               "tokens")
class EvictedHashLeftInMap(_with_pool(_EvictedHashLeftInMap)):
    pass


class _HitRefNotRestored(BlockPool):
    def touch(self, blocks):
        for blk in blocks:
            if blk.ref_cnt == 0:
                self.free_queue.remove(blk)  # the defect: the revived block keeps ref 0
            else:
                blk.ref_cnt += 1


@fault("K3", "hit-ref-not-restored", variant=V,
       upstream="vLLM v1 BlockPool.touch (vllm/v1/core/block_pool.py)",
       properties=("ref-balance",),
       summary="a hit takes a cached block out of the free queue without restoring its ref "
               "count: the block is held at ref 0, and the holder's free drives it negative")
class HitRefNotRestored(_with_pool(_HitRefNotRestored)):
    pass


class _EvictFromMiddle(BlockPool):
    def _pop_victims(self, n):
        # the defect: victims taken from the middle of the queue, not its LRU front
        return [self.free_queue.pop_at(len(self.free_queue) // 2) for _ in range(n)]


@fault("K4", "evict-from-middle", variant=V,
       upstream="vLLM v1 FreeKVCacheBlockQueue.popleft_n (vllm/v1/core/kv_cache_utils.py)",
       properties=("victim",),
       summary="an allocation takes its blocks from the middle of the free queue instead of "
               "the LRU front: recently freed prefix blocks are evicted before older ones")
class EvictFromMiddle(_with_pool(_EvictFromMiddle)):
    pass


@fault("K5", "unchained-hash", variant=V,
       upstream="vLLM v1 hash_block_tokens (vllm/v1/core/kv_cache_utils.py)",
       properties=("data-integrity",),
       summary="a block's hash covers its own tokens but not its parent's hash: equal blocks "
               "after different prefixes collide, and a hit reads KV computed for another "
               "prefix")
class UnchainedHash(BlockHashCache):
    def hash_block_tokens(self, parent, tokens):
        return super().hash_block_tokens(None, tokens)  # the defect: the parent is dropped


@fault("K6", "free-head-first", variant=V,
       upstream="vLLM v1 KVCacheManager.free, reverse order (vllm/v1/core/kv_cache_manager.py)",
       properties=("lru-order",),
       summary="a request's blocks are freed head first instead of tail first: the shared "
               "prefix block of a chain is reused before the chain's own tail")
class FreeHeadFirst(BlockHashCache):
    @staticmethod
    def _free_order(table):
        return list(table)  # the defect: not reversed


@fault("K7", "alloc-oom-off-by-one", variant=V,
       upstream="vLLM v1 KVCacheManager.allocate_slots (vllm/v1/core/kv_cache_manager.py)",
       properties=("spurious-oom",),
       summary="allocate_slots refuses when the free blocks exactly cover what it needs "
               "(>= for >): the request waits or is preempted with room to run")
class AllocOomOffByOne(BlockHashCache):
    def _fits(self, need):
        return need < self.pool.num_free  # the defect: should be <=


# -- batch admission (the scheduler's waiting loop) ---------------------------------------------

@fault("K8", "refused-admission-keeps-hit", variant=V,
       upstream="vLLM v1 KVCacheManager.allocate_slots: the free-block check precedes "
                "allocate_new_computed_blocks / BlockPool.touch (model)",
       properties=("admission-sound", "ref-balance"),
       summary="allocate_slots takes the prefix hit (touch: refs, revived blocks) before it "
               "checks the free blocks, and a refusal keeps it: the request left waiting "
               "holds refs no block table accounts for, and revived blocks leave the queue")
class RefusedAdmissionKeepsHit(BlockHashCache):
    def allocate_slots(self, rid, tokens, num_computed, num_new_tokens, new_computed=(),
                       num_new_computed=None):
        out = super().allocate_slots(rid, tokens, num_computed, num_new_tokens, new_computed,
                                     num_new_computed)
        if out is None and new_computed:
            for blocks in self._groups_of(new_computed):
                self.pool.touch(blocks)  # the defect: touched before the check, kept
        return out


# -- the hybrid mode: a sliding-window group beside the full-attention one ----------------------

@fault("K9", "null-block-counted-evictable", variant=V, params=HYBRID,
       upstream="vLLM PR #19031 (https://github.com/vllm-project/vllm/pull/19031, \"[Bugfix] "
                "get_num_blocks_to_allocate with null_block\": the null block must not count "
                "as an evictable computed block); get_num_blocks_to_allocate / "
                "_get_num_evictable_blocks",
       properties=("spurious-oom",),
       summary="allocate_slots counts the null blocks padding a sliding-window hit (ref count "
               "0, never pooled) as hit blocks it must revive out of the free queue: it asks "
               "for blocks it will never take and refuses a request that fits")
class NullBlockCountedEvictable(BlockHashCache):
    def blocks_needed(self, rid, num_tokens, new_computed, computed=0):
        need = super().blocks_needed(rid, num_tokens, new_computed, computed)
        # the defect: every null of the hit counted as a block at ref 0 to revive
        return need + sum(1 for hit in self._groups_of(new_computed) for b in hit
                          if b is self.pool.null_block)


class _Released(BlockHashCache):
    """Keeps every block ``remove_skipped_blocks`` released, per request (as SimpleCPUOffload's
    eager store list keeps their ids)."""

    def __init__(self, num_blocks, block_size, window=0):
        super().__init__(num_blocks, block_size, window)
        self.released: dict[int, list] = {}

    def remove_skipped_blocks(self, rid, computed):
        before = [list(t.get(rid, ())) for t in self.tables]
        super().remove_skipped_blocks(rid, computed)
        for old, t in zip(before, self.tables):
            now = t.get(rid, ())
            self.released.setdefault(rid, []).extend(
                b for i, b in enumerate(old) if i < len(now) and now[i] is not b)


@fault("K10", "released-block-freed-again", variant=V, params=HYBRID,
       upstream="vLLM v1 KV block double free with sliding window + eager SimpleCPUOffload "
                "(vllm-project/vllm#42571; proposed guard vllm-project/vllm#42615)",
       properties=("ref-balance", "conservation", "quiescence"),
       summary="a sliding block released when it left the window is freed again when the "
               "request ends: its ref count drops a second time (below 0, or to 0 under "
               "another request that now holds it, which puts a held block in the free queue; "
               "freed in the final drain, the drained pool keeps a ref of -1: quiescence)")
class ReleasedBlockFreedAgain(_Released):
    def free(self, rid):
        super().free(rid)
        # the defect: the released blocks are freed once more with the request
        self.pool.free_blocks(list(reversed(self.released.pop(rid, []))))


@fault("K11", "unreconciled-hit", variant=V, params=HYBRID,
       upstream="vLLM v1 HybridKVCacheCoordinator.find_longest_cache_hit: prefix hits not "
                "reconciled across full, sliding and mamba-aligned groups "
                "(vllm-project/vllm#50457)",
       properties=("window-hit",),
       summary="the coordinator keeps the full-attention group's hit length instead of "
               "cutting it to the sliding group's shorter hit: the request skips tokens whose "
               "sliding-window KV was never computed")
class UnreconciledHit(BlockHashCache):
    def _reconcile(self, full, sliding):
        return len(full) * self.block_size  # the defect: the sliding hit is not taken
