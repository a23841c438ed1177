"""Reference radix prefix cache over a full KV pool and a sliding-window pool (SGLang's
``UnifiedRadixCache`` with the ``Full + SWA`` components).

Models with sliding-window attention layers (Gemma, gpt-oss, Llama-4, hybrids) need the KV of
every token for their full-attention layers but only the last ``window`` tokens' KV for the
sliding ones.  So a node keeps two values: its full slots (``value``) and their window slots
(``swa_value``, through the pool's full -> window map, ``caches/window_pool.py``) -- or
``None``, a *tombstone*: the window KV was freed, the full KV stays.  Read from sglang 0.5.23
``srt/mem_cache/unified_cache/components/swa.py`` (``SWAComponent``), ``unified_radix_cache.py``
and ``common.py`` (``free_swa_out_of_window_slots``); the rules:

* **match** (``create_match_validator``): walking down, a tombstone resets the run of live
  window KV to 0 and is no match boundary; a live node extends the run, and is a boundary once
  the run covers the window (from the root, before any tombstone, every node is).  The match
  ends at the deepest boundary: its last ``window`` tokens all have live window KV.
* **lock** (``acquire_component_lock`` / ``release_component_lock``): the full lock covers the
  path to the root; the window lock only the segment from the node up to where ``window``
  tokens are covered (tombstones counted).  The segment's top node is stamped with a uuid, the
  lock's receipt; a release walks up to the node carrying that uuid (a split moves the stamp
  to the new parent, ``redistribute_on_node_split``).  ``inc_lock_ref`` returns the receipt
  and its holder hands it back to ``dec_lock_ref`` (a request keeps it as ``swa_receipt``, as
  upstream's ``TreeLock``); the cache also lists the receipts of each anchor (``receipts``).
  ``release_window_lock`` releases a lock's window segment early (a request decoded past it,
  ``release_swa_prefix_lock``; only a segment with a stamp); a leaf whose window lock drops to
  0 there is tombstoned at once.
* **sizes**: full evictable/protected as the radix cache; window evictable/protected count
  the live window tokens of nodes with window lock 0 / > 0.
* **insert** (``update_component_on_insert_overlap`` / ``commit_insert_component_data``): the
  key's positions below the request's ``swa_evicted_seqlen`` have no window KV (it was freed
  out of window), so the part of a new leaf below it is split off as a tombstone; the live
  rest is capped at one page-aligned window, the older part split off as a live parent
  (``_maybe_split_leaf_for_swa_lock``: locking the leaf then pins one window of KV).  An existing
  tombstone the insert passes over, within the request's window and past what it already
  owned (``prev``), is *recovered*: the incoming window slots are re-pointed onto the node's
  full slots: an unlocked node adopts the incoming full slots (its own are freed; the caller
  frees the rest of its duplicates, ``duplicates``), a locked one keeps its full slots and
  the incoming window slots are re-pointed onto them (``RecoverSWAWithLockedFull``).
* **evict** (full): the radix eviction; freeing a leaf frees its full and window KV.
  **evict_swa** (the scheduler asking for window room): the least recently used node with
  live window KV and no window lock -- a leaf nobody holds goes whole, any other node is
  tombstoned (``_evict_device_next_node``).
* **out of window** (``free_swa_out_of_window_slots``): a running request frees the window
  KV of its own positions more than a page-rounded window behind its end, from
  ``max(swa_evicted_seqlen, cache_protected_len)`` (never the tree's) to that frontier,
  page-aligned; ``swa_evicted_seqlen`` records how far.  The scheduler calls it before a
  chunk is cached (``cache_unfinished_req``, at the unaligned cacheable length) and before
  each decode step but the first (``maybe_evict_swa``, with ``SGLANG_SWA_EVICTION_INTERVAL``
  at 1; its default, 128, frees nothing in pools of a few pages).

Modelled differently (deliberately): one LRU clock for both components (upstream keeps a
window LRU refreshed only within a window of the match end); no sessions, no HiCache, no
EAGLE bigram keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from caches.admission import PrefillBudget
from caches.arith import ceil_align, floor_align
from caches.radix import LockUnderflow, RadixCache, TreeNode
from caches.request import Req
from caches.window_pool import SWAPagedAllocator


class SWANode(TreeNode):
    __slots__ = ("swa_value", "swa_lock_ref", "swa_uuid")

    def __init__(self, nid: int):
        super().__init__(nid)
        self.swa_value: list[int] | None = []  # None: a tombstone
        self.swa_lock_ref = 0
        self.swa_uuid: int | None = None  # the window-lock boundary stamp


@dataclass(eq=False)  # a lock's identity, not its contents
class Receipt:
    """One lock's window segment: it ends at the node stamped ``uuid`` (None: the root)."""

    uuid: int | None
    released: bool = False  # the window part was released early


class HybridSWARadixCache(RadixCache):
    admission = PrefillBudget

    def __init__(self, allocator: SWAPagedAllocator, page_size: int = 1, window: int = 4):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        super().__init__(allocator, page_size)

    def reset(self) -> None:
        super().reset()
        self.swa_evictable_size_ = 0
        self.swa_protected_size_ = 0
        self.receipts: dict[int, list[Receipt]] = {}
        self.last_receipt: Receipt | None = None
        self.adopted: set[int] = set()  # full slots the last insert adopted (recoveries)
        self._next_uuid = 0

    def _new_node(self) -> SWANode:
        node = SWANode(self._next_id)
        self._next_id += 1
        return node

    # -- the window's sizes -------------------------------------------------------------
    def _window_live(self, node: SWANode, sign: int) -> None:
        """``node``'s live window tokens enter (+1) or leave (-1) the window counters."""
        n = sign * len(node.key)
        if node.swa_lock_ref > 0:
            self.swa_protected_size_ += n
        else:
            self.swa_evictable_size_ += n

    def _set_window_lock(self, node: SWANode, ref: int) -> None:
        """Set ``node``'s window lock; its live window tokens move between the counters."""
        if node.swa_value is not None and (node.swa_lock_ref > 0) != (ref > 0):
            self._window_live(node, -1)
            node.swa_lock_ref = ref
            self._window_live(node, +1)
        else:
            node.swa_lock_ref = ref

    def _tombstone(self, node: SWANode) -> int:
        """Free ``node``'s window KV, keep its full KV."""
        self.allocator.free_swa(node.value)
        self._window_live(node, -1)
        node.swa_value = None
        return len(node.key)

    def _recover_window(self, node: SWANode, incoming: list[int]) -> None:
        """A tombstone gets the window KV of ``incoming`` (the same tokens' fresh slots):
        unlocked, the node adopts the incoming full slots and frees its own (their window KV
        is long gone); while a request reads its full slots under a lock, the incoming window
        slots are re-pointed onto them instead and the incoming full slots stay duplicates
        (``RecoverSWAWithLockedFull``)."""
        if self._keeps_full(node):
            self._move_window(node.value, incoming)
        else:
            self.allocator.free(node.value)
            node.value = list(incoming)
            self.adopted.update(incoming)
        node.swa_value = self.allocator.translate(node.value)
        self._window_live(node, +1)

    def _keeps_full(self, node: SWANode) -> bool:
        """A recovered node keeps its full slots while a request reads them."""
        return node.lock_ref > 0

    def _move_window(self, kept: list[int], incoming: list[int]) -> None:
        """``kept`` takes over ``incoming``'s window slots; ``incoming`` maps none after."""
        self.allocator.move_window(kept, incoming)

    def duplicates(self, slots: Sequence[int]) -> list[int]:
        """Of the slots an insert passed over, those the tree did not adopt (the caller's to
        free: upstream's ``record_adopted_range``)."""
        return [s for s in slots if s not in self.adopted]

    # -- match ----------------------------------------------------------------------------
    def match_prefix(self, key: Sequence[int]):
        match = super().match_prefix(key)
        path, node = [], match.last_node
        while node is not self.root_node:
            path.append(node)
            node = node.parent
        best, run, depth, best_len = self.root_node, float("inf"), 0, 0
        for node in reversed(path):  # root -> end
            depth += len(node.key)
            if node.swa_value is None:
                run = 0
                continue
            run += len(node.key)
            if run >= self.window:
                best, best_len = node, depth
        match.indices = match.indices[:best_len]
        match.last_node = best
        return match

    # -- insert ---------------------------------------------------------------------------
    def insert(self, key: Sequence[int], value: Sequence[int], evicted: int = 0,
               prev: int = 0) -> int:
        return self.insert_path(key, value, evicted, prev)[0]

    def insert_path(self, key: Sequence[int], value: Sequence[int], evicted: int = 0,
                    prev: int = 0) -> tuple[int, SWANode]:
        """Insert; (the prefix the tree already had, the key's last node).  ``evicted``: the
        key's positions below it have no window KV; ``prev``: what the caller already owned
        in the tree (no recovery there)."""
        key = self._page_align(key)
        value = self._value_for_key(value, key)
        node, prefix = self.root_node, 0
        self.adopted: set[int] = set()
        self._touch(node)
        while len(key) > 0 and self._child_key(key) in node.children:
            node = node.children[self._child_key(key)]
            self._touch(node)
            n = self._key_match(node.key, key)
            if n < len(node.key):
                node = self._split_node(node, n)
            node = self._overlap(node, prefix, value[:n], evicted, prev)
            prefix += n
            key, value = key[n:], value[n:]
        if len(key) > 0:
            node = self._add_leaf(node, key, value)
            node = self._populate(node, prefix, evicted)
        return prefix, node

    def _overlap(self, node: SWANode, start: int, incoming: list[int], evicted: int,
                 prev: int) -> SWANode:
        """A tombstone passed over within the window is recovered (its part below
        ``evicted`` split off, staying a tombstone); returns the node the walk goes on from."""
        end = start + len(node.key)
        if node.swa_value is not None or end <= prev:
            return node
        live = max(start, evicted)
        if live >= end:
            return node
        if live > start:
            self._split_node(node, live - start)  # the head stays a tombstone; node is the tail
        self._recover_window(node, list(incoming[live - start:]))
        return node

    def _populate(self, leaf: SWANode, start: int, evicted: int) -> SWANode:
        """A new leaf's window KV: its part below ``evicted`` is split off as a tombstone (all
        of it below: a tombstone leaf)."""
        live = max(start, evicted)
        if live >= start + len(leaf.key):
            return leaf
        if live > start:
            self._split_node(leaf, live - start)  # the head inherits the leaf's None
        tail = ceil_align(self.window, self.page_size)
        if len(leaf.key) > tail:  # capped at one window: locking it pins one window of KV
            head = self._split_node(leaf, len(leaf.key) - tail)
            head.swa_value = self.allocator.translate(head.value)
            self._window_live(head, +1)
        leaf.swa_value = self.allocator.translate(leaf.value)
        self._window_live(leaf, +1)
        return leaf

    def _add_leaf(self, parent, key: tuple, value: list[int]) -> SWANode:
        leaf = super()._add_leaf(parent, key, value)
        leaf.swa_value = None  # populated by the insert (``_populate``)
        return leaf

    def _split_node(self, child: SWANode, split_len: int) -> SWANode:
        new = super()._split_node(child, split_len)
        new.swa_lock_ref = child.swa_lock_ref
        if child.swa_value is not None:
            new.swa_value, child.swa_value = child.swa_value[:split_len], child.swa_value[split_len:]
        else:
            new.swa_value = None
        new.swa_uuid, child.swa_uuid = child.swa_uuid, None  # the segment's older edge moves up
        return new

    def _delete_leaf(self, node: SWANode) -> None:
        if node.swa_value is not None:
            self._window_live(node, -1)
        super()._delete_leaf(node)

    # -- locks ----------------------------------------------------------------------------
    holder_receipts = True  # inc_lock_ref's receipt goes back to dec_lock_ref (its holder's)

    def inc_lock_ref(self, node: SWANode) -> Receipt | None:
        """Lock ``node``'s path; the lock's receipt (None at the root), also ``last_receipt``."""
        super().inc_lock_ref(node)
        receipt = None
        if node is not self.root_node:
            receipt = Receipt(self._lock_window(node))
            self.receipts.setdefault(node.id, []).append(receipt)
        self.last_receipt = receipt
        return receipt

    def dec_lock_ref(self, node: SWANode, receipt: Receipt | None = None) -> None:
        """Unlock ``node``'s path and the window segment of ``receipt`` (None: the latest lock
        taken on ``node``)."""
        RadixCache._reject_unmatched_unlock(self, node)
        if node is not self.root_node:
            stack = self.receipts.get(node.id, [])
            if receipt is None and stack:
                receipt = stack[-1]
            if receipt is None or not any(r is receipt for r in stack):
                raise LockUnderflow(f"dec_lock_ref: no such lock on node {node.id}; "
                                    f"unmatched unlock rejected")
            stack.remove(receipt)
            if not stack:
                del self.receipts[node.id]
            if not receipt.released:
                self._release_window(node, receipt.uuid)
        super().dec_lock_ref(node)

    def _lock_window(self, node: SWANode) -> int | None:
        """Lock the segment covering the trailing window; its receipt (the top's stamp)."""
        covered, stamp, cur = 0, None, node
        while cur is not self.root_node and covered < self.window:
            self._set_window_lock(cur, cur.swa_lock_ref + 1)
            covered += len(cur.key)
            if covered >= self.window:
                if cur.swa_uuid is None:
                    self._next_uuid += 1
                    cur.swa_uuid = self._next_uuid
                stamp = cur.swa_uuid
            cur = cur.parent
        return stamp

    def _release_window(self, node: SWANode, stamp: int | None) -> list[SWANode]:
        """Release the segment from ``node`` up to the node stamped ``stamp``; the nodes
        whose window lock dropped to 0."""
        released, cur = [], node
        while cur is not self.root_node:
            if cur.swa_lock_ref <= 0:
                raise LockUnderflow(f"window lock of node {cur.id} is already 0")
            self._set_window_lock(cur, cur.swa_lock_ref - 1)
            if cur.swa_lock_ref == 0:
                released.append(cur)
            if stamp is not None and cur.swa_uuid == stamp:
                break
            cur = cur.parent
        return released

    def release_window_lock(self, node: SWANode, receipt: Receipt | None = None) -> bool:
        """Release the window part of the lock ``receipt`` on ``node`` early (None: the latest
        one not released); False if there is none -- released already, or a segment that
        reached the root (no stamp: upstream releases only a receipt with a window uuid)."""
        if receipt is None:
            receipt = next((r for r in reversed(self.receipts.get(node.id, ()))
                            if not r.released), None)
        if receipt is None or receipt.released or receipt.uuid is None:
            return False
        receipt.released = True
        for cur in self._release_window(node, receipt.uuid):
            if not cur.children and cur.swa_value is not None:
                self._tombstone(cur)
        return True

    # -- eviction -------------------------------------------------------------------------
    def _window_evictable(self) -> list[SWANode]:
        out, stack = [], [self.root_node]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self.root_node and node.swa_value is not None \
                    and node.swa_lock_ref == 0:
                out.append(node)
        return out

    def evict_swa(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` window tokens, least recently used first: a leaf
        nobody holds goes whole, any other node becomes a tombstone; returns window tokens
        freed."""
        freed = 0
        while freed < num_tokens:
            nodes = self._window_evictable()
            if not nodes:
                break
            victim = min(nodes, key=lambda n: (n.last_access_time, n.id))
            if victim in self.evictable_leaves:
                freed += len(victim.key)
                self.allocator.free(victim.value)
                self._delete_leaf(victim)
            else:
                freed += self._tombstone(victim)
        return freed

    def alloc_with_eviction(self, num_tokens: int) -> list[int] | None:
        """Allocate both pools' slots, evicting full KV and window KV for what each lacks
        (``evict_from_tree_cache``); None when eviction cannot make room."""
        need = ceil_align(num_tokens, self.page_size)
        short = need - self.allocator.full_available_size()
        if short > 0 and self.evictable_size_ > 0:
            self.evict(short)
        short = need - self.allocator.window.available_size()
        if short > 0:
            self.evict_swa(short)
        return self.allocator.alloc(num_tokens)

    # -- request paths --------------------------------------------------------------------
    def free_out_of_window(self, req: Req, pre_len: int) -> None:
        """Free ``req``'s own window KV more than a page-rounded window behind ``pre_len``."""
        evicted = req.swa_evicted_seqlen
        if pre_len - self.window < evicted + 1:
            return
        evicted = max(evicted, req.cache_protected_len)  # the tree's part is not the request's
        req.swa_evicted_seqlen = evicted
        frontier = pre_len - ceil_align(max(self.window, self.page_size), self.page_size)
        new = floor_align(max(evicted, frontier), self.page_size)
        if new > evicted:
            self.allocator.free_swa(req.kv_indices[evicted:new])
            req.swa_evicted_seqlen = new

    def cache_unfinished_req(self, req: Req) -> None:
        filled = self._cacheable_len(req)
        aligned = floor_align(filled, self.page_size)
        self.free_out_of_window(req, filled - 1)  # the unaligned key (urc checkpoint_into_tree)
        tokens, kv = req.tokens[:aligned], req.kv_indices[:aligned]
        old = req.cache_protected_len
        new_prefix, node = self.insert_path(tokens, kv, req.swa_evicted_seqlen, old)
        self.allocator.free(self.duplicates(req.kv_indices[old:new_prefix]))
        path = self._path_value(node)
        req.kv_indices[old:len(path)] = path[old:]
        self.dec_lock_ref(req.last_node, getattr(req, "swa_receipt", None))
        req.swa_receipt = self.inc_lock_ref(node)
        req.cache_protected_len = len(path)
        req.last_node = node

    def _path_value(self, node: SWANode) -> list[int]:
        parts = []
        while node is not self.root_node:
            parts.append(node.value)
            node = node.parent
        return [s for part in reversed(parts) for s in part]

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        old = req.cache_protected_len
        aligned = floor_align(req.filled, self.page_size)
        if is_insert:
            new_prefix, _ = self.insert_path(req.tokens[:aligned], req.kv_indices[:aligned],
                                             req.swa_evicted_seqlen, old)
            self.allocator.free(self.duplicates(req.kv_indices[old:new_prefix]))
            self.allocator.free(req.kv_indices[max(aligned, old):])
        else:
            self.allocator.free(req.kv_indices[old:])
        self.dec_lock_ref(req.last_node, getattr(req, "swa_receipt", None))
        req.swa_receipt = None
