"""Conservation: free + owned by the tree + held by live requests == capacity, no id twice."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Iterable, Mapping

from .violation import fail
from .views import PoolView


def check_conservation(pool: PoolView, owners: Mapping[str, Iterable[int]],
                       borrowed: Mapping[str, Iterable[int]] | None = None) -> None:
    """Every usable id of ``pool`` is in exactly one place: the free list or one owner.

    ``owners`` maps an owner name (``tree``, ``request 3``, ``session 1``...) to the ids it
    holds.  Reports duplicates in the free list (double free), an id both free and owned (use
    after free), an id owned twice, reserved/out-of-range ids, and lost ids (leaks).
    ``borrowed`` maps a reader (a request reading the tree's prefix) to ids it uses without
    owning them: none of those may be free.
    """
    if _consistent(pool, owners, borrowed):
        return
    _diagnose(pool, owners, borrowed)


def check_held_once(pool: str, owner: str, slots: Iterable[int], unit: str = "slot") -> None:
    """``owner`` (the tree) holds each of its ``slots`` at one position only.  Conservation
    counts pages, and a page holds several tokens of one owner, so it cannot see two positions
    of the tree sharing one slot -- each would read the other's KV, and evicting both frees the
    slot twice."""
    slots = list(slots)
    if len(set(slots)) == len(slots):
        return
    twice = sorted(i for i, c in Counter(slots).items() if c > 1)
    fail("conservation", f"pool {pool}: {unit}(s) {twice[:16]} are held at two positions by "
         f"{owner} (they would read each other's KV)", pool=pool, ids=twice, owner=owner)


def _consistent(pool: PoolView, owners, borrowed) -> bool:
    """The fast path (set operations in C): True when nothing at all is wrong."""
    return consistent_lists(pool.free, pool.capacity, pool.reserved, list(owners.values()),
                            list(borrowed.values()) if borrowed else None, base=pool.base)


def consistent_lists(free, capacity: int, reserved, owners: list, borrowed: list | None = None,
                     full: frozenset | None = None, held_once: int = 0,
                     base: int = 1) -> bool:
    """``_consistent`` on a pool given by its free ids, capacity and reserved ids, with the
    owners' and the readers' ids as lists of id lists (a pool can answer without building
    its ``PoolView``, nor a fast verdict the owner names: ``caches.pools`` ``consistent``).

    The same predicate as checking each owner against the union so far: the free list has
    no duplicate, the free set and every owner's set are pairwise disjoint, none holds a
    reserved id, the union is exactly ``capacity`` ids in ``1..capacity``, and no borrowed id
    is free.  The usual case -- no id listed twice anywhere -- is one set over all the lists;
    only when some id repeats are the sets built owner by owner (an owner may list an id
    more than once, e.g. several tokens of one page).  ``full``, if given, is
    ``ids_1_to(capacity)`` and holds no reserved id: then "``capacity`` distinct ids, none
    reserved, all in ``1..capacity``" is one set comparison.  ``base``: the pool's first id
    (``caches.seam.PoolLayout``; 0 for an allocator without a padding id): the ids are then
    ``base..base + capacity - 1``.

    ``held_once``: the first ``held_once`` owners (the tree's lists) together list no id twice
    as well (``check_held_once``), which the one set already says in the usual case: it costs
    a set only when some id repeats."""
    listed = list(free)
    for ids in owners:
        listed += ids
    seen = set(listed)
    n = len(seen)
    if n != len(listed):
        if held_once:
            tree = [i for ids in owners[:held_once] for i in ids]
            if len(set(tree)) != len(tree):
                return False
        return _consistent_per_owner(free, capacity, reserved, owners, borrowed, base)
    if full is not None:
        if seen != full:
            return False
    elif n != capacity or not seen.isdisjoint(reserved):
        return False
    elif n and (min(seen) < base or max(seen) > n - 1 + base):
        return False
    if borrowed:
        fs = set(free)
        return all(fs.isdisjoint(ids) for ids in borrowed)
    return True


@lru_cache(maxsize=256)
def ids_1_to(capacity: int) -> frozenset:
    """The ids ``1..capacity`` (what a pool's free and owned ids add up to)."""
    return frozenset(range(1, capacity + 1))


def _consistent_per_owner(free, capacity: int, reserved, owners: list, borrowed,
                          base: int = 1) -> bool:
    """``consistent_lists`` when some id is listed twice: disjoint iff the owners' distinct
    sizes and the free list's add up to the size of their union."""
    fs = set(free)
    if len(fs) != len(free):
        return False
    seen = set(fs)
    total = len(fs)
    for ids in owners:
        ids = set(ids)
        total += len(ids)
        seen |= ids
    n = len(seen)
    if total != n or n != capacity or not seen.isdisjoint(reserved):
        return False
    if n and (min(seen) < base or max(seen) > n - 1 + base):
        return False
    return not borrowed or all(fs.isdisjoint(ids) for ids in borrowed)


def _diagnose(pool: PoolView, owners, borrowed) -> None:
    """The slow path: find the first thing wrong and say it with the ids and numbers."""
    name, unit = pool.name, pool.unit
    free_count = Counter(pool.free)
    dup_free = sorted(i for i, c in free_count.items() if c > 1)
    if dup_free:
        fail("conservation", f"pool {name}: {unit}(s) {dup_free} are in the free list more "
             "than once (freed twice)", pool=name, ids=dup_free)
    where: dict[int, str] = {i: "free" for i in free_count}
    ids = range(pool.base, pool.base + pool.capacity)
    valid = set(ids) if not set(pool.reserved) & set(ids) else None
    for owner, ids in owners.items():
        for i in ids:
            if i in where:
                other = where[i]
                if other == owner:
                    continue  # several tokens of one page held by the same owner
                msg = (f"pool {name}: {unit} {i} is both free and held by {owner}"
                       if other == "free" else
                       f"pool {name}: {unit} {i} is held by both {other} and {owner}")
                fail("conservation", msg, pool=name, id=i, places=[other, owner])
            where[i] = owner
    for reader, ids in (borrowed or {}).items():
        for i in ids:
            if where.get(i) == "free":
                fail("conservation", f"pool {name}: {unit} {i} is free but {reader} still "
                     "reads it", pool=name, id=i, reader=reader)
    bad = sorted(i for i in where if (i in pool.reserved) or
                 (valid is not None and i not in valid))
    if bad:
        fail("conservation", f"pool {name}: reserved or out-of-range {unit}(s) {bad} in use",
             pool=name, ids=bad)
    if len(where) != pool.capacity:
        by_owner = Counter(where.values())
        lost = sorted(valid - set(where)) if valid else []
        fail("conservation", f"pool {name}: free {by_owner.get('free', 0)} + owned "
             f"{len(where) - by_owner.get('free', 0)} = {len(where)} != capacity "
             f"{pool.capacity}" + (f"; lost {unit}(s) {lost[:16]}" if lost else ""),
             pool=name, free=by_owner.get("free", 0), owned=len(where) - by_owner.get("free", 0),
             capacity=pool.capacity, lost=lost)
