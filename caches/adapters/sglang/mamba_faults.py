"""Catalogued faults applied to SGLang's real ``MambaRadixCache`` (``--target sglang``,
himamba at ``host=0``), as textual patches of the one upstream method each lives in
(``patching.py``; the real class is never modified).

The radix faults whose code SGLang's mamba cache shares (docs/faults.md: R1 "also in its Mamba
variant"), in ``MambaRadixCache``'s own copies of those methods:

* R1 ``add-leaf-subtracts-parent`` -- ``_insert_helper``: a childless node gaining its first
  child has its tokens taken off ``full_evictable_size_`` (pymllm #656, there in its Mamba
  cache too); a split does not do the same, so the counter drifts from the tree.
* R3 ``evict-spins`` -- ``evict_full``: the never-evict-the-root guard tests the leaf's parent,
  so leaves hanging off the root are skipped and eviction frees nothing while the counter
  says there is something to free.
* R4 ``lock-skips-node`` -- ``inc_lock_ref``/``dec_lock_ref``: the full-lock walk steps to the
  parent before touching the ref, so the matched node's KV stays unprotected and the root's
  ref moves (mini-sglang #52).

The himamba faults have no form here: H1, H4 and H5 live in the host tier this class does not
have, H3's flag is ignored by the non-Hi ``_insert_helper``, and H2's cascade guard is
latent in the non-Hi cache (a locked tombstone always has a locked descendant, so a cascade
never reaches one) -- see docs/variants/himamba.md.
"""

from __future__ import annotations

from functools import lru_cache

from caches.adapters.sglang import loader
from caches.adapters.sglang.patching import Patch, UpstreamFault, lookup, patched_subclass

UPSTREAM_FAULTS = {f.id: f for f in (
    UpstreamFault("R1", (Patch(
        "_insert_helper",
        "            node.children[child_key] = new_node\n",
        "            if not node.children and node != self.root_node and node.full_lock_ref == 0:\n"
        "                self.full_evictable_size_ -= len(node.value)  # kvcheck fault R1\n"
        "            node.children[child_key] = new_node\n"),),
        "_insert_helper: a node gaining its first child has its tokens subtracted from "
        "full_evictable_size_ (pymllm #656, its Mamba cache)"),
    UpstreamFault("R3", (Patch(
        "evict_full",
        "            full_num_evicted_delta, _, x, x_next = self._evict_leaf_node(x, False)\n",
        "            if x.parent == self.root_node:  # kvcheck fault R3: the root guard tests\n"
        "                x = self.full_lru_list.get_prev_leaf_no_lock(x)  # the parent\n"
        "                continue\n"
        "            full_num_evicted_delta, _, x, x_next = self._evict_leaf_node(x, False)\n"),),
        "evict_full: skips leaves under the root, so eviction frees nothing although "
        "full_evictable_size_ > 0 (pymllm #656 follow-up)"),
    UpstreamFault("R4", (
        Patch("inc_lock_ref",
              "        while node != self.root_node:\n"
              "            # lock full from node to root\n",
              "        while node != self.root_node:\n"
              "            node = node.parent  # kvcheck fault R4: moved above the increment\n"),
        Patch("inc_lock_ref",
              "            node.full_lock_ref += 1\n            node = node.parent\n",
              "            node.full_lock_ref += 1\n"),
        Patch("dec_lock_ref",
              "        while node != self.root_node:\n"
              "            assert (\n"
              "                node.full_lock_ref > 0\n",
              "        while node != self.root_node:\n"
              "            node = node.parent  # kvcheck fault R4, mirrored\n"
              "            assert (\n"
              "                node.full_lock_ref > 0\n"),
        Patch("dec_lock_ref",
              "            node.full_lock_ref -= 1\n            node = node.parent\n",
              "            node.full_lock_ref -= 1\n")),
        "inc_lock_ref/dec_lock_ref: the full-lock walk steps to the parent before touching the "
        "ref, so the matched node stays unlocked and the root's ref moves (mini-sglang #52)"),
)}

NOT_INJECTABLE = {
    "H1": "MambaRadixCache has no host tier: no host refs for the cascade to ignore",
    "H2": "latent in the non-Hi cache: a locked tombstone always has a locked descendant, so "
          "the cascade never reaches one (it is observable on HiMambaRadixCache, host=1)",
    "H3": "MambaRadixCache._insert_helper ignores the chunked flag (only the Hi cache counts "
          "hits with it)",
    "H4": "MambaRadixCache has no host tier and no host-leaf set",
    "H5": "MambaRadixCache has no host insert",
}


@lru_cache(maxsize=None)
def upstream_fault(fid: str) -> type:
    """A subclass of SGLang's ``MambaRadixCache`` with fault ``fid``'s patch applied."""
    loader.require()
    from sglang.srt.mem_cache.mamba_radix_cache import MambaRadixCache

    fault = lookup(UPSTREAM_FAULTS, NOT_INJECTABLE, fid, "MambaRadixCache")
    return patched_subclass(MambaRadixCache, fault)
