"""An engine's own radix ``TreeNode`` seen through kvcheck's radix node interface: what the
SGLang and pymllm radix adapters share (their trees come from one design)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class MatchResult(NamedTuple):
    indices: list
    last_node: "RawNode"


def ids_of(value) -> tuple:
    """A node value (a tensor; a list at SGLang's root; None once pymllm evicted it) as a
    tuple of ints."""
    if value is None:
        return ()
    return tuple(value.tolist()) if isinstance(value, torch.Tensor) else tuple(value)


class RawNode:
    """One engine ``TreeNode`` (one wrapper per node, so ``is`` works); ids are relative to
    the root's.  ``cache``: the adapter, with ``tree`` (the engine's cache) and ``node(raw)``.
    Subclasses name the engine and how a key's tokens are read."""

    __slots__ = ("raw", "_cache")
    engine = "engine"

    def __init__(self, raw, cache):
        self.raw, self._cache = raw, cache

    def key_tokens(self) -> tuple:
        return tuple(self.raw.key.token_ids)

    @property
    def id(self) -> int:
        return self.raw.id - self._cache.tree.root_node.id

    @property
    def parent(self):
        return None if self.raw.parent is None else self._cache.node(self.raw.parent)

    @property
    def children(self) -> dict:
        return {ck: self._cache.node(c) for ck, c in self.raw.children.items()}

    @property
    def key(self) -> tuple:
        return self.key_tokens()

    @property
    def value(self) -> tuple:
        return ids_of(self.raw.value)

    @property
    def lock_ref(self) -> int:
        return self.raw.lock_ref

    @property
    def last_access_time(self):
        return self.raw.last_access_time

    def __repr__(self) -> str:
        return (f"{self.engine}.TreeNode({self.id}, key={list(self.key)}, "
                f"lock_ref={self.lock_ref})")


class RawNodes:
    """An adapter's wrappers of the engine's nodes: ``node(raw)`` gives the one ``node_class``
    wrapper of each (kept in ``_nodes``, which also keeps the raw node alive); needs ``tree``."""

    node_class = RawNode
    _nodes: dict

    def node(self, raw):
        n = self._nodes.get(id(raw))
        if n is None:
            n = self._nodes[id(raw)] = self.node_class(raw, self)
        return n

    @property
    def root_node(self):
        return self.node(self.tree.root_node)


def raw_tree_view(root, page_size: int, key_tokens, times: bool = False):
    """The engine's tree straight from its ``TreeNode``s (cheaper than through ``RawNode``),
    ids relative to the root's; ``key_tokens(raw)`` reads a node's key; with ``times`` each
    node's ``extra["time"]`` is its ``last_access_time`` (the LRU key)."""
    from invariants import NodeView, TreeView

    base, nodes, stack = root.id, {}, [root]
    while stack:
        n = stack.pop()
        nid = n.id - base
        if nid in nodes:
            continue
        nodes[nid] = NodeView(nid, None if n.parent is None else n.parent.id - base,
                              key_tokens(n), ids_of(n.value), {"lock": n.lock_ref},
                              {ck: c.id - base for ck, c in n.children.items()},
                              {"time": n.last_access_time} if times else {})
        stack.extend(n.children.values())
    return TreeView(nodes, 0, page_size)


def check_request_rows(free, size: int, held: dict, live, unit: str = "slot",
                       reserved: tuple = (0,)) -> None:
    """The engine's request-to-token table: every row free or held by exactly one live
    request (``held``: rid -> row), and no finished request still holding one."""
    from invariants import PoolView, check_conservation, fail

    pool = PoolView("req_to_token", unit, size, tuple(free), reserved)
    check_conservation(pool, {f"request r{rid}": [i] for rid, i in held.items()})
    stale = sorted(set(held) - set(live))
    if stale:
        fail("conservation", f"request-table rows of finished requests {stale} are still "
             "held", pool="req_to_token", requests=stale)
