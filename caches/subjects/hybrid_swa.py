"""The hybrid-swa subject: a radix cache over a full pool and a sliding-window pool, driven as
SGLang 0.5.23's scheduler drives ``UnifiedRadixCache`` with ``Full + SWA`` components.

Everything the radix subject does (``caches/subjects/radix.py``: admission, chunks, decode,
speculative steps, finish, abort, retract, batch scheduling, the bare tree API) runs here
unchanged over ``HybridSWARadixCache``; what the window adds:

* a decode step first releases the request's out-of-window window KV, as ``maybe_evict_swa``
  does before each decode batch after the first (``evict_sliding_windows(req, seqlen - 1)``);
  the frontier that release had to reach is recorded per request (``window-release``);
* ``evict_swa(n)``: the scheduler asking for ``n`` tokens of window room
  (``evict(EvictParams(swa_num_tokens=n))``): tombstones;
* ``release_window(rid)``: a request decoded a window past its prefix releases its lock's
  window part early (``release_swa_prefix_lock``);
* every match's last ``window`` tokens must have live window KV (``window-hit``), and after
  every op the window snapshot (``window_state``) is checked (``invariants/window.py``):
  sentinel, tombstones, window-pool conservation, window locks against the lock receipts,
  window counters, out-of-window release.

An engine's subject overrides ``window_state`` and ``window_spans`` (what it shows of its
nodes) and offers the cache methods ``evict_swa``, ``free_out_of_window`` and
``release_window_lock``.  Allocation policy (``spurious-oom``, the allocation's
``over-eviction``) is not judged here: a failed allocation may be short in either pool, and
those checks read one; ``evict(n)``'s over-eviction and victim checks run as in radix.
"""

from __future__ import annotations

from dataclasses import replace

from caches.arith import ceil_align, floor_align
from caches.hybrid_swa import HybridSWARadixCache
from caches.request import Req
from caches.subjects.base import Skip
from caches.subjects.canon import Ref, Unordered, ids
from caches.subjects.radix import RadixSubject
from caches.window_pool import SWAPagedAllocator
from invariants import check_quiescence
from invariants.window import (WindowNode, WindowRequest, WindowState, check_sentinel,
                               check_window, check_window_hit)


def release_frontier(pre_len: int, window: int, page_size: int) -> int:
    """Where a release at ``pre_len`` computed positions must have freed a request's own
    window KV up to: a page-rounded window behind, page-aligned (``common.py``
    ``free_swa_out_of_window_slots``, the prefix-sharing branch)."""
    return floor_align(pre_len - ceil_align(max(window, page_size), page_size), page_size)


class HybridSWASubject(RadixSubject):
    variant = "hybrid-swa"

    def __init__(self, cache_cls=HybridSWARadixCache, *, page_size: int = 1,
                 pool_pages: int = 12, swa_pages: int = 6, window: int = 4,
                 device: str | None = None, cache=None):
        self.window = window
        if cache is None:
            pool = SWAPagedAllocator(pool_pages, swa_pages, page_size, device)
            cache = cache_cls(pool, page_size, window)
            cache.pool = pool
        self.frontiers: dict[int, int] = {}  # rid -> the frontier its last release had to reach
        self.decode_steps: dict[int, int] = {}  # rid -> decode steps since (re)admission
        self.lock_receipts: dict = {}  # hid -> its lock's receipt
        self.pinned_receipts: dict = {}  # rid -> the receipt of a pin not yet placed
        self._live_before: tuple = ({}, {})  # node id / full slot -> live window KV? (last check)
        super().__init__(page_size=page_size, pool_pages=pool_pages, device=device, cache=cache)

    # -- each holder's lock receipt (a cache that hands them out: ``holder_receipts``) --------
    def _receipts_kept(self) -> bool:
        return getattr(self.cache, "holder_receipts", False)

    def admit(self, rid: int, tokens: list[int]) -> str:
        out = super().admit(rid, tokens)
        if self._receipts_kept() and rid in self.requests:
            self.requests[rid].swa_receipt = self.cache.last_receipt
        return out

    def lock(self, hid: int, tokens: list[int]) -> str:
        out = super().lock(hid, tokens)
        if self._receipts_kept() and hid in self.locks:
            self.lock_receipts[hid] = self.cache.last_receipt
        return out

    def unlock(self, hid: int) -> str:
        if not self._receipts_kept() or hid not in self.locks:
            return super().unlock(hid)
        self.cache.dec_lock_ref(self.locks.pop(hid), self.lock_receipts.pop(hid))
        return "unlocked"

    def _pin(self, req: Req, admitted: int):
        pinned = super()._pin(req, admitted)
        if self._receipts_kept():
            self.pinned_receipts[req.rid] = self.cache.last_receipt
        return pinned

    def _unpin(self, req: Req, pinned) -> None:
        if not self._receipts_kept():
            return super()._unpin(req, pinned)
        self.cache.dec_lock_ref(pinned[1], self.pinned_receipts.pop(req.rid))

    def _place(self, req: Req, pinned, own: list[int]) -> None:
        super()._place(req, pinned, own)
        if self._receipts_kept():
            req.swa_receipt = self.pinned_receipts.pop(req.rid)

    # -- the window's ops -----------------------------------------------------------------
    def evict_swa(self, n: int) -> str:
        return f"freed {self.cache.evict_swa(n)} window tokens"

    def release_window(self, rid: int) -> str:
        req = self._decoding(rid)
        if req.output < self.window:
            raise Skip(f"r{rid} has decoded {req.output} < window {self.window} tokens")
        if req.last_node is self.cache.root_node:
            raise Skip(f"r{rid} holds no tree lock")
        if not self.cache.release_window_lock(req.last_node, getattr(req, "swa_receipt", None)):
            raise Skip(f"r{rid}'s lock has no window part left")
        self.reached("window-lock-released")
        return f"released r{rid}'s window lock on node {req.last_node.id}"

    def _release_out_of_window(self, req: Req, pre_len: int) -> None:
        before = req.swa_evicted_seqlen
        self.cache.free_out_of_window(req, pre_len)
        frontier = release_frontier(pre_len, self.window, self.page_size)
        self.frontiers[req.rid] = max(self.frontiers.get(req.rid, 0), frontier)
        if req.swa_evicted_seqlen > max(before, req.cache_protected_len):
            self.reached("out-of-window-freed")

    def _decode_alloc(self, req: Req):
        # not the first decode batch since (re)admission (upstream's ``decode_batch_idx``,
        # reset by ``reset_for_retract``)
        if self.decode_steps.get(req.rid, 0) >= 1:
            self._release_out_of_window(req, req.filled)
        self.decode_steps[req.rid] = self.decode_steps.get(req.rid, 0) + 1
        return super()._decode_alloc(req)

    def _forget(self, rid: int) -> None:
        self.frontiers.pop(rid, None)
        self.decode_steps.pop(rid, None)

    def _reset(self, req: Req) -> None:
        super()._reset(req)
        req.swa_evicted_seqlen = 0
        self._forget(req.rid)

    def finish(self, rid: int) -> str:
        self._forget(rid)
        return super().finish(rid)

    def abort(self, rid: int) -> str:
        self._forget(rid)
        return super().abort(rid)

    def _free_and_evictable(self) -> int:
        """The batch budget: the smaller pool's free + evictable (SGLang's ``PrefillAdder``
        takes the minimum of the full and the SWA pool)."""
        full = super()._free_and_evictable()
        window = self.pool.window.available_size() + self.cache.swa_evictable_size_
        return min(full, window)

    def cache_duplicates(self, slots: list[int]) -> list[int]:
        return self.cache.duplicates(slots)

    def alloc_demands(self) -> dict:
        return {}  # see the module doc

    # -- views and checks -------------------------------------------------------------------
    def window_spans(self, match) -> list:
        """The matched path, root first: (node id, tokens, live window KV?)."""
        spans, node = [], match.last_node
        while node is not self.cache.root_node:
            spans.append((node.id, len(node.key), node.swa_value is not None))
            node = node.parent
        return spans[::-1]

    def _check_match(self, key, match) -> None:
        super()._check_match(key, match)
        spans = self.window_spans(match)
        if any(not live for _, _, live in spans):
            self.reached("hit-over-tombstone")
        check_window_hit(f"match of a {len(key)}-token key", spans, self.window)

    def window_state(self) -> WindowState:
        cache, pool = self.cache, self.pool
        nodes, stack = {}, [cache.root_node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            nodes[n.id] = WindowNode(n.id, None if n.parent is None else n.parent.id,
                                     tuple(n.value),
                                     None if n.swa_value is None else tuple(n.swa_value),
                                     n.swa_lock_ref, n.swa_uuid)
        mapping = pool.mapping
        requests = tuple(
            WindowRequest(rid, {p: mapping[s] for p, s in enumerate(r.kv_indices)
                                if p >= r.cache_protected_len and s in mapping},
                          r.cache_protected_len, r.swa_evicted_seqlen, self.frontiers.get(rid))
            for rid, r in sorted(self.requests.items()))
        receipts = tuple((anchor, r.uuid, r.released)
                         for anchor, rs in cache.receipts.items() for r in rs)
        root = cache.root_node.id
        holders = {k: v for k, v in self.held_locks().items() if k != root}
        return WindowState(self.window, self.page_size, pool.window.view(), root, nodes,
                           dict(mapping), requests, receipts, cache.swa_evictable_size_,
                           cache.swa_protected_size_, holders=holders,
                           free_full=tuple(pool.free_pages))

    def check(self) -> None:
        super().check()
        state = self.window_state()
        self._window_transitions(state)
        check_window(state)

    def _window_transitions(self, state: WindowState) -> None:
        """Tombstones made and recovered, seen two ways: a node (by id) whose window KV went
        or came back, and a full slot the tree held with window KV and now holds without (or
        the other way: a locked recovery keeps the node's full slots).  The slots see it where
        a target shows no nodes (the Rust core's aggregate view)."""
        before, slots_before = self._live_before
        now = {nid: n.window is not None for nid, n in state.nodes.items() if nid != state.root}
        slots = {f: n.window is not None for nid, n in state.nodes.items() if nid != state.root
                 for f in n.full}
        made = any(before.get(nid) is True and not live for nid, live in now.items() if nid >= 0)
        made = made or any(slots_before.get(f) is True and not live for f, live in slots.items())
        back = any(before.get(nid) is False and live for nid, live in now.items() if nid >= 0)
        back = back or any(slots_before.get(f) is False and live for f, live in slots.items())
        if made:
            self.reached("tombstone-made")
        if back:
            self.reached("tombstone-recovered")
        for nid, live in now.items():
            if not live and nid >= 0 and not any(m.parent == nid for m in state.nodes.values()):
                self.reached("tombstone-leaf")
        self._live_before = (now, slots)

    def check_quiescent(self) -> None:
        check_sentinel(self.window_state())  # a freed sentinel first, not as a double free
        check_quiescence(self.tree_view(), [self.pool.view(), self.pool.window.view()],
                         {"lock": 1})

    def abstract_state(self) -> dict:
        """The radix abstract state plus, by token path, whether each node's window KV is
        live and its window lock (``kvcheck diff``); a subject without nodes shows neither."""
        state = super().abstract_state()
        if "tree" in state:
            paths = self.token_paths(self.tree_view())
            ws = self.window_state()
            state["window"] = tuple(sorted((paths[i], n.window is not None, n.lock)
                                           for i, n in ws.nodes.items()
                                           if i != ws.root and i in paths))
        return state

    def counters(self) -> dict:
        return {**super().counters(), "swa_evictable": self.cache.swa_evictable_size_,
                "swa_protected": self.cache.swa_protected_size_,
                "free_window_pages": len(self.pool.window.free_pages)}

    def outline(self) -> str:
        lines = [super().outline(), "window:"]
        stack = [self.cache.root_node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n is not self.cache.root_node:
                lines.append(f"  #{n.id} " + ("tombstone" if n.swa_value is None
                                               else f"window={list(n.swa_value)}")
                             + f" wlock={n.swa_lock_ref}"
                             + (f" stamp={n.swa_uuid}" if n.swa_uuid else ""))
        for rid in self.live():
            r = self.requests[rid]
            lines.append(f"  r{rid}: window freed below {r.swa_evicted_seqlen}")
        return "\n".join(lines)

    def state(self):
        """The radix state (``RadixSubject.state``) plus each node's window KV, window lock and
        stamp, the window pool's free list, each request's evicted length and the receipts."""
        base = super().state()
        node, ps = base.node, self.page_size
        cache = self.cache
        by_id, stack = {}, [cache.root_node]
        while stack:
            n = stack.pop()
            by_id[n.id] = n
            stack.extend(n.children.values())

        def window_node(n):
            return node(n) + (None if n.swa_value is None else ids("window", n.swa_value, ps),
                              n.swa_lock_ref, n.swa_uuid is not None)

        receipts = [(Ref(by_id[a]), r.released) for a, rs in cache.receipts.items() for r in rs]
        return replace(base, node=window_node, rest=base.rest + (
            ids("window", self.pool.window.free_pages),
            tuple((rid, r.swa_evicted_seqlen, self.frontiers.get(rid), self.decode_steps.get(rid),
                   getattr(getattr(r, "swa_receipt", None), "released", None))
                  for rid, r in sorted(self.requests.items())),
            Unordered(receipts)))
