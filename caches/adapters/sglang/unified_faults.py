"""Catalogued radix faults patched into SGLang 0.5.23's ``UnifiedRadixCache`` (Python tree core),
as the bad diffs -- installed through SGLang's own seam for custom components
(``CacheInitParams.component_registry_override``: a ``FullComponent`` subclass carrying the
patch, built by ``patching.patched_subclass``); the real classes are never modified.  A fault in
a component forces the Python core (the registry's fallback rule: custom components need it), so
faults have no form on ``sglang-rust`` (compiled code).

| fault | form on 0.5.23 | why / where |
|---|---|---|
| R4 ``lock-walk-off-by-one`` | ``FullComponent.acquire/release_component_lock`` | below |
| P1 ``mru-victim`` | ``FullComponent._evict_device_start`` / ``_evict_device_next_node`` (the heap key negated) | caught on ``victim`` (``unified_radix.py``, "eviction policy") |
| R1, R3, R5 | not yet | their code moved into ``UnifiedTreeCore``'s resumable insert walk and eviction loop; not ported (use ``sglang-radixcache``, where the 0.5.12.post1 patches apply unchanged) |
| R2 ``dec-lock-underflow`` | none | 0.5.23's release asserts ``lock_ref > 0`` (radix F1 is fixed in the unified cache) -- removing that assert *is* R2, but it is the finding's fix, not a defect to catch |
| R6 | none | as on 0.5.12.post1: a sub-page key walks nothing |
| P2, P3 | none | allocate-with-eviction is the scheduler's on SGLang, not cache code |
| P4 ``hit-no-refresh`` | not yet | the match walk's refresh is in ``UnifiedTreeCore`` |

himamba host=1 storage=0 (``unified_hicache.py``): R4 as above, H4 as a patch of
``UnifiedTreeCore`` (``TREE_CORE_FAULTS``, registered as a tree-core backend); H1, H2 (latent),
H3, H5 say why not (``HICACHE_NOT_INJECTABLE``).

The policy faults (``POLICY_FAULTS``), as component patches through the same override: P6
``mamba-mru-victim`` in ``MambaComponent``'s device walk (host=0 and host=1), P7
``host-mru-victim`` in ``FullComponent.drive_host_eviction``'s heap key (host=1; host=0 has no
host tier).  Both are caught on ``victim`` (the policy checks, ``unified_mamba.py``).
"""

from __future__ import annotations

from functools import lru_cache

from caches.adapters.sglang.patching import Patch, UpstreamFault, lookup, patched_subclass

UNIFIED_FAULTS = {f.id: f for f in (
    UpstreamFault("R4", (
        Patch("acquire_component_lock",
              "        while cur is not root:\n"
              "            cd = cur.component_data[ct]\n"
              "            assert cd.value is not None, (\n",
              "        while cur is not root:\n"
              "            cur = cur.parent  # kvcheck fault R4: moved above the increment\n"
              "            if cur is root:\n"
              "                break\n"
              "            cd = cur.component_data[ct]\n"
              "            assert cd.value is not None, (\n"),
        Patch("acquire_component_lock",
              "            self.tree_core.evictable_device_leaves.discard(cur)\n"
              "            cur = cur.parent\n",
              "            self.tree_core.evictable_device_leaves.discard(cur)\n"),
        Patch("release_component_lock",
              "        while cur != root:\n"
              "            cd = cur.component_data[ct]\n",
              "        while cur != root:\n"
              "            cur = cur.parent  # kvcheck fault R4, mirrored\n"
              "            if cur == root:\n"
              "                break\n"
              "            cd = cur.component_data[ct]\n"),
        Patch("release_component_lock",
              "                self.tree_core._update_evictable_leaf_sets(cur)\n"
              "            cur = cur.parent\n",
              "                self.tree_core._update_evictable_leaf_sets(cur)\n")),
        "FullComponent lock walks: the walk steps to the parent before touching the ref, so the "
        "matched node stays unlocked (mini-sglang #52)"),
    # P1 (radix's policy fault): the Full device walk's heap keyed by -last_access_time, at
    # the walk's start and where the victim's parent is pushed back -- the reference's
    # MruVictim in 0.5.23's FullComponent; caught on ``victim`` (unified_radix.py, "eviction
    # policy")
    UpstreamFault("P1", (
        Patch("_evict_device_start",
              "            (self.session_ref_eviction_strategy(n), n)\n",
              "            (-self.session_ref_eviction_strategy(n), n)  # kvcheck fault P1\n"),
        Patch("_evict_device_next_node",
              "                (self.session_ref_eviction_strategy(lv.parent), lv.parent),\n",
              "                (-self.session_ref_eviction_strategy(lv.parent), lv.parent),\n")),
        "FullComponent's device-eviction heap is keyed by -last_access_time: eviction takes the "
        "most recently used unlocked leaf first, so hot prefixes are recomputed"),
)}

NOT_INJECTABLE = {
    "R1": "moved into UnifiedTreeCore's resumable insert walk on 0.5.23; not ported yet "
          "(--target sglang-radixcache carries it)",
    "R3": "moved into UnifiedTreeCore's eviction loop on 0.5.23; not ported yet "
          "(--target sglang-radixcache carries it)",
    "R5": "moved into UnifiedTreeCore's insert on 0.5.23; not ported yet "
          "(--target sglang-radixcache carries it)",
    "R2": "0.5.23's FullComponent release asserts lock_ref > 0: the underflow guard is there "
          "(radix F1 is fixed in the unified cache)",
    "R6": "not observable: a sub-page key walks nothing and returns the root, as the fixed code",
    "P2": "no cache code: on SGLang allocate-with-eviction is the scheduler's "
          "(evict_from_tree_cache), which the adapter drives",
    "P3": "no cache code: on SGLang allocate-with-eviction is the scheduler's "
          "(evict_from_tree_cache), which the adapter drives",
    "P4": "the match walk's refresh is in UnifiedTreeCore on 0.5.23, which no component "
          "override reaches; not ported",
}


@lru_cache(maxsize=None)
def full_component_fault(fid: str) -> type:
    """A subclass of SGLang's ``FullComponent`` with fault ``fid``'s patch applied."""
    from sglang.srt.mem_cache.unified_cache.components.full import FullComponent

    fault = lookup(UNIFIED_FAULTS, NOT_INJECTABLE, fid, "UnifiedRadixCache")
    return patched_subclass(FullComponent, fault)


# -- himamba host=0 on 0.5.23 (UnifiedRadixCache, Full + Mamba) ----------------------------------
# R4 is the FullComponent patch above (the Full component is shared with the radix variant, as
# MambaRadixCache shared its lock walk on 0.5.12.post1); the rest say why not.
HIMAMBA_NOT_INJECTABLE = {
    "R1": NOT_INJECTABLE["R1"],
    "R3": "moved into UnifiedTreeCore's eviction loop (evict_device_next_node); not ported yet",
    "H1": "host=0: no host tier, no host refs for the cascade to ignore (see host=1)",
    "H2": "latent at host=0 as on 0.5.12.post1 (a locked tombstone always has a locked "
          "descendant), and at host=1 too (see HICACHE_NOT_INJECTABLE)",
    "H3": "no form: 0.5.23's checkpoint has no chunked flag (a request counts each node once "
          "through InsertParams.inserted_len)",
    "H4": "host=0: no host-leaf set (ported at host=1 storage=0)",
    "H5": "host=0: no host insert",
}

# -- himamba host=1 storage=0 on 0.5.23 (the same tree with HiCache) ------------------------------
# H4 lives in UnifiedTreeCore itself, which no component override reaches: the patched
# subclass is registered with SGLang's own seam for tree cores (tree_core_registry.
# register_tree_core_backend, under "kvcheck-<id>") and the cache is built with that backend.
TREE_CORE_FAULTS = {f.id: f for f in (
    UpstreamFault("H4", (
        Patch("_is_host_leaf",
              "        if len(node.children) > 0:\n"
              "            return False\n",
              "        # kvcheck fault H4: the children are not checked\n"),),
        "UnifiedTreeCore._is_host_leaf: host-leaf status ignores the node's children, so an "
        "evicted node with children counts as an evictable host leaf (SGLang #22592 era)"),
)}

HICACHE_NOT_INJECTABLE = {
    "R1": NOT_INJECTABLE["R1"],
    "R3": HIMAMBA_NOT_INJECTABLE["R3"],
    "H1": "not reachable at storage=0: its guard (cd.host_lock_ref > 0, the same line as "
          "H2's) only decides for a node that holds a host lock without a lock, and at "
          "storage=0 every host lock comes with a lock -- a load-back's (load_back takes both, "
          "released together in loading_check) and the scheduler's admission pin "
          "(schedule_policy._lock_node(best, lock_host=True) takes both); only storage=1's "
          "holders (a storage backup, a prefetch anchor) hold a host lock alone; storage=1 is "
          "driven on 0.5.23, so H1 is reachable there in principle, but no patch of "
          "_iteratively_delete_tombstone_ancestors is catalogued and fuzzed at storage=1 yet",
    "H2": "latent on 0.5.23: the guard's lock_ref disjunct only decides for a childless node "
          "without Full device KV (one with device KV stops the cascade on the next line "
          "either way), and no lock sits on such a node without a host lock as well -- a "
          "write lock needs device KV and takes the node's mamba lock (so its state cannot "
          "be evicted under it, unlike 0.5.12.post1), request and bare locks are taken on "
          "device nodes, a load-back's lock comes with a host lock (H1's disjunct).  A patch "
          "dropping the disjunct was fuzzed at storage=0 and never caught (docs/engines/sglang.md)",
    "H3": HIMAMBA_NOT_INJECTABLE["H3"],
    "H5": "no form: 0.5.23 has no Full LRU list (insert_host stamps node times, and the Mamba "
          "LRU is ordered by state use by design); insert_host also needs storage=1",
}


@lru_cache(maxsize=None)
def tree_core_backend(fid: str) -> str:
    """The tree-core backend name under which ``UnifiedTreeCore`` with fault ``fid``'s patch
    is registered (once per process)."""
    from sglang.srt.mem_cache.unified_cache import tree_core_registry
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    cls = patched_subclass(UnifiedTreeCore, lookup(TREE_CORE_FAULTS, HICACHE_NOT_INJECTABLE,
                                                   fid, "UnifiedTreeCore"))
    name = f"kvcheck-{fid}"
    tree_core_registry.register_tree_core_backend(
        name, lambda params, components: cls(params, components))
    return name


def hicache_fault(fid: str) -> tuple:
    """(``component_registry_override``, tree-core backend) carrying fault ``fid`` for himamba
    host=1 storage=0 on 0.5.23: R4 in the Full component, H4 in the tree core."""
    from caches.target import FaultNotInjectable

    if fid in TREE_CORE_FAULTS:
        return None, tree_core_backend(fid)
    if fid in POLICY_FAULTS:  # P7 has its host heap here (host=0 refuses it)
        from caches.adapters.sglang import loader

        ct, cls = policy_component_fault(fid)
        return {getattr(loader.load().ComponentType, ct): cls}, None
    if fid in HICACHE_NOT_INJECTABLE:
        raise FaultNotInjectable(f"fault {fid} has no upstream form in 0.5.23's "
                                 f"UnifiedRadixCache (Full + Mamba, HiCache, storage=0): "
                                 f"{HICACHE_NOT_INJECTABLE[fid]}")
    return himamba_component_override(fid), None


# -- the policy faults (P6, P7) on 0.5.23: the component each pass lives in ---------------------
# P6 turns the Mamba walk round (MambaComponent: the cursor starts at the list's MRU end and
# moves toward its LRU end); P7 negates the Full component's host-heap key
# (FullComponent.drive_host_eviction).  Each is caught on ``victim`` by the policy checks
# (unified_mamba.py, "eviction policy").
POLICY_FAULTS = {f.id: ("MAMBA" if f.id == "P6" else "FULL", f) for f in (
    UpstreamFault("P6", (
        Patch("_evict_device_start",
              "            self._evict_device_cursor = self.tree_core.lru_lists[\n"
              "                self.component_type\n"
              "            ].get_lru_no_lock()\n",
              "            # kvcheck fault P6: the walk starts at the list's MRU end\n"
              "            lru = self.tree_core.lru_lists[self.component_type]\n"
              "            x = lru.head.lru_next[lru._pt]\n"
              "            while x is not lru.tail and \\\n"
              "                    x.component_data[self.component_type].lock_ref > 0:\n"
              "                x = x.lru_next[lru._pt]\n"
              "            self._evict_device_cursor = None if x is lru.tail else x\n"),
        Patch("_evict_device_next_node",
              "        lru = self.tree_core.lru_lists[ct]\n",
              "        lru = self.tree_core.lru_lists[ct]\n"
              "\n"
              "        def toward_lru(node):  # kvcheck fault P6: the walk runs MRU -> LRU\n"
              "            y = node.lru_next[lru._pt]\n"
              "            while y is not lru.tail and y.component_data[ct].lock_ref > 0:\n"
              "                y = y.lru_next[lru._pt]\n"
              "            return None if y is lru.tail else y\n"),
        Patch("_evict_device_next_node",
              "                lru.cursor_next() if enabled else lru.get_lru_no_lock()\n",
              "                lru.cursor_next() if enabled else toward_lru(lru.head)\n"),
        Patch("_evict_device_next_node",
              "                lru.cursor_next() if enabled else lru.get_prev_no_lock(x)\n",
              "                lru.cursor_next() if enabled else toward_lru(x)\n"),
        Patch("_evict_device_next_node",
              "            self._evict_device_cursor = lru.get_prev_no_lock(x)\n",
              "            self._evict_device_cursor = toward_lru(x)\n")),
        "MambaComponent's device walk runs from the Mamba LRU list's MRU end instead of its LRU "
        "end: the states of hot prefixes are dropped first (inner nodes turn into tombstones)"),
    UpstreamFault("P7", (
        Patch("drive_host_eviction",
              "            (self.session_ref_eviction_strategy(n), n)\n",
              "            (-self.session_ref_eviction_strategy(n), n)  # kvcheck fault P7\n"),
        Patch("drive_host_eviction",
              "                    (self.session_ref_eviction_strategy(x.parent), x.parent),\n",
              "                    (-self.session_ref_eviction_strategy(x.parent), x.parent),\n")),
        "FullComponent.drive_host_eviction's heap is keyed by -last_access_time: the host tier "
        "drops its most recently used backups first"),
)}

HIMAMBA_NOT_INJECTABLE["P7"] = "host=0: no host tier, no host heap (ported at host=1 storage=0)"


@lru_cache(maxsize=None)
def policy_component_fault(fid: str) -> tuple:
    """(component type name, the SGLang component subclass carrying policy fault ``fid``)."""
    from sglang.srt.mem_cache.unified_cache.components.full import FullComponent
    from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

    ct, fault = POLICY_FAULTS[fid]
    return ct, patched_subclass(MambaComponent if ct == "MAMBA" else FullComponent, fault)


def himamba_component_override(fid: str) -> dict:
    """``component_registry_override`` carrying fault ``fid`` for himamba on 0.5.23 (host=0;
    host=1 through ``hicache_fault``): R4 and P7 in the Full component, P6 in the Mamba one."""
    from caches.adapters.sglang import loader
    from caches.target import FaultNotInjectable

    if fid in HIMAMBA_NOT_INJECTABLE:
        raise FaultNotInjectable(f"fault {fid} has no upstream form in 0.5.23's "
                                 f"UnifiedRadixCache (Full + Mamba): {HIMAMBA_NOT_INJECTABLE[fid]}")
    types = loader.load().ComponentType
    if fid in POLICY_FAULTS:
        ct, cls = policy_component_fault(fid)
        return {getattr(types, ct): cls}
    return {types.FULL: full_component_fault(fid)}
