"""Reference model of TokenSpeed's hybrid prefix cache: a paged radix tree whose L-aligned nodes
carry per-group snapshots (History chain + State windows) and continuation-state snapshots.

Upstream: lightseekorg/tokenspeed, clean = 754c3405 (PR #583),
``tokenspeed-scheduler/csrc/resource/hybrid_prefix_cache/hybrid_prefix_cache.cpp`` (adopt L353,
terminal commit L392, isPagedCacheSnapshotBorrowed L474, OnKVEvict L503, match L866, acquire
L1086, admission L1174, DetachStateSnapshotFromNode L1389, tryPrune L1411, CommitChunk L1508,
release block L1638-1675) and ``radix_tree/{paged_cache_snapshot.h,tree_node.h}``.

What the model keeps:

* The tree is a trie of L-token blocks (L = lcm of the History groups' page sizes), so every
  node sits at a multiple of L and a snapshot node is never split (upstream refuses to split
  one; a block trie never needs to).  Nodes carry no KV slots of their own: the main KV cache
  is not modelled, only the paged cache groups.
* A node has at most one ``Snapshot`` (``prefix_len`` = its depth): per group a ``Segment`` of
  pages it *owns*.  History segments form the History chain; a terminal's State segment holds
  only the delta its request wrote, the rest of the continuation window lives on ancestors.
* Refs are path locks: ``devref`` counts active requests at or below a node, ``hostref``
  retracted ones.  A retracted request keeps its tables (it still borrows their pages).
* ``commit_chunk`` is ``CommitChunk``: attach/adopt snapshots at each L boundary, the terminal
  continuation snapshot, then release the State of superseded interior ancestors that are
  provably unreferenced (window advanced past it, sole device ref, not borrowed by any table).
* The clean adoption *fills* a missing required State segment from the adopting request's own
  table (the #460 reviewer's fix; upstream still fails the adoption -- fault C4).

The hooks the faults override: ``_adopt_missing_state``, ``_release_superseded``,
``_release_blocked``.  Logical clock, deterministic node ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from caches.cache_groups import (HISTORY, STATE, CacheGroup, GroupTable,
                                 PagePool, Segment)


class Snapshot:
    __slots__ = ("prefix_len", "groups")

    def __init__(self, prefix_len: int):
        self.prefix_len = prefix_len
        self.groups: dict[str, Segment] = {}


class Node:
    __slots__ = ("id", "parent", "key", "depth", "path", "children", "devref", "hostref",
                 "snapshot", "last_access")

    def __init__(self, nid: int, parent, key: tuple):
        self.id = nid
        self.parent = parent
        self.key = key
        self.depth = (parent.depth if parent else 0) + len(key)
        self.path = (parent.path if parent else ()) + key  # the tokens root..here
        self.children: dict[tuple, Node] = {}
        self.devref = 0
        self.hostref = 0
        self.snapshot: Snapshot | None = None
        self.last_access = 0

    def __repr__(self) -> str:
        return f"Node({self.id}, depth={self.depth})"


@dataclass
class Hit:
    node: Node
    length: int
    history: dict = field(default_factory=dict)  # gid -> pages of the chain (base 0)
    state: dict = field(default_factory=dict)  # gid -> (pages, base) of the window


@dataclass
class CommitResult:
    depth: int
    committed: list = field(default_factory=list)  # (t, "new" | "adopted")
    preflight_failed: str | None = None
    adopt_failed: int | None = None  # depth where adoption failed
    terminal_ok: bool = False
    released: list = field(default_factory=list)  # node ids whose State was released
    kept: list = field(default_factory=list)  # (node id, why) State kept by the release


class ContinuationStateCache:
    def __init__(self, groups: list[CacheGroup], pools: dict[str, PagePool],
                 required: tuple[str, ...]):
        self.groups = {g.gid: g for g in groups}
        self.pools = pools
        self.required = tuple(required)
        self.history_groups = [g for g in self.required if self.groups[g].family == HISTORY]
        self.state_groups = [g for g in self.required if self.groups[g].family == STATE]
        self.continuation_groups = [g.gid for g in groups if g.family == STATE]
        if not self.history_groups:
            raise ValueError("required groups must contain a History group")
        self.L = math.lcm(*(self.groups[g].page_tokens for g in self.history_groups))
        for g in self.continuation_groups:
            grp = self.groups[g]
            if grp.window <= 0 or grp.window % grp.page_tokens:
                raise ValueError(f"State group {g}: window must be a positive multiple of its "
                                 "page size")
            if g in self.state_groups and (self.L % grp.page_tokens or grp.window % self.L):
                raise ValueError(f"required State group {g} must divide into L={self.L}")
        self.w_max = max((self.groups[g].window for g in self.continuation_groups), default=0)
        self.tables: dict[int, dict[str, GroupTable]] = {}  # rid -> gid -> table
        self._next_id = 0
        self._clock = 0
        self.root = self._new_node(None, ())
        self.note = lambda event: None  # coverage hook: the subject counts events

    # -- nodes --------------------------------------------------------------------------
    def _new_node(self, parent, key) -> Node:
        node = Node(self._next_id, parent, tuple(key))
        self._next_id += 1
        if parent is not None:
            parent.children[node.key] = node
        return node

    @staticmethod
    def lru_order(node: Node) -> tuple:
        """The order prune and KV eviction scan in: least recently used first, the deeper
        node first on a tie (``tryPrunePagedCacheSnapshot`` L1411, ``OnKVEvict`` L503)."""
        return node.last_access, -node.depth, node.id

    def _touch(self, node: Node) -> None:
        self._clock += 1
        while node is not None and node is not self.root:
            node.last_access = self._clock
            node = node.parent

    def insert(self, tokens, depth: int) -> Node:
        """The node at ``depth`` (a multiple of L) along ``tokens``, creating missing blocks."""
        node, L = self.root, self.L
        for start in range(0, depth, L):
            key = tuple(tokens[start:start + L])
            child = node.children.get(key)
            node = child if child is not None else self._new_node(node, key)
        self._touch(node)
        return node

    def nodes(self):
        stack, out = [self.root], []
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    @staticmethod
    def path(node: Node):
        """node, parent, ..., below the root."""
        while node is not None and node.parent is not None:
            yield node
            node = node.parent

    def ancestor_at(self, node: Node, depth: int) -> Node:
        while node.depth > depth:
            node = node.parent
        return node

    # -- refs (path locks, root excluded) -------------------------------------------------
    def lock(self, node: Node) -> None:
        for n in self.path(node):
            n.devref += 1

    def unlock(self, node: Node) -> None:
        for n in self.path(node):
            n.devref -= 1

    def host_lock(self, node: Node) -> None:
        for n in self.path(node):
            n.hostref += 1

    def host_unlock(self, node: Node) -> None:
        for n in self.path(node):
            n.hostref -= 1

    # -- snapshot flags -------------------------------------------------------------------
    def history_complete(self, node: Node) -> bool:
        s = node.snapshot
        return s is not None and all(g in s.groups for g in self.history_groups)

    def state_complete(self, node: Node) -> bool:
        s = node.snapshot
        return s is not None and all(g in s.groups for g in self.state_groups)

    def continuation_complete(self, node: Node) -> bool:
        s = node.snapshot
        return (s is not None and bool(self.continuation_groups)
                and all(g in s.groups for g in self.continuation_groups))

    def window(self, gid: str, depth: int) -> tuple[int, int]:
        g = self.groups[gid]
        return max(0, depth - g.window) // g.page_tokens, depth // g.page_tokens

    def assemble(self, node: Node, gid: str):
        """The State window of ``gid`` at ``node``'s depth, stitched from the chain's segments
        (``AssemblePagedCacheStateGroupPagesToTarget``); None if it has a hole."""
        lo, hi = self.window(gid, node.depth)
        at: dict[int, int] = {}
        for n in reversed(list(self.path(node))):
            seg = n.snapshot.groups.get(gid) if n.snapshot else None
            if seg is not None:
                for j, pid in enumerate(seg.pages):
                    at[seg.base + j] = pid
        if any(k not in at for k in range(lo, hi)):
            return None
        return [at[k] for k in range(lo, hi)], lo

    def is_borrowed(self, node: Node, family: str | None = None) -> bool:
        """``isPagedCacheSnapshotBorrowed`` (#583): some table, active or retracted, borrows a
        page of this node's segments (of groups of ``family``; None = any)."""
        s = node.snapshot
        if s is None:
            return False
        for gid, seg in s.groups.items():
            if family is not None and self.groups[gid].family != family:
                continue
            ids = set(seg.pages)
            for tabs in self.tables.values():
                if ids.intersection(tabs[gid].borrowed):
                    return True
        return False

    # -- match ----------------------------------------------------------------------------
    def match(self, tokens) -> Hit:
        """``augmentMatchPagedCache`` on ``tokens`` (the caller leaves out the last token)."""
        chain, node = [], self.root
        for start in range(0, len(tokens) // self.L * self.L, self.L):
            child = node.children.get(tuple(tokens[start:start + self.L]))
            if child is None or not self.history_complete(child):
                break
            chain.append(child)
            node = child
        hit = None
        if chain:
            if not all(g in self.state_groups for g in self.continuation_groups):
                # a continuation-only State group: only the deepest History node, and only if
                # it is a complete continuation point; otherwise no hit (cap_to_root)
                h = chain[-1]
                if self.continuation_complete(h) and all(self.assemble(h, g)
                                                         for g in self.continuation_groups):
                    hit = h
            else:
                for h in reversed(chain):
                    if all(self.assemble(h, g) for g in self.continuation_groups):
                        hit = h
                        break
        if hit is None:
            return Hit(self.root, 0)
        self._touch(hit)
        out = Hit(hit, hit.depth)
        for gid in self.history_groups:
            out.history[gid] = [p for n in reversed(list(self.path(hit)))
                                for p in n.snapshot.groups[gid].pages]
        for gid in self.continuation_groups:
            out.state[gid] = self.assemble(hit, gid)
        return out

    # -- request tables -------------------------------------------------------------------
    def new_tables(self, rid: int, hit: Hit) -> None:
        tabs = {gid: GroupTable(g, self.pools[gid]) for gid, g in self.groups.items()}
        if hit.length:
            for gid, pages in hit.history.items():
                tabs[gid].import_borrowed(pages, 0, hit.length)
            for gid, (pages, base) in hit.state.items():
                tabs[gid].import_borrowed(pages, base, hit.length)
        self.tables[rid] = tabs

    def release_request(self, rid: int) -> None:
        for tab in self.tables.pop(rid).values():
            tab.release_all()

    def shortfall(self, rid: int, first: int, target: int) -> dict[str, int]:
        """Groups whose pool cannot cover the next acquire: gid -> pages missing."""
        out = {}
        for gid, tab in self.tables[rid].items():
            freed, need = tab.plan(first, target)
            have = self.pools[gid].available_size() + freed
            if need > have:
                out[gid] = need - have
        return out

    def admit_chunk(self, rid: int, first: int, target: int) -> bool:
        """The admission check with the LRU snapshot prune (``admitPagedCacheChunk``)."""
        tries = sum(1 for n in self.nodes() if n.snapshot is not None)
        while True:
            short = self.shortfall(rid, first, target)
            if not short:
                return True
            if tries <= 0:
                return False
            tries -= 1
            families = {self.groups[g].family for g in short}
            if not self.prune(families):
                return False

    def acquire_for_request(self, rid: int, first: int, target: int) -> None:
        """``AcquireForRequest``: slide the State groups, then reserve up to ``target``."""
        for tab in self.tables[rid].values():
            if tab.group.sliding:
                tab.release_skipped(max(0, first - tab.group.window + 1))
            tab.acquire(target)

    # -- prune ------------------------------------------------------------------------------
    def pinned(self, node: Node, family: str | None) -> bool:
        if self.is_borrowed(node, family):
            return True
        return any(n.devref > 0 for n in self.path(node))

    def prune(self, families: set) -> bool:
        """``tryPrunePagedCacheSnapshot``: one LRU step; True if something was released."""
        cands = sorted((n for n in self.nodes() if n.snapshot is not None),
                       key=self.lru_order)
        if families == {STATE}:
            for n in cands:
                if (any(g in n.snapshot.groups for g in self.continuation_groups)
                        and not self.pinned(n, STATE)):
                    self.detach_state(n)
                    self.note("prune-state")
                    return True
            return False
        for n in cands:
            if not self.pinned(n, None):
                self.note("prune-snapshot")
                self.detach_snapshot(n)
                stack = list(n.children.values())
                while stack:
                    d = stack.pop()
                    if d.snapshot is not None and not self.pinned(d, None):
                        self.detach_snapshot(d)
                    stack.extend(d.children.values())
                return True
        return False

    def detach_state(self, node: Node) -> None:
        """``DetachStateSnapshotFromNode``: every continuation group's pages go back."""
        s = node.snapshot
        for gid in self.continuation_groups:
            seg = s.groups.pop(gid, None)
            if seg is not None:
                self.pools[gid].free(seg.pages)
        if not s.groups:
            node.snapshot = None

    def detach_snapshot(self, node: Node) -> None:
        for gid, seg in node.snapshot.groups.items():
            self.pools[gid].free(seg.pages)
        node.snapshot = None

    # -- KV eviction --------------------------------------------------------------------------
    def evict(self, n: int) -> int:
        """``OnKVEvict`` on up to ``n`` unreferenced leaves, LRU first: the snapshot is
        detached unless borrowed, then the node leaves the tree.  Returns nodes removed."""
        removed = 0
        while removed < n:
            leaves = sorted((x for x in self.nodes() if x is not self.root and not x.children
                             and x.devref == 0 and x.hostref == 0
                             and not (x.snapshot and self.is_borrowed(x))),
                            key=self.lru_order)
            if not leaves:
                break
            self.note("kv-evict")
            leaf = leaves[0]
            if leaf.snapshot is not None:
                self.detach_snapshot(leaf)
            del leaf.parent.children[leaf.key]
            removed += 1
        return removed

    # -- CommitChunk ----------------------------------------------------------------------------
    def _preflight(self, tabs, t: int) -> str | None:
        for gid in self.required:
            tab = tabs[gid]
            if t % tab.P or not tab.committed < t <= tab.cursor:
                return f"{gid}: t={t} committed={tab.committed} cursor={tab.cursor}"
            if tab.group.family == HISTORY:
                if tab.base + len(tab.borrowed) != tab.committed // tab.P:
                    return f"{gid}: owned columns do not start at the committed page"
                if len(tab.owned) < (t - tab.committed) // tab.P:
                    return f"{gid}: not enough owned pages"
        return None

    def commit_chunk(self, rid: int, terminal: Node) -> CommitResult:
        tabs, D = self.tables[rid], terminal.depth
        res = CommitResult(D)
        last = tabs[self.required[0]].committed
        while last + self.L <= D:
            t = last + self.L
            x = self.ancestor_at(terminal, t)
            why = self._preflight(tabs, t)
            if why is not None:
                res.preflight_failed = why
                break
            if x.snapshot is not None:
                if not self.adopt(tabs, x, t):
                    res.adopt_failed = t
                    break
                res.committed.append((t, "adopted"))
                self.note("adopted")
            else:
                snap = Snapshot(t)
                for gid in self.history_groups:
                    snap.groups[gid] = tabs[gid].commit_history(t)
                for gid in self.state_groups:
                    seg = tabs[gid].checkpoint_state(t)
                    if seg is not None:
                        snap.groups[gid] = seg
                x.snapshot = snap
                res.committed.append((t, "new"))
            last = t
        res.terminal_ok = self.commit_terminal(tabs, terminal)
        self._kept = []
        if res.terminal_ok:
            res.released = self._release_superseded(terminal, D)
            res.kept = self._kept
        return res

    def adopt(self, tabs, x: Node, t: int) -> bool:
        """``adoptExistingPagedCacheSnapshot``: another request committed these tokens first;
        borrow its segments for every required group (continuation-only State is not adopted)."""
        s = x.snapshot
        if any(g not in s.groups for g in self.history_groups):
            return False
        for gid in self.state_groups:
            if gid not in s.groups and not self._adopt_missing_state(tabs, x, gid, t):
                return False
        for gid in self.history_groups:
            tabs[gid].adopt_history(s.groups[gid].pages, t)
        for gid in self.state_groups:
            seg = s.groups[gid]
            if tabs[gid].committed < t:  # not just filled from this table
                tabs[gid].adopt_state(seg.pages, seg.base, t)
        return True

    def _adopt_missing_state(self, tabs, x: Node, gid: str, t: int) -> bool:
        """Clean (the #460 reviewer's fix): fill a History-only anchor's missing required State
        segment from this request's own table; an EMPTY checkpoint means failure."""
        seg = tabs[gid].checkpoint_state(t)
        if seg is None:
            return False
        x.snapshot.groups[gid] = seg
        self.note("adopt-filled-state")
        return True

    def commit_terminal(self, tabs, terminal: Node) -> bool:
        """``commitTerminalContinuationSnapshot``: the trailing State window at the terminal."""
        D, s = terminal.depth, terminal.snapshot
        if not self.continuation_groups or s is None or s.prefix_len != D:
            return False
        if not self.history_complete(terminal):
            return False
        for gid in self.continuation_groups:
            if gid in s.groups:
                self.note("terminal-state-present")
                continue  # already there (another request's, or required): table untouched
            tab, g = tabs[gid], self.groups[gid]
            lo, hi = self.window(gid, D)
            if D % g.page_tokens or D > tab.cursor or tab.base > lo or tab.end < hi:
                return False
            seg = tab.checkpoint_state(D)
            if seg is None:
                return False
            s.groups[gid] = seg
        return self.continuation_complete(terminal)

    def _release_blocked(self, node: Node, D: int) -> str | None:
        """Why an ancestor's State must stay (None: provably unreferenced, release it)."""
        if node.depth + self.w_max > D:
            return "window"  # (1) this request's window has not advanced past it
        if node.devref != 1:
            return "shared"  # (2a) #460: another active request passes through it
        if self.is_borrowed(node, STATE):
            return "borrowed"  # (2b) #583: some table (incl. retracted) still borrows it
        return None

    def _release_superseded(self, terminal: Node, D: int) -> list:
        """The #460/#583 release block: detach superseded interior continuation State."""
        released, kept = [], []
        self._kept = kept  # (node id, why) for the commit's result
        for a in self.path(terminal.parent):  # T->Parent() up to below the root
            s = a.snapshot
            if s is None or not any(g in s.groups for g in self.continuation_groups):
                continue
            why = self._release_blocked(a, D)
            if why is not None:
                kept.append((a.id, why))
                self.note(f"release-kept-{why}")
                continue
            self.detach_state(a)
            self.note("state-released")
            released.append(a.id)
        return released
