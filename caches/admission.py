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
swaps it); every variant that forms batches builds its budget here.  LightLLM's router has a
rule of its own (``PeakTokenBudget`` below, for paged-bigpage), TokenSpeed's scheduler
another (``SecuredPagesBudget``, for continuation-state).
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

    def fits(self, extend: int, max_new: int, req=None) -> bool:
        """Admit a candidate extending ``extend`` tokens (``req``: the request; SGLang's
        estimate reads only the lengths)."""
        return self.cost(extend, max_new) < self.free_and_evictable() - self.total_offset

    def reserve(self, extend: int, max_new: int, req=None) -> None:
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


# -- LightLLM's router ------------------------------------------------------------------------
ADDED_OUTPUT_LEN = 16  # LightLLM's req.py line 469: padding on every request's remaining output


def lightllm_tuple_tokens(total_len: int, cur_kv_len: int, output: int, max_new: int, *,
                          chunk: int, wait_tokens: int = 1,
                          added_output_len: int = ADDED_OUTPUT_LEN) -> tuple[int, int]:
    """``ChunkedPrefillReq.get_tuple_tokens`` (LightLLM ``server/core/objs/req.py`` lines
    475-504) with ``is_busy`` true (the remaining output is ``max_new_tokens`` less what was
    generated, no EMA guess): ``(tokens it holds or will hold before its next output,
    tokens it may still grow by)``.  ``total_len`` = input + output so far."""
    a_len = max(total_len + 1, cur_kv_len + 1)
    b_len = (-(-(total_len - cur_kv_len) // chunk) * (wait_tokens + 1)
             + max_new - output - 1)
    return a_len, max(0, b_len) + added_output_len


class PeakTokenBudget:
    """LightLLM's admission: ``ChunkedPrefillQueue._can_add_new_req`` (``server/router/
    req_queue/chunked_prefill/impl.py`` lines 24-51), called for each waiting request in order
    by ``generate_new_batch`` (lines 54-93; the first refusal ends the pass).

    Every request of the running batch and each candidate is a pair ``(a, b)`` =
    ``lightllm_tuple_tokens``; sorted by ``b`` descending, the peak the batch can reach is
    ``max_i(b_i * (i + 1) + a_0 + ... + a_i)`` (the ``i``-th longest remaining request
    finishes last of the first ``i + 1``); a candidate is admitted iff that peak is below
    ``max_total_tokens`` (the KV pool), the batch holds at most ``running_max_req_size``
    requests, and the new batch's first chunks fit ``batch_max_tokens`` (kvcheck's pools are
    far below any batch cap: not modelled).  The router never sees prefix hits: a candidate
    counts its whole sequence.

    Sound for the cache (what ``admission-sound`` checks): the peak's last term is at least
    the sum of every request's ``a`` = whole length + 1, which bounds the KV the running
    requests hold (their own slots plus the tree tokens their held nodes pin) plus each new
    request's prefill and first decode slot -- so ``get_can_alloc_token_num`` covers them.
    """

    def __init__(self, max_total_tokens: int, running: list[tuple[int, int]],
                 max_requests: int, tuple_tokens):
        self.max_total_tokens = max_total_tokens
        self.max_requests = max_requests
        self.entries = list(running)
        self.tuple_tokens = tuple_tokens  # req -> (a, b)

    def peak(self, entries) -> int:
        run, best = 0, 0
        for i, (a, b) in enumerate(sorted(entries, key=lambda e: -e[1])):
            run += a
            best = max(best, b * (i + 1) + run)
        return best

    def fits(self, extend: int, max_new: int, req=None) -> bool:
        entries = self.entries + [self.tuple_tokens(req)]
        return (self.peak(entries) < self.max_total_tokens
                and len(entries) <= self.max_requests)

    def reserve(self, extend: int, max_new: int, req=None) -> None:
        self.entries.append(self.tuple_tokens(req))


class NewOnlyPeakBudget(PeakTokenBudget):
    """The peak estimate over the candidates alone: the running batch left out (what a
    fault swaps in -- ``_init_cache_list`` without the current batch)."""

    def __init__(self, max_total_tokens, running, max_requests, tuple_tokens):
        super().__init__(max_total_tokens, [], max_requests, tuple_tokens)


# -- vLLM v1's scheduler ----------------------------------------------------------------------
class StepTokenBudget:
    """vLLM 0.33.0's budget for the waiting requests of one ``Scheduler.schedule()`` step
    (``vllm/v1/core/sched/scheduler.py``): there is no memory estimate -- the KV test is the
    allocation itself (``KVCacheManager.allocate_slots`` returning None, lines 1435-1461) --
    only a token budget and a cap on running requests:

    * ``token_budget = self.max_num_scheduled_tokens`` (line 719; ``max_num_batched_tokens``
      unless set, lines 139-143), spent by each scheduled request's ``num_new_tokens`` (line
      1570); the waiting loop runs ``while token_budget > 0`` (line 1062);
    * ``len(self.running) >= self.max_num_active_reqs`` ends the pass (lines 1071-1074;
      ``max_num_seqs`` unless set, lines 131-138);
    * a request's chunk is its unscheduled tokens cut to what is left of the budget
      (``num_new_tokens = request.num_tokens - num_computed_tokens``, line 1306, then
      ``min(num_new_tokens, request_token_budget)``, line 1346: chunked prefill on, no long
      prefill threshold)."""

    def __init__(self, tokens: int, max_running: int, running: int):
        self.tokens, self.max_running, self.running = tokens, max_running, running

    def room(self) -> bool:
        """Another waiting request may be looked at (the loop's two guards)."""
        return self.tokens > 0 and self.running < self.max_running

    def chunk(self, unscheduled: int) -> int:
        return min(unscheduled, self.tokens)

    def take(self, num_new_tokens: int) -> None:
        self.tokens -= num_new_tokens
        self.running += 1


# -- TokenSpeed's scheduler -------------------------------------------------------------------
RETRACTION_SAFE_STEPS = 4096  # TokenSpeed's kRetractionSafeSteps (forward.cpp line 63)


class SecuredPagesBudget:
    """TokenSpeed 0.1.42's admission of new prompts in one round (the ``tokenspeed-scheduler``
    sdist, ``csrc/scheduler/operations/forward.cpp``).  The admission *is* the allocation:

    * the round's candidates are its requests in submission order (lines 1440-1446), and
      ``scheduleLocalPrefillWork`` (lines 1269-1298) offers each waiting (``Submitted``) one
      the round's token budget, ``max_scheduled_tokens`` less the chunks already scheduled
      (``scheduler.h`` line 321); a full batch (``max_batch_size``) ends the round;
    * ``schedulePrefillFirstChunk`` (lines 361-493): the first chunk is the unmatched prompt
      cut to that budget (a budget of 0: not scheduled, line 391); ``CacheCoordinator::Admit``
      (``cache_admission.cpp`` line 718, evicting cached blocks to make room, lines 858-866)
      takes the chunk's pages and secures the rest of the prompt plus the decode headroom
      ``min(remaining new tokens, kRetractionSafeSteps * (1 + retractions))`` (lines 402 and
      420, ``request.h`` lines 68-70) -- all or nothing;
    * a newcomer whose admission fails is noted and the round goes on to the next one (lines
      1292-1296: only a resident chunk's failure ends it); an admitted request whose first
      chunk leaves its prompt incomplete holds the head of line and ends the round (lines
      71-76 and 1289-1291).

    ``need(req, extend, max_new)``: pages per group that request must secure (its prompt's
    unmatched ``extend`` tokens and ``max_new`` decode tokens); ``free()``: pages per group
    free now (after the prune the caller ran).  A candidate fits iff every group's need plus
    what this round's earlier admissions secured is at most that group's free pages."""

    refusal_ends_pass = False  # a refused newcomer does not end the round

    def __init__(self, tokens: int, free: Callable[[], dict], need: Callable):
        self.tokens = tokens  # the round's token budget left
        self.free, self.need = free, need
        self.secured: dict = {}
        self.sealed = False  # an incomplete prefill holds the head of line

    @staticmethod
    def headroom(max_new: int, retracted: int = 0) -> int:
        return min(max_new, RETRACTION_SAFE_STEPS * (1 + retracted))

    def chunk(self, unscheduled: int) -> int:
        """The first chunk's tokens (0: no budget left this round)."""
        return min(unscheduled, self.tokens)

    def short(self, extend: int, max_new: int, req=None) -> dict:
        """Groups short of pages for this candidate: gid -> pages missing."""
        free = self.free()
        out = {}
        for gid, pages in self.need(req, extend, max_new).items():
            missing = pages + self.secured.get(gid, 0) - free.get(gid, 0)
            if missing > 0:
                out[gid] = missing
        return out

    def fits(self, extend: int, max_new: int, req=None) -> bool:
        return not self.sealed and self.chunk(extend) > 0 and not self.short(extend, max_new, req)

    def reserve(self, extend: int, max_new: int, req=None) -> None:
        for gid, pages in self.need(req, extend, max_new).items():
            self.secured[gid] = self.secured.get(gid, 0) + pages
        chunk = self.chunk(extend)
        self.tokens -= chunk
        self.sealed = chunk < extend


class UnsecuredPagesBudget(SecuredPagesBudget):
    """TokenSpeed's rule with each admission securing nothing for the next: every candidate
    judged against the free pages alone (what a fault swaps in)."""

    def reserve(self, extend: int, max_new: int, req=None) -> None:
        secured = dict(self.secured)
        super().reserve(extend, max_new, req)
        self.secured = secured  # the defect's shape: the round forgets what it handed out
