"""Reference HiMamba radix cache (SGLang ``HiMambaRadixCache`` semantics, sglang 0.5.12.post1).

A radix tree over token ids for hybrid (attention + mamba) models, with two tiers:

* every node owns full-KV token slots (``value``: device pool ids, ``None`` once the node was
  evicted to host) and optionally one mamba state slot (``mamba_value``).  A node without a
  device mamba state is a *tombstone*: its KV can still be matched through, but a hit can only
  end at a node that has a mamba state (device or host).  Splits always produce tombstones.
* host tier: ``host_value`` (host KV slots) and ``mamba_host_value`` (one host mamba slot).  A
  node is *backed up* when it has ``host_value``; *evicted* when it has no device KV (then it
  must be backed up).  Device residency is prefix-closed; backups are prefix-closed in the
  write-through policies.
* two lock counts per node: ``inc_lock_ref(n)`` adds a mamba lock to ``n`` only (if it has a
  device mamba) and a full lock to every device node on the path to the root, so
  ``full_lock_ref >= mamba_lock_ref``.  ``host_ref_counter`` / ``host_mamba_ref_counter``
  protect a node's host copies while a storage prefetch or backup uses it.
* four counters (full/mamba x evictable/protected), a full LRU list (every device node), a
  mamba LRU list (every node with a device mamba), a host mamba LRU list (every node with a
  host mamba and no host-mamba ref), and two cached leaf sets: evictable device leaves and
  evictable host leaves.
* eviction: device leaves go to host (backed up) or are deleted (not backed up); a deleted
  leaf whose parent became a childless tombstone cascades the deletion up the tree
  (``_iteratively_delete_tombstone_leaf``), stopping at the root, at a node with a mamba
  state, and at locked or host-protected nodes.  Host leaves are evicted from the host tier
  with the same cascade.
* write_back (``WRITE_BACK``): nothing is backed up on a hit; a device leaf not backed up is
  written back when eviction picks it (``_evict_leaf``), then demoted; a backup the host has no
  room for drops the leaf with its host-only subtree or keeps it on device (0.5.23's fallback).

Transfers are instantaneous copies between the device pools and the host pools (torch tensors;
the host ones on CPU), carrying the fingerprints across.  A write-through backup keeps the node
full-locked until ``writing_check`` acknowledges it (a separate op), as upstream does.  Time is a
logical clock (integers, ``TICK`` apart, so match post-processing can give ancestors slightly
older times); node ids are deterministic.

Upstream: ``python/sglang/srt/mem_cache/mamba_radix_cache.py`` (M:) and
``hi_mamba_radix_cache.py`` (H:); see docs/variants/himamba.md for line references.  Faults
hook into the small methods marked "fault hook".
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional, Sequence

from caches.pools import StatePool, TokenSlotAllocator
from caches.request import Req

WRITE_THROUGH, WRITE_THROUGH_SELECTIVE = "write_through", "write_through_selective"
WRITE_BACK = "write_back"
# the himamba variant's ``policy`` param: every write policy SGLang's HiCacheController accepts
POLICIES = (WRITE_THROUGH, WRITE_THROUGH_SELECTIVE, WRITE_BACK)
# no host tier at all: SGLang's plain ``MambaRadixCache`` (nothing is ever backed up, so a
# device leaf is always deleted on eviction and hits are not counted)
DEVICE_ONLY = "device_only"
TICK = 1000  # clock step; match post-processing gives the k-th ancestor time T - k


class CacheAssertion(AssertionError):
    """An assertion upstream makes (e.g. "parent does not have child key")."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise CacheAssertion(msg)


class Node:
    __slots__ = ("id", "parent", "children", "key", "value", "mamba_value", "host_value",
                 "mamba_host_value", "full_lock_ref", "mamba_lock_ref", "host_ref_counter",
                 "host_mamba_ref_counter", "hit_count", "last_access_time")

    def __init__(self, nid: int, t: int):
        self.id = nid
        self.parent: Node | None = None
        self.children: dict[int, Node] = {}
        self.key: tuple = ()
        self.value: list[int] | None = []
        self.mamba_value: int | None = None
        self.host_value: list[int] | None = None
        self.mamba_host_value: int | None = None
        self.full_lock_ref = 0
        self.mamba_lock_ref = 0
        self.host_ref_counter = 0
        self.host_mamba_ref_counter = 0
        self.hit_count = 0
        self.last_access_time = t

    @property
    def evicted(self) -> bool:
        return self.value is None

    @property
    def backuped(self) -> bool:
        return self.host_value is not None

    @property
    def mamba_backuped(self) -> bool:
        return self.mamba_host_value is not None

    def __repr__(self) -> str:
        return f"Node({self.id}, key={list(self.key)})"


class LRU:
    """An LRU list as an ordered dict (first = least recently used, last = MRU)."""

    def __init__(self, name: str):
        self.name = name
        self.d: dict[int, Node] = {}

    def __contains__(self, node) -> bool:
        return node.id in self.d and self.d[node.id] is node

    def insert_mru(self, node: Node) -> None:
        self.d.pop(node.id, None)
        self.d[node.id] = node

    reset_mru = insert_mru

    def remove(self, node: Node) -> None:
        self.d.pop(node.id, None)

    def mru_first(self) -> list[Node]:
        return list(reversed(self.d.values()))

    def lru_first(self) -> list[Node]:
        return list(self.d.values())


@dataclass
class HiReq(Req):
    """A request with its running mamba state slot (``req.mamba_pool_idx`` upstream)."""

    mamba_slot: Optional[int] = None


@dataclass
class MatchResult:
    device_indices: list[int]
    last_device_node: Node
    last_host_node: Node
    best_node: Node  # the deepest matched node holding a mamba state (device or host)
    host_hit_length: int


class HiMambaRadixCache:
    load_back_threshold = 1  # upstream 10 tokens; our sequences are a few tokens long
    # an ancestor a victim's cascade leaves childless competes in the same ``evict`` call (what
    # the subject's victim check replays: ``device_cascade_exposes``)
    evict_exposes_cascade = True

    def __init__(self, kv: TokenSlotAllocator, mamba: StatePool, host_kv: TokenSlotAllocator,
                 host_mamba: StatePool, write_policy: str = WRITE_THROUGH,
                 enable_storage: bool = True):
        self.kv, self.mamba, self.host_kv, self.host_mamba = kv, mamba, host_kv, host_mamba
        self.write_policy = write_policy
        self.write_through_threshold = {WRITE_THROUGH: 1, WRITE_THROUGH_SELECTIVE: 2,
                                        WRITE_BACK: None, DEVICE_ONLY: None}[write_policy]
        self._next_id = 0
        self._clock = 0
        self.root_node = self._new_node()
        self.root_node.full_lock_ref = self.root_node.mamba_lock_ref = 1
        self.full_evictable_size_ = self.full_protected_size_ = 0
        self.mamba_evictable_size_ = self.mamba_protected_size_ = 0
        self.full_lru, self.mamba_lru = LRU("full_lru_list"), LRU("mamba_lru_list")
        self.host_mamba_lru = LRU("mamba_host_lru_list")
        self.evictable_full_device_leaves: set[Node] = set()
        self.evictable_full_host_leaves: set[Node] = set()
        self.ongoing_write_through: dict[int, Node] = {}
        self.write_lock_took_mamba: dict[int, bool] = {}
        self.enable_storage = enable_storage
        self.ongoing_backup: dict[int, tuple[Node, bool]] = {}  # storage backups in flight
        self._backup_ops = 0
        self.deleted: list[Node] = []  # nodes unlinked from the tree (for the checks)

    # -- helpers ------------------------------------------------------------------------
    def now(self) -> int:
        self._clock += TICK
        return self._clock

    def _new_node(self) -> Node:
        node = Node(self._next_id, self.now())
        self._next_id += 1
        return node

    @staticmethod
    def _match_len(a: Sequence[int], b: Sequence[int]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    def path_tokens(self, node: Node) -> list[int]:
        keys = []
        while node is not None and node is not self.root_node:
            keys.append(node.key)
            node = node.parent
        return [t for k in reversed(keys) for t in k]

    def _unlink(self, node: Node) -> None:
        parent = node.parent
        v = parent.children.pop(node.key[0], None)
        _check(v is node, f"parent does not have child key, {node.key[0]}")
        self.deleted.append(node)

    # -- leaf sets (H:472-501) ----------------------------------------------------------
    def _update_leaf_status(self, node: Node) -> None:
        self._update_full_device_leaf_status(node)
        self._update_full_host_leaf_status(node)

    def _update_full_device_leaf_status(self, node: Node) -> None:
        if node is self.root_node or node.evicted or node.full_lock_ref > 0 or any(
                not c.evicted for c in node.children.values()):
            self.evictable_full_device_leaves.discard(node)
        else:
            self.evictable_full_device_leaves.add(node)

    def _host_leaf_blocked_by_children(self, node: Node) -> bool:  # fault hook (H4)
        return len(node.children) > 0

    def _update_full_host_leaf_status(self, node: Node) -> None:
        if (not node.evicted or not node.backuped or node is self.root_node
                or node.host_ref_counter > 0 or node.host_mamba_ref_counter > 0
                or self._host_leaf_blocked_by_children(node)):
            self.evictable_full_host_leaves.discard(node)
        else:
            self.evictable_full_host_leaves.add(node)

    def _discard_from_leaf_sets(self, node: Node) -> None:
        self.evictable_full_device_leaves.discard(node)
        self.evictable_full_host_leaves.discard(node)

    # -- locks (H:1168-1226) ------------------------------------------------------------
    def inc_lock_ref(self, node: Node) -> int:
        delta = 0
        if node.mamba_value is not None:
            if node.mamba_lock_ref == 0:
                self.mamba_evictable_size_ -= 1
                self.mamba_protected_size_ += 1
            node.mamba_lock_ref += 1
        while node is not self.root_node:
            if node.evicted:
                node = node.parent
                continue
            _check(node.full_lock_ref >= 0, f"inc_lock_ref on node {node.id} with negative ref")
            if node.full_lock_ref == 0:
                self.full_evictable_size_ -= len(node.value)
                self.full_protected_size_ += len(node.value)
                delta -= len(node.value)
                self.evictable_full_device_leaves.discard(node)
            node.full_lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: Node, mamba: bool = True) -> int:
        delta = 0
        if mamba and node.mamba_value is not None and node.mamba_lock_ref > 0:
            if node.mamba_lock_ref == 1:
                self.mamba_evictable_size_ += 1
                self.mamba_protected_size_ -= 1
            node.mamba_lock_ref -= 1
        while node is not self.root_node:
            if node.evicted:
                node = node.parent
                continue
            _check(node.full_lock_ref > 0,
                   f"dec_lock_ref on node with full_lock_ref={node.full_lock_ref}, {node.id}")
            if node.full_lock_ref == 1:
                self.full_evictable_size_ += len(node.value)
                self.full_protected_size_ -= len(node.value)
                delta += len(node.value)
            node.full_lock_ref -= 1
            if node.full_lock_ref == 0:
                self._update_full_device_leaf_status(node)
            node = node.parent
        return delta

    # -- host protection (H:454-470) ----------------------------------------------------
    def protect_host_node(self, node: Node, protect_mamba: bool = True) -> None:
        node.host_ref_counter += 1
        self.evictable_full_host_leaves.discard(node)
        if protect_mamba:
            self.protect_host_mamba(node)

    def protect_host_mamba(self, node: Node) -> None:
        """The mamba half of ``protect_host_node`` (TreeNode.protect_host_mamba): a prefetch
        takes it once its own host slots are allocated."""
        node.host_mamba_ref_counter += 1
        self.host_mamba_lru.remove(node)

    def release_host_node(self, node: Node, release_mamba: bool = True) -> None:
        if node.host_ref_counter <= 0:
            raise RuntimeError("Host reference counter is already zero.")
        node.host_ref_counter -= 1
        if release_mamba:
            if node.host_mamba_ref_counter <= 0:
                raise RuntimeError("Host mamba reference counter is already zero.")
            node.host_mamba_ref_counter -= 1
            if node.host_mamba_ref_counter == 0 and node.mamba_host_value is not None:
                if node not in self.host_mamba_lru:
                    self.host_mamba_lru.insert_mru(node)
        if node.host_ref_counter == 0 and node.host_mamba_ref_counter == 0:
            self._update_full_host_leaf_status(node)

    # -- split (M:1080-1111, H:1076-1127) -----------------------------------------------
    def _split_node(self, child: Node, split_len: int) -> Node:
        if child.evicted:
            return self._split_evicted_node(child, split_len)
        self.evictable_full_device_leaves.discard(child)
        new = self._new_node()
        new.children = {child.key[split_len]: child}
        new.parent = child.parent
        new.full_lock_ref = child.full_lock_ref
        new.key, new.value = child.key[:split_len], child.value[:split_len]
        child.last_access_time = self.now()
        self.full_lru.remove(child)
        if child.mamba_value is not None:
            self.mamba_lru.remove(child)
        child.parent = new
        child.key, child.value = child.key[split_len:], child.value[split_len:]
        new.parent.children[new.key[0]] = new
        self.full_lru.insert_mru(new)
        self.full_lru.insert_mru(child)
        if child.mamba_value is not None:
            self.mamba_lru.insert_mru(child)
        if child.backuped:
            new.host_value = child.host_value[:split_len]
            child.host_value = child.host_value[split_len:]
        self._update_leaf_status(new)
        self._update_leaf_status(child)
        return new

    def _split_evicted_node(self, child: Node, split_len: int) -> Node:
        self.evictable_full_host_leaves.discard(child)
        new = self._new_node()
        new.children = {child.key[split_len]: child}
        new.parent = child.parent
        new.value = None
        new.full_lock_ref = child.full_lock_ref
        new.key = child.key[:split_len]
        if child.backuped:
            new.host_value = child.host_value[:split_len]
            child.host_value = child.host_value[split_len:]
        child.last_access_time = self.now()
        child.parent = new
        child.key = child.key[split_len:]
        new.parent.children[new.key[0]] = new
        self._update_full_host_leaf_status(new)
        self._update_full_host_leaf_status(child)
        return new

    # -- match (H:927-1074) -------------------------------------------------------------
    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        key = tuple(key)
        root = self.root_node
        if not key:
            return MatchResult([], root, root, root, 0)
        node, value, best, best_len = root, [], root, 0
        while key and key[0] in node.children:
            child = node.children[key[0]]
            if child.evicted and not child.backuped:
                break
            if node.mamba_value is not None or node.mamba_backuped:
                best, best_len = node, len(value)
            p = self._match_len(child.key, key)
            if p < len(child.key):
                new = self._split_node(child, p)
                if not new.evicted:
                    value.append(new.value)
                node = new
                break
            if not child.evicted:
                value.append(child.value)
            node, key = child, key[p:]
        if node.mamba_value is not None or node.mamba_backuped:
            best, best_len = node, len(value)
        # post-processing: refresh LRU lists and access times along the path
        lru_node = best
        while lru_node is not root and lru_node.evicted:
            lru_node = lru_node.parent
        self._reset_node_and_parents_mru(self.full_lru, lru_node, mamba=False)
        self._reset_node_and_parents_mru(self.mamba_lru, best, mamba=True)
        t, n = self.now(), best
        while n is not None:
            n.last_access_time = t
            t -= 1
            n = n.parent
        kv_host_hit, last_device = 0, best
        while last_device is not root and last_device.evicted:
            kv_host_hit += len(last_device.host_value)
            last_device = last_device.parent
        last_host = best
        while last_host is not root and not last_host.backuped:
            last_host = last_host.parent
        mamba_host_hit = 1 if (last_host.mamba_value is None and last_host.mamba_backuped) else 0
        indices = [i for v in value[:best_len] for i in v]
        return MatchResult(indices, last_device, last_host, best, max(kv_host_hit, mamba_host_hit))

    def _reset_node_and_parents_mru(self, lru: LRU, node: Node, *, mamba: bool) -> None:
        chain = []
        while node is not self.root_node:
            if not mamba or node.mamba_value is not None:
                chain.append(node)
            node = node.parent
        for n in reversed(chain):  # the deepest node ends up most recently used
            lru.reset_mru(n)

    # -- insert (H:830-925) -------------------------------------------------------------
    def insert(self, key: Sequence[int], value: Sequence[int], mamba_value: int, *,
               chunked: bool = False, prev_prefix_len: int = 0) -> tuple[int, bool]:
        """Insert key -> value (+ the mamba state at its end); returns (prefix the tree
        already had, whether a mamba state already existed at the end: the caller frees its)."""
        key, value = tuple(key), list(value)
        node = self.root_node
        node.last_access_time = self.now()
        if not key:
            return 0, True
        total = 0
        while key and key[0] in node.children:
            node = node.children[key[0]]
            node.last_access_time = self.now()
            if not node.evicted:
                self.full_lru.reset_mru(node)
            if node.mamba_value is not None:
                self.mamba_lru.reset_mru(node)
            p = self._match_len(node.key, key)
            if p < len(node.key):
                node = self._split_node(node, p)
            if node.evicted:
                self._unevict_node(node, value[:p])
            else:
                if prev_prefix_len < total + p:
                    start = max(0, prev_prefix_len - total)
                    self.kv.free(value[start:p])
                total += p
                self._inc_hit_count(node, chunked)
            key, value = key[p:], value[p:]
        exist = False
        if key:
            new = self._add_new_node(node, key, value, mamba_value)
            self._inc_hit_count(new, chunked)
        elif node.mamba_value is None:
            node.mamba_value = mamba_value
            if not node.evicted:
                self.full_lru.reset_mru(node)
            self.mamba_lru.insert_mru(node)
            self.mamba_evictable_size_ += 1
            node.last_access_time = self.now()
        else:
            exist = True
            if not node.evicted:
                self.full_lru.reset_mru(node)
            self.mamba_lru.reset_mru(node)
            node.last_access_time = self.now()
        return total, exist

    def _add_new_node(self, parent: Node, key: tuple, value: list, mamba_value: int) -> Node:
        new = self._new_node()
        new.parent, new.key, new.value, new.mamba_value = parent, key, list(value), mamba_value
        self.full_lru.insert_mru(new)
        self.mamba_lru.insert_mru(new)
        parent.children[key[0]] = new
        self.full_evictable_size_ += len(value)
        self.mamba_evictable_size_ += 1
        self._update_full_device_leaf_status(new)
        self._update_full_device_leaf_status(parent)
        return new

    def _unevict_node(self, node: Node, fresh_value: list) -> None:
        _check(node.evicted, f"not evicted, {node.id}")
        _check(node.mamba_value is None, f"evicted node has device mamba, {node.id}")
        node.value = list(fresh_value)
        self.full_lru.insert_mru(node)
        self.full_evictable_size_ += len(fresh_value)
        self._update_leaf_status(node)
        if node.parent is not None:
            self._update_leaf_status(node.parent)

    def _inc_hit_count(self, node: Node, chunked: bool = False) -> None:
        if chunked or self.write_through_threshold is None:
            return
        node.hit_count += 1
        if not node.backuped and node.hit_count >= self.write_through_threshold:
            self.write_backup(node)

    # -- host tier: backup / ack / load (H:206-367) -------------------------------------
    def _host_write(self, node: Node, with_mamba: bool):
        """The controller's D->H copy (hybrid_cache_controller.py ``write`` +
        ``_resolve_pool_transfers_allocation``): host KV first (short: give up), then a host
        mamba slot with the pool's own eviction callback (``evict_mamba_host``), rolling the KV
        back if that still fails.  None when short."""
        if self.host_kv.available_size() < len(node.value):
            return None
        host = self.host_kv.alloc(len(node.value))
        mamba_host = node.mamba_host_value if with_mamba else None
        if with_mamba and mamba_host is None:
            got = self.host_mamba.alloc(1)
            if got is None:
                self.evict_mamba_host(1)
                got = self.host_mamba.alloc(1)
            if got is None:
                self.host_kv.free(host)
                return None
            mamba_host = got[0]
        self.host_kv.write(host, self.kv.read(node.value))
        if with_mamba:
            self.host_mamba.write([mamba_host], self.mamba.read([node.mamba_value]))
        return host, mamba_host

    def write_backup(self, node: Node, write_back: bool = False) -> int:
        """D->H backup of ``node`` (H:206-245).  A write-through backup full-locks the node
        until ``writing_check`` acknowledges it; a write-back one (``write_back``, eviction's
        own, 0.5.10.post1 H:279-307) takes no lock and has no parent guard: under write_back
        a leaf is backed up when eviction picks it, whatever its ancestors hold."""
        if not write_back and node.parent is not self.root_node and not node.parent.backuped:
            return 0  # backed-up nodes stay prefix-closed
        if node.mamba_value is not None and node.mamba_host_value is not None:
            if node in self.host_mamba_lru:
                self.host_mamba_lru.reset_mru(node)
        with_mamba = node.mamba_value is not None
        got = self._host_write(node, with_mamba)
        if got is None:  # the tree's retry frees host KV only (H:228-236)
            self.evict_host(len(node.value))
            got = self._host_write(node, with_mamba)
        if got is None:
            return 0
        node.host_value, mamba_host = got
        if mamba_host is not None and node.mamba_host_value is None:
            node.mamba_host_value = mamba_host
            self.host_mamba_lru.insert_mru(node)
        self.ongoing_write_through[node.id] = node
        if write_back:  # "no need to lock nodes if write back"
            self.write_lock_took_mamba[node.id] = None
        else:
            self.write_lock_took_mamba[node.id] = node.mamba_value is not None
            self.inc_lock_ref(node)
        return len(node.host_value)

    def writing_check(self, write_back: bool = False) -> int:
        """Acknowledge every finished write-through: release its lock.  ``write_back``: the
        blocking ack a write-back waits for (0.5.10.post1 H:442-452; every copy is done at
        once here, so both forms ack everything in flight); a write-back backup holds no
        lock to release."""
        acked = 0
        for nid in list(self.ongoing_write_through):
            node = self.ongoing_write_through.pop(nid)
            took_mamba = self.write_lock_took_mamba.pop(nid)
            if took_mamba is not None:
                self._release_write_lock(node, took_mamba)
            if self.enable_storage:
                self.write_backup_storage(node)
            acked += 1
        return acked

    def write_backup_storage(self, node: Node) -> None:
        """H->storage backup of an acknowledged node (H:1686-1702): host-protects it (and its
        host mamba state, if any) until the storage acknowledges (``drain_backup``)."""
        protect_mamba = node.mamba_host_value is not None
        self._backup_ops += 1
        self.ongoing_backup[self._backup_ops] = (node, protect_mamba)
        self.protect_host_node(node, protect_mamba=protect_mamba)

    def drain_backup(self) -> int:
        """Storage acknowledged every backup in flight: release their host protection."""
        n = 0
        for op in list(self.ongoing_backup):
            node, protect_mamba = self.ongoing_backup.pop(op)
            self.release_host_node(node, release_mamba=protect_mamba)
            n += 1
        return n

    def _release_write_lock(self, node: Node, took_mamba: bool) -> None:
        """Release a write-through lock as it was taken.  Upstream calls plain
        ``dec_lock_ref(node)``: when the node was a tombstone at backup time and got its mamba
        state back before the ack, that drops a mamba lock some request holds (a finding,
        docs/variants/himamba.md); the model releases only what the backup took."""
        self.dec_lock_ref(node, mamba=took_mamba)

    def load_back(self, node: Node) -> Optional[list[int]]:
        """Load the evicted chain ending at ``node`` (and ``node``'s host-only mamba) to device.

        Instantaneous: the in-flight lock upstream keeps until ``loading_check`` is not modelled
        (the caller locks the node right away)."""
        last_hit = node
        to_load = []
        while node.evicted:
            _check(node.backuped, f"No backup on evicted node {node.id}")
            to_load.insert(0, node)
            node = node.parent
        ancestor = node
        restore = [last_hit] if (last_hit.mamba_backuped and last_hit.mamba_value is None) else []
        self.inc_lock_ref(ancestor)
        host_ids = [i for n in to_load for i in n.host_value]
        if host_ids and len(host_ids) < self.load_back_threshold and not restore:
            self.dec_lock_ref(ancestor)
            return None
        # write_back: the eviction below writes leaves back, and their backups evict host
        # leaves -- the chain being loaded among them (0.5.10.post1 reads a freed host_value
        # there).  The load host-protects its node for its duration, as 0.5.23 host-locks
        # the nodes it loads (urc load_back)
        guard = self.write_policy == WRITE_BACK
        if guard:
            self.protect_host_node(last_hit)
        got = self._host_load(host_ids, restore)
        if got is None:
            if host_ids:
                self.evict(len(host_ids))
            got = self._host_load(host_ids, restore)
        if guard:
            self.release_host_node(last_hit)
        self.dec_lock_ref(ancestor)
        if got is None:
            return None
        device_ids, mamba_ids = got
        for n in restore:
            n.mamba_value = mamba_ids.pop(0)
            if n in self.mamba_lru:
                self.mamba_lru.reset_mru(n)
            else:
                self.mamba_lru.insert_mru(n)
                self.mamba_evictable_size_ += 1
        off = 0
        for n in to_load:
            k = len(n.host_value)
            n.value = device_ids[off:off + k]
            off += k
            self.full_lru.insert_mru(n)
            self.full_evictable_size_ += k
            self._update_leaf_status(n)
        self._update_leaf_status(ancestor)
        return device_ids

    def _host_load(self, host_ids: list[int], restore: list[Node]):
        """The controller's H->D copy (``load`` + ``_resolve_pool_transfers_allocation``):
        device KV first (short: give up), then device mamba slots with the pool's eviction
        callback (``evict_mamba``), rolling the KV back if that still fails.  None if short."""
        if self.kv.available_size() < len(host_ids):
            return None
        dev = self.kv.alloc(len(host_ids)) if host_ids else []
        mamba_ids = []
        if restore:
            mamba_ids = self.mamba.alloc(len(restore))
            if mamba_ids is None:
                self.evict_mamba(len(restore))
                mamba_ids = self.mamba.alloc(len(restore))
            if mamba_ids is None:
                self.kv.free(dev)
                return None
        self.kv.write(dev, self.host_kv.read(host_ids))
        self.mamba.write(mamba_ids, self.host_mamba.read([n.mamba_host_value for n in restore]))
        return dev, list(mamba_ids)

    def init_load_back(self, node: Node):
        """(loaded device ids, node the request should lock)."""
        if node.evicted or (node.mamba_value is None and node.mamba_backuped):
            got = self.load_back(node)
            if got is not None:
                return got, node
            while node is not self.root_node and (node.evicted or node.mamba_value is None):
                node = node.parent
        return [], node

    # -- device eviction (H:503-575, 669-814) -------------------------------------------
    def _free_device_mamba(self, node: Node) -> int:
        if node.mamba_value is None:
            return 0
        self.mamba.free([node.mamba_value])
        if node.mamba_lock_ref > 0:
            self.mamba_protected_size_ -= 1
            node.mamba_lock_ref = 0
        else:
            self.mamba_evictable_size_ -= 1
        self.mamba_lru.remove(node)
        node.mamba_value = None
        return 1

    def _evict_to_host(self, node: Node) -> tuple[int, int]:
        _check(not node.evicted, f"already evicted, {node.id}")
        _check(node.backuped, f"not backuped, {node.id}")
        n = len(node.value)
        self.kv.free(node.value)
        self.full_evictable_size_ -= n
        self.full_lru.remove(node)
        m = self._free_device_mamba(node)
        node.value = None
        self._update_leaf_status(node)
        self._update_full_device_leaf_status(node.parent)
        return n, m

    def _evict_regular(self, node: Node) -> tuple[int, int]:
        _check(not node.evicted, f"already evicted, {node.id}")
        _check(not node.backuped, f"backuped node, {node.id}")
        _check(not node.children, f"non-leaf, {node.id}")
        n = len(node.value)
        self.kv.free(node.value)
        self.full_evictable_size_ -= n
        self.full_lru.remove(node)
        m = self._free_device_mamba(node)
        if node.mamba_host_value is not None:
            self.host_mamba_lru.remove(node)
            self.host_mamba.free([node.mamba_host_value])
            node.mamba_host_value = None
        node.value = None
        self._discard_from_leaf_sets(node)
        self._unlink(node)
        self._update_leaf_status(node.parent)
        _, cf, cm = self._iteratively_delete_tombstone_leaf(node)
        return n + cf, m + cm

    def _evict_device_leaf(self, node: Node) -> tuple[int, int]:
        if not node.backuped:
            return self._evict_regular(node)
        return self._evict_to_host(node)

    # -- write_back: the backup eviction makes (0.5.10.post1 H:719-733, urc 1025-1055) ------
    def _evict_leaf(self, node: Node) -> Optional[tuple[int, int]]:
        """A device leaf an eviction pass picked: ``_evict_device_leaf``, except that under
        write_back a leaf not yet backed up is written back first and then demoted
        (H:_evict_device_leaf's write_back branch).  None: the backup failed and the leaf
        stays on device (``_write_back_failed``)."""
        if self.write_policy == WRITE_BACK and not node.backuped:
            if not self._write_back(node):
                return self._write_back_failed(node)
        return self._evict_device_leaf(node)

    def _write_back(self, node: Node) -> bool:
        """Back ``node`` up and wait for the ack (``write_backup(x, write_back=True)`` +
        ``writing_check(write_back=True)``; urc 1647-1663 ``backup_node_for_write_back``).
        The node is host-protected meanwhile: the backup's ``evict_host`` may take its
        host-only children, and the tombstone cascade would then delete the node being
        copied (0.5.12 has no such guard; 0.5.23's cascade keeps nodes with Full KV)."""
        self.protect_host_node(node, protect_mamba=False)
        try:
            if not self.write_backup(node, write_back=True):
                return False
            self.writing_check(write_back=True)
            return True
        finally:
            self.release_host_node(node, release_mamba=False)

    def _write_back_failed(self, node: Node) -> Optional[tuple[int, int]]:
        """The host had no room for ``node`` (urc 1041-1055, SGLang PR #28614): drop it with
        its host-only subtree, unless something there is held -- then it stays on device
        until host space frees (``_write_back_kept``)."""
        if self._drop_subtree_no_host(node):
            return self._evict_device_leaf(node)  # not backed up: deleted
        self._write_back_kept(node)
        return None

    def _write_back_kept(self, node: Node) -> None:
        """A write-back leaf stays on device: the eviction goes on without it."""

    def _drop_subtree_no_host(self, node: Node) -> bool:
        """Free the host-only subtree below the unbacked device leaf ``node``, leaving it a
        childless leaf for ``_evict_regular`` (0.5.23 unified_tree_core.py
        ``drop_subtree_no_host``); False, with nothing changed, when ``node`` or a
        descendant is locked or host-protected."""
        _check(not node.evicted and not node.backuped, f"drop of a backed-up node, {node.id}")

        def held(n: Node) -> bool:
            return n.full_lock_ref > 0 or n.mamba_lock_ref > 0 or n.host_ref_counter > 0 \
                or n.host_mamba_ref_counter > 0

        if held(node):
            return False
        below, stack = [], list(node.children.values())
        while stack:
            n = stack.pop()
            if held(n):
                return False
            below.append(n)
            stack.extend(n.children.values())
        for n in reversed(below):  # children before their parents
            _check(n.evicted and n.backuped, f"node {n.id} not host-only")
            self._remove_host_node(n)
        self._update_leaf_status(node)
        return True

    def evict(self, num_tokens: int, mamba_num: int = 0) -> int:
        """Free at least ``num_tokens`` device KV tokens (oldest device leaves first), then
        ``mamba_num`` mamba states; returns the device KV tokens freed."""
        freed = 0
        if num_tokens > 0:
            heap = [(n.last_access_time, n.id, n) for n in self.evictable_full_device_leaves]
            heapq.heapify(heap)
            while freed < num_tokens and heap:
                _, _, x = heapq.heappop(heap)
                if x not in self.evictable_full_device_leaves:
                    continue
                leaves, free = set(self.evictable_full_device_leaves), self.kv.available_size()
                got = self._evict_leaf(x)
                # every device leaf the eviction exposed competes at once: the nearest ancestor
                # a victim's cascade leaves in the tree (M:evict_full restarts its walk at the
                # LRU end; 0.5.23's Full walk files the ancestor a cascade stops at as a device
                # leaf -- H:699-709's heap took only the victim's own parent back, so an
                # ancestor the cascade stopped at waited for the next call while counted
                # evictable: SGLang's defect, finding F6, tests/upstream_findings/README.md),
                # and under write_back the tombstones a backup's own host eviction cascaded
                # into elsewhere in the tree (only the leaf written back is protected)
                for q in self.evictable_full_device_leaves - leaves:
                    heapq.heappush(heap, (q.last_access_time, q.id, q))
                freed += self.kv.available_size() - free
                if got is None:
                    continue  # write_back: kept on device, not pushed back
        if mamba_num > 0:
            self.evict_mamba(mamba_num)
        return freed

    def _tombstone_internal_node(self, node: Node) -> None:
        _check(len(node.children) != 0, f"Cannot tombstone a leaf node, {node.id}")
        self.mamba_evictable_size_ -= 1
        node.mamba_value = None

    @staticmethod
    def _mamba_evictable(n: Node) -> bool:
        """``get_lru_no_lock`` skips mamba-locked nodes.  The model also skips a full-locked
        leaf: upstream asserts ``full_lock_ref == 0`` on it, and a write-through lock taken on
        a tombstone whose mamba state came back before the ack makes one (a finding,
        docs/variants/himamba.md)."""
        return n.mamba_lock_ref == 0 and (n.children or n.full_lock_ref == 0)

    def evict_mamba(self, mamba_num: int) -> int:
        """Free mamba states from the mamba LRU tail (skipping mamba-locked nodes): an inner
        node becomes a tombstone, a leaf is evicted whole (to host, or deleted)."""
        if mamba_num <= 0:
            return 0
        evicted, kept = 0, set()
        while evicted < mamba_num:
            x = next((n for n in self.mamba_lru.lru_first()
                      if self._mamba_evictable(n) and n not in kept), None)
            if x is None:
                break
            _check(x.mamba_value is not None and x is not self.root_node and not x.evicted,
                   f"bad node in mamba_lru_list, {x.id}")
            if x.children and self.write_policy == WRITE_BACK and not x.backuped and \
                    x.mamba_host_value is None:
                # back the inner node up before taking its state (0.5.23 components/mamba.py
                # InternalStateBackup, urc 882-890: a failed backup does not stop the eviction)
                self._write_back(x)
                if not x.children:
                    continue  # its backup's host eviction took the host-only children: picked
                    # again, as a leaf (_finish_internal_component_eviction re-selects it)
            if x.children:
                self.mamba.free([x.mamba_value])
                self.mamba_lru.remove(x)
                self._tombstone_internal_node(x)
                evicted += 1
            else:
                _check(x.full_lock_ref == 0, f"evict device leaf: full_lock_ref mismatch with "
                       f"{x.id} full_lock_ref={x.full_lock_ref} mamba_lock_ref={x.mamba_lock_ref}")
                got = self._evict_leaf(x)
                if got is None:
                    kept.add(x)  # write_back: kept on device, skipped for this pass
                    continue
                evicted += got[1]
        return evicted

    # -- host eviction (H:577-667, 719-770) ---------------------------------------------
    def _evict_host_leaf(self, node: Node) -> int:
        _check(node.evicted, f"not evicted, {node.id}")
        _check(node.backuped, f"not backuped, {node.id}")
        _check(node.mamba_value is None, f"has device mamba, {node.id}")
        _check(node.host_ref_counter == 0, f"host kv in use, {node.id}")
        _check(node.host_mamba_ref_counter == 0, f"host mamba in use, {node.id}")
        n = len(node.host_value)
        self._remove_host_node(node)
        self._update_leaf_status(node.parent)
        _, cf, _ = self._iteratively_delete_tombstone_leaf(node)
        return n + cf

    def _remove_host_node(self, node: Node) -> None:
        """Free a host-only node's host KV and host mamba state and take it out of the tree."""
        self.host_kv.free(node.host_value)
        node.host_value = None
        if node.mamba_host_value is not None:
            self.host_mamba_lru.remove(node)
            self.host_mamba.free([node.mamba_host_value])
            node.mamba_host_value = None
        self._discard_from_leaf_sets(node)
        self._unlink(node)

    def _delete_tombstone_leaf(self, node: Node) -> None:
        _check(node.mamba_value is None, f"has mamba value, {node.id}")
        _check(node.mamba_host_value is None, f"has mamba host value, {node.id}")
        _check(not node.children, f"leaf node has children, {node.id}")
        self._unlink(node)
        self._discard_from_leaf_sets(node)
        if node.backuped and node.host_ref_counter == 0 and node.host_mamba_ref_counter == 0:
            self.host_kv.free(node.host_value)
            node.host_value = None
        self._update_leaf_status(node.parent)

    def _cascade_stops_at(self, p: Node) -> bool:  # fault hook (H1, H2)
        """The cascade's guards on the parent it would delete next (H:641-651)."""
        if p is self.root_node or p.mamba_value is not None or p.mamba_host_value is not None:
            return True
        if p.full_lock_ref > 0 or p.mamba_lock_ref > 0:
            return True
        if p.host_ref_counter > 0 or p.host_mamba_ref_counter > 0:
            return True
        return False

    def _iteratively_delete_tombstone_leaf(self, node: Node) -> tuple[Node, int, int]:
        full_evicted = 0
        while len(node.parent.children) == 0:
            p = node.parent
            if self._cascade_stops_at(p):
                break
            if not p.evicted:
                full_evicted += len(p.value)
                self.full_evictable_size_ -= len(p.value)
                self.kv.free(p.value)
                self.full_lru.remove(p)
            self._discard_from_leaf_sets(p)
            self._delete_tombstone_leaf(p)
            node = p
        return node, full_evicted, 0

    def evict_host(self, num_tokens: int) -> int:
        heap = [(n.last_access_time, n.id, n) for n in self.evictable_full_host_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            if x not in self.evictable_full_host_leaves:
                continue
            freed += self._evict_host_leaf(x)
            if x.parent in self.evictable_full_host_leaves:
                p = x.parent
                heapq.heappush(heap, (p.last_access_time, p.id, p))
        return freed

    def evict_mamba_host(self, num: int) -> int:
        evicted = 0
        while evicted < num:
            # HostLRUList inherits lock_ref="mamba_lock_ref": it skips device-mamba-locked nodes
            x = next((n for n in self.host_mamba_lru.lru_first() if n.mamba_lock_ref == 0), None)
            if x is None:
                break
            if x in self.evictable_full_host_leaves:
                self._evict_host_leaf(x)
            else:
                _check(x.host_mamba_ref_counter == 0, f"host mamba in use, {x.id}")
                self.host_mamba_lru.remove(x)
                self.host_mamba.free([x.mamba_host_value])
                x.mamba_host_value = None
            evicted += 1
        return evicted

    # -- storage prefetch completion (H:1851-1906) --------------------------------------
    def _refresh_start_node(self, node: Node) -> None:  # fault hook (H5)
        """The #23696 review patch: refresh the start node's LRU positions with its time."""
        if node is not self.root_node:
            if not node.evicted:
                self.full_lru.reset_mru(node)
            if node.mamba_value is not None:
                self.mamba_lru.reset_mru(node)

    def _refresh_walked_node(self, node: Node) -> None:  # fault hook (H5)
        if not node.evicted:
            self.full_lru.reset_mru(node)
        if node.mamba_value is not None:
            self.mamba_lru.reset_mru(node)

    def insert_helper_host(self, node: Node, key: Sequence[int], host_value: list[int],
                           mamba_host_value: Optional[int]) -> int:
        """Attach prefetched host KV below ``node``; returns how much was already there (the
        caller frees those host slots, and the mamba slot when no new leaf took it)."""
        key, host_value = tuple(key), list(host_value)
        node.last_access_time = self.now()
        self._refresh_start_node(node)
        if not key:
            return 0
        matched = 0
        while key and key[0] in node.children:
            node = node.children[key[0]]
            node.last_access_time = self.now()
            self._refresh_walked_node(node)
            p = self._match_len(node.key, key)
            key, host_value = key[p:], host_value[p:]
            matched += p
            if p < len(node.key):
                node = self._split_node(node, p)
        if key:
            new = self._new_node()
            new.parent, new.key, new.value, new.host_value = node, key, None, host_value
            node.children[key[0]] = new
            self._update_full_host_leaf_status(new)
            self._update_full_host_leaf_status(node)
            if mamba_host_value is not None:
                new.mamba_host_value = mamba_host_value
                self.host_mamba_lru.insert_mru(new)
        return matched

    # -- request paths (M:513-716) ------------------------------------------------------
    def _unfinished_insert_chunked(self, chunked: bool) -> bool:  # fault hook (H3)
        return chunked

    def cache_unfinished_req(self, req, chunked: bool = False) -> None:
        tokens, kv = req.tokens[:req.filled], req.kv_indices[:req.filled]
        forked = self.fork_mamba(req.mamba_slot)
        if forked is None:
            self.evict(0, mamba_num=1)
            forked = self.fork_mamba(req.mamba_slot)
            _check(forked is not None, "Can not alloc mamba cache")
        _, exist = self.insert(tokens, kv, forked, prev_prefix_len=req.cache_protected_len,
                               chunked=self._unfinished_insert_chunked(chunked))
        if exist:
            self.mamba.free([forked])
        m = self.match_prefix(tokens)
        new_indices, new_last = m.device_indices, m.last_device_node
        if not exist:
            _check(new_last.mamba_value == forked, "the unfinished insert's mamba state is not "
                   "at the matched node")
        old = req.cache_protected_len
        req.kv_indices[old:len(new_indices)] = new_indices[old:]
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(new_last)
        req.cache_protected_len = len(new_indices)
        req.last_node = new_last

    def fork_mamba(self, slot: int) -> Optional[int]:
        got = self.mamba.alloc(1)
        if got is None:
            return None
        self.mamba.write(got, self.mamba.read([slot]))
        return got[0]

    def cache_finished_req(self, req, is_insert: bool = True) -> None:
        old = req.cache_protected_len
        if is_insert:
            _, exist = self.insert(req.tokens[:req.filled], req.kv_indices[:req.filled],
                                   req.mamba_slot, prev_prefix_len=old)
            if exist:
                self.mamba.free([req.mamba_slot])
            self.kv.free(req.kv_indices[max(old, req.filled):])
        else:
            self.kv.free(req.kv_indices[old:])
            self.mamba.free([req.mamba_slot])
        req.mamba_slot = None
        self.dec_lock_ref(req.last_node)
