"""Faults S1-S7 of the streaming-session cache, each the smallest mutation of
``StreamingSessionCache`` (SGLang 0.5.12.post1 ``session/streaming_session.py``, SS)."""

from __future__ import annotations

from caches.faults import fault
from caches.streaming_session import StreamingSessionCache


@fault("S1", "spec-tail-leak", variant="streaming-session",
       upstream="SGLang #22862 (speculative alloc-commit gap)",
       properties=("conservation",),
       summary="the next turn's tail free stops at kv_committed_len: what speculative decoding "
               "allocated above it ([C, A)) is dropped from the row without being freed")
class SpecTailLeak(StreamingSessionCache):
    def _tail_range(self, slot, prefix_len):
        return prefix_len, slot.kv_committed_len  # the defect: end should be kv_allocated_len


@fault("S2", "retract-drip", variant="streaming-session",
       upstream="SGLang #22862 (pre-fix trim of [C, A) only)",
       properties=("conservation",),
       summary="the tail free starts at kv_committed_len, so on retract-retry (prefix_len = "
               "C - 1, logit reserve) position C-1 is overwritten by a fresh slot and the old "
               "one leaks: one token per retract")
class RetractDrip(StreamingSessionCache):
    def _tail_range(self, slot, prefix_len):
        # the defect: only [C, A) is trimmed, [prefix_len, C) is overwritten unfreed
        return max(prefix_len, slot.kv_committed_len), slot.kv_allocated_len


@fault("S3", "free-tail-unaligned", variant="streaming-session",
       upstream="SGLang #22862 review (page alignment of _free_kv_aligned)",
       properties=("conservation", "data-integrity"),
       params={"page_size": 4, "pool_pages": 10},
       summary="the tail free is not ceil-aligned to the page: the paged allocator frees the "
               "whole partial page while it still holds committed tokens (page both free and "
               "held, later freed twice / reused under the session)")
class FreeTailUnaligned(StreamingSessionCache):
    def _tail_start(self, target):
        return target  # the defect: no ceil_align(target, page_size)


@fault("S4", "prefix-double-reserve", variant="streaming-session",
       upstream="SGLang #22862 (prefix_len bonus fix)",
       properties=("session-prefix", "conservation"),
       summary="prefix_len = min(committed, len(token_ids) - 1): the extra -1 double-counts the "
               "logit reserve already applied to token_ids")
class PrefixDoubleReserve(StreamingSessionCache):
    def _prefix_len(self, committed, num_token_ids):
        return min(committed, max(num_token_ids - 1, 0))  # the defect: reserve applied twice


@fault("S5", "protected-regress", variant="streaming-session",
       upstream="SGLang #22790/#22862 (append-only assert; historic shrink paths)",
       properties=("append-only",),
       summary="a streaming turn may rewind (offset accepted, prefix_len clamped to the kept "
               "history) and the append-only assert is gone, so prefix_len drops below the "
               "slot's cache_protected_len and the tail free releases tree-owned KV")
class ProtectedRegress(StreamingSessionCache):
    _keep = None  # history length the accepted rewind keeps, for the next match only

    def build_turn_input(self, history, append, rewind=0):
        # the defect: the controller accepts a rewinding turn (offset), and the slot resumes
        # at the rewind point -- which may lie inside the tree-owned prefix
        keep = max(0, len(history) - rewind)
        self._keep = keep if rewind else None
        return list(history[:keep]) + list(append)

    def _prefix_len(self, committed, num_token_ids):
        keep, self._keep = self._keep, None
        prefix_len = super()._prefix_len(committed, num_token_ids)
        return prefix_len if keep is None else min(prefix_len, keep)

    def _check_append_only(self, prefix_len, slot):
        pass  # the defect: SS:242-245 removed


@fault("S6", "admission-counts-session-kv", variant="streaming-session",
       upstream="SGLang PrefillBudget's evictable count (mem_cache/prefill_budget.py, model)",
       properties=("admission-sound",), params={"page_size": 1, "pool_pages": 12},
       summary="the batch budget counts the session slots' KV as evictable: a batch is "
               "admitted whose prefill or first decode step needs KV that no eviction can "
               "free")
class AdmissionCountsSessionKv(StreamingSessionCache):
    def admission_evictable(self):
        # the defect: the slots' own KV (row[P:A), never in the tree) added to the tree's
        return self.evictable_size_ + sum(self.session_held_tokens(sid) for sid in self.slots)


@fault("S7", "pre-abort-restores-slot", variant="streaming-session",
       upstream="SGLang #22273 (a pre-aborted streaming turn restores and overwrites its "
                "session's slot; 0.5.23: StreamingSession.find_active_slot detaches it)",
       properties=("session-prefix",),
       summary="a turn marked to finish before it runs (set_finish_with_abort: a 1-token "
               "stub) is not detached from its session: the match lends it the slot, at "
               "prefix 0, and its prefill and abort overwrite or release what the last "
               "finished turn left there")
class PreAbortRestoresSlot(StreamingSessionCache):
    def _detaches_pre_aborted(self, req):
        return False  # the defect: to_finish is not looked at
