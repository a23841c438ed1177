"""Invariants of a hash-chained block prefix cache (vLLM v1's ``BlockPool``; variant block-hash).

Pure functions over plain data read from the pool: each block's ref count and hash, the free
queue's block ids in order, the hash -> block ids map, and which live request holds which
blocks.  Conservation itself is ``check_conservation`` over a ``PoolView`` of the free queue;
the eviction-order properties are in ``invariants/policy.py`` (``check_queue_order``,
``check_queue_victims``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .violation import fail


def check_block_refs(refs: Mapping[int, int], holders: Mapping[int, Sequence[str]]) -> None:
    """``ref-balance``: every usable block's ref count == the live requests holding it."""
    for bid in sorted(refs):
        got, who = refs[bid], list(holders.get(bid, ()))
        if got < 0:
            fail("ref-balance", f"block {bid}: ref count {got} < 0", block=bid, ref=got)
        if got != len(who):
            fail("ref-balance", f"block {bid}: ref count {got}, but {len(who)} live request(s) "
                 f"hold it {who}", block=bid, ref=got, expected=len(who), holders=who)


def check_hash_map(hash_map: Mapping[str, Sequence[int]],
                   block_hashes: Mapping[int, str | None]) -> None:
    """``hash-map``: the hash -> blocks map holds exactly the cached blocks, each under its
    own hash (a stale entry would hand a hit a block that now holds other tokens)."""
    for h, ids in hash_map.items():
        if not ids:
            fail("hash-map", f"hash {h} maps to no block", hash=h)
        for bid in ids:
            mine = block_hashes.get(bid)
            if mine != h:
                fail("hash-map", f"hash {h} maps to block {bid}, whose hash is {mine} "
                     "(a stale entry: the block was evicted or re-hashed)", hash=h,
                     block=bid, block_hash=mine)
    for bid, h in sorted(block_hashes.items()):
        if h is not None and bid not in hash_map.get(h, ()):
            fail("hash-map", f"block {bid} is cached under hash {h}, but the map does not "
                 "lead to it", block=bid, hash=h)


def check_blocks_quiescent(free: Sequence[int], capacity: int, refs: Mapping[int, int],
                           hash_map_size: int) -> None:
    """``quiescence``: every request gone and the prefix cache reset -> every usable block is
    free, no ref is left and the hash map is empty."""
    held = sorted(b for b, r in refs.items() if r)
    if held:
        fail("quiescence", f"after draining, block(s) {held[:16]} still have a ref",
             blocks=held)
    if len(set(free)) != capacity or len(free) != capacity:
        fail("quiescence", f"after draining, {len(set(free))} of {capacity} blocks are free "
             f"({capacity - len(set(free))} leaked)", free=len(set(free)), capacity=capacity)
    if hash_map_size:
        fail("quiescence", f"after reset_prefix_cache, {hash_map_size} hash(es) are still "
             "mapped", hashes=hash_map_size)
