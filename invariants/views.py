"""Plain, read-only views of a cache and its pools: what every invariant reads.

Subjects (reference caches and upstream adapters) build these; invariants never touch a
live cache object, so each check is a pure function that can be unit-tested on a hand-built
view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple

_EMPTY: Mapping = {}


class NodeView(NamedTuple):
    """One tree node.

    ``key`` holds the tokens on the edge into this node, ``value`` the pool ids holding their
    KV (same length as ``key``).  ``refs`` maps each ref counter the cache keeps on the node
    (``"lock"`` for a plain radix cache; ``"full"``/``"mamba"``/``"host"`` elsewhere) to its
    value.  ``children`` maps the child key (first token, or first page of tokens) to the
    child's id.  ``extra`` carries variant-specific fields (buffers, tiers, snapshots).
    (A NamedTuple: a view is rebuilt after every step, and tuples are the cheapest to build.)
    """

    id: int
    parent: int | None
    key: tuple
    value: tuple
    refs: Mapping[str, int]
    children: Mapping[object, int] = _EMPTY
    extra: Mapping[str, object] = _EMPTY


@dataclass(frozen=True)
class TreeView:
    nodes: Mapping[int, NodeView]
    root: int
    page_size: int = 1

    def walk(self) -> tuple:
        """Nodes in depth-first order from the root (cycle-safe).  Worked out once per view
        (a view is read-only; several checks walk the same one after every step)."""
        order = self.__dict__.get("_walk")
        if order is None:
            seen, stack, out, nodes = set(), [self.root], [], self.nodes
            while stack:
                nid = stack.pop()
                if nid in seen or nid not in nodes:
                    continue
                seen.add(nid)
                node = nodes[nid]
                out.append(node)
                stack.extend(node.children.values())
            order = tuple(out)
            object.__setattr__(self, "_walk", order)
        return order

    def path_to_root(self, nid: int):
        seen = set()
        while nid is not None and nid not in seen:
            seen.add(nid)
            yield nid
            nid = self.nodes[nid].parent if nid in self.nodes else None

    def tokens(self) -> int:
        return sum(len(n.value) for n in self.nodes.values() if n.id != self.root)


@dataclass(frozen=True)
class PoolView:
    """A pool's allocation units: ``capacity`` usable ids ``base .. base + capacity - 1``, the
    free list, reserved (padding) ids.  ``caches.seam.PoolLayout`` declares base and padding."""

    name: str
    unit: str
    capacity: int
    free: tuple
    reserved: tuple = (0,)
    base: int = 1
