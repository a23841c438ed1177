"""The HiMamba subject's fast verdict: every state check of ``HiMambaSubject.check_state``
answered in one walk of the live tree, without building views.

``himamba_fast_ok(subject)`` returns True only when every check ``check_state`` runs would
pass (host protection, full-lock balance, the node-only ref counters, lock order, structure,
both size accountings, both leaf sets, the three LRU lists and their order, tombstones,
conservation of the four pools with each id the tree holds at one position, the data
read-backs).  Anything else -- a check that would
fail, or a tree too broken to walk -- returns False, and the subject then runs
``check_state``, which finds the violation and says it with the node and the numbers.  So the fast
path decides nothing on its own: it only skips building views on the (overwhelmingly common)
steps where nothing is wrong.

Each condition here restates one pure check of ``invariants/`` over the same node fields
``HiMambaSubject._views`` reads; ``tests/test_himamba_fast.py`` runs both side by side after
every step of random runs, clean and with every himamba fault, and requires the same verdict.
"""

from __future__ import annotations

from functools import lru_cache
from operator import attrgetter, lt


_SEED = 17  # Fingerprint.of_prefix's starting hash
_id = attrgetter("id")


def _extend(h: int, pos: int, key) -> tuple[list[int], int]:
    """Fingerprints of ``key``'s tokens continuing a prefix whose hash is ``h`` after ``pos``
    tokens (``Fingerprint.of_prefix``, one step per token)."""
    out = []
    for tok in key:
        h = (h * 1_000_003 + (tok + 1) * 7919 + pos) & 0x7FFF_FFFF
        out.append(h)
        pos += 1
    return out, h


def himamba_fast_ok(s) -> bool:
    """True when every non-policy check of ``s.check_state()`` passes (see the module doc)."""
    try:
        return _ok(s)
    except Exception:  # noqa: BLE001 -- a tree too broken to walk: the state check says why
        return False


def _ok(s) -> bool:  # noqa: C901 -- one pass on purpose: that is the point of this module
    c = s.cache
    root = c.root_node
    rid = root.id
    # the walk (HiMambaSubject._walk: depth first, first object seen per id wins)
    order, by_id, stack = [], {}, [root]
    while stack:
        n = stack.pop()
        if n.id in by_id:
            continue
        by_id[n.id] = n
        order.append(n)
        stack.extend(n.children.values())

    held, held_mamba, held_host, held_host_mamba = s.held_ledger()
    dev_set = list(map(_id, c.evictable_full_device_leaves))
    host_set = list(map(_id, c.evictable_full_host_leaves))
    dev_ids, host_ids = set(dev_set), set(host_set)
    if len(dev_ids) != len(dev_set) or len(host_ids) != len(host_set):
        return False
    # host protection
    for nid, count in held_host.items():
        if count > 0 and (nid not in by_id or nid in host_ids):
            return False
    # full locks: every holder's node is in the tree
    if not held.keys() <= by_id.keys():
        return False

    full_total = full_locked = m_total = m_locked = 0
    want_dev, want_host = set(), set()
    lru_full, lru_mamba, lru_host_mamba = set(), set(), set()
    times = {}
    kv_tree, m_tree, hk_tree, hm_tree = [], [], [], []
    # the data read-backs: what each slot the tree owns must hold, in the order above
    checking = s.checking
    kv_want, m_want, hk_want, hm_want = [], [], [], []
    prefix = {rid: (_SEED, 0)}  # node id -> (hash, length) of the tokens up to its end
    full_of, mamba_of = held.get, held_mamba.get
    host_of, host_mamba_of = held_host.get, held_host_mamba.get
    get = by_id.get
    for n in order:
        nid = n.id
        full, mamba = n.full_lock_ref, n.mamba_lock_ref
        host, host_mamba = n.host_ref_counter, n.host_mamba_ref_counter
        times[nid] = n.last_access_time
        if full < 0 or full < mamba:
            return False
        if host != host_of(nid, 0) or host_mamba != host_mamba_of(nid, 0):
            return False
        # the links down; a node's full ref is its own holders' count plus its children's
        # refs (so, by induction from the leaves, the holders at or below it)
        children = n.children
        below = full_of(nid, 0)
        on_device_child = False
        for ck, ch in children.items():
            child = get(ch.id)
            if child is None:
                return False
            parent = child.parent
            if parent is None or parent.id != nid or len(child.key) == 0 or child.key[0] != ck:
                return False
            below += child.full_lock_ref
            if child.value is not None:
                on_device_child = True
        if nid == rid:
            if mamba != mamba_of(nid, 0) + 1 or full != 1:
                return False  # the root keeps its baselines of 1
            continue
        if mamba != mamba_of(nid, 0) or full != below:
            return False
        # the link up (parent in the tree and listing this node) is implied by the links
        # down: a non-root node is in ``by_id`` only as a listed child of a node in
        # ``by_id``, whose link-down test above requires this node to name it as parent
        value, hv = n.value, n.host_value
        nv = len(value) if value is not None else 0
        key = n.key
        if len(key) != (nv or (len(hv) if hv else 0)):
            return False
        full_total += nv
        if full > 0:
            full_locked += nv
        mv, mhv = n.mamba_value, n.mamba_host_value
        has_m, has_hm = mv is not None, mhv is not None
        if has_m:
            m_total += 1
            lru_mamba.add(nid)
            m_tree.append(mv)
            if mamba > 0:
                m_locked += 1
        elif mamba != 0:
            return False  # a tombstone holding a mamba lock
        if value is not None:  # on device
            lru_full.add(nid)
            if full == 0 and not on_device_child:
                want_dev.add(nid)
        elif hv is not None and host == 0 and host_mamba == 0 and not children:
            want_host.add(nid)
        if has_hm:
            hm_tree.append(mhv)
            if host_mamba == 0:
                lru_host_mamba.add(nid)
        if not children and not has_m and not has_hm and full <= 0 and host <= 0 \
                and host_mamba <= 0 and nid not in dev_ids and nid not in host_ids:
            return False  # a stranded tombstone leaf
        if nv:
            kv_tree.extend(value)
        if hv:
            hk_tree.extend(hv)
        if checking:
            # the prefix hash carried down the tree (parents come before their children)
            h, pos = prefix[n.parent.id]
            if type(key) is tuple:
                fps, h = _extend_cached(h, pos, key)
            else:
                fps, h = _extend(h, pos, key)
            pos += len(key)
            prefix[nid] = (h, pos)
            if nv:
                kv_want.extend(fps)  # (all of them: the key's length is the value's)
            if hv:  # (more host slots than fingerprints: the lists no longer line up)
                hk_want.extend(fps[:len(hv)])
            # the state after ``pos`` tokens: the last position's hash (0 for the empty prefix)
            want = h if pos else 0
            if has_m:
                m_want.append(want)
            if has_hm:
                hm_want.append(want)
    # the counters
    fe, fp, me, mp = (c.full_evictable_size_, c.full_protected_size_,
                      c.mamba_evictable_size_, c.mamba_protected_size_)
    if min(fe, fp, me, mp) < 0 or fe + fp != full_total or fp != full_locked or \
            me + mp != m_total or mp != m_locked:
        return False
    # leaf sets and LRU lists
    if dev_ids != want_dev or host_ids != want_host:
        return False
    for lru, members, ordered in ((c.full_lru, lru_full, True), (c.mamba_lru, lru_mamba, True),
                                  (c.host_mamba_lru, lru_host_mamba, False)):
        ids = list(map(_id, lru.lru_first()))
        if len(ids) != len(members) or members.symmetric_difference(ids):
            return False
        if ordered and len(ids) > 1:  # strictly newer towards the MRU end
            ts = list(map(times.__getitem__, ids))
            if not all(map(lt, ts, ts[1:])):
                return False
    # conservation
    kv_owners, kv_borrowed, m_owners = [kv_tree], [], [m_tree]
    for req in s.requests.values():
        kv_owners.append(req.own_indices)
        kv_borrowed.append(req.borrowed_indices)
        m_owners.append([req.mamba_slot])
    hk, hm = [hk_tree], [hm_tree]
    for p in s.prefetches.values():
        hk.append(p["host"])
        hm.append([p["mamba"]])
    # (held_once=1: check_held_once on the tree's list, the first owner, too)
    if not (s.kv.consistent(kv_owners, kv_borrowed, 1) and s.mamba.consistent(m_owners, None, 1)
            and s.host_kv.consistent(hk, None, 1) and s.host_mamba.consistent(hm, None, 1)):
        return False
    if not checking:
        return True
    # every slot the tree owns, on either tier, holds its prefix's fingerprints
    return _holds(s.kv, kv_tree, kv_want) and _holds(s.host_kv, hk_tree, hk_want) and \
        _holds(s.mamba, m_tree, m_want) and _holds(s.host_mamba, hm_tree, hm_want)


def _holds(pool, ids: list, want: list) -> bool:
    """The slots ``ids`` of ``pool`` read back ``want`` (one copy of the pool's data)."""
    return not ids or list(map(pool.snapshot().__getitem__, ids)) == want


@lru_cache(maxsize=1 << 16)
def _extend_cached(h: int, pos: int, key: tuple) -> tuple[tuple, int]:
    """``_extend`` (its fingerprints as a tuple), once per (prefix hash, position, key): a
    node's key and the prefix above it rarely change between steps.  Pure."""
    fps, h = _extend(h, pos, key)
    return tuple(fps), h
