"""Size accounting: evictable + protected == tokens in the tree, split by lock state."""

from __future__ import annotations

from .violation import fail
from .views import TreeView


def check_size_accounting(tree: TreeView, evictable: int, protected: int, *,
                          counter: str = "lock", label: str = "") -> None:
    """The cache's counters agree with the tree.

    Checks, in order: neither counter negative; ``evictable + protected`` == tokens held by
    non-root nodes; and the split itself (``protected`` == tokens of nodes whose ``counter``
    ref is > 0).  ``label`` names the counter pair when a cache keeps several (``full``,
    ``mamba``, ``host``).
    """
    tag = f"{label} " if label else ""
    if evictable < 0 or protected < 0:
        fail("size-accounting", f"{tag}evictable={evictable}, protected={protected}: a "
             "counter is negative", evictable=evictable, protected=protected)
    total = locked = 0
    for n in tree.nodes.values():
        if n.id != tree.root:
            total += len(n.value)
            if n.refs.get(counter, 0) > 0:
                locked += len(n.value)
    if evictable + protected != total:
        fail("size-accounting", f"{tag}evictable {evictable} + protected {protected} = "
             f"{evictable + protected} != {total} tokens in the tree",
             evictable=evictable, protected=protected, tree_tokens=total)
    if locked != protected:
        fail("size-accounting", f"{tag}protected is {protected}, but nodes with {counter} ref "
             f"> 0 hold {locked} tokens", protected=protected, locked_tokens=locked)
