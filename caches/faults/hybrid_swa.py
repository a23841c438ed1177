"""Faults of the hybrid-swa radix cache (SW1-SW8), each the smallest mutation of
``HybridSWARadixCache`` mirroring a real sliding-window defect upstream."""

from __future__ import annotations

from caches.arith import ceil_align, floor_align
from caches.faults import fault
from caches.hybrid_swa import HybridSWARadixCache
from caches.radix import RadixCache
from caches.window_pool import SENTINEL


@fault("SW1", "recovery-keeps-stale-mapping", variant="hybrid-swa",
       upstream="sgl-project/sglang issue #27789 / PR #27586 (a stale full -> SWA map entry "
                "left by tombstone recovery; RecoverSWAWithLockedFull clears the incoming "
                "ids' entries, components/swa.py _set_swa)",
       properties=("conservation", "tombstone"),
       summary="a locked tombstone recovered on insert maps the incoming window slots but "
               "the incoming full slots keep their map entries; the caller frees the incoming "
               "duplicates and, through the stale entries, the window KV the node now holds")
class RecoveryKeepsStaleMapping(HybridSWARadixCache):
    def _move_window(self, kept, incoming):
        for k, w in zip(kept, self.allocator.translate(incoming)):
            if w != SENTINEL:  # the defect: incoming's entries are not cleared
                self.allocator.mapping[k] = w


@fault("SW2", "window-unlock-by-length", variant="hybrid-swa",
       upstream="SGLang SWA lock release without its window boundary (the uuid receipt, "
                "components/swa.py release_component_lock)",
       properties=("ref-balance",),
       summary="a window lock is released over the trailing window measured again at "
               "release time instead of up to the node stamped when it was taken; after a "
               "split inside the segment the release stops short (or runs past it into other "
               "requests' segments)")
class WindowUnlockByLength(HybridSWARadixCache):
    def _release_window(self, node, stamp):
        released, cur, covered = [], node, 0
        while cur is not self.root_node and covered < self.window:
            if cur.swa_lock_ref <= 0:
                break
            self._set_window_lock(cur, cur.swa_lock_ref - 1)
            if cur.swa_lock_ref == 0:
                released.append(cur)
            covered += len(cur.key)  # the defect: no stamp, the window re-measured
            cur = cur.parent
        return released


@fault("SW3", "out-of-window-frees-tree-kv", variant="hybrid-swa",
       upstream="SGLang free_swa_out_of_window_slots eviction frontier (swa_dead_lo: never "
                "below cache_protected_len, common.py / schedule_batch.py)",
       properties=("conservation", "tombstone"),
       summary="the out-of-window release starts at the request's evicted length without "
               "raising it to cache_protected_len, so it frees window KV of the prefix the "
               "tree owns (the node still lists it)")
class OutOfWindowFreesTreeKV(HybridSWARadixCache):
    def free_out_of_window(self, req, pre_len):
        evicted = req.swa_evicted_seqlen  # the defect: not max(..., cache_protected_len)
        if pre_len - self.window < evicted + 1:
            return
        frontier = pre_len - ceil_align(max(self.window, self.page_size), self.page_size)
        new = floor_align(max(evicted, frontier), self.page_size)
        if new > evicted:
            self.allocator.free_swa(req.kv_indices[evicted:new])
            req.swa_evicted_seqlen = new


@fault("SW4", "tombstone-free-hits-sentinel", variant="hybrid-swa",
       upstream="SGLang SWA eviction refactor freeing the padding page 0 (components/swa.py "
                "evict_component: 'Pass full indices to free_swa so slots with no SWA pair are "
                "skipped')",
       properties=("sentinel",),
       summary="deleting a leaf frees its window value translated from its full slots without "
               "skipping unmapped ones: a tombstone's slots all map to page 0, the sentinel, "
               "which goes into the free list (again at every such delete)")
class TombstoneFreeHitsSentinel(HybridSWARadixCache):
    def _delete_leaf(self, node):
        if node.swa_value is None:  # the defect: the translated slots freed as they are
            self.allocator.window.free(self.allocator.translate(node.value))
        super()._delete_leaf(node)


@fault("SW5", "match-counts-tombstone", variant="hybrid-swa",
       upstream="SGLang's SWA match validator (unified_cache/components/swa.py "
                "create_match_validator: a tombstone resets the run of live window KV)",
       properties=("window-hit",),
       summary="the match does not reset the window run at a tombstone, so a hit may end with "
               "tokens whose window KV is gone")
class MatchCountsTombstone(HybridSWARadixCache):
    def match_prefix(self, key):
        return RadixCache.match_prefix(self, key)  # the defect: the radix match, not cut


@fault("SW6", "out-of-window-double-free", variant="hybrid-swa",
       upstream="vLLM #42571 (the same block pushed twice into the free queue with sliding "
                "window); SGLang free_swa clearing the map (allocator/swa.py)",
       properties=("conservation", "window-release"),
       summary="the out-of-window release frees the window pages but leaves their map "
               "entries: the request still holds what it released, its finish (or a later "
               "release) frees it again, a reallocation hands it out twice")
class OutOfWindowDoubleFree(HybridSWARadixCache):
    def free_out_of_window(self, req, pre_len):
        before = req.swa_evicted_seqlen
        mapping = dict(self.allocator.mapping)
        super().free_out_of_window(req, pre_len)
        for s in req.kv_indices[before:req.swa_evicted_seqlen]:  # the defect: entries kept
            if s in mapping:
                self.allocator.mapping[s] = mapping[s]


@fault("SW7", "recover-below-window", variant="hybrid-swa",
       upstream="SGLang tombstone recovery clipped to the request's window "
                "(components/swa.py _clip_to_window, swa_evicted_seqlen)",
       properties=("tombstone", "sentinel"),
       summary="a tombstone overlapped by an insert is recovered over its whole span, also "
               "below the inserting request's evicted length, where the request has no window "
               "KV left: the node goes live mapping the sentinel")
class RecoverBelowWindow(HybridSWARadixCache):
    def _overlap(self, node, start, incoming, evicted, prev):
        return super()._overlap(node, start, incoming, 0, prev)  # the defect: no clip


@fault("SW8", "release-frontier-a-page-short", variant="hybrid-swa",
       upstream="SGLang free_swa_out_of_window_slots frontier (the page-rounded window, "
                "common.py)",
       properties=("window-release",),
       summary="the out-of-window release keeps one page more than the page-rounded window, "
               "so a running request goes on holding window KV it will never read")
class ReleaseFrontierShort(HybridSWARadixCache):
    def free_out_of_window(self, req, pre_len):
        super().free_out_of_window(req, pre_len - self.page_size)  # the defect: a page late


@fault("SW9", "unlock-repeats-window-release", variant="hybrid-swa",
       upstream="sgl-project/sglang PR #28161 (the final unlock skips the SWA part a request "
                "released early: TreeLock.swa_released, unified_radix_cache.py unlock)",
       properties=("ref-balance", "crash"),
       summary="a lock whose window part was released early (release_swa_prefix_lock) walks "
               "its window segment again when it is finally released, taking other holders' "
               "window locks down with it")
class UnlockRepeatsWindowRelease(HybridSWARadixCache):
    def dec_lock_ref(self, node, receipt=None):
        stack = self.receipts.get(node.id) or [None]
        mine = receipt if receipt is not None else stack[-1]
        if mine is not None:
            mine.released = False  # the defect: the early release is forgotten (no skip_swa)
        super().dec_lock_ref(node, receipt)


@fault("SW10", "recover-frees-locked-full", variant="hybrid-swa",
       upstream="sgl-project/sglang PR #29352 (recovery over a locked full value keeps the "
                "locked ids: RecoverSWAWithLockedFull, components/swa.py _recover_from_incoming)",
       properties=("conservation",),
       summary="a tombstone recovered on insert adopts the incoming full slots and frees its "
               "own also while a running request reads them under its lock")
class RecoverFreesLockedFull(HybridSWARadixCache):
    def _keeps_full(self, node):
        return False  # the defect: the full lock is not asked
