"""Structure: parent/child links, child keys, key/value shapes, and eviction sets."""

from __future__ import annotations

from typing import Iterable

from .violation import fail
from .views import TreeView


def child_key(key, page_size: int):
    """How a parent indexes a child: its first token, or its first page of tokens."""
    return key[0] if page_size == 1 else tuple(key[:page_size])


def check_structure(tree: TreeView, partial_pages: bool = False) -> None:
    """Links agree both ways, child keys match, key/value lengths agree and are page-aligned.

    ``partial_pages``: the engine's tree keeps partial last pages (pymllm's ``insert`` does not
    page-align); a key that is not a page multiple is then allowed on a leaf only (a partial
    page can only end a path), instead of on no node."""
    ps = tree.page_size
    for node in tree.walk():
        for ck, cid in node.children.items():
            child = tree.nodes.get(cid)
            if child is None:
                fail("structure", f"node {node.id} lists child {cid}, which does not exist",
                     node=node.id, child=cid)
            if child.parent != node.id:
                fail("structure", f"node {cid} is a child of {node.id} but its parent is "
                     f"{child.parent}", node=cid, parent=child.parent, listed_by=node.id)
            if len(child.key) == 0 or child_key(child.key, ps) != ck:
                fail("structure", f"node {cid} is indexed by {ck!r} under {node.id} but its "
                     f"key starts {child_key(child.key, ps) if child.key else '(empty)'!r}",
                     node=cid, indexed_by=ck)
        if node.id == tree.root:
            continue
        parent = tree.nodes.get(node.parent)
        if parent is None or node.id not in parent.children.values():
            fail("structure", f"node {node.id}'s parent {node.parent} does not have it as a "
                 "child", node=node.id, parent=node.parent)
        if len(node.key) != len(node.value):
            fail("structure", f"node {node.id}: key has {len(node.key)} tokens, value "
                 f"{len(node.value)} ids", node=node.id)
        if ps > 1 and len(node.key) % ps and partial_pages and node.children:
            fail("structure", f"node {node.id}: key length {len(node.key)} ends in a partial "
                 f"page (page_size {ps}) but the node has children", node=node.id,
                 length=len(node.key), page_size=ps)
        if ps > 1 and len(node.key) % ps and not partial_pages:
            fail("structure", f"node {node.id}: key length {len(node.key)} is not a multiple "
                 f"of page_size {ps}", node=node.id, length=len(node.key), page_size=ps)


def evictable_leaves(tree: TreeView, counter: str = "lock") -> set[int]:
    """Non-root leaves nobody locks: what an eviction set must hold exactly."""
    return {n.id for n in tree.nodes.values()
            if n.id != tree.root and not n.children and n.refs.get(counter, 0) == 0}


def check_eviction_set(name: str, members: Iterable[int], expected: set[int]) -> None:
    """A cache's eviction/LRU set holds exactly ``expected`` (no more, no less)."""
    members = list(members)
    got = set(members)
    if len(got) != len(members):
        fail("eviction-set", f"{name} lists a node twice", set=name, members=members)
    extra, missing = sorted(got - expected), sorted(expected - got)
    if extra or missing:
        fail("eviction-set", f"{name} differs from what it should hold: extra {extra}, "
             f"missing {missing}", set=name, extra=extra, missing=missing)
