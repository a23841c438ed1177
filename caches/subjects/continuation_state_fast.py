"""The continuation-state subject's fast verdict: every state check of
``ContinuationStateSubject.check`` answered in one walk of the live tree, without building the
``TreeView``.

``continuation_state_fast_ok(subject)`` returns True only when every state check ``check``
runs would pass: snapshot placement, both ref balances (device and host), structure, per
group the dangling borrows, conservation of the pages and each page at one position of the
tree, and (while checking) the data read-backs of every snapshot segment and every request's
table.  Anything else -- a check that would fail, or a tree too broken to walk -- returns
False, and the subject then runs the checks themselves, which find the violation and say it
with the node and the numbers.  So the fast path decides nothing on its own: it only skips
building the view on the (overwhelmingly common) steps where nothing is wrong.  The policy
checks are not restated: they read what the op recorded and forget it, and the subject always
runs them (while checking).

Each condition here restates one pure check of ``invariants/`` over the same node fields
``ContinuationStateSubject.tree_view`` reads; ``tests/test_continuation_state_fast.py`` runs
both side by side after every step of random runs, clean and with every continuation-state
fault, and requires the same verdict.
"""

from __future__ import annotations

from caches.subjects.base import _prefix_fingerprints
from caches.subjects.fast_refs import add_path_refs


def continuation_state_fast_ok(s) -> bool:
    """True when every state check of ``s.check()`` passes (see the module doc)."""
    try:
        return _ok(s)
    except Exception:  # noqa: BLE001 -- a tree too broken to walk: the full check says why
        return False


def _refs_by_path(walked: list, dev: dict, host: dict) -> bool:
    """check_ref_balance where the root has a parent (never so in the cache): the view's paths
    to the root run on past it, so each ref is what the holders' paths add up to."""
    by_id = {n.id: n for n in walked}
    exp_dev, exp_host = {}, {}
    if not (add_path_refs(exp_dev, dev.items(), by_id)
            and add_path_refs(exp_host, host.items(), by_id)):
        return False
    return all(n.devref == exp_dev.get(nid, 0) and n.hostref == exp_host.get(nid, 0)
               for nid, n in by_id.items() if n is not walked[0])


def _ok(s) -> bool:  # noqa: C901 -- one pass on purpose: that is the point of this module
    c = s.cache
    L = s.L
    root = c.root
    # the holders of device and host refs, per node id (check_ref_balance's ``held``)
    dev, host = {}, {}
    for r in s.requests.values():
        held = dev if r.active else host
        nid = r.node.id
        held[nid] = held.get(nid, 0) + 1
    dget, hget = dev.get, host.get
    # one walk over every node object (``cache.nodes()``'s walk, inlined), checking:
    # * check_structure: each listed child's parent is the lister (by id, as the view links
    #   them), its key starts with the key it is listed under, and is whole L-blocks;
    # * check_snapshot_placement: a snapshot sits at its own depth, a multiple of L, on one
    #   L-block edge;
    # * check_ref_balance (device and host): the root keeps 0, and every other node's ref is
    #   the holders at it plus its children's refs -- by induction from the leaves, the
    #   holders at or below it, what the view's paths to the root add up to once the links
    #   agree both ways;
    # * no id twice (the view keeps one object per id; then the full checks decide), which
    #   also ends the walk on a cyclic tree: an object walked again repeats its id.
    # The checks are one conjunction, so their order is free.
    # (A root with a parent -- never so in the cache -- has the refs checked as the holders'
    # paths add up, after the walk: the view's paths to the root then run on past it.)
    by_path = root.parent is not None
    ids, stack, snaps, walked = set(), [root], [], [root]
    pop, push, add = stack.pop, stack.append, ids.add
    count = 0
    while stack:
        n = pop()
        nid = n.id
        add(nid)
        count += 1
        if len(ids) != count:
            return False
        snap = n.snapshot
        if snap is not None:
            depth = n.depth
            if snap.prefix_len != depth or depth % L or len(n.key) != L:
                return False
            snaps.append(n)
        dsum = hsum = 0
        for ck, ch in n.children.items():
            parent = ch.parent
            if parent is not n and (parent is None or parent.id != nid):
                return False
            ckey = ch.key
            if not ckey or len(ckey) % L or (ckey[0] if L == 1 else tuple(ckey[:L])) != ck:
                return False
            dsum += ch.devref
            hsum += ch.hostref
            push(ch)
        if n is root:
            if n.devref != 0 or n.hostref != 0:
                return False
        elif by_path:
            walked.append(n)
        elif n.devref != dget(nid, 0) + dsum or n.hostref != hget(nid, 0) + hsum:
            return False
    if not ids.issuperset(dev) or not ids.issuperset(host):  # a holder outside the tree
        return False
    if by_path and not _refs_by_path(walked, dev, host):
        return False
    return _pages_ok(s, snaps)


def _pages_ok(s, snaps: list) -> bool:
    """The group pages and (while checking) the data read-backs, given the snapshot nodes
    (each once: no two nodes share an id)."""
    c = s.cache
    tables, pools, checking = c.tables, s.pools, s.checking
    # one pass over the snapshot segments: each group's segment pages (for check_group_pages)
    # and, while checking, check_fingerprints of every segment (it reads its prefix back)
    owners = {gid: [] for gid in pools}
    if checking:
        data = {gid: pool.snapshot() for gid, pool in pools.items()}
        groups = c.groups
    for n in snaps:
        fps = None
        for gid, seg in n.snapshot.groups.items():
            pages = seg.pages
            if gid in owners:
                owners[gid].append(pages)
            if not checking or not pages:
                continue
            if fps is None:
                fps = _prefix_fingerprints(n.path)
            P = groups[gid].page_tokens
            got, base = data[gid], seg.base
            for j, pid in enumerate(pages):
                if got[pid] != fps[(base + j + 1) * P - 1]:
                    return False
    # check_group_pages per group: every borrowed page is in some snapshot segment, then
    # conservation of free / segments / owned
    for gid, pool in pools.items():
        own, held = owners[gid], None
        segments = len(own)
        for tabs in tables.values():
            tab = tabs[gid]
            borrowed = tab.borrowed
            if borrowed:
                if held is None:
                    held = set().union(*own[:segments])
                if not held.issuperset(borrowed):
                    return False
            own.append(tab.owned)
        # (and check_held_once over the segments' pages, the first ``segments`` owners)
        if not pool.consistent(own, None, segments):
            return False
    if not checking:
        return True
    # check_fingerprints of every complete computed page of every request's table
    for req in s.requests.values():
        computed, fps = req.computed, req.fps
        for gid, tab in tables[req.rid].items():
            P = tab.group.page_tokens  # (tab.P)
            got, k = data[gid], tab.base
            entries = tab.borrowed + tab.owned  # TableGroup.entries' order
            if P > 0:  # entry j is complete and computed iff (k + j + 1) * P <= computed,
                # iff j < computed // P - k: a prefix of the entries
                entries = entries[:max(0, computed // P - k)]
                for pid in entries:
                    k += 1
                    if got[pid] != fps[k * P - 1]:
                        return False
                continue
            for pid in entries:
                if (k + 1) * P <= computed and got[pid] != fps[(k + 1) * P - 1]:
                    return False
                k += 1
    return True
