"""Invariants of a radix cache with a sliding-window pool (the hybrid-swa variant).

Pure functions over one plain snapshot, ``WindowState``; each raises a ``Violation`` naming
the property, the node / request / slot, and the numbers:

* ``sentinel`` -- the window pool's padding page 0 is never free, and no node or request holds
  it (``check_sentinel``);
* ``tombstone`` -- a tombstoned node maps no window slot; a live node maps, for each of its
  full slots, the window slot its value lists, none of them the sentinel (``check_tombstones``);
* ``conservation`` -- the window pool: free + live nodes' window slots + requests' own window
  slots == capacity, no page in two places, and no free full slot still maps a window slot
  (``check_window_pool``, ``check_stale_map``);
* ``ref-balance`` -- each node's window lock == the unreleased lock segments covering it, and
  each anchor carries as many lock receipts as it has holders (``check_window_locks``);
* ``size-accounting`` -- window evictable + protected == the live window tokens, split by the
  window lock (``check_window_sizes``);
* ``window-release`` -- once a request's out-of-window slots were released up to its frontier,
  it holds no window slot of its own below it (``check_window_release``);
* ``window-hit`` -- a match's last ``window`` tokens (all, if shorter) have live window KV
  (``check_window_hit``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .conservation import check_conservation, check_held_once
from .violation import fail
from .views import PoolView

SENTINEL = 0


@dataclass(frozen=True)
class WindowNode:
    id: int
    parent: int | None
    full: tuple  # full slots
    window: tuple | None  # window slots; None: a tombstone
    lock: int  # window lock ref
    stamp: int | None = None  # the window-lock boundary uuid on it


@dataclass(frozen=True)
class WindowRequest:
    rid: int
    own: Mapping[int, int]  # position -> window slot, for the request's own mapped positions
    protected: int  # cache_protected_len: positions below are the tree's
    evicted: int  # swa_evicted_seqlen
    frontier: int | None = None  # where its last release had to reach (None: no release yet)


@dataclass(frozen=True)
class WindowState:
    window: int
    page_size: int
    pool: PoolView  # the window pool
    root: int
    nodes: Mapping[int, WindowNode]
    mapping: Mapping[int, int]  # full slot -> window slot, the mapped ones
    requests: Sequence[WindowRequest] = ()
    receipts: Sequence[tuple] = ()  # (anchor id, stamp or None, released)
    evictable: int | None = None  # the cache's window counters (None: not shown)
    protected: int | None = None
    sentinel_pages: tuple = (SENTINEL,)
    holders: Mapping[int, int] = field(default_factory=dict)  # anchor id -> live holders
    free_full: tuple | None = None  # the full pool's free pages (None: not shown)


def _page(slot: int, ps: int) -> int:
    return slot // ps


def check_sentinel(s: WindowState) -> None:
    ps, bad = s.page_size, set(s.sentinel_pages)
    freed = [p for p in s.pool.free if p in bad]
    if freed:
        fail("sentinel", f"window pool: sentinel page(s) {freed} in the free list "
             f"({s.pool.free.count(freed[0])} time(s)): the padding sink was freed",
             pool=s.pool.name, pages=freed)
    for n in s.nodes.values():
        if n.window is not None and any(_page(w, ps) in bad for w in n.window):
            fail("sentinel", f"node {n.id} holds the sentinel window page as live window KV "
                 f"(window slots {list(n.window)})", node=n.id, window=list(n.window))
    for r in s.requests:
        pos = [p for p, w in r.own.items() if _page(w, ps) in bad]
        if pos:
            fail("sentinel", f"request r{r.rid} maps position(s) {pos[:8]} to the sentinel "
                 f"window page", request=r.rid, positions=pos)


def check_tombstones(s: WindowState) -> None:
    for n in s.nodes.values():
        if n.id == s.root:
            continue
        mapped = [s.mapping.get(f, SENTINEL) for f in n.full]
        if n.window is None:
            live = [(f, w) for f, w in zip(n.full, mapped) if w != SENTINEL]
            if live:
                fail("tombstone", f"tombstoned node {n.id} still maps window slots: "
                     f"{live[:8]} (full -> window)", node=n.id, mapped=live)
        elif list(n.window) != mapped:
            fail("tombstone", f"live node {n.id} lists window slots {list(n.window)} but its "
                 f"full slots {list(n.full)} map to {mapped}", node=n.id,
                 window=list(n.window), mapped=mapped)


def check_stale_map(s: WindowState) -> None:
    """A free full slot maps no window slot: a stale entry would free (or read) window KV that
    someone else holds the next time the full slot is freed or handed out."""
    if s.free_full is None:
        return
    free, ps = set(s.free_full), s.page_size
    stale = sorted(f for f in s.mapping if _page(f, ps) in free)
    if stale:
        fail("conservation", f"window map: free full slot(s) {stale[:8]} still map window "
             f"slot(s) {[s.mapping[f] for f in stale[:8]]} (stale entries)",
             pool=s.pool.name, full=stale, window=[s.mapping[f] for f in stale])


def check_window_pool(s: WindowState) -> None:
    check_stale_map(s)
    tree = [w for n in s.nodes.values() if n.window is not None for w in n.window]
    check_held_once(s.pool.name, "the tree", tree)
    ps = s.page_size

    def pages(slots):
        return list(dict.fromkeys(_page(w, ps) for w in slots))

    owners = {"tree": pages(tree)}
    for r in s.requests:
        owners[f"request r{r.rid}"] = pages(r.own.values())
    check_conservation(s.pool, owners)


def expected_window_locks(s: WindowState) -> Counter:
    """Each unreleased receipt's segment: from its anchor up to the node stamped with it."""
    want: Counter = Counter()
    for anchor, stamp, released in s.receipts:
        if released:
            continue
        cur = anchor
        while cur is not None and cur != s.root:
            want[cur] += 1
            node = s.nodes[cur]
            if stamp is not None and node.stamp == stamp:
                break
            cur = node.parent
    return want


def check_window_locks(s: WindowState) -> None:
    per_anchor = Counter(a for a, _, _ in s.receipts)
    for anchor in set(per_anchor) | set(s.holders):
        if per_anchor.get(anchor, 0) != s.holders.get(anchor, 0):
            fail("ref-balance", f"node {anchor} carries {per_anchor.get(anchor, 0)} lock "
                 f"receipt(s) but has {s.holders.get(anchor, 0)} live holder(s)",
                 node=anchor, receipts=per_anchor.get(anchor, 0),
                 holders=s.holders.get(anchor, 0))
    want = expected_window_locks(s)
    for n in s.nodes.values():
        if n.id != s.root and n.lock != want.get(n.id, 0):
            fail("ref-balance", f"node {n.id}: window lock {n.lock}, but {want.get(n.id, 0)} "
                 f"unreleased lock segment(s) cover it", node=n.id, lock=n.lock,
                 expected=want.get(n.id, 0))


def check_window_sizes(s: WindowState) -> None:
    if s.evictable is None:
        return
    ev = sum(len(n.window) for n in s.nodes.values()
             if n.id != s.root and n.window is not None and n.lock == 0)
    pr = sum(len(n.window) for n in s.nodes.values()
             if n.id != s.root and n.window is not None and n.lock > 0)
    if (s.evictable, s.protected) != (ev, pr):
        fail("size-accounting", f"window counters evictable={s.evictable} "
             f"protected={s.protected}, but the tree's live window tokens are {ev} unlocked "
             f"+ {pr} locked", evictable=s.evictable, protected=s.protected,
             expected_evictable=ev, expected_protected=pr)


def check_window_release(s: WindowState) -> None:
    for r in s.requests:
        if r.frontier is None:
            continue
        held = sorted(p for p in r.own if r.protected <= p < r.frontier)
        if held:
            fail("window-release", f"request r{r.rid} still holds window slots at position(s) "
                 f"{held[:8]} below its release frontier {r.frontier} (window {s.window}, "
                 f"tree owns < {r.protected}, evicted_seqlen {r.evicted})", request=r.rid,
                 positions=held, frontier=r.frontier)


def check_window_hit(what: str, spans: Sequence[tuple], window: int) -> None:
    """``spans``: the matched path, root first, as (node id, tokens, live window KV?)."""
    need, total = window, sum(n for _, n, _ in spans)
    for nid, n, live in reversed(spans):
        if need <= 0:
            break
        if not live:
            fail("window-hit", f"{what}: a {total}-token hit whose last {window} tokens "
                 f"include tombstoned node {nid} ({n} tokens without window KV)",
                 node=nid, hit=total, window=window)
        need -= n


def check_window(s: WindowState) -> None:
    """Every window check on one snapshot, in the order that names the root cause first."""
    check_sentinel(s)
    check_tombstones(s)
    check_window_pool(s)
    check_window_locks(s)
    check_window_sizes(s)
    check_window_release(s)
