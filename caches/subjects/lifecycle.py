"""The serving lifecycle past the prefill, written once for every radix-tree subject (radix
and its upstream targets, himamba, paged-bigpage): ``decode``, ``retract``, ``enqueue``,
``schedule`` and the ``admission-sound`` property; ``spec_decode`` where the subject frees
rejected drafts.

A subject mixes ``Lifecycle`` in and supplies the steps that differ per cache (hooks below):
where the KV lives (``kv_pool``), a decode step's slot (``_decode_alloc``), what else a
step advances (``_advance``: himamba's mamba state moves in place), how long a request may
grow (``_decode_limit``), how a request is released without insert (``_release_no_insert``),
and how a waiting request is matched and pinned (``_pin``), undone (``_unpin``), given its KV
(``_place``), and what the budget reads (``_free_and_evictable``).  A cache whose engine
judges and prefills differently replaces the budget (``_budget``: paged-bigpage's is
LightLLM's router estimate, which never sees prefix hits) and the admitted request's prefill
(``_extend``: paged-bigpage matches after admission and prefills chunk by chunk with the
state copies).  An engine whose admission *is* the allocation replaces the per-request
judgement (``admit_one``, public: the seam for an engine whose adder matches, estimates and
locks in one call) and what follows the prefill (``_first_decode``): block-hash, where
vLLM's ``allocate_slots`` admits and a later decode shortfall preempts; continuation-state,
where TokenSpeed's ``CacheCoordinator::Admit`` secures the pages and the batch's forward
computes each admitted request's first chunk.  The scheduler the defaults follow is SGLang
0.5.23's:

* retract: ``managers/schedule_batch.py`` ``ScheduleBatch.retract_decode`` (line 3451) ->
  ``release_req`` (line 2360) -> ``mem_cache/common.py`` ``release_kv_cache(req, tree_cache,
  checkpoint=False)`` (lines 400-440), then ``Req.reset_for_retract`` (line 2049) and the
  request back in the waiting queue; re-admitted later like any waiting request, its
  sequence the prompt + the output so far;
* schedule: ``PrefillAdder.add_one_req`` for each waiting request in order
  (``caches/admission.py``), then the batch's extend and its first decode step.
"""

from __future__ import annotations

from caches.admission import PrefillBudget, remaining_decode, running_reservation
from caches.request import Req
from caches.subjects.base import NotDriven, Skip
from invariants import fail

VOCAB = 3
RETRACT_DECODE_STEPS = 20  # SGLang's SGLANG_RETRACT_DECODE_STEPS default (environ.py line 649)


class Lifecycle:
    """Mixin: the lifecycle ops over the hooks (see the module doc).

    ``lifecycle_declined``: op name -> why this subject's engine cannot take it (an engine
    target whose scheduler path is not driven); such an op is a no-op saying why."""

    waiting: dict  # rid -> Req, in arrival order (the subject's __init__ sets it)
    lifecycle_declined: dict = {}

    def _takes(self, op: str) -> None:
        why = self.lifecycle_declined.get(op)
        if why is not None:
            raise NotDriven(f"{op} is not driven on this target: {why}")

    # -- hooks ------------------------------------------------------------------------------
    def kv_pool(self):
        raise NotImplementedError

    def _decode_alloc(self, req: Req):
        """The slot for ``req``'s next position, or None (out of memory)."""
        raise NotImplementedError

    def _advance(self, req: Req) -> None:
        """What else a decode step advances (nothing for a plain KV cache)."""

    def _release_no_insert(self, req: Req) -> None:
        """Release ``req`` without inserting it (its own KV freed, its lock dropped)."""
        raise NotImplementedError

    def _reset(self, req: Req) -> None:
        req.kv_indices, req.filled, req.cache_protected_len, req.last_node = [], 0, 0, None

    def _pin(self, req: Req, admitted: int):
        """Match ``req``'s sequence (less its last token) and lock the match: (prefix KV
        ids, locked node, ...), or None when the request cannot be admitted besides the
        ``admitted`` ones of this pass (it is refused)."""
        raise NotImplementedError

    def _unpin(self, req: Req, pinned) -> None:
        raise NotImplementedError

    def _place(self, req: Req, pinned, own: list[int]) -> None:
        """Make ``req`` live over its pinned prefix + ``own`` fresh slots."""
        raise NotImplementedError

    def _alloc_prefill(self, n: int):
        raise NotImplementedError

    def _free_and_evictable(self) -> int:
        raise NotImplementedError

    def _free_kv_tokens(self) -> int:
        """Free KV tokens (what an eviction for room is measured against)."""
        raise NotImplementedError

    def _evict_tokens(self, n: int) -> int:
        """Evict ``n`` tokens the way the ``evict`` op does (its checks too); tokens freed."""
        raise NotImplementedError

    def _sync_row(self, req: Req) -> None:
        """An adapter whose engine keeps the request's row itself copies the grown row."""
        sync = getattr(self.cache, "sync_row", None)
        if sync is not None:
            sync(req)

    # -- decode -----------------------------------------------------------------------------
    def _decoding(self, rid: int) -> Req:
        req = self.req(rid)
        if req.filled < len(req.tokens):
            raise Skip(f"r{rid} is still prefilling")
        return req

    @staticmethod
    def _sample(req: Req) -> int:
        """The token a step samples (a function of the request, so replays agree)."""
        return (len(req.tokens) * 2 + req.rid) % VOCAB

    def _decode_step(self, req: Req) -> bool:
        """One decode step: a slot for the next position, its token's KV written."""
        slot = self._decode_alloc(req)
        if slot is None:
            self.reached("out-of-memory")
            return False
        req.kv_indices.append(slot)
        req.tokens.append(self._sample(req))
        req.output += 1
        self.kv_pool().write([slot], self.expected_data(req.tokens)[-1:])
        req.filled += 1
        self._advance(req)
        self._sync_row(req)
        return True

    def _decode_limit(self, req: Req) -> int | None:
        """How many more tokens ``req`` may generate (None: no limit here)."""
        return None

    def decode(self, rid: int, n: int) -> str:
        self._takes("decode")
        req = self._decoding(rid)
        limit = self._decode_limit(req)
        if limit is not None:
            if limit <= 0:
                raise Skip(f"r{rid} is at its longest sequence")
            n = min(n, limit)
        for step in range(n):
            if not self._decode_step(req):
                return f"out of memory after {step} step(s) (a scheduler retracts here)"
        return f"decoded {n}: {req.filled} tokens computed, {req.output} output"

    # -- retract ----------------------------------------------------------------------------
    def retract(self, rid: int) -> str:
        self._takes("retract")
        req = self._decoding(rid)
        self._release_no_insert(req)
        del self.requests[rid]
        evicted = self._evict_after_retract()
        self._reset(req)
        req.retracted += 1
        self.waiting[rid] = req
        return (f"retracted with {len(req.tokens)} tokens ({req.output} output), re-queued"
                + (f"; evicted {evicted} tokens for the rest of the batch" if evicted else ""))

    def _evict_after_retract(self) -> int:
        """``release_req``'s eviction right after the release: room for the decoding requests
        left in the batch to run ``RETRACT_DECODE_STEPS`` more steps each ("use the newly
        evictable memory instantly", ``schedule_batch.py`` lines 2390-2392, through
        ``evict_from_tree_cache`` -> ``allocator/base.py`` ``evict_to_free_tokens`` lines
        155-169: evict the shortfall below that many free tokens).  The tokens evicted."""
        left = sum(1 for r in self.requests.values() if r.filled >= len(r.tokens))
        shortfall = left * RETRACT_DECODE_STEPS - self._free_kv_tokens()
        if shortfall <= 0:
            return 0
        self.reached("retract-evicts")
        return self._evict_tokens(shortfall)

    # -- batch admission --------------------------------------------------------------------
    def enqueue(self, rid: int, tokens: list[int], max_new: int) -> str:
        self._takes("schedule")
        if rid in self.requests or rid in self.waiting:
            raise Skip(f"r{rid} is already live or waiting")
        self.waiting[rid] = self._new_waiting(rid, tokens, max_new)
        return f"r{rid} waits ({len(self.waiting)} waiting)"

    def _new_waiting(self, rid: int, tokens: list[int], max_new: int) -> Req:
        return Req(rid, list(tokens), max_new=max_new)

    def admission_rule(self):
        """The batch budget rule: the cache's own (a fault may swap it), else SGLang's."""
        return getattr(self.cache, "admission", PrefillBudget)

    def schedule(self, n: int) -> str:
        """One scheduling step: admit up to ``n`` waiting requests, oldest first, against the
        budget (each judged with its prefix locked; a refusal ends the pass unless the budget
        says ``refusal_ends_pass = False``, and a ``sealed`` budget ends it); then run the
        batch's prefill and first decode step.  Admitted work that cannot allocate breaks
        ``admission-sound``."""
        self._takes("schedule")
        if not self.waiting:
            raise Skip("nothing is waiting")
        budget = self._budget()
        batch = []
        for rid in list(self.waiting)[:max(n, 0)]:
            if getattr(budget, "sealed", False):
                break  # the budget closed the pass (TokenSpeed: an incomplete prefill)
            req = self.waiting[rid]
            pinned = self.admit_one(req, budget, len(batch))
            if pinned is None:
                self.reached("admission-refused")
                if getattr(budget, "refusal_ends_pass", True):
                    break
                continue
            batch.append((req, pinned))
        if not batch:
            return "nothing admitted (no budget)"
        if len(batch) > 1:
            self.reached("batch-admitted")
        for req, pinned in batch:  # the step's extend: allocate, compute
            del self.waiting[req.rid]
            if req.retracted:
                self.reached("retract-readmitted")
            failed = self._extend(req, pinned)
            if failed:
                self.admission_unsound(batch, failed)
        ran = self._first_decode(batch)
        return (f"admitted {', '.join(self._label(r) for r, _ in batch)} of "
                f"{len(batch) + len(self.waiting)} waiting; {ran}")

    def admit_one(self, req: Req, budget, admitted: int):
        """Judge one waiting request (``admitted`` already taken this pass): its pinned
        prefix (what ``_extend`` gets), or None when it is refused (the pass ends).  The
        default pins the match, asks the budget, and unpins a refused one.

        The public seam for batch admission: an engine whose adder matches, estimates and
        locks in one call overrides this alone and calls its adder here -- ``schedule`` keeps
        the waiting queue (``self.waiting``, rid -> request, oldest first), removes what is
        admitted, counts refusals and runs the batch's prefill and first decode step; a
        refusal ends the pass unless the budget says ``refusal_ends_pass = False``."""
        pinned = self._pin(req, admitted)
        if pinned is None:
            return None
        extend = len(req.tokens) - len(pinned[0])
        max_new = remaining_decode(req.max_new, req.output)
        if not budget.fits(extend, max_new, req):
            self._unpin(req, pinned)
            return None
        budget.reserve(extend, max_new, req)
        return pinned

    def _first_decode(self, batch) -> str:
        """The batch's first decode step; one that cannot allocate breaks
        ``admission-sound``.  Says what ran."""
        for req, _ in batch:
            if not self._decode_step(req):
                self.admission_unsound(batch, f"{self._label(req)}'s first decode step")
        return "prefilled, decoded one step"

    def _budget(self):
        """This pass's budget: ``fits(extend, max_new, req)``, ``reserve(extend, max_new,
        req)`` (``caches/admission.py``)."""
        return self.admission_rule()(self.page_size, self._free_and_evictable,
                                     running_reservation(self.requests.values()))

    def _extend(self, req: Req, pinned) -> str | None:
        """An admitted request's prefill over its pinned prefix: allocate, place, compute.
        None, or what failed to allocate."""
        prefix = len(pinned[0])
        if prefix:
            self.reached("prefix-hit")
        own = self._alloc_prefill(len(req.tokens) - prefix)
        if own is None:
            return f"{self._label(req)}'s prefill of {len(req.tokens) - prefix} tokens"
        self._place(req, pinned, own)
        self.kv_pool().write(own, self.expected_data(req.tokens)[prefix:])
        req.filled = len(req.tokens)
        self._advance(req)
        return None

    def admission_unsound(self, batch, what: str) -> None:
        """Report ``admission-sound`` broken: ``batch`` (``[(request, pinned)]``, the pass's
        admitted requests) was admitted, yet ``what`` failed to allocate.  Public: an engine's
        own ``admit_one``/``_first_decode`` calls it where its admitted work cannot run."""
        fail("admission-sound", f"the budget admitted {len(batch)} request(s) "
             f"({', '.join(self._label(r) for r, _ in batch)}) but {what} failed to allocate "
             f"({self._free_and_evictable()} tokens free or evictable)",
             batch=[r.rid for r, _ in batch])

    def waiting_state(self) -> tuple:
        """The waiting queue for the exhaustive search's state."""
        return tuple((rid, tuple(r.tokens), r.max_new, r.output, r.retracted)
                     for rid, r in self.waiting.items())

    def waiting_lines(self) -> list[str]:
        return [f"{self._label(r)}: waiting with {len(r.tokens)} tokens ({r.output} output)"
                for r in self.waiting.values()]

    def _label(self, req: Req) -> str:
        """How reports name a request."""
        return f"r{req.rid}"
