"""Invariants of vLLM's hybrid KV cache (a full-attention group and a sliding-window group over
one ``BlockPool``; variant block-hash with ``window > 0``).

Pure functions over plain data: block ids per group table, the hit a lookup returned (block ids
per group and its length in tokens), each block's hash (None: uncached), the free queue's ids,
the hash -> block ids map.  The null block is the id ``null`` (0 upstream); a sliding table pads
the positions that left the window with it.  The window rules are vLLM 0.33.0's
(``vllm/v1/core/single_type_kv_cache_manager.py``): a token position ``p`` is out of the window
of the next token once ``p < computed - W + 1`` (``SlidingWindowManager.get_num_skipped_tokens``),
and a hit of ``n`` tokens needs the sliding blocks holding positions ``n - W + 1 .. n - 1``
(``find_longest_cache_hit``'s ``ceil((W - 1) / block_size)`` contiguous blocks ending at ``n``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .violation import fail


def window_blocks(n: int, window: int, block_size: int) -> range:
    """The block indices a sliding table needs real for the next token after ``n`` tokens:
    those holding positions ``max(0, n - W + 1) .. n - 1``."""
    return range(max(0, n - window + 1) // block_size, -(-n // block_size))


def check_window_hit(rid: int, n: int, hit: Sequence[Sequence[int]], window: int,
                     block_size: int, hashes: Mapping[int, object], null: int = 0) -> None:
    """``window-hit``: a hit of ``n`` tokens gives every group ``n / block_size`` blocks; the
    full group's all real, the sliding group's real (and cached) over the window's last W - 1
    tokens -- a null block or an uncached one there is KV the sliding layers never computed."""
    if n % block_size:
        fail("window-hit", f"r{rid}'s hit of {n} tokens is not block-aligned "
             f"(block size {block_size})", rid=rid, tokens=n)
    want = n // block_size
    names = ("full-attention", "sliding-window")
    for g, blocks in enumerate(hit):
        if len(blocks) != want:
            fail("window-hit", f"r{rid}'s hit of {n} tokens gives the {names[g]} group "
                 f"{len(blocks)} block(s) {list(blocks)[:16]}, not {want}: the groups' hits "
                 "are not reconciled", rid=rid, group=g, tokens=n, blocks=list(blocks))
    full, sliding = hit[0], hit[1]
    nulls = [i for i, b in enumerate(full) if b == null]
    if nulls:
        fail("window-hit", f"r{rid}'s full-attention hit holds the null block at position(s) "
             f"{nulls[:16]}", rid=rid, positions=nulls)
    for i in window_blocks(n, window, block_size):
        b = sliding[i]
        if b == null or hashes.get(b) is None:
            what = "the null block" if b == null else f"block {b}, which is not cached"
            fail("window-hit", f"r{rid}'s hit of {n} tokens: its sliding-window block {i} "
                 f"(tokens {i * block_size}..{(i + 1) * block_size - 1}, inside the window of "
                 f"{window}) is {what}", rid=rid, tokens=n, position=i, block=b,
                 window=window)


def check_window_release(rid: int, table: Sequence[int], computed: int, window: int,
                         block_size: int, null: int = 0) -> None:
    """``window-release``: after ``allocate_slots`` ran with ``computed`` tokens computed, the
    request's sliding table holds the null block at every position wholly before the window
    (``remove_skipped_blocks``): a real block there is memory the request no longer reads."""
    skipped = min(max(0, computed - window + 1) // block_size, len(table))
    kept = [(i, b) for i, b in enumerate(table[:skipped]) if b != null]
    if kept:
        i, b = kept[0]
        fail("window-release", f"r{rid}'s sliding table still holds block {b} at position {i} "
             f"(tokens {i * block_size}..{(i + 1) * block_size - 1}), wholly before the window "
             f"of {window} after {computed} computed tokens ({len(kept)} such block(s))",
             rid=rid, position=i, block=b, computed=computed, window=window)


def check_sentinel(null: int, free: Sequence[int], null_hash: object,
                   hash_map: Mapping[object, Sequence[int]], handed_out: Sequence[int],
                   full_tables: Mapping[str, Sequence[int]]) -> None:
    """``sentinel``: the null block is never in the free queue, never cached (no hash, no map
    entry), never handed out by an allocation, never in a full-attention table."""
    if null in free:
        fail("sentinel", f"the null block {null} is in the free queue (at position "
             f"{list(free).index(null)}): an allocation would hand it out", block=null)
    if null_hash is not None:
        fail("sentinel", f"the null block {null} carries hash {null_hash}", block=null,
             hash=null_hash)
    for h, ids in hash_map.items():
        if null in ids:
            fail("sentinel", f"hash {h} maps to the null block {null}: a hit would read it",
                 block=null, hash=h)
    if null in handed_out:
        fail("sentinel", f"get_new_blocks handed out the null block {null}", block=null)
    for who, table in full_tables.items():
        if null in table:
            fail("sentinel", f"{who}'s full-attention table holds the null block {null} at "
                 f"position {list(table).index(null)}", block=null, owner=who)


def check_groups_disjoint(tables: Mapping[str, Sequence[Sequence[int]]], null: int = 0) -> None:
    """``conservation``: a block belongs to one KV cache group at a time (its hash carries the
    group id): no block in a full-attention table and a sliding-window table at once."""
    seen: dict[int, tuple[int, str]] = {}
    for who, groups in tables.items():
        for g, table in enumerate(groups):
            for b in table:
                if b == null:
                    continue
                other = seen.setdefault(b, (g, who))
                if other[0] != g:
                    fail("conservation", f"block {b} is held by {other[1]}'s group {other[0]} "
                         f"table and {who}'s group {g} table: one block serves two KV cache "
                         "groups", block=b, groups=[other[0], g])
