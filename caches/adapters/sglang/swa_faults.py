"""The hybrid-swa faults (``caches/faults/hybrid_swa.py``, SW1-SW10) as bad diffs of SGLang
0.5.23's real classes -- ``SWAComponent`` (``unified_cache/components/swa.py``, installed
through ``CacheInitParams.component_registry_override``), ``UnifiedRadixCache`` (a subclass of
it is the cache built) and, where the defect lives in the
module function ``free_swa_out_of_window_slots`` (``mem_cache/common.py``), that function
patched and called from its two real callers, each patched to call it:
``SWAComponent._free_out_of_window_slots`` (a chunk's checkpoint) and
``UnifiedRadixCache.evict_sliding_windows`` (a decode step's ``maybe_evict_swa``; a
``UnifiedRadixCache`` subclass).  The real classes are never modified (``patching.py``); a
component override forces the Python tree core, so the Rust core takes none.

| fault | where on 0.5.23 |
|---|---|
| SW1 ``recovery-keeps-stale-mapping`` | ``SWAComponent._set_swa``: the incoming ids' map entries are not cleared |
| SW2 ``window-unlock-by-length`` | ``SWAComponent.release_component_lock``: stops after a window of tokens, not at the receipt's uuid |
| SW3 ``out-of-window-frees-tree-kv`` | ``free_swa_out_of_window_slots``: the cursor is not raised to ``swa_dead_lo`` (the tree's prefix) |
| SW4 ``tombstone-free-hits-sentinel`` | ``SWAComponent.evict_component``: a tombstone's full ids are queued for ``free_swa`` too (their map reads 0: the padding page) |
| SW5 ``match-counts-tombstone`` | ``SWAComponent.create_match_validator``: a tombstone is a valid match boundary |
| SW6 ``out-of-window-double-free`` | ``free_swa_out_of_window_slots``: the freed slots' map entries are put back |
| SW7 ``recover-below-window`` | ``SWAComponent._clip_to_window``: no clip at the request's SWA eviction cursor |
| SW8 ``release-frontier-a-page-short`` | ``free_swa_out_of_window_slots``: the frontier a page lower |
| SW9 ``unlock-repeats-window-release`` | ``UnifiedRadixCache.unlock`` without ``skip_swa`` (PR #28161 reverted) |
| SW10 ``recover-frees-locked-full`` | ``SWAComponent._recover_from_incoming`` without the Full-lock check (PR #29352 reverted) |
"""

from __future__ import annotations

from functools import lru_cache

from caches.adapters.sglang.patching import (Patch, UpstreamFault, lookup, patch_method,
                                             patched_subclass)

COMPONENT_FAULTS = {f.id: f for f in (
    UpstreamFault("SW1", (
        Patch("_set_swa",
              "        allocator.clear_full_to_swa_mapping(incoming_full)\n",
              "        # kvcheck fault SW1: the incoming ids keep their map entries\n"),),
        "SWAComponent._set_swa moves a recovered tombstone's window pages to the kept full "
        "ids without clearing the incoming ids' entries: freeing the incoming duplicates "
        "frees the window pages the node now holds"),
    UpstreamFault("SW2", (
        Patch("release_component_lock",
              "        cur = node\n"
              "        while cur != root and dec_swa:\n",
              "        cur = node\n"
              "        covered = 0  # kvcheck fault SW2\n"
              "        while cur != root and dec_swa:\n"),
        Patch("release_component_lock",
              "            if swa_uuid_for_lock and comp.metadata.get(uuid_key) == "
              "swa_uuid_for_lock:\n"
              "                dec_swa = False\n",
              "            covered += len(cur.key)  # kvcheck fault SW2: re-measured, no uuid\n"
              "            if covered >= self.sliding_window_size:\n"
              "                dec_swa = False\n")),
        "SWAComponent.release_component_lock walks a window of tokens up from the node "
        "instead of up to the node stamped with the receipt's uuid: after a split inside the "
        "segment it stops short or runs into other locks' segments"),
    UpstreamFault("SW4", (
        Patch("evict_component",
              "        # Device layer\n",
              "        # Device layer\n"
              "        if EvictLayer.DEVICE in target and cd.value is None:  # kvcheck SW4\n"
              "            device_frees[self.component_type].append(\n"
              "                node.component_data[BASE_COMPONENT_TYPE].value\n"
              "            )\n"),),
        "SWAComponent.evict_component queues a tombstone's full ids for free_swa as well: "
        "they map to 0, and the segment free hands the padding page to the free list"),
    UpstreamFault("SW5", (
        Patch("create_match_validator",
              "                if not gates_prefix_match and (node.backuped or not "
              "node.evicted):\n"
              "                    return True\n"
              "                return False\n",
              "                return True  # kvcheck fault SW5: a tombstone ends a match\n"),),
        "SWAComponent.create_match_validator accepts a tombstone as a match boundary: a hit "
        "may end with tokens whose window KV is gone"),
    UpstreamFault("SW10", (
        Patch("_recover_from_incoming",
              "        if full_cd.lock_ref > 0:\n"
              "            cache_actions.append(\n"
              "                RecoverSWAWithLockedFull(node.id, old_full, incoming_full)\n"
              "            )\n"
              "            return\n",
              "        # kvcheck fault SW10: the Full lock is not asked (PR #29352 reverted)\n"),),
        "SWAComponent._recover_from_incoming adopts the incoming full ids and frees the node's "
        "own (FreeDeviceKVFullOnly) also while a running request reads them under its lock "
        "(sgl-project/sglang PR #29352 reverted)"),
    UpstreamFault("SW7", (
        Patch("_clip_to_window",
              "        live_start = max(start, window_start)\n",
              "        live_start = start  # kvcheck fault SW7: not clipped to the window\n"),),
        "SWAComponent._clip_to_window recovers a tombstone over its whole span, also below "
        "the inserting request's SWA eviction cursor, where its window slots are gone"),
)}

# the defects of ``common.free_swa_out_of_window_slots`` (a function, patched on its own; the
# text one level deeper than the function body, as patches are written at class-body level)
FUNCTION_FAULTS = {f.id: f for f in (
    UpstreamFault("SW3", (
        Patch("free_swa_out_of_window_slots",
              "        evicted_seqlen = max(evicted_seqlen, dead_lo)\n",
              "        # kvcheck fault SW3: the cursor is not raised to swa_dead_lo\n"),),
        "free_swa_out_of_window_slots starts at the request's cursor without raising it to "
        "swa_dead_lo (cache_protected_len): it frees window KV of the prefix the tree owns"),
    UpstreamFault("SW6", (
        Patch("free_swa_out_of_window_slots",
              "            free_segment(free_slots, start_pos=evicted_seqlen)\n",
              "            _map = token_to_kv_pool_allocator.full_to_swa_index_mapping  # SW6\n"
              "            _kept = _map[free_slots.long()].clone()\n"
              "            free_segment(free_slots, start_pos=evicted_seqlen)\n"
              "            _map[free_slots.long()] = _kept  # kvcheck fault SW6: entries kept\n"),),
        "free_swa_out_of_window_slots frees the window pages but leaves their map entries: "
        "the request's release frees them again"),
    UpstreamFault("SW8", (
        Patch("free_swa_out_of_window_slots",
              "        new_evicted_seqlen = max(evicted_seqlen, evict_threshold)\n",
              "        evict_threshold -= page_size  # kvcheck fault SW8: a page short\n"
              "        new_evicted_seqlen = max(evicted_seqlen, evict_threshold)\n"),),
        "free_swa_out_of_window_slots keeps one page more than the page-rounded window"),
)}

# defects of ``UnifiedRadixCache`` itself (a subclass of it is the cache built)
CACHE_FAULTS = {f.id: f for f in (
    UpstreamFault("SW9", (
        Patch("unlock",
              "        self.dec_lock_ref(lock.node, lock.receipt, skip_swa=lock.swa_released)\n",
              "        self.dec_lock_ref(lock.node, lock.receipt)  # kvcheck fault SW9\n"),),
        "UnifiedRadixCache.unlock drops skip_swa=lock.swa_released: a lock whose window part "
        "was released early (release_swa_prefix_lock) releases its window segment again "
        "(sgl-project/sglang PR #28161 reverted)"),
)}

NOT_INJECTABLE: dict = {}

# the two callers of ``free_swa_out_of_window_slots``, made to call the patched copy
_CALLERS = (
    ("SWAComponent", Patch("_free_out_of_window_slots",
                           "        free_swa_out_of_window_slots(\n",
                           "        from caches.adapters.sglang.swa_faults import faulty\n"
                           "        faulty({fid!r})(\n")),
    ("UnifiedRadixCache", Patch("evict_sliding_windows",
                                "        from sglang.srt.mem_cache.common import "
                                "free_swa_out_of_window_slots\n",
                                "        from caches.adapters.sglang.swa_faults import faulty\n"
                                "        free_swa_out_of_window_slots = faulty({fid!r})\n")),
)


@lru_cache(maxsize=None)
def faulty(fid: str):
    """``common.free_swa_out_of_window_slots`` with fault ``fid``'s patch (a function)."""
    from sglang.srt.mem_cache import common

    return patch_method(common, "free_swa_out_of_window_slots",
                        FUNCTION_FAULTS[fid].patches, fid)


def _caller_fault(fid: str, cls_name: str) -> UpstreamFault:
    patch = dict(_CALLERS)[cls_name]
    return UpstreamFault(fid, (Patch(patch.method, patch.old,
                                     patch.new.format(fid=fid)),), FUNCTION_FAULTS[fid].why)


@lru_cache(maxsize=None)
def swa_fault(fid: str) -> tuple:
    """(``SWAComponent`` subclass or None, ``UnifiedRadixCache`` subclass or None) carrying
    fault ``fid``; ``FaultNotInjectable`` when it has no form here."""
    from sglang.srt.mem_cache.unified_cache.components.swa import SWAComponent
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from caches.target import FaultNotInjectable

    if fid in FUNCTION_FAULTS:
        return (patched_subclass(SWAComponent, _caller_fault(fid, "SWAComponent")),
                patched_subclass(UnifiedRadixCache, _caller_fault(fid, "UnifiedRadixCache")))
    if fid in CACHE_FAULTS:
        return None, patched_subclass(UnifiedRadixCache, CACHE_FAULTS[fid])
    try:  # (the union: a refusal lists every injectable id)
        fault = lookup({**COMPONENT_FAULTS, **FUNCTION_FAULTS, **CACHE_FAULTS},
                       NOT_INJECTABLE, fid, "UnifiedRadixCache (Full + SWA)")
    except KeyError as exc:
        raise FaultNotInjectable(str(exc).strip("'\"")) from None
    return patched_subclass(SWAComponent, fault), None
