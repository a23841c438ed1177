"""The ref-balance expectation the fast verdicts share: each node's ref is the number of
holders at it or below it (``invariants.refs.check_ref_balance`` over the view), computed by
walking every holder's path to the root, parents by id as the view has them."""

from __future__ import annotations


def add_path_refs(expected: dict, holders, by_id: dict) -> bool:
    """Add each ``(node id, count)`` holder's count to ``expected`` for its node and every
    ancestor; False when a path leaves the tree (a node deleted while held, or a parent
    outside it) -- the full check then says which."""
    for nid, count in holders:
        seen = set()
        while nid is not None and nid not in seen:
            node = by_id.get(nid)
            if node is None:
                return False
            seen.add(nid)
            expected[nid] = expected.get(nid, 0) + count
            parent = node.parent
            nid = parent.id if parent is not None else None
    return True
