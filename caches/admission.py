"""Batch admission against one budget: SGLang 0.5.23's ``PrefillAdder`` estimate.

One scheduling step admits waiting requests one by one (first come, first served) against
one memory budget, then runs their prefill and their first decode step.  The rule, read from
SGLang 0.5.23 (single token pool, ``kv_shard_size`` 1, no host tier):

* ``managers/schedule_policy.py`` ``PrefillAdder.add_one_req`` (lines 1395-1425): a candidate
  costs ``total_tokens = extend + max_new + per_req_token_overhead`` with ``extend = len(fill)
  - prefix_len``, ``max_new = min(max(max_new_tokens - len(output_ids), 0), CLIP)`` and
  ``per_req_token_overhead = page_size`` (lines 733-737: one page of allocation rounding per
  request); its matched prefix is pinned while it is judged (``_lock_node``);
* ``mem_cache/prefill_budget.py`` ``PrefillBudget``: admitted iff ``total_tokens <
  remaining_total`` (``check_prefill``, lines 114-129), where ``remaining_total = available +
  evictable - total_offset``; an admitted request reserves ``ceil_paged(extend) + page_size
  (+ extra_tokens, which is ``per_req_token_overhead - page_size`` = 0 here)`` now and
  ``max_new`` more for its decode (``reserve``, lines 156-168); the offset starts at the
  running requests' remaining decode, ``min(max_new - len(output), CLIP) * new_token_ratio``
  (``_get_running_request_total_token_offset``, schedule_policy.py lines 785-794), with
  SGLang's initial ratio 0.7 (``SGLANG_INIT_NEW_TOKEN_RATIO``);
* a ``NO_TOKEN`` verdict stops the pass (the scheduler's loop breaks on it).

A variant's cache may carry its own rule as the class attribute ``admission`` (a fault
swaps it); every variant that forms batches builds its budget here.
"""

from __future__ import annotations

from typing import Callable

from caches.arith import ceil_align

NEW_TOKEN_RATIO = 0.7  # SGLang's SGLANG_INIT_NEW_TOKEN_RATIO default


class PrefillBudget:
    """One scheduling pass's budget.  ``free_and_evictable()`` is read live, so a prefix
    locked by an admission (its tokens leave the evictable count) shrinks what is left."""

    def __init__(self, page_size: int, free_and_evictable: Callable[[], int],
                 running_decode: float = 0.0):
        self.page_size = page_size
        self.free_and_evictable = free_and_evictable
        self.total_offset = running_decode

    def ceil_paged(self, tokens: int) -> int:
        return ceil_align(tokens, self.page_size)

    def overhead(self) -> int:
        """Tokens charged per request for allocation rounding (one page)."""
        return self.page_size

    def cost(self, extend: int, max_new: int) -> int:
        """``total_tokens`` of one candidate."""
        return extend + max_new + self.overhead()

    def fits(self, extend: int, max_new: int) -> bool:
        return self.cost(extend, max_new) < self.free_and_evictable() - self.total_offset

    def reserve(self, extend: int, max_new: int) -> None:
        self.total_offset += self.ceil_paged(extend) + self.overhead() + max_new


class UnroundedBudget(PrefillBudget):
    """The estimate without page rounding: raw extend lengths, no per-request page (what a
    fault swaps in)."""

    def ceil_paged(self, tokens: int) -> int:
        return tokens

    def overhead(self) -> int:
        return 0


def remaining_decode(max_new: int, output: int) -> int:
    """Decode tokens a request may still generate (``max(max_new - len(output), 0)``)."""
    return max(max_new - output, 0)


def running_reservation(reqs) -> float:
    """The running requests' remaining decode, as ``PrefillAdder`` reserves it."""
    return sum(remaining_decode(r.max_new, r.output) for r in reqs) * NEW_TOKEN_RATIO
