"""Quiescence: with every request finished and everything evicted, nothing is left held."""

from __future__ import annotations

from typing import Iterable, Mapping

from .conservation import check_conservation
from .violation import fail
from .views import PoolView, TreeView


def check_quiescence(tree: TreeView, pools: Iterable[PoolView],
                     root_refs: Mapping[str, int]) -> None:
    """Only the root is left, with its baseline refs, and every pool is entirely free."""
    left = [n.id for n in tree.nodes.values() if n.id != tree.root]
    if left:
        fail("quiescence", f"after draining, {len(left)} node(s) are still in the tree: "
             f"{sorted(left)[:16]}", nodes=sorted(left))
    root = tree.nodes[tree.root]
    for counter, want in root_refs.items():
        got = root.refs.get(counter, 0)
        if got != want:
            fail("quiescence", f"after draining, root {counter} ref is {got}, expected "
                 f"{want}", counter=counter, ref=got, expected=want)
    for pool in pools:
        distinct = set(pool.free)
        free = len(distinct)
        if free != len(pool.free) or (pool.capacity and distinct and (
                min(distinct) < pool.base or max(distinct) > pool.capacity - 1 + pool.base)):
            # an id freed twice, or one that is no id of the pool: not a leak, the free list
            # itself is wrong -- conservation says which (with nothing left to own an id)
            check_conservation(pool, {})
        if free != pool.capacity or len(pool.free) != pool.capacity:
            fail("quiescence", f"after draining, pool {pool.name} has {free} of "
                 f"{pool.capacity} {pool.unit}s free ({pool.capacity - free} leaked)",
                 pool=pool.name, free=free, capacity=pool.capacity)
