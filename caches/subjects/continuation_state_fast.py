"""The continuation-state subject's fast verdict: every state check of
``ContinuationStateSubject.check`` answered in one walk of the live tree, without building the
``TreeView``.

``continuation_state_fast_ok(subject)`` returns True only when every state check ``check``
runs would pass: snapshot placement, both ref balances (device and host), structure, per
group the dangling borrows and conservation of the pages, and (while checking) the data
read-backs of every snapshot segment and every request's table.  Anything else -- a check that
would fail, or a tree too broken to walk -- returns False, and the subject then runs the checks
themselves, which find the violation and say it with the node and the numbers.  So the fast
path decides nothing on its own: it only skips building the view on the (overwhelmingly
common) steps where nothing is wrong.  The policy checks are not restated: they read what the
op recorded and forget it, and the subject always runs them (while checking).

Each condition here restates one pure check of ``invariants/`` over the same node fields
``ContinuationStateSubject.tree_view`` reads; ``tests/test_continuation_state_fast.py`` runs
both side by side after every step of random runs, clean and with every continuation-state
fault, and requires the same verdict.
"""

from __future__ import annotations

from caches.subjects.fast_refs import add_path_refs
from functools import lru_cache

from caches.pools import Fingerprint


@lru_cache(maxsize=4096)
def _fingerprints(path: tuple) -> list[int]:
    """``Fingerprint.of_prefix(path)``, once per distinct path (a snapshot node's path never
    changes, and the same snapshots are read back after every step).  Read only."""
    return Fingerprint.of_prefix(path)


def continuation_state_fast_ok(s) -> bool:
    """True when every state check of ``s.check()`` passes (see the module doc)."""
    try:
        return _ok(s)
    except Exception:  # noqa: BLE001 -- a tree too broken to walk: the full check says why
        return False


def _walk(by_id: dict, rid) -> list:
    """``TreeView.walk``'s nodes (depth first over child ids from the root, each id once)."""
    seen, stack, out = set(), [rid], []
    while stack:
        nid = stack.pop()
        if nid in seen or nid not in by_id:
            continue
        seen.add(nid)
        n = by_id[nid]
        out.append(n)
        stack.extend(ch.id for ch in n.children.values())
    return out


def _ok(s) -> bool:  # noqa: C901 -- one pass on purpose: that is the point of this module
    c = s.cache
    L = s.L
    # every node object (``cache.nodes()``'s walk, inlined); the view keeps the last object
    # per id.  The same pass checks snapshot placement (at its own depth, a multiple of L, one
    # L-block edge) and that no ref is negative (check_ref_balance, device and host) -- the
    # checks are one conjunction, so their order is free
    by_id, stack, snaps = {}, [c.root], []
    pop, push = stack.pop, stack.extend
    count = 0
    while stack:
        n = pop()
        count += 1
        by_id[n.id] = n
        push(n.children.values())
        if n.devref < 0 or n.hostref < 0:
            return False
        snap = n.snapshot
        if snap is not None:
            depth = n.depth
            if snap.prefix_len != depth or depth % L or len(n.key) != L:
                return False
            snaps.append(n)
    if count != len(by_id):  # two objects share an id: the negative-ref test above read one
        return False         # the view drops, so let the full checks decide
    rid = c.root.id
    # check_ref_balance, device and host: each node's ref is the holders at or below it (the
    # holders' paths to the root, parents by id as the view has them); the root keeps 0
    dev, host = {}, {}
    reqs = s.requests.values()
    if not (add_path_refs(dev, [(r.node.id, 1) for r in reqs if r.active], by_id)
            and add_path_refs(host, [(r.node.id, 1) for r in reqs if not r.active], by_id)):
        return False
    dget, hget = dev.get, host.get
    # with the refs, check_structure over the view's walk (every node, as no two share an
    # id): links agree both ways, child keys are the child's first L-block, edges are whole
    # L-blocks (a node's view value is its positions, as long as its key by construction)
    for nid, n in by_id.items():
        if nid == rid:
            if n.devref != 0 or n.hostref != 0:
                return False
        else:
            if n.devref != dget(nid, 0) or n.hostref != hget(nid, 0):
                return False
            # the link up is implied by the links down: a node other than the root is walked
            # only because a walked node lists it, and that lister is (checked here) its parent
            if L > 1 and len(n.key) % L:
                return False
        for ck, ch in n.children.items():
            child = by_id[ch.id]
            parent = child.parent
            if parent is None or parent.id != nid:
                return False
            ckey = child.key
            if len(ckey) == 0 or (ckey[0] if L == 1 else tuple(ckey[:L])) != ck:
                return False
    # check_group_pages per group: every borrowed page is in some snapshot segment (the view
    # keeps the last snapshot node per id), then conservation of free / segments / owned
    tables = c.tables
    for gid, pool in s.pools.items():
        owners = []
        for n in snaps:
            seg = n.snapshot.groups.get(gid)
            if seg is not None:
                owners.append(seg.pages)
        held = set()
        for pages in owners:
            held.update(pages)
        for tabs in tables.values():
            tab = tabs[gid]
            if not held.issuperset(tab.borrowed):
                return False
            owners.append(tab.owned)
        if not pool.consistent(owners):
            return False
    if not s.checking:
        return True
    # check_fingerprints: every snapshot segment, and every complete computed page of every
    # request's table, reads back its prefix
    data = {gid: pool.snapshot() for gid, pool in s.pools.items()}
    groups = c.groups
    for n in snaps:
        fps = None
        for gid, seg in n.snapshot.groups.items():
            pages = seg.pages
            if not pages:
                continue
            if fps is None:
                fps = _fingerprints(n.path)
            P = groups[gid].page_tokens
            got, base = data[gid], seg.base
            for j, pid in enumerate(pages):
                if got[pid] != fps[(base + j + 1) * P - 1]:
                    return False
    for req in s.requests.values():
        computed, fps = req.computed, req.fps
        for gid, tab in tables[req.rid].items():
            P = tab.P
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
