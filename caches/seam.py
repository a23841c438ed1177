"""The engine-neutral seam: what a target *declares* so kvcheck's checks fit its engine.

An engine need not look like SGLang to be checked.  Its adapter states, with plain data:

* ``NodeFields`` -- where its tree nodes keep their id, parent, children, key, value, lock
  count and access time (attribute names or functions); ``tree_view`` and ``NodeProxy`` read
  any tree through it (SGLang's and pymllm's adapters are two users, ``raw_radix.py``);
* ``PoolLayout`` -- the ids its allocator hands out (``base`` 0 or 1, the ``padding`` ids it
  holds back), honoured by ``invariants/conservation.py`` and ``invariants/quiescence.py``;
* ``Results`` -- what its calls return: what "out of memory" looks like, and whether ``evict``
  returns a count or the indices it freed for the caller to free;
* ``Policy`` -- its eviction key, tie-break and recency rule, and the ``Difference``s from the
  reference it accepts (``kvcheck diff`` reports those as "differs as declared");
* an eviction observer (``RadixSubject.observe_evictions`` / ``RadixSubject.note_victim``,
  ``caches/subjects/radix.py``): every victim, also of evictions the engine runs on its own.

``docs/adapters.md`` (section 2a) lists every public name; ``tests/plugin_example/`` is an
engine plugged in through these only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

from invariants.policy import lru_key

Field = Union[str, Callable[[object], object]]  # an attribute name, or a function of the node


def read(fld: Field, raw):
    """One field of an engine object: ``getattr(raw, fld)``, or ``fld(raw)``."""
    return fld(raw) if callable(fld) else getattr(raw, fld)


def ids_of(value) -> tuple:
    """A node value (a tensor, a list, an array, None once evicted) as a tuple of ints."""
    if value is None:
        return ()
    tolist = getattr(value, "tolist", None)
    return tuple(tolist()) if tolist is not None else tuple(value)


@dataclass(frozen=True)
class NodeFields:
    """Where an engine's tree node keeps each thing kvcheck reads.  Each field is an attribute
    name or a function of the node.  ``key`` and ``value`` may be None (a root without one);
    ``value`` may be a tensor.  ``id`` must be deterministic within a run (creation order per
    tree); ``tree_view`` makes ids relative to the root's, so a global counter works too."""

    id: Field = "id"
    parent: Field = "parent"
    children: Field = "children"  # child key -> child node
    key: Field = "key"  # the tokens on the edge into the node
    value: Field = "value"  # the pool ids holding their KV
    lock: Field = "lock_ref"
    time: Field = "last_access_time"  # what the LRU policy key reads

    def key_of(self, raw) -> tuple:
        k = read(self.key, raw)
        return () if k is None else tuple(k)


REFERENCE_FIELDS = NodeFields()  # kvcheck's own caches (and SGLang's 0.5.12 tree, but its key)


def tree_view(root, fields: NodeFields, page_size: int, *, times: bool = False):
    """The engine's tree as an ``invariants.TreeView``, read through ``fields``; node ids are
    relative to the root's; with ``times`` each node's ``extra["time"]`` is its access time."""
    from invariants import NodeView, TreeView

    get_id, parent_of, children_of = fields.id, fields.parent, fields.children
    base = read(get_id, root)
    nodes, stack = {}, [root]
    while stack:
        n = stack.pop()
        nid = read(get_id, n) - base
        if nid in nodes:
            continue
        parent, kids = read(parent_of, n), read(children_of, n)
        nodes[nid] = NodeView(nid, None if parent is None else read(get_id, parent) - base,
                              fields.key_of(n), ids_of(read(fields.value, n)),
                              {"lock": read(fields.lock, n)},
                              {ck: read(get_id, c) - base for ck, c in kids.items()},
                              {"time": read(fields.time, n)} if times else {})
        stack.extend(kids.values())
    return TreeView(nodes, 0, page_size)


class NodeProxy:
    """One engine node seen with kvcheck's node names (``id``, ``parent``, ``children``,
    ``key``, ``value``, ``lock_ref``, ``last_access_time``), read through ``fields``.  Made by
    ``NodeProxies.node(raw)``: one proxy per node, so the driver's ``is`` works."""

    __slots__ = ("raw", "_owner")
    engine = "engine"

    def __init__(self, raw, owner: "NodeProxies"):
        self.raw, self._owner = raw, owner

    @property
    def _fields(self) -> NodeFields:
        return self._owner.node_fields

    @property
    def id(self) -> int:
        return read(self._fields.id, self.raw) - read(self._fields.id, self._owner.raw_root())

    @property
    def parent(self):
        p = read(self._fields.parent, self.raw)
        return None if p is None else self._owner.node(p)

    @property
    def children(self) -> dict:
        return {ck: self._owner.node(c) for ck, c in read(self._fields.children, self.raw).items()}

    @property
    def key(self) -> tuple:
        return self._fields.key_of(self.raw)

    @property
    def value(self) -> tuple:
        return ids_of(read(self._fields.value, self.raw))

    @property
    def lock_ref(self) -> int:
        return read(self._fields.lock, self.raw)

    @property
    def last_access_time(self):
        return read(self._fields.time, self.raw)

    def __repr__(self) -> str:
        return f"{self.engine} node {self.id} (key {list(self.key)}, lock {self.lock_ref})"


class NodeProxies:
    """Mixed into an adapter: ``node(raw)`` gives the one ``node_class`` proxy of each engine
    node (kept in ``_nodes``, which also keeps the raw node alive).  Needs ``node_fields`` and
    ``raw_root()`` (the engine's root node; by default ``self.tree.root_node``)."""

    node_class = NodeProxy
    node_fields = REFERENCE_FIELDS
    _nodes: dict

    def raw_root(self):
        return self.tree.root_node

    def node(self, raw):
        nodes = self.__dict__.setdefault("_nodes", {})
        n = nodes.get(id(raw))
        if n is None:
            n = nodes[id(raw)] = self.node_class(raw, self)
        return n

    @property
    def root_node(self):
        return self.node(self.raw_root())


@dataclass(frozen=True)
class PoolLayout:
    """The ids an engine's allocator hands out: ``base`` .. ``base + capacity - 1``, never one
    of ``padding`` (ids it holds back, e.g. SGLang's slot/page 0).  kvcheck's own pools and
    SGLang's are ``PoolLayout(1, (0,))`` (the default); an allocator with 0-based ids and no
    padding is ``PoolLayout(0, ())``."""

    base: int = 1
    padding: tuple = (0,)

    def ids(self, capacity: int) -> range:
        return range(self.base, self.base + capacity)

    def view(self, name: str, unit: str, capacity: int, free):
        """An ``invariants.PoolView`` of this layout."""
        from invariants import PoolView

        return PoolView(name, unit, capacity, tuple(free), tuple(self.padding), self.base)


ONE_BASED = PoolLayout()
ZERO_BASED = PoolLayout(0, ())


def returns_none(got) -> bool:
    return got is None


COUNT, INDICES = "count", "indices"


@dataclass(frozen=True)
class Results:
    """What an engine's calls return, as the radix driver reads them.

    ``out_of_memory(got)``: whether ``alloc_with_eviction``'s result means "no memory" (the
    default: ``None``; an engine whose allocator returns an empty list says ``lambda got: not
    got``).  ``evict_returns``: ``"count"`` (tokens freed) or ``"indices"`` (the slot ids it
    took out of the tree, which the *caller* must free: the driver frees them)."""

    out_of_memory: Callable[[object], bool] = returns_none
    evict_returns: str = COUNT

    def __post_init__(self):
        if self.evict_returns not in (COUNT, INDICES):
            raise ValueError(f"evict_returns must be {COUNT!r} or {INDICES!r}")


@dataclass(frozen=True)
class Difference:
    """A difference from the reference a target accepts, with its reason: ``kvcheck diff``
    reports a step where the two sides' abstract state first differs as "differs as declared"
    when the op is one of ``ops`` and only ``fields`` of the state differ (the sides have then
    diverged as declared in those fields: the rest of that example compares every other field;
    each side's invariants still run)."""

    name: str
    reason: str
    ops: tuple  # op names at which the difference may first show
    fields: tuple  # abstract-state fields that may differ (``Subject.abstract_state``)

    def accepts(self, op: str, differing) -> bool:
        return op in self.ops and set(differing) <= set(self.fields)


@dataclass(frozen=True)
class Policy:
    """A target's declared eviction policy, what the ``victim`` / ``over-eviction`` checks
    judge against.  ``key(NodeView) -> tuple``: the smallest goes first (read from the view,
    never a call into the engine); ``cascade_exposes``: a parent a victim leaves childless joins
    the candidates within the same pass (else only at the next); ``tie_break`` and ``recency``
    say in words what ties and a hit do (``recency`` is checked: a match refreshes every node it
    walks); ``differences``: what ``kvcheck diff`` accepts."""

    key: Callable = lru_key
    cascade_exposes: bool = True
    tie_break: str = "any minimal leaf may go"
    recency: str = "a match stamps every node it walks"
    differences: tuple = field(default_factory=tuple)
