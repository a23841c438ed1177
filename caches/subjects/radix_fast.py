"""The radix subject's fast verdict: every state check of ``RadixSubject.check`` answered in
one walk of the live tree, without building a ``TreeView``.

``radix_fast_ok(subject)`` returns True only when every state check ``RadixSubject.check``
runs would pass: size accounting, ref balance, structure and the eviction set (``check_tree``
less its policy checks) and conservation of the pool.  Anything else -- a check that would
fail, or a tree too broken to walk -- returns False, and the subject then builds the view and
runs the checks themselves, which find the violation and say it with the node and the numbers.
So the fast path decides nothing on its own: it only skips building the view on the
(overwhelmingly common) steps where nothing is wrong.  The policy checks are not restated:
they read what the op recorded and forget it, and the subject always runs them.

Each condition here restates one pure check of ``invariants/`` over the same node fields
``RadixSubject.tree_view`` reads (a node's id, parent's id, key, value, ``lock_ref``, its
children's ids); ``tests/test_radix_fast.py`` runs both side by side after every step of
random runs, clean and with every radix fault, and requires the same verdict.
"""

from __future__ import annotations

from caches.subjects.fast_refs import add_path_refs


def radix_fast_ok(s) -> bool:
    """True when every state check of ``s.check()`` passes (see the module doc)."""
    try:
        slots = tree_slots_if_ok(s)
        return slots is not None and _pool_ok(s, slots)
    except Exception:  # noqa: BLE001 -- a tree too broken to walk: the full check says why
        return False


def tree_slots_if_ok(s) -> list | None:  # noqa: C901 -- one pass on purpose
    """The slots the tree owns (``tree_slots`` of the view) when the state checks of
    ``check_tree`` (size accounting, ref balance, structure, the eviction set) and
    ``check_held_once`` over them would pass on ``s``'s tree, else None.  (The
    streaming-session fast verdict builds on this too.)

    The checks are one conjunction, so their order is free: the expected refs are worked out
    before the pass over the nodes, which then compares each node's ref on the way."""
    c = s.cache
    ps = s.page_size
    partial = getattr(s, "partial_pages", False)
    root = c.root_node
    rid = root.id
    # the walk (RadixSubject.tree_view: depth first, the first object seen per id wins)
    by_id, stack = {}, [root]
    pop, push = stack.pop, stack.extend
    while stack:
        n = pop()
        nid = n.id
        if nid in by_id:
            continue
        by_id[nid] = n
        push(n.children.values())

    evictable, protected = c.evictable_size_, c.protected_size_
    if evictable < 0 or protected < 0:  # check_size_accounting: no counter negative
        return None
    if root.lock_ref != 1:  # check_ref_balance: the root keeps 1
        return None
    # check_ref_balance: each node's ref is the holders locking it or a node below it (the
    # holders' paths to the root, parents by id as the view has them)
    expected = {}
    if not add_path_refs(expected, s.held_locks().items(), by_id):
        return None
    get = expected.get

    total = locked = 0
    want_leaves = set()
    slots = []
    for nid, n in by_id.items():
        value, children = n.value, n.children
        slots.extend(value)  # tree_slots: every node's value, the root's included
        # check_structure, the links down: each listed child names this node as its parent
        # and is indexed by its first token (page)
        if ps == 1:
            for ck, ch in children.items():
                child = by_id[ch.id]
                parent = child.parent
                if parent is None or parent.id != nid:
                    return None
                ckey = child.key
                if len(ckey) == 0 or ckey[0] != ck:
                    return None
        else:
            for ck, ch in children.items():
                child = by_id[ch.id]
                parent = child.parent
                if parent is None or parent.id != nid:
                    return None
                ckey = child.key
                if len(ckey) == 0 or tuple(ckey[:ps]) != ck:
                    return None
        if nid == rid:  # (its ref: 1, checked above)
            continue
        # check_ref_balance: the ref is what the holders below make it (so never negative)
        ref = n.lock_ref
        if ref != get(nid, 0):
            return None
        # check_structure, the link up: implied by the links down -- a non-root node is in
        # ``by_id`` only because a node in ``by_id`` lists it, and that lister is (checked
        # above) the id its parent names; so its parent is in the tree and lists it
        nv = len(value)
        if len(n.key) != nv:
            return None
        if ps > 1 and nv % ps and (children or not partial):
            return None  # a partial page, where it may not be
        # check_size_accounting: the tokens in the tree and the locked ones
        total += nv
        if ref > 0:
            locked += nv
        elif not children:  # evictable_leaves: a non-root leaf nobody locks
            want_leaves.add(nid)
    if evictable + protected != total or protected != locked:
        return None
    # check_eviction_set: evictable_leaves lists each such leaf once, and nothing else
    members = [n.id for n in c.evictable_leaves]
    got = set(members)
    if len(got) != len(members) or got != want_leaves:
        return None
    if len(set(slots)) != len(slots):  # check_held_once: no slot at two positions of the tree
        return None
    return slots


def _pool_ok(s, slots) -> bool:
    """``check_conservation`` over the pool's pages: the tree's, each request's own and
    borrowed."""
    reqs = s.requests.values()
    owners = [slots]
    owners += [req.own_indices for req in reqs]
    return s.pool.consistent_slots(owners, [req.borrowed_indices for req in reqs])
