"""Faults of the HiMamba radix cache (H1-H5, and the policy faults P6-P7), each the smallest
mutation of ``HiMambaRadixCache``."""

from __future__ import annotations

import heapq

from caches.faults import fault
from caches.himamba import HiMambaRadixCache


@fault("H1", "tombstone-cascade-ignores-host-ref", variant="himamba",
       upstream="SGLang #23696 (follow-up of #22592)",
       properties=("host-protection",), params={"policy": 1, "kv_slots": 6},
       summary="the tombstone cascade checks the lock refs but not the host ref counters, so a "
               "node under a storage prefetch is deleted; its parent->child link is gone and a "
               "later delete asserts 'parent does not have child key'")
class CascadeIgnoresHostRef(HiMambaRadixCache):
    def _cascade_stops_at(self, p):
        if p is self.root_node or p.mamba_value is not None or p.mamba_host_value is not None:
            return True
        return p.full_lock_ref > 0 or p.mamba_lock_ref > 0  # the defect: no host-ref guard


@fault("H2", "tombstone-cascade-ignores-lock", variant="himamba",
       upstream="SGLang #23696 (second test, unified radix cache)",
       properties=("ref-balance",), params={"policy": 1, "storage": 0, "kv_slots": 8},
       summary="the tombstone cascade deletes a parent whose lock_ref > 0 (a write-through in "
               "flight locks it): a locked node leaves the tree and its KV is freed under the "
               "copy")
class CascadeIgnoresLock(HiMambaRadixCache):
    def _cascade_stops_at(self, p):
        if p is self.root_node or p.mamba_value is not None or p.mamba_host_value is not None:
            return True
        return p.host_ref_counter > 0 or p.host_mamba_ref_counter > 0  # the defect: no lock guard


@fault("H3", "unfinished-drops-chunked", variant="himamba", upstream="SGLang #23696",
       properties=("hit-count",),
       summary="cache_unfinished_req does not pass the chunked flag to insert, so every prefill "
               "chunk counts as a hit and triggers write-through backups of partial prefixes")
class UnfinishedDropsChunked(HiMambaRadixCache):
    def _unfinished_insert_chunked(self, chunked):
        return False  # the defect: insert(..., chunked=chunked) lost its argument


@fault("H4", "host-leaf-with-device-children", variant="himamba",
       upstream="SGLang #22592 era (broadened: see docs)",
       properties=("eviction-set",),
       summary="host-leaf status ignores the node's children, so an evicted node whose "
               "children are still in the tree counts as an evictable host leaf")
class HostLeafIgnoresChildren(HiMambaRadixCache):
    def _host_leaf_blocked_by_children(self, node):
        return False  # the defect: `or len(node.children) > 0` dropped


@fault("H5", "host-insert-skips-full-lru", variant="himamba",
       upstream="SGLang #23696 review (icepoint666), unfixed in 0.5.12.post1",
       properties=("lru-order",),
       summary="inserting prefetched KV on host bumps the access time of the nodes it walks but "
               "refreshes only the mamba LRU (and not the start node's), so the full LRU is no "
               "longer in access order")
class HostInsertSkipsFullLru(HiMambaRadixCache):
    def _refresh_start_node(self, node):
        pass  # upstream: the start node's LRU positions are not refreshed

    def _refresh_walked_node(self, node):
        if node.mamba_value is not None:  # upstream refreshes the mamba LRU only
            self.mamba_lru.reset_mru(node)


# -- policy faults: each caught only by the policy property it names (invariants/policy.py) --

@fault("P6", "mamba-mru-victim", variant="himamba",
       upstream="kvcheck policy mutant (state component)",
       properties=("victim",),
       summary="evict_mamba scans the mamba LRU list from its most- instead of its least-"
               "recently-used end: the states of hot prefixes are dropped (inner nodes turn "
               "into tombstones) and those prefixes recompute")
class MambaMruVictim(HiMambaRadixCache):
    def evict_mamba(self, mamba_num):
        evicted = 0
        while evicted < mamba_num:
            x = next((n for n in self.mamba_lru.mru_first()  # the defect: not lru_first()
                      if self._mamba_evictable(n)), None)
            if x is None:
                break
            if x.children:
                self.mamba.free([x.mamba_value])
                self.mamba_lru.remove(x)
                self._tombstone_internal_node(x)
                evicted += 1
            else:
                evicted += self._evict_device_leaf(x)[1]
        return evicted


@fault("P7", "host-mru-victim", variant="himamba", upstream="kvcheck policy mutant (host tier)",
       properties=("victim",),
       summary="evict_host's heap is keyed by -last_access_time: the host tier drops its "
               "most recently used backups first, so a prefix that would load back from host "
               "recomputes")
class HostMruVictim(HiMambaRadixCache):
    def evict_host(self, num_tokens):
        heap = [(-n.last_access_time, n.id, n) for n in self.evictable_full_host_leaves]
        heapq.heapify(heap)  # the defect: the key is negated
        freed = 0
        while freed < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            if x not in self.evictable_full_host_leaves:
                continue
            freed += self._evict_host_leaf(x)
            if x.parent in self.evictable_full_host_leaves:
                heapq.heappush(heap, (-x.parent.last_access_time, x.parent.id, x.parent))
        return freed


# -- write_back ------------------------------------------------------------------------------
# a 3-slot host under a 6-slot device: write-backs fail for want of room
_HOST_PRESSURE = {"policy": 2, "storage": 0, "kv_slots": 6, "mamba_slots": 4, "host_kv_slots": 3,
                  "host_mamba_slots": 2}

@fault("WB1", "write-back-demotes-unbacked", variant="himamba",
       upstream="SGLang 0.5.12.post1 hi_mamba_radix_cache.py _evict_device_leaf (fixed by "
                "the drop fallback of SGLang PR #28614, 0.5.23's drop_subtree_no_host)",
       properties=("crash",),
       params=_HOST_PRESSURE,
       summary="write_back ignores a failed backup: a device leaf the host has no room for "
               "is demoted anyway, and _evict_to_host asserts 'not backuped' in the middle of "
               "the eviction (the leaf neither dropped nor kept)")
class WriteBackDemotesUnbacked(HiMambaRadixCache):
    def _write_back_failed(self, node):
        return self._evict_to_host(node)  # the defect: write_backup's result is not checked


@fault("WB2", "write-back-host-eviction-deletes-its-leaf", variant="himamba",
       upstream="SGLang 0.5.12.post1 hi_mamba_radix_cache.py write_backup(write_back=True) "
                "(no host lock on the leaf; 0.5.23 pins a device-only write-back anchor and "
                "its cascade keeps nodes with Full KV)",
       properties=("size-accounting",),
       params=_HOST_PRESSURE,
       summary="a write-back's host eviction frees the leaf's host-only children, and the "
               "tombstone cascade then deletes the device tombstone being written back: its "
               "KV is freed under the copy, and the demotion that follows counts it again")
class WriteBackHostEvictionDeletesItsLeaf(HiMambaRadixCache):
    def _write_back(self, node):
        if not self.write_backup(node, write_back=True):  # the defect: node not host-protected
            return False
        self.writing_check(write_back=True)
        return True
