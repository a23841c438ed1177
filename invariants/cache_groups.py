"""Invariants of paged cache groups with snapshots (TokenSpeed's hybrid prefix cache).

Pure functions over plain data (ids, depths, counts); each raises a ``Violation``:

* ``dangling-borrow`` -- a page a request table borrows is not held by a snapshot segment (it
  was freed, or handed to another owner) while the table still reads it;
* ``conservation`` -- per group: free + snapshot segments + request-owned == capacity, no page
  in two places (``check_conservation``);
* ``snapshot-placement`` -- snapshots only at multiples of L, with ``prefix_len`` equal to the
  node's depth, and never on a node that was split (a node whose edge is not one L-block);
* ``commit-complete`` -- after a commit that should succeed, the terminal has a snapshot that is
  History-complete, continuation-state complete, holds every required group, and its State
  windows assemble;
* ``superseded-state`` -- after a successful commit, no strict ancestor of the terminal whose
  window the request has advanced past, that only this request passes through and no table
  borrows, still holds State pages;
* ``owned-bounded`` -- after a commit, the request owns only the pages past the terminal.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .conservation import check_conservation
from .violation import fail
from .views import PoolView


def check_group_pages(pool: PoolView, segments: Mapping[str, Iterable[int]],
                      owned: Mapping[str, Iterable[int]],
                      borrowed: Mapping[str, Iterable[int]]) -> None:
    """One group's pool.  ``segments``: snapshot owner (``node 4``) -> page ids;
    ``owned``: request -> ids it owns; ``borrowed``: request -> ids it borrows.

    First no dangling borrow (every borrowed id is held by a snapshot segment), then
    conservation of the partition free / segments / owned."""
    held = {}
    for owner, ids in segments.items():
        for i in ids:
            held.setdefault(i, owner)
    free = set(pool.free)
    owners_of = {}
    for owner, ids in owned.items():
        for i in ids:
            owners_of.setdefault(i, owner)
    for reader, ids in borrowed.items():
        for i in ids:
            if i in held:
                continue
            if i in free:
                where = "free (released while still borrowed)"
            elif i in owners_of:
                where = f"owned by {owners_of[i]} (released and handed out again)"
            else:
                where = "held by no snapshot"
            fail("dangling-borrow", f"pool {pool.name}: {reader} borrows {pool.unit} {i}, "
                 f"which is {where}", pool=pool.name, id=i, reader=reader)
    check_conservation(pool, {**segments, **owned})


def check_snapshot_placement(snapshots: Iterable[tuple], L: int) -> None:
    """``snapshots``: (node id, node depth, snapshot prefix_len, edge length) per snapshot."""
    for nid, depth, prefix_len, edge in snapshots:
        if prefix_len != depth:
            fail("snapshot-placement", f"node {nid} at depth {depth} carries a snapshot for "
                 f"prefix {prefix_len}", node=nid, depth=depth, prefix_len=prefix_len)
        if depth % L:
            fail("snapshot-placement", f"node {nid} carries a snapshot at depth {depth}, not "
                 f"a multiple of L={L}", node=nid, depth=depth, L=L)
        if edge != L:
            fail("snapshot-placement", f"node {nid} carries a snapshot but its edge has "
                 f"{edge} tokens, not one L={L} block (it was split)", node=nid, edge=edge, L=L)


def check_commit_complete(rid: int, depth: int, groups: Iterable[str],
                          history: Iterable[str], required: Iterable[str],
                          continuation: Iterable[str], assembles: Mapping[str, bool],
                          node: int | None = None) -> None:
    """After r{rid}'s commit at ``depth``: ``groups`` are the group ids on the terminal's
    snapshot (None: no snapshot); ``assembles[gid]`` whether that State window stitches."""
    where = f"r{rid}'s terminal" + (f" node {node}" if node is not None else "") + \
        f" at depth {depth}"
    if groups is None:
        fail("commit-complete", f"{where} has no snapshot after a successful commit",
             rid=rid, depth=depth, node=node)
    groups = set(groups)
    for what, need in (("History", history), ("required", required),
                       ("continuation-state", continuation)):
        missing = sorted(set(need) - groups)
        if missing:
            fail("commit-complete", f"{where} is not {what} complete after the commit: "
                 f"missing {missing}", rid=rid, depth=depth, node=node, missing=missing)
    bad = sorted(g for g, ok in assembles.items() if not ok)
    if bad:
        fail("commit-complete", f"{where}: the continuation window of {bad} does not assemble "
             "from the chain's segments (no resume anchor)", rid=rid, depth=depth,
             node=node, groups=bad)


def check_superseded(rid: int, depth: int, window: int, ancestors: Iterable[tuple]) -> None:
    """``ancestors``: (node id, node depth, State pages held, devref, borrowed?) for the strict
    ancestors of r{rid}'s terminal at ``depth``; ``window`` = the largest State window."""
    for nid, d, pages, devref, borrowed in ancestors:
        if pages and d + window <= depth and devref == 1 and not borrowed:
            fail("superseded-state", f"after r{rid}'s commit at depth {depth}, interior node "
                 f"{nid} (depth {d}) still holds {pages} State page(s): the window advanced "
                 f"past it, only r{rid} passes through it and no table borrows it",
                 rid=rid, node=nid, depth=d, terminal_depth=depth, pages=pages)


def check_owned_bounded(rid: int, gid: str, depth: int, committed: int, owned: int,
                        cursor: int, page_tokens: int) -> None:
    """After a commit at ``depth``: the History table committed ``depth`` and owns exactly the
    pages covering ``[depth, cursor)``."""
    want = -(-cursor // page_tokens) - depth // page_tokens
    if committed != depth or owned != want:
        fail("owned-bounded", f"r{rid} group {gid}: after the commit at depth {depth} the "
             f"table committed {committed} and owns {owned} page(s); expected {depth} and "
             f"{want} (pages past the terminal only)", rid=rid, group=gid, depth=depth,
             committed=committed, owned=owned, expected=want)
