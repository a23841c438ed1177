"""block-hash on vLLM's real ``KVCacheManager`` + ``BlockPool`` (vllm 0.33.0, one full-attention
KV cache group, prefix caching on, sha256 block hashes; with ``window > 0`` a second group, a
``SlidingWindowSpec`` of that window, so that the manager builds its
``HybridKVCacheCoordinator`` over a ``FullAttentionManager`` and a ``SlidingWindowManager``
sharing the one ``BlockPool``, as ``kv_cache_utils.py`` builds a hybrid model's config: one
``KVCacheGroupSpec`` per attention type, equal block sizes, ``scheduler_block_size`` and
``hash_block_size`` the block size).

``VllmCache`` puts vLLM's manager behind the cache interface ``BlockHashSubject`` drives
(``caches/subjects/block_hash.py``), the way ``v1/core/sched/scheduler.py`` calls it:

* one vLLM ``Request`` per request id, its tokens kept in step with the subject's (decoded
  tokens go in through ``append_output_token_ids``, which extends its block hashes);
* ``get_computed_blocks(request)`` for a waiting request (its hit);
* ``allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks)``
  with ``request.num_computed_tokens`` set as the scheduler keeps it (0 for a waiting or
  preempted request, the computed count for a running one);
* ``free(request)`` (finish, abort, preempt), ``evict_blocks(ids)``, ``reset_prefix_cache()``.

``VllmBlockHashSubject`` reads the real state for the checks: every block's ``ref_cnt`` and
``block_hash``, the free queue in order (``get_all_free_blocks``), the hash -> block map
(``cached_block_hash_to_block``) and each request's block table in every group (each
manager's ``req_to_blocks``).
"""

from __future__ import annotations

import logging

from caches.subjects.block_hash import BlockHashSubject


class VllmCache:
    """vLLM's manager behind the reference cache's method names."""

    def __init__(self, num_blocks: int, block_size: int, max_len: int, window: int = 0):
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, SlidingWindowSpec)
        from vllm.v1.request import Request, RequestStatus

        # vLLM logs every refused reset_prefix_cache as a warning: the machine does it on purpose
        logging.getLogger("vllm").setLevel(logging.ERROR)
        init_none_hash(sha256)
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                 dtype=torch.float32)
        groups = [KVCacheGroupSpec(["layer.0"], spec)]
        if window:
            groups.append(KVCacheGroupSpec(["layer.1"], SlidingWindowSpec(
                block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32,
                sliding_window=window)))
        self.window = window
        config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                               kv_cache_groups=groups)
        self.manager = KVCacheManager(config, max_model_len=max(max_len, block_size) + 1,
                                      scheduler_block_size=block_size,
                                      hash_block_size=block_size, enable_caching=True)
        self.pool = self.manager.block_pool
        self.block_size = block_size
        self._hasher = get_request_block_hasher(block_size, sha256)
        self._make_request = lambda rid, tokens: Request(
            str(rid), list(tokens), SamplingParams(max_tokens=max_len), None,
            block_hasher=lambda req: self._hasher(req))
        self._blocks = lambda groups: KVCacheBlocks(tuple(tuple(g) for g in groups))
        self._status = RequestStatus
        self.vreqs: dict[int, object] = {}
        self._hit_tokens: dict[int, tuple] = {}  # rid -> (blocks, tokens) of its last hit

    def set_block_hasher(self, hasher) -> None:
        """The block hasher new requests get (a fault's; vLLM's chained sha256 by default)."""
        self._hasher = hasher

    @property
    def req_to_blocks(self) -> dict:
        """The full-attention manager's block tables, by our request id."""
        return self.tables[0]

    @property
    def tables(self) -> tuple[dict, ...]:
        """Every group's block tables (the managers' ``req_to_blocks``), by our request id."""
        return tuple({int(k): v for k, v in m.req_to_blocks.items() if v}
                     for m in self.manager.coordinator.single_type_managers)

    def _request(self, rid: int, tokens) -> object:
        """Request ``rid`` with exactly ``tokens``: a new one for a new sequence, else the
        live one with any decoded tokens appended."""
        req = self.vreqs.get(rid)
        have = list(req.all_token_ids) if req is not None else None
        if have is None or have != list(tokens)[:len(have)]:
            req = self.vreqs[rid] = self._make_request(rid, tokens)
        elif len(tokens) > len(have):
            req.append_output_token_ids(list(tokens)[len(have):])
        return req

    def get_computed_blocks(self, rid: int, tokens):
        req = self._request(rid, tokens)
        req.num_computed_tokens = 0
        blocks, n, _ = self.manager.get_computed_blocks(req)
        hit = list(blocks.blocks[0])
        self._hit_tokens[rid] = (len(hit), n)  # what the scheduler hands allocate_slots
        if self.window:
            return tuple(list(g) for g in blocks.blocks), n
        return hit, n

    def allocate_slots(self, rid: int, tokens, num_computed: int, num_new_tokens: int,
                       new_computed=(), num_new_computed: int | None = None):
        req = self._request(rid, tokens)
        req.num_computed_tokens = num_computed
        groups = new_computed if self.window else (new_computed,)
        hit = self._blocks(groups) if any(groups) else None
        # upstream (Scheduler.schedule): num_new_computed_tokens is the count
        # get_computed_blocks returned with the blocks, not one derived from them -- a branch
        # where the two differ is driven as vLLM's scheduler drives it
        blocks, hit_tokens = self._hit_tokens.pop(rid, (None, None))
        if num_new_computed is not None:  # the subject hands the count (hybrid)
            hit_tokens = num_new_computed if hit is not None else 0
        elif not new_computed:
            hit_tokens = 0
        elif blocks != len(new_computed):  # not the hit get_computed_blocks returned
            hit_tokens = len(new_computed) * self.block_size
        out = self.manager.allocate_slots(req, num_new_tokens,
                                          num_new_computed_tokens=hit_tokens,
                                          new_computed_blocks=hit)
        if out is None:
            return None
        req.status = self._status.RUNNING
        return [b for g in out.blocks for b in g]

    def free(self, rid: int) -> None:
        req = self.vreqs[rid]
        self.manager.free(req)
        req.status = self._status.PREEMPTED  # waits (or is gone) holding nothing

    def evict_blocks(self, block_ids) -> None:
        self.manager.evict_blocks(set(block_ids))

    def reset_prefix_cache(self) -> bool:
        return bool(self.manager.reset_prefix_cache())


class VllmBlockHashSubject(BlockHashSubject):
    """The block-hash subject reading vLLM's own state."""

    def refs(self) -> dict[int, int]:
        return {b.block_id: b.ref_cnt for b in self.cache.pool.blocks[1:]}

    def block_hashes(self) -> dict[int, object]:
        return {b.block_id: b.block_hash for b in self.cache.pool.blocks[1:]}

    def free_ids(self) -> list[int]:
        return [b.block_id for b in self.cache.pool.free_block_queue.get_all_free_blocks()]

    def hash_map(self) -> dict[object, tuple]:
        out = {}
        for h, v in self.cache.pool.cached_block_hash_to_block._cache.items():
            out[h] = (v.block_id,) if hasattr(v, "block_id") else tuple(v)
        return out

    def table(self, rid: int) -> list[int]:
        return [b.block_id for b in self.cache.req_to_blocks.get(rid, ())]

    def tables(self, rid: int) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in t.get(rid, ())] for t in self.cache.tables)

    @staticmethod
    def block_id(block) -> int:
        return block.block_id


def make_subject(params, *, fault=None, device=None) -> VllmBlockHashSubject:
    from caches.adapters.vllm.faults import inject

    cache = VllmCache(params["num_blocks"], params["block_size"], params["max_len"],
                      params.get("window", 0))
    inject(cache, fault)
    return VllmBlockHashSubject(cache=cache, max_len=params["max_len"], device=device)
