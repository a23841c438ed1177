"""Catalogued himamba faults applied to SGLang's real ``HiMambaRadixCache`` (``--target sglang``,
himamba at ``host=1``), as textual patches of the one upstream method each lives in
(``patching.py``: installed on a subclass ``HiMambaRadixCache_H1``...; the real class is never
modified).  SGLang 0.5.12.post1 already carries the PR #23696 fixes, so H1-H3 are those fixes
undone (notes/himamba.md section 4):

* H1 ``tombstone-cascade-ignores-host-ref`` -- ``_iteratively_delete_tombstone_leaf`` loses its
  ``host_ref_counter/host_mamba_ref_counter > 0`` stop (hi_mamba_radix_cache.py:647-651): a
  node a storage backup or prefetch protects is deleted.
* H2 ``tombstone-cascade-ignores-lock`` -- the same cascade loses its
  ``full_lock_ref/mamba_lock_ref > 0`` stop (:645): a write-locked tombstone is deleted while
  its device->host copy is in flight.
* H3 ``unfinished-drops-chunked`` -- ``cache_unfinished_req`` (``MambaRadixCache``'s, which the
  Hi cache inherits; mamba_radix_cache.py:674) stops passing ``chunked`` to ``insert``, so a
  prefill chunk counts as a hit and starts write-throughs.
* H4 ``host-leaf-with-device-children`` (the broadened form, docs/variants/himamba.md) --
  ``_update_full_host_leaf_status`` loses ``or len(node.children) > 0`` (:490-501): an evicted
  node with children counts as an evictable host leaf.

H5 has no upstream form: the pinned ``_insert_helper_host`` *is* H5 (known upstream finding
sglang-himamba-F1, tests/upstream_findings/).
"""

from __future__ import annotations

from functools import lru_cache

from caches.adapters.sglang import loader
from caches.adapters.sglang.patching import (
    Patch,
    UpstreamFault,
    lookup,
    patched_subclass,
)

UPSTREAM_FAULTS = {f.id: f for f in (
    UpstreamFault("H1", (Patch(
        "_iteratively_delete_tombstone_leaf",
        "            if (\n"
        "                node.parent.host_ref_counter > 0\n"
        "                or node.parent.host_mamba_ref_counter > 0\n"
        "            ):\n"
        "                break\n",
        "            # kvcheck fault H1: no host-ref stop (the pre-#23696 cascade)\n"),),
        "_iteratively_delete_tombstone_leaf: the cascade deletes a tombstone whose host copy a "
        "storage backup or prefetch still protects (SGLang #23696)"),
    UpstreamFault("H2", (Patch(
        "_iteratively_delete_tombstone_leaf",
        "            if node.parent.full_lock_ref > 0 or node.parent.mamba_lock_ref > 0:\n"
        "                break\n",
        "            # kvcheck fault H2: no lock stop\n"),),
        "_iteratively_delete_tombstone_leaf: the cascade deletes a locked tombstone (a "
        "write-through in flight) and frees its KV under the copy (SGLang #23696)"),
    UpstreamFault("H3", (Patch(
        "cache_unfinished_req",
        "                chunked=chunked,\n",
        ""),),
        "cache_unfinished_req: insert is called without the chunked flag, so every prefill "
        "chunk counts as a hit and backs up partial prefixes (SGLang #23696)"),
    UpstreamFault("H4", (Patch(
        "_update_full_host_leaf_status",
        "            or node.host_mamba_ref_counter > 0\n"
        "            or len(node.children) > 0\n",
        "            or node.host_mamba_ref_counter > 0  # kvcheck fault H4: children ignored\n"),),
        "_update_full_host_leaf_status: an evicted node with children counts as an evictable "
        "host leaf (the #22592-era check, broadened)"),
)}

NOT_INJECTABLE = {
    "H5": "SGLang 0.5.12.post1's _insert_helper_host already lacks the full-LRU refresh: the "
          "defect is there (known upstream finding sglang-himamba-F1, tests/upstream_findings/)",
}


@lru_cache(maxsize=None)
def upstream_fault(fid: str) -> type:
    """A subclass of SGLang's ``HiMambaRadixCache`` with fault ``fid``'s patch applied."""
    loader.require()
    from sglang.srt.mem_cache.hi_mamba_radix_cache import HiMambaRadixCache

    fault = lookup(UPSTREAM_FAULTS, NOT_INJECTABLE, fid, "HiMambaRadixCache")
    return patched_subclass(HiMambaRadixCache, fault)
