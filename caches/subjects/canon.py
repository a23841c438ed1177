"""One canonicaliser for the exhaustive search's state merging (``kvcheck check``).

A subject declares *what* its state is -- ``Subject.state()`` returns a ``TreeState``: the
tree's root, each node's own fields, and everything else (requests, locks, pools' free lists,
counters), as plain data in which node references, pool ids and clock values are marked:

    Ref(node)            a node (renamed to its label, see below; None stays None)
    Id(pool, x, per=1)   an id of pool ``pool`` (renamed by first appearance; with ``per``
                         > 1 a slot of a page of that many slots: the page is renamed, the
                         offset kept); ``ids(pool, xs)`` marks a sequence of them
    Time(t)              a clock value or sort key (replaced by its rank among every Time of
                         the state; equal values, equal rank)
    Unordered(items)     a collection whose order means nothing (sorted once renamed)
    IdMap(pool, {x: v})  a mapping keyed by pool ids (entries by the keys' new names; keys not
                         named yet in raw order)

``canonical(state)`` turns that into a hashable value up to renaming, the same way for every
subject: nodes are labelled by a pre-order walk with children sorted by key (then nodes
referred to but no longer in the tree -- only a fault does that -- walking up their
parents), each node becomes ``(parent label, *fields, sorted (key, child label) pairs)``;
pool ids are renamed per pool in order of first appearance (tree nodes in label order, then
the rest in the order the subject lists it: put the free lists last, their order decides the
next allocation); id 0 of every pool (reserved padding) stays 0.  Two states with equal
canonical forms must behave the same under every op sequence; a subject keeps everything
later ops or checks can observe (counters too: faults corrupt them) -- too fine only costs
states, too coarse can hide a bug.  Collections whose order matters (LRU lists, free
lists, in-flight queues) stay sequences; only what is really a set goes in ``Unordered``
(never pool ids: their first-appearance order would then depend on raw ids).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class Ref:
    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node


class Id:
    __slots__ = ("pool", "x", "per")

    def __init__(self, pool, x, per: int = 1):
        self.pool, self.x, self.per = pool, x, per


class Time:
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


class Unordered:
    __slots__ = ("items",)

    def __init__(self, items):
        self.items = tuple(items)


class IdMap:
    __slots__ = ("pool", "items")

    def __init__(self, pool, items: dict):
        self.pool, self.items = pool, items


class Ids:
    __slots__ = ("pool", "xs", "per")

    def __init__(self, pool, xs, per: int = 1):
        self.pool, self.xs, self.per = pool, xs, per


def ids(pool, xs, per: int = 1):
    """The ids ``xs`` of ``pool`` marked for renaming, in order (None stays None)."""
    return None if xs is None else Ids(pool, xs, per)


def one(pool, x, per: int = 1):
    """One id of ``pool`` (None stays None)."""
    return None if x is None else Id(pool, x, per)


def _children(n):
    return n.children


def _parent(n):
    return getattr(n, "parent", None)


@dataclass
class TreeState:
    """What a subject's state is (see the module docstring)."""

    root: object
    node: Callable  # node -> tuple of its own fields (plain data and markers)
    rest: tuple  # everything else, in an order that is part of the state
    children: Callable = _children  # node -> {key: child}
    parent: Callable = _parent  # node -> parent (None at the root)
    is_node: Callable = lambda n: n is not None  # noqa: E731  parents past this are not nodes


_PLAIN = frozenset({int, str, bool, float, type(None), bytes})


def canonical(state: TreeState) -> tuple:
    """``state`` as a hashable value up to renaming of node ids, pool ids and clocks."""
    order: list = []
    label: dict[int, int] = {}

    def add(n) -> None:
        label[id(n)] = len(order)
        order.append(n)

    stack = [state.root]
    while stack:  # pre-order, children by key, so labels do not depend on ids
        n = stack.pop()
        if id(n) in label:  # a cycle (only a fault makes one): do not walk it twice
            continue
        add(n)
        stack.extend(c for _, c in sorted(state.children(n).items(), key=_key, reverse=True))

    times: set = set()

    def scan(x) -> None:  # pass 1: clock values, and nodes referred to but not in the tree
        t = type(x)
        if t is tuple or t is list:
            for y in x:
                if type(y) not in _PLAIN:
                    scan(y)
        elif t is Ref:
            n = x.node
            while state.is_node(n) and id(n) not in label:
                add(n)
                n = state.parent(n)
        elif t is Time:
            times.add(x.t)
        elif t is Unordered:
            scan(x.items)
        elif t is IdMap:
            scan(tuple(x.items.values()))
        # anything else (plain data, ids) holds no node and no clock

    fields: list = []

    def scan_nodes() -> None:
        while len(fields) < len(order):
            f = state.node(order[len(fields)])
            fields.append(f)
            scan(f)

    scan_nodes()
    scan(state.rest)
    scan_nodes()  # their own fields, for nodes the rest referred to

    rank = {t: i for i, t in enumerate(sorted(times))}
    names: dict = {}

    def name(pool, x):
        d = names.get(pool)
        if d is None:
            d = names[pool] = {0: 0}
        return d.setdefault(x, len(d))

    def enc(x):  # pass 2: renamed, in order
        t = type(x)
        if t is tuple or t is list:
            return tuple([y if type(y) in _PLAIN else enc(y) for y in x])
        if t in _PLAIN:
            return x
        if t is Ids:
            d = names.get(x.pool)
            if d is None:
                d = names[x.pool] = {0: 0}
            per = x.per
            if per == 1:
                return tuple([d.setdefault(y, len(d)) for y in x.xs])
            return tuple([d.setdefault(y // per, len(d)) * per + y % per for y in x.xs])
        if t is Id:
            if x.per == 1:
                return name(x.pool, x.x)
            return name(x.pool, x.x // x.per) * x.per + x.x % x.per
        if t is Ref:
            return None if x.node is None else label.get(id(x.node), -1)
        if t is Time:
            return rank[x.t]
        if t is Unordered:
            return tuple(sorted((enc(y) for y in x.items), key=repr))
        if t is IdMap:
            d = names.get(x.pool) or {}
            keys = sorted(x.items, key=lambda k: (k not in d, d.get(k, k)))
            return tuple((name(x.pool, k), enc(x.items[k])) for k in keys)
        return x

    nodes = tuple((enc(Ref(state.parent(n))) if state.is_node(state.parent(n)) else -1,
                   *enc(f),
                   tuple(sorted((k, label[id(c)]) for k, c in state.children(n).items())))
                  for n, f in zip(order, fields))
    return nodes, enc(state.rest)


def _key(kv):
    return kv[0]
