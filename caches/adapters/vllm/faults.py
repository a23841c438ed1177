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
| K9 | the sliding manager's ``get_num_blocks_to_allocate`` | the hit's null blocks counted as evictable blocks to revive (what #19031 fixed) |
| K10 | the sliding manager's ``_remove_blocks_in_range`` and ``free`` | the blocks released out of the window are recorded and freed again with the request (#42571) |
| K11 | ``HybridKVCacheCoordinator.find_longest_cache_hit`` | the per-group hits (``find_longest_cache_hit_per_group``) with the full group's length: not reconciled (#50457) |

K6 (the free order lives inside ``SingleTypeKVCacheManager.free``) and K7 (a comparison inside
``allocate_slots``) have no small instance patch: the target refuses them.
"""

from __future__ import annotations

from caches.target import FaultNotInjectable

INJECTABLE = ("K1", "K2", "K3", "K4", "K5", "K8", "K9", "K10", "K11")
HYBRID_ONLY = ("K9", "K10", "K11")  # they live in the sliding-window group (window > 0)


def check_injectable(fault: str | None) -> None:
    if fault is not None and fault not in INJECTABLE:
        raise FaultNotInjectable(f"fault {fault} has no form in the vllm target (injectable "
                                 f"there: {', '.join(INJECTABLE)})")


def inject(cache, fault: str | None) -> None:
    """Patch ``fault`` into ``cache`` (a ``VllmCache``)."""
    if fault is None:
        return
    check_injectable(fault)
    if fault in HYBRID_ONLY:
        if not getattr(cache, "window", 0):
            raise FaultNotInjectable(f"fault {fault} lives in the sliding-window group: run "
                                     "it with --param window=4 (the hybrid regime)")
        _inject_hybrid(cache, fault)
        return
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


def _inject_hybrid(cache, fault: str) -> None:
    """K9-K11 on the hybrid coordinator of ``cache`` (group 1: the sliding window)."""
    coordinator = cache.manager.coordinator
    sliding = coordinator.single_type_managers[1]
    if fault == "K9":
        count = sliding.get_num_blocks_to_allocate

        def get_num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks, *args,
                                       **kwargs):
            need = count(request_id, num_tokens, new_computed_blocks, *args, **kwargs)
            # K9: every null of the hit counted as an evictable block to revive
            return need + sum(1 for b in new_computed_blocks if b.is_null)

        sliding.get_num_blocks_to_allocate = get_num_blocks_to_allocate
    elif fault == "K10":
        released: dict = {}
        remove, free = sliding._remove_blocks_in_range, sliding.free

        def remove_blocks_in_range(request_id, first_block, last_block):
            before = list(sliding.req_to_blocks.get(request_id, ()))
            remove(request_id, first_block, last_block)
            now = sliding.req_to_blocks.get(request_id, ())
            released.setdefault(request_id, []).extend(
                b for i, b in enumerate(before) if i < len(now) and now[i] is not b)

        def free_again(request_id):
            free(request_id)
            # K10: the released blocks freed once more with the request
            sliding.block_pool.free_blocks(list(reversed(released.pop(request_id, []))))

        sliding._remove_blocks_in_range = remove_blocks_in_range
        sliding.free = free_again
    elif fault == "K11":
        full_group = coordinator.full_attention_group_id

        def find_longest_cache_hit(block_hashes, max_cache_hit_length):
            # K11: every group's own hit, the full group's length, nothing reconciled
            blocks, lengths = coordinator.find_longest_cache_hit_per_group(
                block_hashes, max_cache_hit_length)
            return tuple(list(b) for b in blocks), lengths[full_group], 0

        coordinator.find_longest_cache_hit = find_longest_cache_hit
