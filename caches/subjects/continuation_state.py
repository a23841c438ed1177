"""The continuation-state subject: TokenSpeed's hybrid prefix cache driven like its scheduler.

Caller order as upstream (``scheduler/operations/forward.cpp``: attach, acquire, populate):

* ``admit``: match (all but the last token), take the device ref on the hit, the admission
  check with the LRU snapshot prune, then ``AcquireForRequest`` for the first chunk (a fresh
  table imports the hit).
* ``step``: compute the acquired chunk (write fingerprints into its History and State pages),
  move the request's device ref to the node at ``D = floor(computed / L) * L``, ``CommitChunk``
  (always before the next acquire), then admission + acquire for the next chunk.  The commit's
  postconditions are checked here: ``commit-complete``, ``owned-bounded``, ``superseded-state``.
* ``finish`` / ``abort``: ``release_all`` on every table, drop the ref.
* ``retract``: the device ref becomes a host ref; the tables are kept (post-#583).
* ``recover``: re-lock the device ref, admission, acquire on the existing tables; the table's
  pages must still read back the request's prefix.
* ``evict``: ``OnKVEvict`` on unreferenced leaves.
* ``enqueue`` / ``schedule`` (``caches/subjects/lifecycle.py``): requests wait, then one round
  admits them as TokenSpeed's scheduler does (``SecuredPagesBudget`` in
  ``caches/admission.py``): in arrival order each is matched and locked, secures the pages of
  its unmatched prompt plus its decode headroom in every group (pruning snapshots LRU-first
  for room, like ``admit``), and gets a first chunk cut to the round's token budget; a
  refused one stays waiting and the round goes on; one whose first chunk leaves its prompt
  incomplete ends the round.  The batch's forward then computes every first chunk.
  ``admission-sound``: a first chunk the round secured pages for that cannot be acquired.
"""

from __future__ import annotations

from dataclasses import dataclass

from caches.admission import SecuredPagesBudget, remaining_decode
from caches.cache_groups import HISTORY, STATE, CacheGroup, PagePool, Segment
from caches.continuation_state import ContinuationStateCache
from caches.pools import Fingerprint
from caches.subjects.base import Skip, Subject, _prefix_fingerprints, node_objects
from caches.subjects.canon import Ref, Time, TreeState, ids
from caches.subjects.continuation_state_fast import continuation_state_fast_ok
from caches.subjects.lifecycle import Lifecycle
from invariants import (NodeView, TreeView, check_fingerprints, check_held_once, fail,
                        check_quiescence, check_ref_balance, check_structure)
from invariants.cache_groups import (check_commit_complete, check_group_pages,
                                     check_owned_bounded, check_snapshot_placement,
                                     check_superseded)
from invariants.policy import (check_leaf_evictions, check_pick, check_recency,
                               tokenspeed_lru_key)

PAGE = 2  # raw tokens per page in both groups (so L = 2)


@dataclass
class CSReq:
    rid: int
    tokens: list
    chunk: int
    computed: int = 0
    target: int = 0  # acquired up to here (> computed: a chunk is ready to compute)
    node: object = None  # the node its (device or host) ref is on
    active: bool = True  # False: retracted (host ref only, tables kept)
    fps: tuple = ()  # each prefix's fingerprint (shared: read only)


class ContinuationStateSubject(Lifecycle, Subject):
    variant = "continuation-state"
    # one scheduling round: its token budget (TokenSpeed's max_scheduled_tokens, as the
    # tokenspeed target sets it) and the chunk an admitted request steps by afterwards
    round_tokens = 8
    round_chunk = 4

    def __init__(self, cache_cls=ContinuationStateCache, *, state_required: bool = False,
                 pool_pages: int = 8, window: int = 4, device: str | None = None):
        super().__init__()
        if window % PAGE:
            raise ValueError(f"window must be a multiple of the page size {PAGE}")
        groups = [CacheGroup("H", HISTORY, PAGE), CacheGroup("S", STATE, PAGE, window)]
        self.pools = {g.gid: PagePool(pool_pages, device, name=g.gid) for g in groups}
        required = ("H", "S") if state_required else ("H",)
        self.cache = cache_cls(groups, self.pools, required)
        self.cache.note = self.reached
        self.L = self.cache.L
        self.requests: dict[int, CSReq] = {}
        self.waiting: dict = {}  # rid -> Req (caches/request.py), in arrival order
        self._watch_policy()

    # -- serving operations ---------------------------------------------------------------
    def admit(self, rid: int, tokens: list[int], chunk: int) -> str:
        if rid in self.requests or rid in self.waiting:
            raise Skip(f"r{rid} is already live or waiting")
        if not tokens or chunk < 1:
            raise Skip("a request needs tokens and a positive chunk")
        c = self.cache
        hit = c.match(tokens[:-1])
        c.lock(hit.node)
        c.new_tables(rid, hit)
        first, target = hit.length, min(len(tokens), hit.length + chunk)
        if first:
            self.reached("prefix-hit")
        if not c.admit_chunk(rid, first, target):
            self.reached("admission-refused")
            c.release_request(rid)
            c.unlock(hit.node)
            return f"refused: no pages for [{first},{target}) even after pruning"
        c.acquire_for_request(rid, first, target)
        self.requests[rid] = CSReq(rid, list(tokens), chunk, first, target, hit.node,
                                   fps=_prefix_fingerprints(tuple(tokens)))
        return f"hit {first} of {len(tokens)} tokens, acquired [{first},{target})"

    def step(self, rid: int) -> str:
        req = self._active(rid)
        if req.computed == len(req.tokens):
            raise Skip(f"r{rid} is fully computed")
        words = []
        if req.target > req.computed:
            words.append(self._compute(req))
        if req.computed < len(req.tokens):
            first = req.computed
            target = min(len(req.tokens), first + req.chunk)
            if self.cache.admit_chunk(rid, first, target):
                self.cache.acquire_for_request(rid, first, target)
                req.target = target
                words.append(f"acquired [{first},{target})")
            else:
                self.reached("chunk-refused")
                words.append(f"next chunk [{first},{target}) refused (waits)")
        return "; ".join(words)

    def finish(self, rid: int) -> str:
        req = self._active(rid)
        if req.computed < len(req.tokens):
            raise Skip(f"r{rid} is still computing")
        self.cache.release_request(rid)
        self.cache.unlock(req.node)
        del self.requests[rid]
        return "finished, tables released"

    def abort(self, rid: int) -> str:
        req = self.req(rid)
        self.cache.release_request(rid)
        (self.cache.unlock if req.active else self.cache.host_unlock)(req.node)
        del self.requests[rid]
        return f"aborted after {req.computed}/{len(req.tokens)} tokens"

    def retract(self, rid: int) -> str:
        req = self._active(rid)
        self.cache.unlock(req.node)
        self.cache.host_lock(req.node)
        req.active = False
        self.reached("retract")
        return f"retracted to host at node {req.node.id} (tables kept)"

    def recover(self, rid: int) -> str:
        req = self.req(rid)
        if req.active:
            raise Skip(f"r{rid} is not retracted")
        c = self.cache
        c.lock(req.node)
        first, target = req.computed, max(req.target, req.computed)
        if not c.admit_chunk(rid, first, target):
            c.unlock(req.node)
            return "recovery refused: no pages (stays retracted)"
        c.acquire_for_request(rid, first, target)
        c.host_unlock(req.node)
        req.active = True
        self.reached("recover")
        self._verify_tables(req, f"r{rid} after recovery, ")
        return f"recovered at node {req.node.id} with {req.computed} tokens computed"

    def evict(self, n: int) -> str:
        return f"evicted {self.cache.evict(n)} node(s)"

    # -- batch admission (the Lifecycle mixin's schedule over these hooks) ------------------
    def admission_rule(self):
        return getattr(self.cache, "admission", SecuredPagesBudget)

    def _budget(self):
        return self.admission_rule()(self.round_tokens, self._free_pages, self._pages_needed)

    def _free_pages(self) -> dict:
        return {gid: pool.available_size() for gid, pool in self.pools.items()}

    def _free_and_evictable(self) -> int:
        """Free History tokens (what ``admission-sound``'s message reports)."""
        return self.pools["H"].available_size() * PAGE

    def _pages_needed(self, req, extend: int, max_new: int) -> dict:
        """Pages per group ``req``'s tables must acquire for the rest of its prompt and
        ``max_new`` decode tokens (the tables' own arithmetic, ``GroupTable.plan``)."""
        first = len(req.tokens) - extend
        return {gid: tab.plan(first, len(req.tokens) + max_new)[1]
                for gid, tab in self.cache.tables[req.rid].items()}

    def admit_one(self, req, budget, admitted: int):
        """Match and lock, then secure the pages (pruning snapshots LRU-first while a group
        is short, as ``admit_chunk`` does): (the hit, the first chunk's tokens), or None --
        the request stays waiting, its lock and tables undone."""
        c, rid = self.cache, req.rid
        hit = c.match(req.tokens[:-1])
        c.lock(hit.node)
        c.new_tables(rid, hit)
        extend = len(req.tokens) - hit.length
        max_new = budget.headroom(remaining_decode(req.max_new, req.output), req.retracted)
        tries = sum(1 for n in c.nodes() if n.snapshot is not None)
        while not budget.fits(extend, max_new, req):
            short = budget.short(extend, max_new, req) if budget.chunk(extend) else {}
            if not short or tries <= 0 or not c.prune({c.groups[g].family for g in short}):
                c.release_request(rid)
                c.unlock(hit.node)
                return None
            tries -= 1
        chunk = budget.chunk(extend)
        budget.reserve(extend, max_new, req)
        return hit, chunk

    def _extend(self, req, pinned) -> str | None:
        """The admitted request's first chunk acquired (``AcquireForRequest``)."""
        hit, chunk = pinned
        c, rid, first = self.cache, req.rid, hit.length
        target = first + chunk
        if first:
            self.reached("prefix-hit")
        if not c.admit_chunk(rid, first, target):
            return f"r{rid}'s first chunk [{first},{target})"
        c.acquire_for_request(rid, first, target)
        self.requests[rid] = CSReq(rid, list(req.tokens), self.round_chunk, first, target,
                                   hit.node, fps=_prefix_fingerprints(tuple(req.tokens)))
        return None

    def _first_decode(self, batch) -> str:
        """The round's forward: every admitted request's first chunk computed and committed."""
        for req, _ in batch:
            self._compute(self.requests[req.rid])
        return "first chunks computed"

    # -- helpers --------------------------------------------------------------------------
    def _active(self, rid: int) -> CSReq:
        req = self.req(rid)
        if not req.active:
            raise Skip(f"r{rid} is retracted")
        return req

    def _compute(self, req: CSReq) -> str:
        """Compute [computed, target): fill its pages, insert, move the ref, CommitChunk."""
        c, rid = self.cache, req.rid
        lo, hi = req.computed, req.target
        for tab in c.tables[rid].values():
            P = tab.P
            ids, vals = [], []
            for k, pid, borrowed in tab.entries():
                if not borrowed and k * P < hi and (k + 1) * P > lo:
                    ids.append(pid)
                    vals.append(req.fps[min((k + 1) * P, hi) - 1])
            tab.pool.write(ids, vals)
        req.computed = hi
        D = hi // self.L * self.L
        if D == 0:
            return f"computed [{lo},{hi})"
        T = c.insert(req.tokens, D)
        if T is not req.node:
            c.lock(T)
            c.unlock(req.node)
            req.node = T
        covered = self._window_covered(rid, T)
        had = set(T.snapshot.groups) if T.snapshot is not None else set()
        res = c.commit_chunk(rid, T)
        if self.checking and res.preflight_failed is None and covered:
            self._check_commit(req, T, res, had)
        done = ", ".join(f"{t}:{how}" for t, how in res.committed) or "nothing new"
        words = f"computed [{lo},{hi}), committed to depth {D} ({done})"
        self._note_commit(res)
        if res.preflight_failed:
            words += f", commit stopped: {res.preflight_failed}"
        if res.adopt_failed is not None:
            words += f", adoption failed at {res.adopt_failed}"
        words += ", terminal continuation-complete" if res.terminal_ok else \
            ", terminal incomplete"
        if res.released:
            words += f", released State of node(s) {res.released}"
        return words

    def _note_commit(self, res) -> None:
        if res.preflight_failed:
            self.reached("commit-stopped")
        if res.terminal_ok:
            self.reached("terminal-complete")
        for nid, why in res.kept:
            if why == "borrowed":
                node = next(n for n in self.cache.nodes() if n.id == nid)
                if any(not r.active and set(self.cache.tables[r.rid]["S"].borrowed) &
                       set(node.snapshot.groups.get("S", Segment([], 0)).pages)
                       for r in self.requests.values()):
                    self.reached("release-kept-for-retracted")

    def _window_covered(self, rid: int, T) -> bool:
        """The precondition of the terminal commit: each continuation table covers its window
        at T (or T already has that group)."""
        c = self.cache
        for gid in c.continuation_groups:
            if T.snapshot is not None and gid in T.snapshot.groups:
                continue
            tab = c.tables[rid][gid]
            lo, hi = c.window(gid, T.depth)
            if tab.base > lo or tab.end < hi:
                return False
        return True

    def _check_commit(self, req: CSReq, T, res, had: set) -> None:
        """The commit's postconditions.  The window must assemble for a State segment this
        commit wrote at T; one another request wrote earlier may have lost an ancestor segment
        to a legitimate release on another branch (a lost hit, not a fault)."""
        c, rid, D = self.cache, req.rid, T.depth
        snap = T.snapshot
        check_commit_complete(
            rid, D, None if snap is None else list(snap.groups), c.history_groups, c.required,
            c.continuation_groups,
            {g: c.assemble(T, g) is not None for g in c.continuation_groups if g not in had},
            node=T.id)
        for gid in c.history_groups:
            tab = c.tables[rid][gid]
            check_owned_bounded(rid, gid, D, tab.committed, len(tab.owned), tab.cursor, tab.P)
        if res.terminal_ok:
            anc = []
            for a in c.path(T.parent):
                pages = sum(len(a.snapshot.groups[g].pages) for g in c.continuation_groups
                            if a.snapshot is not None and g in a.snapshot.groups)
                anc.append((a.id, a.depth, pages, a.devref, c.is_borrowed(a, STATE)))
            check_superseded(rid, D, c.w_max, anc)

    def _verify_tables(self, req: CSReq, what: str, data=None) -> None:
        """Every complete computed page in the request's tables reads back its prefix."""
        if not self.checking:
            return
        for gid, tab in self.cache.tables[req.rid].items():
            P = tab.P
            ids = [(pid, k) for k, pid, _ in tab.entries() if (k + 1) * P <= req.computed]
            if not ids:
                continue
            got = (data[gid] if data else None)
            got = [got[i] for i, _ in ids] if got is not None else tab.pool.read(
                [i for i, _ in ids])
            check_fingerprints(gid, [i for i, _ in ids], got,
                               [req.fps[(k + 1) * P - 1] for _, k in ids], what=what)

    # -- views and checks -------------------------------------------------------------------
    def _nodes(self) -> list:
        """``cache.nodes()`` with each node object once (``node_objects``: a corrupted tree
        with a cycle is reported, not walked forever); on a tree without one, the same nodes
        in the same order."""
        return node_objects(self.cache.root)

    def tree_view(self) -> TreeView:
        nodes = {}
        for n in self._nodes():
            nodes[n.id] = NodeView(
                n.id, n.parent.id if n.parent is not None else None, n.key,
                tuple(range(n.depth - len(n.key), n.depth)),  # the positions it covers
                {"dev": n.devref, "host": n.hostref},
                {k: ch.id for k, ch in n.children.items()})
        return TreeView(nodes, self.cache.root.id, self.L)

    def check(self) -> None:
        """Every invariant after every op.  On the reference cache the one-walk fast verdict
        (``continuation_state_fast.py``) answers first, and then only the policy checks (of
        the prunes, evictions and matches this op made) run; when it sees anything wrong the
        view is built and every check runs, to say what broke."""
        if self.fast_check and isinstance(self.cache, ContinuationStateCache) \
                and continuation_state_fast_ok(self):
            if self.checking:
                self.check_policy()
            return
        c = self.cache
        nodes = self._nodes()
        snaps = [n for n in nodes if n.snapshot is not None]
        check_snapshot_placement(((n.id, n.depth, n.snapshot.prefix_len, len(n.key))
                                  for n in snaps), self.L)
        tree = self.tree_view()
        dev, host = {}, {}
        for req in self.requests.values():
            held = dev if req.active else host
            held[req.node.id] = held.get(req.node.id, 0) + 1
        if len(tree.nodes) != len(nodes):  # the view keeps one node per id
            twice = sorted({n.id for n in nodes if sum(m.id == n.id for m in nodes) > 1})
            fail("structure", f"node id(s) {twice} name more than one node of the tree",
                 ids=twice)
        check_ref_balance(tree, dev, counter="dev", root_baseline=0)
        check_ref_balance(tree, host, counter="host", root_baseline=0)
        check_structure(tree)
        for gid, pool in self.pools.items():
            segments = {f"node {n.id}": n.snapshot.groups[gid].pages for n in snaps
                        if gid in n.snapshot.groups}
            owned = {f"r{r}": c.tables[r][gid].owned for r in sorted(c.tables)}
            borrowed = {f"r{r}": c.tables[r][gid].borrowed for r in sorted(c.tables)}
            check_group_pages(pool.view(), segments, owned, borrowed)
            # a page at two positions of the tree: two nodes sharing one is conservation's
            # (each node is an owner), one segment listing it twice is not (an owner may)
            tree = [p for n in snaps if gid in n.snapshot.groups
                    for p in n.snapshot.groups[gid].pages]
            check_held_once(pool.name, "the tree", tree, pool.unit)
        if not self.checking:
            return
        data = {gid: pool.data.tolist() for gid, pool in self.pools.items()}
        for n in snaps:
            fps = None
            for gid, seg in n.snapshot.groups.items():
                if not seg.pages:
                    continue
                fps = fps or Fingerprint.of_prefix(n.path)
                P = c.groups[gid].page_tokens
                check_fingerprints(gid, seg.pages, [data[gid][i] for i in seg.pages],
                                   [fps[(seg.base + j + 1) * P - 1]
                                    for j in range(len(seg.pages))],
                                   what=f"snapshot of node {n.id}, ")
        for req in self.requests.values():
            self._verify_tables(req, f"r{req.rid}'s table, ", data)
        self.check_policy()

    fast_check = True  # False: always build the view (the fast path's side-by-side test)

    # -- policy (invariants/policy.py): the one-step LRU snapshot prune, KV eviction, recency --
    victim_key = staticmethod(tokenspeed_lru_key)

    def policy_view(self) -> TreeView:
        """The tree with what the policy reads: ``extra`` time, depth, snapshot (any segment),
        state (a continuation-group segment), borrowed (the families some table, active or
        retracted, borrows a page of)."""
        c = self.cache
        lent = {}  # gid -> the pages some table borrows (groups nobody borrows from: absent)
        for tabs in c.tables.values():
            for gid, tab in tabs.items():
                if tab.borrowed:
                    lent.setdefault(gid, set()).update(tab.borrowed)
        groups, cont, nothing = c.groups, c.continuation_groups, frozenset()
        nodes = {}
        for n in c.nodes():
            segs = n.snapshot.groups if n.snapshot is not None else None
            if segs:
                borrowed = nothing
                if lent:
                    borrowed = frozenset(groups[g].family for g, seg in segs.items()
                                         if g in lent and not lent[g].isdisjoint(seg.pages))
                extra = {"time": n.last_access, "depth": n.depth, "snapshot": True,
                         "state": not segs.keys().isdisjoint(cont), "borrowed": borrowed}
            else:
                extra = {"time": n.last_access, "depth": n.depth, "snapshot": False,
                         "state": False, "borrowed": nothing}
            nodes[n.id] = NodeView(n.id, n.parent.id if n.parent is not None else None, n.key,
                                   (), {"dev": n.devref, "host": n.hostref},
                                   {k: ch.id for k, ch in n.children.items()}, extra)
        return TreeView(nodes, c.root.id, self.L)

    @staticmethod
    def _pinned(tree: TreeView, node: NodeView, family: str | None) -> bool:
        """``pinned``: borrowed (by ``family``; None = any), or a device ref on its path."""
        if node.extra["borrowed"] if family is None else family in node.extra["borrowed"]:
            return True
        while node.id != tree.root:
            if node.refs["dev"]:
                return True
            node = tree.nodes[node.parent]
        return False

    def _watch_policy(self) -> None:
        self._policy_events = []
        cache, subject = self.cache, self
        prune, evict, match = cache.prune, cache.evict, cache.match

        def policy_prune(families):
            if not subject.checking:
                return prune(families)
            before = subject.policy_view()
            out = prune(families)
            subject._policy_events.append(("prune", set(families), before,
                                           subject.policy_view()))
            return out

        def policy_evict(n):
            if not subject.checking:
                return evict(n)
            before = subject.policy_view()
            out = evict(n)
            gone = set(before.nodes) - {x.id for x in cache.nodes()}
            subject._policy_events.append(("evict", n, before, gone))
            return out

        def policy_match(tokens):
            if not subject.checking:
                return match(tokens)
            latest = max([x.last_access for x in cache.nodes()], default=0)
            hit = match(tokens)
            path = [(x.id, x.last_access) for x in cache.path(hit.node)]
            subject._policy_events.append(("match", len(tokens), latest, path[::-1]))
            return hit

        cache.prune, cache.evict, cache.match = policy_prune, policy_evict, policy_match

    def check_policy(self) -> None:
        events = self._policy_events
        if not events:  # (most steps: no prune, eviction or match to check)
            return
        self._policy_events = []
        key = self.victim_key
        for ev in events:
            if ev[0] == "prune":
                _, families, before, after = ev
                state_only = families == {STATE}
                flag = "state" if state_only else "snapshot"
                lost = [before.nodes[nid] for nid, n in before.nodes.items()
                        if n.extra[flag] and not (nid in after.nodes
                                                  and after.nodes[nid].extra[flag])]
                if not lost:
                    continue
                chosen = min(lost, key=lambda n: (n.extra["depth"], n.id))  # the rest: cascade
                cands = [n for n in before.nodes.values() if n.id != before.root
                         and n.extra[flag]
                         and not self._pinned(before, n, STATE if state_only else None)]
                what = ("prune of a continuation State segment" if state_only else
                        f"prune of a snapshot ({'/'.join(sorted(families))} short)")
                check_pick(what, chosen.id, cands, key)
            elif ev[0] == "evict":
                _, n, before, gone = ev
                check_leaf_evictions(
                    before, gone, n, key, what=f"evict({n})",
                    allowed=lambda x: not x.refs["dev"] and not x.refs["host"]
                    and not x.extra["borrowed"])
            else:
                _, n, latest, path = ev
                check_recency(f"match of a {n}-token key", latest, path)

    def drain(self) -> None:
        self.waiting.clear()  # a waiting request holds nothing
        for rid in self.live():
            req = self.requests[rid]
            if req.active and req.computed == len(req.tokens):
                self.finish(rid)
            else:
                self.abort(rid)
        self.cache.evict(1 << 30)

    def check_quiescent(self) -> None:
        check_quiescence(self.tree_view(), [p.view() for p in self.pools.values()],
                         {"dev": 0, "host": 0})

    def state(self) -> TreeState:
        """The exhaustive search's state (``canon.py``): keys, refs, snapshot segments (pages
        and bases) and the fingerprints of pages a check reads back (snapshot pages and the
        computed pages of each table), access times as the prune / evict order
        ``(last_access, -depth, id)``, every live request (tokens, chunk, progress, node,
        active) with its tables (base, borrowed, owned, cursor, committed), tables left
        without a request, and each group's free list (LIFO: it decides the next pages)."""
        c = self.cache
        data = {gid: pool.data.tolist() for gid, pool in self.pools.items()}

        def node(n):
            snap = None
            if n.snapshot is not None:
                snap = (n.snapshot.prefix_len, tuple(
                    (gid, seg.base, ids(gid, seg.pages), tuple(data[gid][p] for p in seg.pages))
                    for gid, seg in sorted(n.snapshot.groups.items())))
            return n.key, n.devref, n.hostref, Time((n.last_access, -n.depth, n.id)), snap

        reqs = []
        for rid, r in sorted(self.requests.items()):
            tabs = []
            for gid, tab in sorted(c.tables[rid].items()):
                read = tuple(data[gid][pid] for k, pid, _ in tab.entries()
                             if (k + 1) * tab.P <= r.computed)
                tabs.append((gid, tab.base, ids(gid, tab.borrowed), ids(gid, tab.owned),
                             tab.cursor, tab.committed, read))
            reqs.append((rid, tuple(r.tokens), r.chunk, r.computed, r.target, Ref(r.node),
                         r.active, tuple(tabs)))
        return TreeState(
            c.root, node,
            (tuple(reqs), tuple(sorted(set(c.tables) - set(self.requests))),
             self.waiting_state(),
             tuple((gid, ids(gid, pool.free_slots)) for gid, pool in sorted(self.pools.items()))))

    def counters(self) -> dict:
        out = {f"free_{gid}": len(p.free_slots) for gid, p in self.pools.items()}
        out["snapshots"] = sum(1 for n in self.cache.nodes() if n.snapshot is not None)
        out["live"] = len(self.requests)
        out["waiting"] = len(self.waiting)
        return out

    def outline(self) -> str:
        c, lines = self.cache, []

        def walk(node, depth):
            if node is c.root:
                lines.append("root")
            else:
                snap = ""
                if node.snapshot is not None:
                    snap = " snap{" + ", ".join(
                        f"{g}:{seg.pages}@{seg.base}"
                        for g, seg in sorted(node.snapshot.groups.items())) + "}"
                lines.append(f"{'  ' * depth}#{node.id} {list(node.key)} d={node.depth} "
                             f"dev={node.devref} host={node.hostref}{snap}")
            for _, child in sorted(node.children.items()):
                walk(child, depth + 1)

        walk(c.root, 0)
        for rid in self.live():
            r = self.requests[rid]
            state = "active" if r.active else "retracted"
            lines.append(f"r{rid} ({state}): {r.computed}/{len(r.tokens)} computed, acquired "
                         f"to {r.target}, on #{r.node.id}; "
                         + " ".join(repr(t) for t in c.tables[rid].values()))
        lines.extend(self.waiting_lines())
        lines.append("free: " + ", ".join(f"{g}={sorted(p.free_slots)}"
                                          for g, p in self.pools.items()))
        return "\n".join(lines)
