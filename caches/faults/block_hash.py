"""Faults K1-K8 of the block-hash cache, each the smallest mutation of ``BlockHashCache``
(vLLM 0.33.0's ``BlockPool`` / ``KVCacheManager`` semantics; ids K for KV blocks: B is taken
by the TokenSpeed boundary faults).  Each is caught only on the property it names."""

from __future__ import annotations

from caches.block_hash import BlockHashCache, BlockPool
from caches.faults import fault

V = "block-hash"


def _with_pool(pool_cls):
    """A ``BlockHashCache`` whose block pool is ``pool_cls`` (the faulty one)."""

    class Cache(BlockHashCache):
        def __init__(self, num_blocks, block_size):
            super().__init__(num_blocks, block_size)
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
    def allocate_slots(self, rid, tokens, num_computed, num_new_tokens, new_computed=()):
        out = super().allocate_slots(rid, tokens, num_computed, num_new_tokens, new_computed)
        if out is None and new_computed:
            self.pool.touch(new_computed)  # the defect: touched before the check, kept
        return out
