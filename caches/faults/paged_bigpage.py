"""Faults L1-L5 of LightLLM's linear-attention paged radix cache (PR #1348), each the smallest
mutation of ``LinearAttPagedRadixCache``.  L2-L4 are the same missing root release at three
exits; upstream main still has all three (the fixes were reverted before the merge).  L6-L7
are model mutations of the serving lifecycle's new paths (decode output freed at finish, the
router's admission estimate)."""

from __future__ import annotations

from caches.admission import NewOnlyPeakBudget
from caches.faults import fault
from caches.paged_bigpage import LinearAttPagedRadixCache, PagedNode

BIG_PAGES_ON = {"big_page_num": 2}


@fault("L1", "root-in-evict-set", variant="paged-bigpage", upstream="LightLLM #1348",
       properties=("eviction-set",),
       summary="when the tree empties (or a miss visits an empty tree) the root, now a leaf, "
               "is added to the eviction set, contradicting the evictor's 'never evict root'")
class RootInEvictSet(LinearAttPagedRadixCache):
    def _add_node(self, node):
        if node.is_leaf():  # the defect: no `and node is not self.root_node`
            self._evict_tree_set[node] = node.get_compare_key()
        if node.small_page_buffer_idx is not None:
            self._evict_tree_set_for_linear_att[node] = node.get_compare_key_for_buffer_idx()


@fault("L2", "root-ref-leak-on-miss", variant="paged-bigpage",
       upstream="LightLLM #1348 (fix reverted; still on main)", properties=("ref-balance",),
       summary="match_prefix refs the root while descending; the 'no match' return hands back "
               "nothing without releasing it, so root.ref drifts up on every miss")
class RootRefLeakOnMiss(LinearAttPagedRadixCache):
    def _release_root(self, where):
        if where != "miss":  # the defect: the miss exit returns without the release
            super()._release_root(where)


@fault("L3", "root-ref-leak-on-trim", variant="paged-bigpage",
       upstream="LightLLM #1348 (fix reverted; still on main)", properties=("ref-balance",),
       summary="same root-ref leak when the matched tail is trimmed away to empty (small pages "
               "without a state buffer)")
class RootRefLeakOnTrim(LinearAttPagedRadixCache):
    def _release_root(self, where):
        if where != "trim":  # the defect: the trim-to-empty exit returns without the release
            super()._release_root(where)


@fault("L4", "root-ref-leak-on-deref", variant="paged-bigpage",
       upstream="LightLLM #1348 (fix reverted; still on main)", properties=("ref-balance",),
       params=BIG_PAGES_ON,
       summary="the big-page downgrade walk (deref to the first big-page node) leaks the root "
               "ref when it bottoms out at the root")
class RootRefLeakOnDeref(LinearAttPagedRadixCache):
    def _release_root(self, where):
        if where != "deref":  # the defect: deref returns None without the release
            super()._release_root(where)


@fault("L5", "bigpage-buffer-leak-on-abort", variant="paged-bigpage", upstream="LightLLM #1348",
       properties=("conservation",), params=BIG_PAGES_ON,
       summary="big-page state buffers collected during chunked prefill are neither inserted "
               "nor freed when the request is paused/aborted mid-prefill (free_req's "
               "insert-nothing branch); asserts on: worker crash, asserts off: leaked slots")
class BigPageBufferLeakOnAbort(LinearAttPagedRadixCache):
    def _release_pending_big_pages(self, req):
        pass  # the defect (pre-fix IB 228-249): the pending ids stay on the request


class _InvertedUsableNode(PagedNode):
    __slots__ = ()

    def get_compare_key(self):
        usable = 1 if (self.is_big_page_node() or self.small_page_buffer_idx is not None) else 0
        return (0 if self.ref_counter == 0 else 1, 1 - usable, self.time_id)  # the defect


@fault("P5", "inverted-usable-flag", variant="paged-bigpage",
       upstream="kvcheck policy mutant", properties=("victim",),
       summary="the 'usable' flag of the eviction sort key is inverted, so leaves that carry a "
               "linear state (big pages, small pages with a buffer) are evicted before "
               "unusable ones -- the hits a hybrid model can resume from go first")
class InvertedUsableFlag(LinearAttPagedRadixCache):
    def _new_node(self):
        node = _InvertedUsableNode(self._next_id, self.big_page_tokens, self._time())
        self._next_id += 1
        return node


# -- the serving lifecycle past the prefill (decode, batch admission) ---------------------------

@fault("L6", "decode-kv-leak-on-finish", variant="paged-bigpage",
       upstream="LightLLM _linear_att_free_req frees [.. : cur_kv_len] (model)",
       properties=("conservation",),
       summary="the release of a finished request stops at its prompt (input_len), not at "
               "cur_kv_len: the KV slots its decode steps took are never freed")
class DecodeKVLeakOnFinish(LinearAttPagedRadixCache):
    def _linear_att_free_req(self, free_token_index, req):
        req.cur_kv_len = min(req.cur_kv_len, req.input_len)  # the defect
        super()._linear_att_free_req(free_token_index, req)


@fault("L7", "admission-ignores-running-batch", variant="paged-bigpage",
       upstream="LightLLM ChunkedPrefillQueue._init_cache_list (model)",
       properties=("admission-sound",),
       summary="the router's peak-token estimate is taken over the new candidates only, not "
               "the running batch: a batch is admitted whose prefill cannot allocate while "
               "running requests hold the KV")
class AdmissionIgnoresRunningBatch(LinearAttPagedRadixCache):
    admission = NewOnlyPeakBudget  # the defect
