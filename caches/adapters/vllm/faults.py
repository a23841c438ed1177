"""The block-hash faults in vLLM's own classes: each patches the one method of *this* cache's
``BlockPool`` (or its request block hasher) the defect lives in, on the instance only.

| id | patched | form |
|---|---|---|
| K1 | ``BlockPool.touch`` | a block at ref 0 gains its ref but stays in the free queue |
| K2 | ``BlockPool._maybe_evict_cached_block`` | the block's hash is reset, the map entry kept |
| K3 | ``BlockPool.touch`` | a block at ref 0 leaves the free queue without gaining a ref |
| K4 | ``free_block_queue.popleft_n`` | blocks taken from the middle of the queue |
| K5 | the request block hasher | each block hashed without its parent's hash |
| K8 | ``KVCacheManager.allocate_slots`` | a refusal (None) keeps the hit: ``BlockPool.touch`` on it |

K6 (the free order lives inside ``SingleTypeKVCacheManager.free``) and K7 (a comparison inside
``allocate_slots``) have no small instance patch: the target refuses them.
"""

from __future__ import annotations

from caches.target import FaultNotInjectable

INJECTABLE = ("K1", "K2", "K3", "K4", "K5", "K8")


def check_injectable(fault: str | None) -> None:
    if fault is not None and fault not in INJECTABLE:
        raise FaultNotInjectable(f"fault {fault} has no form in the vllm target (injectable "
                                 f"there: {', '.join(INJECTABLE)})")


def inject(cache, fault: str | None) -> None:
    """Patch ``fault`` into ``cache`` (a ``VllmCache``)."""
    if fault is None:
        return
    check_injectable(fault)
    pool = cache.pool
    queue = pool.free_block_queue
    if fault in ("K1", "K3"):
        def touch(blocks):
            for blk in blocks:
                if blk.is_null:
                    continue
                if fault == "K1":
                    blk.ref_cnt += 1  # K1: no free_block_queue.remove at ref 0
                elif blk.ref_cnt == 0:
                    queue.remove(blk)  # K3: revived, ref left at 0
                else:
                    blk.ref_cnt += 1

        pool.touch = touch
    elif fault == "K2":
        def maybe_evict(blk):
            if blk.block_hash is None:
                return False
            blk.reset_hash()  # K2: cached_block_hash_to_block still maps to it
            return True

        pool._maybe_evict_cached_block = maybe_evict
    elif fault == "K4":
        def popleft_n(n):
            out = []
            for _ in range(n):
                free = queue.get_all_free_blocks()
                blk = free[len(free) // 2]  # K4: the middle, not the LRU front
                queue.remove(blk)
                out.append(blk)
            return out

        queue.popleft_n = popleft_n
    elif fault == "K8":
        manager, allocate = cache.manager, cache.manager.allocate_slots

        def allocate_slots(request, num_new_tokens, *args, **kwargs):
            out = allocate(request, num_new_tokens, *args, **kwargs)
            hit = kwargs.get("new_computed_blocks")
            if out is None and hit is not None:
                pool.touch(hit.blocks[0])  # K8: the refused request keeps its hit's refs
            return out

        manager.allocate_slots = allocate_slots
    elif fault == "K5":
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import hash_block_tokens

        bs = cache.block_size

        def unchained(request):
            done, full = len(request.block_hashes), request.num_tokens // bs
            toks = request.all_token_ids
            # K5: every block hashed with no parent
            return [hash_block_tokens(sha256, None, toks[i * bs:(i + 1) * bs])
                    for i in range(done, full)]

        cache.set_block_hasher(unchained)
