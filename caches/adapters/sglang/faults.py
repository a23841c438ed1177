"""Catalogued radix faults applied to SGLang's real ``RadixCache``, as the bad diffs.

Each fault is a textual patch of the one upstream method it lives in, installed on a subclass
(``RadixCache_R1``...) by ``patching.patched_subclass``; the real class is never modified.

Which catalogue faults have an upstream form (docs/faults.md, radix):

* R1, R3, R4, R5 -- below.
* R2 ``dec-lock-underflow`` -- nothing to inject: SGLang 0.5.12.post1's ``dec_lock_ref`` has no
  underflow guard at all.  That is the known upstream finding sglang-radix-F1
  (``tests/upstream_findings/``).
* R6 ``page-key-truncated-to-zero`` -- not observable here: without the second early return,
  SGLang's ``child_key`` slices (``tuple(t[:page_size])``) instead of indexing, so a sub-page key
  walks nothing and returns ``([], root)``, the same as the fixed code (notes/radix.md, R6).
"""

from __future__ import annotations

from functools import lru_cache

from caches.adapters.sglang import loader
from caches.adapters.sglang.patching import Patch, UpstreamFault, lookup, patched_subclass

UPSTREAM_FAULTS = {f.id: f for f in (
    UpstreamFault("R1", (Patch(
        "_insert_helper",
        "            node.children[child_key] = new_node\n",
        "            if not node.children and node is not self.root_node and node.lock_ref == 0:\n"
        "                self.evictable_size_ -= len(node.key)  # kvcheck fault R1\n"
        "            node.children[child_key] = new_node\n"),),
        "_insert_helper: a leaf gaining its first child has its tokens subtracted from "
        "evictable_size_ (pymllm #656)"),
    UpstreamFault("R3", (Patch(
        "evict",
        "            _priority, x = heapq.heappop(eviction_heap)\n",
        "            _priority, x = heapq.heappop(eviction_heap)\n"
        "            if x.parent is self.root_node:  # kvcheck fault R3: the never-evict-the-\n"
        "                continue  # root guard tests the parent, so one-level leaves stay\n"),),
        "evict: skips children of the root, so eviction frees nothing although "
        "evictable_size_ > 0 (pymllm #656 follow-up)"),
    UpstreamFault("R4", (
        Patch("inc_lock_ref",
              "        while node != self.root_node:\n"
              "            if node.lock_ref == 0:\n",
              "        while node != self.root_node:\n"
              "            node = node.parent  # kvcheck fault R4: moved above the increment\n"
              "            if node.lock_ref == 0:\n"),
        Patch("inc_lock_ref",
              "            node = node.parent\n        return IncLockRefResult",
              "        return IncLockRefResult"),
        Patch("dec_lock_ref",
              "        while node != self.root_node:\n"
              "            if node.lock_ref == 1:\n",
              "        while node != self.root_node:\n"
              "            node = node.parent  # kvcheck fault R4, mirrored\n"
              "            if node.lock_ref == 1:\n"),
        Patch("dec_lock_ref",
              "            node = node.parent\n        return DecLockRefResult",
              "        return DecLockRefResult")),
        "inc_lock_ref/dec_lock_ref: the walk steps to the parent before touching the ref, so "
        "the matched node stays unlocked and the root's ref moves (mini-sglang #52)"),
    UpstreamFault("R5", (Patch(
        "insert",
        "            value = value[: len(key)]\n",
        "            pass  # kvcheck fault R5: the value keeps what the page-aligned key dropped\n"),),
        "insert: the value is not cut to the page-aligned key, so counters (by key) and the "
        "tree's tokens (by value) disagree at page_size > 1 (SGLang #10637)"),
)}

NOT_INJECTABLE = {
    "R2": "SGLang 0.5.12.post1's dec_lock_ref has no underflow guard to remove: the defect is "
          "already there (known upstream finding sglang-radix-F1, tests/upstream_findings/)",
    "R6": "not observable on SGLang 0.5.12.post1: without the early return, child_key slices "
          "a sub-page key to () and the match returns ([], root) exactly like the fixed code",
}


@lru_cache(maxsize=None)
def upstream_fault(fid: str) -> type:
    """A subclass of SGLang's ``RadixCache`` with fault ``fid``'s patch applied."""
    fault = lookup(UPSTREAM_FAULTS, NOT_INJECTABLE, fid, "RadixCache")
    return patched_subclass(loader.require().RadixCache, fault)
