"""Checks for two-tier (device + host) caches with per-node state slots (HiMamba).

Pure functions of a ``TreeView`` whose nodes carry, in ``extra``: ``device`` (KV on device),
``backuped`` (KV on host), ``mamba`` (device state), ``mamba_host`` (host state) and ``time``
(last access time); and in ``refs``: ``full``, ``mamba``, ``host``, ``host_mamba``.

Property ids added here:

* ``host-protection`` -- a node whose host copies are protected (host refs > 0, taken by a
  storage prefetch or backup) is never deleted and never host-evictable;
* ``lru-order`` -- an LRU list is ordered by access time (most recent first);
* ``tombstone`` -- a tombstone (no device state) holds no state lock, and a tombstone leaf is
  never stranded: it is protected or waiting in an eviction set;
* ``hit-count`` -- a chunked (unfinished) insert counts no hit and starts no backup.

``check_node_refs`` reports node-only ref counters (mamba locks, host refs) as ``ref-balance``.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from .violation import fail
from .views import TreeView


def _x(node, name):
    return node.extra.get(name, False)


def check_host_protection(tree: TreeView, protected: Mapping[int, int],
                          host_leaves: Iterable[int]) -> None:
    """``protected`` maps node id -> how many live prefetch/backup operations protect it.

    Each such node is still in the tree (reachable from the root), and none of them is in the
    evictable host leaf set."""
    reachable = {n.id for n in tree.walk()}
    for nid, count in sorted(protected.items()):
        if count > 0 and nid not in reachable:
            fail("host-protection", f"node {nid} is host-protected by {count} live "
                 "prefetch/backup operation(s) but was deleted from the tree", node=nid,
                 holders=count)
    bad = sorted(set(host_leaves) & {nid for nid, c in protected.items() if c > 0})
    if bad:
        fail("host-protection", f"host-protected node(s) {bad} are in the evictable host "
             "leaf set", nodes=bad)


def check_node_refs(tree: TreeView, counter: str, held: Mapping[int, int], *,
                    root_baseline: int = 0) -> None:
    """A node-only ref counter equals the live holders at exactly that node (never < 0)."""
    for node in tree.walk():
        got = node.refs.get(counter, 0)
        want = held.get(node.id, 0) + (root_baseline if node.id == tree.root else 0)
        if got < 0 or got != want:
            fail("ref-balance", f"node {node.id}: {counter} ref is {got}, but {want} live "
                 f"holder(s) hold it", node=node.id, counter=counter, ref=got, expected=want)


def check_lock_order(tree: TreeView, outer: str = "full", inner: str = "mamba") -> None:
    """``refs[outer] >= refs[inner]`` on every node, and a tombstone holds no inner lock."""
    for node in tree.walk():
        o, i = node.refs.get(outer, 0), node.refs.get(inner, 0)
        if o < i:
            fail("ref-balance", f"node {node.id}: {outer} lock {o} < {inner} lock {i}",
                 node=node.id, outer=o, inner=i)


def device_leaves(tree: TreeView) -> set[int]:
    """Device nodes, unlocked, none of whose children is on device (H:480-488)."""
    return {n.id for n in tree.walk() if n.id != tree.root and _x(n, "device")
            and n.refs.get("full", 0) == 0
            and not any(_x(tree.nodes[c], "device") for c in n.children.values())}


def host_leaves(tree: TreeView) -> set[int]:
    """Evicted, backed-up, host-unprotected nodes without children (H:490-501)."""
    return {n.id for n in tree.walk() if n.id != tree.root and not _x(n, "device")
            and _x(n, "backuped") and n.refs.get("host", 0) == 0
            and n.refs.get("host_mamba", 0) == 0 and not n.children}


def lru_members(tree: TreeView, kind: str) -> set[int]:
    """What each LRU list must hold: ``full`` every device node, ``mamba`` every node with a
    device state, ``host_mamba`` every node with a host state and no host-state ref."""
    out = set()
    for n in tree.walk():
        if n.id == tree.root:
            continue
        if kind == "full" and _x(n, "device"):
            out.add(n.id)
        elif kind == "mamba" and _x(n, "mamba"):
            out.add(n.id)
        elif kind == "host_mamba" and _x(n, "mamba_host") and n.refs.get("host_mamba", 0) == 0:
            out.add(n.id)
    return out


def check_lru_order(name: str, mru_first: Sequence[int], times: Mapping[int, float]) -> None:
    """The list, most recent first, is in strictly decreasing access time."""
    for a, b in zip(mru_first, mru_first[1:]):
        if times[a] <= times[b]:
            fail("lru-order", f"{name}: node {a} is ahead of node {b} but was accessed "
                 f"earlier (time {times[a]} <= {times[b]})", list=name, ahead=a, behind=b,
                 ahead_time=times[a], behind_time=times[b])


def check_tombstones(tree: TreeView, evictable: Iterable[int]) -> None:
    """No device state -> no state lock; a leaf with neither device nor host state is either
    protected (full lock or host refs) or in an eviction set (about to be reclaimed)."""
    evictable = set(evictable)
    for n in tree.walk():
        if n.id == tree.root:
            continue
        if not _x(n, "mamba") and n.refs.get("mamba", 0) != 0:
            fail("tombstone", f"tombstone node {n.id} has mamba lock {n.refs['mamba']}",
                 node=n.id)
        if n.children or _x(n, "mamba") or _x(n, "mamba_host"):
            continue
        protected = n.refs.get("full", 0) > 0 or n.refs.get("host", 0) > 0 or \
            n.refs.get("host_mamba", 0) > 0
        if not protected and n.id not in evictable:
            fail("tombstone", f"node {n.id} is a tombstone leaf (no mamba state on device or "
                 "host), unprotected and in no eviction set: the cascade left it behind",
                 node=n.id)


def check_hit_counts_once(before: Mapping[int, int], after: Mapping[int, int],
                          may_count: Iterable[int], what: str = "") -> None:
    """SGLang 0.5.23's contract for a request's checkpoint: a request counts each node once --
    only nodes of its path that end past what it had inserted before (``may_count``) gain a
    hit, and at most one; every other count stays (new nodes are not compared)."""
    may_count = set(may_count)
    for nid, h in sorted(after.items()):
        if nid not in before:
            continue
        rise = h - before[nid]
        if rise != 0 and (nid not in may_count or rise != 1):
            why = "counted more than once" if nid in may_count else \
                "not past the request's inserted length"
            fail("hit-count", f"{what}node {nid}: hit count {before[nid]} -> {h} after a "
                 f"checkpoint ({why}: a request counts each node once)", node=nid,
                 before=before[nid], after=h)


def check_hit_counts(before: Mapping[int, int], after: Mapping[int, int],
                     backed_before: Iterable[int], backed_after: Iterable[int],
                     what: str = "") -> None:
    """A chunked insert leaves every hit count as it was (new nodes start at 0) and backs up
    no node that existed before it (a split of a backed-up node is not a new backup)."""
    for nid, h in sorted(after.items()):
        if h != before.get(nid, 0):
            fail("hit-count", f"{what}node {nid}: hit count {before.get(nid, 0)} -> {h} after "
                 "a chunked insert (chunked prefill must not count as a hit)", node=nid,
                 before=before.get(nid, 0), after=h)
    new = sorted((set(backed_after) & set(before)) - set(backed_before))
    if new:
        fail("hit-count", f"{what}a chunked insert started a host backup of node(s) {new}",
             nodes=new)
