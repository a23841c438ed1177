"""Catalogued streaming-session faults applied to SGLang's real ``StreamingSession``, as the bad
diffs.

Each fault is a textual patch of the one ``StreamingSession`` method it lives in
(``session/streaming_session.py``, SGLang 0.5.12.post1, which already carries PR #22862's
``_free_tail``: the clean baseline), installed on a subclass (``StreamingSession_S1``...) by
``patching.patched_subclass``; the real class is never modified.

Which catalogue faults have an upstream form (docs/faults.md, streaming-session):

* S1, S2 -- ``_free_tail`` (SS:500): the range it frees.
* S3 -- ``_free_kv_aligned`` (SS:531-532): the page alignment of the free.
* S4 -- ``try_match_prefix`` (SS:238): the prefix length.
* S5 ``protected-regress`` -- no one-method form, see ``NOT_INJECTABLE``.
* S6 ``admission-counts-session-kv`` -- lives in the scheduler's budget, not the cache.
* S7 ``pre-abort-restores-slot`` -- 0.5.23 only: ``find_active_slot``'s ``to_finish`` detach.

0.5.23's ``StreamingSession`` keeps the same four methods, on the slot's ``ReqKvInfo``
(``kv``) instead of the slot's own fields and ``self.cache.page_size`` instead of
``self.page_size``.  S2 and S4 re-anchor and are caught on their properties
(``UNIFIED_FAULTS``); S1 and S3 patch cleanly but 0.5.23 leaves them nothing to break
(``UNIFIED_NOT_INJECTABLE`` says why; S3's patch is kept in ``UNIFIED_GUARDED`` so a test
can show the guard that refuses it); S5 has no form there for the 0.5.12.post1 reason.
``upstream_fault`` picks the table of the installed release.
"""

from __future__ import annotations

from functools import lru_cache

from caches.adapters.sglang import loader, versions
from caches.adapters.sglang.patching import Patch, UpstreamFault, lookup, patched_subclass

_FREE_TAIL = ("        self._free_kv_aligned(slot.req_pool_idx, prefix_len, "
              "slot.kv_allocated_len)\n")

UPSTREAM_FAULTS = {f.id: f for f in (
    UpstreamFault("S1", (Patch(
        "_free_tail", _FREE_TAIL,
        "        # kvcheck fault S1: the free stops at the committed length\n"
        "        self._free_kv_aligned(slot.req_pool_idx, prefix_len, "
        "slot.kv_committed_len)\n"),),
        "_free_tail: frees [prefix_len, kv_committed_len) only, so what speculative decoding "
        "allocated above the committed length is dropped from the row unfreed (#22862)"),
    UpstreamFault("S2", (Patch(
        "_free_tail", _FREE_TAIL,
        "        # kvcheck fault S2: the pre-#22862 trim, [committed, allocated) only\n"
        "        self._free_kv_aligned(slot.req_pool_idx, max(prefix_len, "
        "slot.kv_committed_len), slot.kv_allocated_len)\n"),),
        "_free_tail: starts at kv_committed_len, so a retract-retry (prefix_len = C - 1) "
        "overwrites position C-1 without freeing it: one token per retract (#22862)"),
    UpstreamFault("S3", (Patch(
        "_free_kv_aligned",
        "        if self.page_size > 1:\n"
        "            start = ceil_align(start, self.page_size)\n",
        "        pass  # kvcheck fault S3: no ceil_align, a partial page is freed whole\n"),),
        "_free_kv_aligned: the tail free is not ceil-aligned, so the paged allocator frees a "
        "page that still holds committed positions (#22862 review)"),
    UpstreamFault("S4", (Patch(
        "try_match_prefix",
        "        prefix_len = min(req.kv_committed_len, len(params.key.token_ids))\n",
        "        prefix_len = min(  # kvcheck fault S4: the logit reserve taken twice\n"
        "            req.kv_committed_len, max(len(params.key.token_ids) - 1, 0))\n"),),
        "try_match_prefix: prefix_len = min(C, len(token_ids) - 1) although token_ids already "
        "carries the 1-token logit reserve (#22862's bonus fix, reverted)"),
)}

_FREE_TAIL_0523 = "        self._free_kv_aligned(kv, prefix_len, kv.kv_allocated_len)\n"

UNIFIED_FAULTS = {f.id: f for f in (
    UpstreamFault("S2", (Patch(
        "_free_tail", _FREE_TAIL_0523,
        "        # kvcheck fault S2: the pre-#22862 trim, [committed, allocated) only\n"
        "        self._free_kv_aligned(kv, max(prefix_len, kv.kv_committed_len), "
        "kv.kv_allocated_len)\n"),),
        UPSTREAM_FAULTS["S2"].why),
    UpstreamFault("S4", (Patch(
        "try_match_prefix",
        "        prefix_len = min(req.kv.kv_committed_len, len(params.key))\n",
        "        prefix_len = min(  # kvcheck fault S4: the logit reserve taken twice\n"
        "            req.kv.kv_committed_len, max(len(params.key) - 1, 0))\n"),),
        UPSTREAM_FAULTS["S4"].why),
)}

# S7 on 0.5.23: find_active_slot's pre-abort detach goes (SGLang #22273's form: the stub of a
# turn marked to finish before it runs is lent its session's slot)
UNIFIED_FAULTS["S7"] = UpstreamFault("S7", (Patch(
    "find_active_slot",
    "        if req.to_finish is not None:\n",
    "        if False:  # kvcheck fault S7: a pre-aborted req is lent the slot (#22273)\n"),),
    "find_active_slot: a request marked to finish before it runs (to_finish, a 1-token stub) "
    "is not detached from its session, so the match lends it the slot at prefix 0: the "
    "append-only assert fires, or the slot's KV is freed past 0 and the stub prefills over "
    "it (SGLang #22273)")

UNIFIED_GUARDED = {"S3": UpstreamFault("S3", (Patch(
    "_free_kv_aligned",
    "        if self.cache.page_size > 1:\n"
    "            start = ceil_align(start, self.cache.page_size)\n",
    "        pass  # kvcheck fault S3: no ceil_align, a partial page is freed whole\n"),),
    UPSTREAM_FAULTS["S3"].why)}

NOT_INJECTABLE = {
    "S5": "no one-method form: append-only is kept by the session controller "
          "(Session.create_req rejects offset/replace, SC:118-133) and checked by "
          "try_match_prefix's assert (SS:242-245). Deleting the assert alone changes nothing "
          "reachable (no append-only input gives prefix_len < cache_protected_len); the defect "
          "needs the controller to accept a rewind too, and the controller's path cannot run "
          "here (its rejection calls set_finish_with_abort, which needs a tensor-parallel "
          "group), so the adapter stands in for it -- a patch there would not be SGLang's code",
    "S7": "0.5.10.post1 has the defect itself (SessionAwareCache.match_prefix restores the "
          "slot into a pre-aborted stub: known upstream finding "
          "sglang-0.5.10-streaming-session-S7); 0.5.12.post1's match was not read here (no "
          "env), so no patch is anchored in it",
    "S6": "not in the cache: the batch budget is the scheduler's (PrefillAdder / PrefillBudget, "
          "mem_cache/prefill_budget.py on 0.5.23), which kvcheck models in caches/admission.py; "
          "StreamingSession has no method that feeds it (the budget reads the tree's "
          "evictable_size())",
}


UNIFIED_NOT_INJECTABLE = {
    "S1": "nothing to break on 0.5.23: a saved slot always has kv_committed_len == "
          "kv_allocated_len (try_cache_finished_req trims A to the finished length and sets "
          "C = min(target, A)), so the range S1 drops, [C, A), is empty at every match after a "
          "save; it is non-empty only when a turn that already allocated is matched again (a "
          "rejected chunked turn), which the machine does not drive",
    "S3": "refused by an upstream guard on 0.5.23: the paged allocator's segment free asserts "
          "a page-aligned start (mem_cache/allocator/paged.py, 'segment start N is not "
          "page-aligned'), so the unaligned free raises before any page is freed "
          "(tests/upstream/test_sglang_unified_streaming_session.py shows it)",
    "S5": NOT_INJECTABLE["S5"],
    "S6": NOT_INJECTABLE["S6"],
}


@lru_cache(maxsize=None)
def upstream_fault(fid: str) -> type:
    """A subclass of SGLang's ``StreamingSession`` with fault ``fid``'s patch applied (the
    table of the installed release)."""
    ss = loader.load_streaming_session()
    if versions.unified(ss.base.version):
        fault = lookup(UNIFIED_FAULTS, UNIFIED_NOT_INJECTABLE, fid,
                       f"StreamingSession ({ss.base.version})")
    else:
        fault = lookup(UPSTREAM_FAULTS, NOT_INJECTABLE, fid, "StreamingSession")
    return patched_subclass(ss.StreamingSession, fault)
