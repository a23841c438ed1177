"""Ref balance: every node's ref count equals the refs live holders have at or below it."""

from __future__ import annotations

from typing import Mapping

from .violation import fail
from .views import TreeView


def expected_refs(tree: TreeView, held: Mapping[int, int]) -> dict[int, int]:
    """Refs each node should carry when ``held[n]`` holders locked node ``n`` (path locking)."""
    exp = {nid: 0 for nid in tree.nodes}
    for nid, count in held.items():
        if nid not in tree.nodes:
            fail("ref-balance", f"a live holder locks node {nid}, which is not in the tree "
                 "(deleted while locked)", node=nid, holders=count)
        for anc in tree.path_to_root(nid):
            exp[anc] += count
    return exp


def check_ref_balance(tree: TreeView, held: Mapping[int, int], *, counter: str = "lock",
                      root_baseline: int = 1, root_counts_holders: bool = False) -> None:
    """Each node's ``counter`` ref == number of live holders locking it or a descendant.

    ``held`` maps a node id to how many live holders (requests, bare locks) locked it.  The
    root keeps ``root_baseline`` and, where the cache also counts holders on the root
    (LightLLM), ``root_baseline + holders``.  Refs are never negative.
    """
    for node in tree.nodes.values():
        r = node.refs.get(counter, 0)
        if r < 0:
            fail("ref-balance", f"node {node.id}: {counter} ref is {r} < 0",
                 node=node.id, counter=counter, ref=r)
    exp = expected_refs(tree, held)
    # non-root nodes first: a wrong node ref is the cause, a wrong root ref often the echo
    for node in tree.nodes.values():
        got = node.refs.get(counter, 0)
        if node.id != tree.root and got != exp[node.id]:
            fail("ref-balance", f"node {node.id} (key {_short(node.key)}): {counter} ref is "
                 f"{got}, but {exp[node.id]} live holder(s) lock it or a descendant",
                 node=node.id, counter=counter, ref=got, expected=exp[node.id])
    got = tree.nodes[tree.root].refs.get(counter, 0)
    want = root_baseline + (exp[tree.root] if root_counts_holders else 0)
    if got != want:
        fail("ref-balance", f"root {counter} ref is {got}, expected {want} "
             f"(baseline {root_baseline}"
             + (f" + {exp[tree.root]} live holders)" if root_counts_holders else ")"),
             node=tree.root, counter=counter, ref=got, expected=want)


def _short(key) -> str:
    key = list(key)
    return str(key) if len(key) <= 8 else f"[{', '.join(map(str, key[:8]))}, ...]"
