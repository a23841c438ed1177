"""The radix subject: a RadixCache-like object, its token pool, and a scheduler-like driver.

The driver calls the cache the way SGLang's scheduler does: admit = match (all but the last
token) + lock + allocate the rest with eviction; a prefill chunk writes KV fingerprints and, if
more chunks follow, ``cache_unfinished_req``; finish = ``cache_finished_req``; abort =
``cache_finished_req(is_insert=False)``.  Bare insert/match/lock/unlock exercise the tree API
directly; ``stray_unlock`` is an unmatched unlock the cache must refuse.

The rest of a request's life, as SGLang 0.5.23's scheduler runs it: ``decode`` (one slot per
step, a fresh page at a page boundary; the output joins the request's sequence, so
``finish`` then inserts prompt + output), ``spec_decode`` (draft slots allocated, the
rejected ones freed after the verify), ``retract`` (``managers/schedule_batch.py``
``retract_decode`` -> ``release_req``, lines 2360 and 3451: released without insert, reset by
``reset_for_retract`` (line 2049) and put back in the waiting queue as the same request, its
prompt + output so far), ``enqueue`` (a request arrives in the waiting queue) and
``schedule`` (one scheduling step: ``PrefillAdder`` admits waiting requests against one
budget, ``caches/admission.py``; then their prefill and first decode step run).  Property
``admission-sound``: an admitted batch whose step then fails to allocate is a violation.
Those ops are ``caches/subjects/lifecycle.py``'s, over this subject's hooks.  ``dllm_step`` (at
page_size > 1) is a diffusion LM's denoising step: the request's trailing page is its in-flight
block, rewritten over the same slots every step, then cached as the engine does
(``_dllm_checkpoint``; sgl-project/sglang issue #35270); a request mid-block takes no decode,
retract or finish.

Any object with the reference cache's interface (``match_prefix``, ``insert``,
``inc/dec_lock_ref``, ``evict``, ``alloc_with_eviction``, the two request paths, and the
readable state ``root_node``, ``evictable_size_``, ``protected_size_``, ``evictable_leaves``)
can be driven: that is how faults and upstream adapters plug in.  What differs between engines
is declared, not coded (``caches/seam.py``): ``node_fields`` (how the tree view reads its
nodes), ``results`` (what out-of-memory looks like, what ``evict`` returns), ``policy`` (the
eviction key and the accepted differences from the reference), and the eviction observer
(``observe_evictions`` / ``note_victim``: every victim, whoever started the eviction).
"""

from __future__ import annotations

from caches.lifecycle import decode_slot, trim_rejected
from caches.pools import PagedAllocator
from caches.radix import LockUnderflow, RadixCache
from caches.request import Req
from caches.seam import INDICES, REFERENCE_FIELDS, Policy, Results, read
from caches.seam import tree_view as seam_tree_view
from caches.subjects.base import Skip, Subject, watch
from caches.subjects.canon import Ref, Time, TreeState, Unordered, ids
from caches.subjects.lifecycle import VOCAB, Lifecycle
from caches.subjects.radix_fast import radix_fast_ok
from invariants import (NodeView, TreeView, check_conservation, check_eviction_set,
                        check_held_once, check_quiescence, check_ref_balance,
                        check_size_accounting, check_structure, evictable_leaves, fail)
from invariants.policy import (ceil_pages, check_no_over_eviction, check_no_spurious_oom,
                               check_recency, check_victims, evictable_tokens, shortfall_need)

# what the eviction observer counts (``Subject.reached``; not coverage transitions): eviction
# passes that freed something, and victims reported -- ``kvcheck coverage`` says so when a
# target evicts but reports no victim (the victim / over-eviction checks never ran on it)
PASSES, VICTIMS = "policy:eviction-passes", "policy:victims"


POISON = -7  # what a rejected draft's slot holds (never read as computed KV)


def evicted_something(got) -> bool:
    """Whether an eviction call's return value says it freed something, whatever the engine
    returns: a count (an int, a 0-d tensor), the freed slots (a list, a tensor -- whose truth value is an error when
    it holds several), a result object, or None (nothing said: counted as not)."""
    if got is None:
        return False
    numel = getattr(got, "numel", None)
    if callable(numel):  # a tensor: a 0-d one is a count, any other the freed slots
        return bool(got.item()) if got.dim() == 0 else numel() > 0
    try:
        return len(got) > 0
    except TypeError:
        pass
    try:
        return bool(got)
    except (TypeError, ValueError, RuntimeError):
        return True  # something came back that says nothing about its size

class RadixSubject(Lifecycle, Subject):
    variant = "radix"
    # the declarations (caches/seam.py); an adapter overrides what its engine does differently
    node_fields = REFERENCE_FIELDS
    results = Results()
    policy = Policy()

    def __init__(self, cache_cls=RadixCache, *, page_size: int = 1, pool_pages: int = 16,
                 device: str | None = None, cache=None):
        """``cache_cls(pool, page_size)`` over a token pool built here, or ``cache``: an
        engine's cache already built over the pool it owns (``cache.pool``)."""
        super().__init__()
        self.page_size = page_size
        if cache is None:
            self.pool = PagedAllocator(pool_pages, page_size, device, name="kv")
            self.cache = cache_cls(self.pool, page_size)
        else:
            self.pool, self.cache = cache.pool, cache
        # an allocation may evict at most once per page (plus one empty try) before it must
        # either succeed or report out-of-memory
        self.waiting: dict[int, Req] = {}  # the scheduler's waiting queue, in arrival order
        self.cache.evict = self.bounded(self.cache.evict, pool_pages + 2,
                                        lambda: self.cache.evictable_size_)
        self._watch_transitions()
        self._watch_policy()

    # -- serving operations ---------------------------------------------------------------
    def admit(self, rid: int, tokens: list[int]) -> str:
        if rid in self.requests or rid in self.waiting:
            raise Skip(f"r{rid} is already live or waiting")
        match = self._match(tokens[:-1])
        prefix = len(match.indices)
        self.verify_data(self.pool, match.indices, tokens, f"r{rid} prefix hit, ")
        if prefix:
            self.reached("prefix-hit")
        self._note_shared_lock(match.last_node)
        self.cache.inc_lock_ref(match.last_node)
        own = self._alloc(len(tokens) - prefix)
        if own is None:
            self.cache.dec_lock_ref(match.last_node)
            return f"out of memory: {len(tokens) - prefix} tokens needed, r{rid} not admitted"
        self.requests[rid] = Req(rid, list(tokens), list(match.indices) + own, filled=prefix,
                                 cache_protected_len=prefix, last_node=match.last_node)
        return f"hit {prefix} of {len(tokens)} tokens, allocated {len(own)}"

    def prefill(self, rid: int, n: int) -> str:
        req = self.req(rid)
        if req.filled >= len(req.tokens):
            raise Skip(f"r{rid} is fully prefilled")
        k = min(n, len(req.tokens) - req.filled)
        span = req.kv_indices[req.filled:req.filled + k]
        self.pool.write(span, self.expected_data(req.tokens)[req.filled:req.filled + k])
        req.filled += k
        if req.filled < len(req.tokens):
            before = req.cache_protected_len
            self.cache.cache_unfinished_req(req)
            if req.cache_protected_len > before:
                self.reached("chunk-cached")
            return f"computed {k} tokens ({req.filled}/{len(req.tokens)}), cached unfinished"
        return f"computed {k} tokens, prefill complete"

    def finish(self, rid: int) -> str:
        req = self.req(rid)
        if req.filled < len(req.tokens):
            raise Skip(f"r{rid} is still prefilling")
        if req.volatile:  # SGLang finishes a dLLM request only on a resolved block
            raise Skip(f"r{rid} has an in-flight dLLM block")
        self.verify_data(self.pool, req.kv_indices, req.tokens, f"r{rid} at finish, ")
        if len(req.tokens) % self.page_size:
            self.reached("partial-page-tail")
        if req.output:
            self.reached("output-inserted")
        self.cache.cache_finished_req(req)
        del self.requests[rid]
        return "finished, KV handed to the tree"

    def abort(self, rid: int) -> str:
        req = self.req(rid)
        if req.filled < len(req.tokens):
            self.reached("abort-mid-prefill")
        self.cache.cache_finished_req(req, is_insert=False)
        del self.requests[rid]
        return f"aborted after {req.filled}/{len(req.tokens)} tokens"

    def evict(self, n: int) -> str:
        return f"evicted {self._evict_tokens(n)} tokens"

    def cache_duplicates(self, slots: list[int]) -> list[int]:
        """Of an insert's slots over what the tree already had, those the caller frees (all:
        a cache that adopts some, hybrid-swa's tombstone recovery, says which it kept)."""
        return slots

    def evicted(self, got) -> int:
        """Tokens an ``evict`` call freed, from what it returned (``results.evict_returns``):
        a count, or the indices it took out of the tree, which the caller frees here."""
        if self.results.evict_returns == INDICES:
            freed = list(got)
            self.pool.free(freed)
            return len(freed)
        return got

    def insert(self, tokens: list[int]) -> str:
        slots = self._alloc(len(tokens))
        if slots is None:
            return "out of memory"
        self.pool.write(slots, self.expected_data(tokens))
        if len(tokens) % self.page_size:
            self.reached("partial-page-tail")
        prefix = self.cache.insert(tokens, slots)
        aligned = len(tokens) // self.page_size * self.page_size
        # what the tree had (less what it adopted), the loose tail
        self.pool.free(self.cache_duplicates(slots[:prefix]) + slots[aligned:])
        return f"tree already had {prefix} tokens"

    def match(self, tokens: list[int]) -> str:
        match = self._match(tokens)
        self.verify_data(self.pool, match.indices, tokens, "match, ")
        return f"hit {len(match.indices)} tokens"

    def lock(self, hid: int, tokens: list[int]) -> str:
        if hid in self.locks:
            raise Skip(f"lock l{hid} is already held")
        match = self._match(tokens)
        if match.last_node is self.cache.root_node:
            return "nothing matched, nothing locked"
        self._note_shared_lock(match.last_node)
        self.cache.inc_lock_ref(match.last_node)
        self.locks[hid] = match.last_node
        return f"locked {len(match.indices)} tokens at node {match.last_node.id}"

    def unlock(self, hid: int) -> str:
        if hid not in self.locks:
            raise Skip(f"lock l{hid} is not held")
        self.cache.dec_lock_ref(self.locks.pop(hid))
        return "unlocked"

    def stray_unlock(self, tokens: list[int]) -> str:
        node = self._match(tokens).last_node
        if node is self.cache.root_node or self.held_locks_below(node):
            raise Skip("the node is held by a live holder")
        try:
            self.cache.dec_lock_ref(node)
        except LockUnderflow:
            self.reached("stray-unlock-rejected")
            return "rejected (lock underflow)"
        return "accepted"

    # -- past the prefill (caches/subjects/lifecycle.py): this cache's hooks ---------------
    def kv_pool(self):
        return self.pool

    def _decode_alloc(self, req: Req):
        """One decode slot: the cache's own ``decode_slot``, or (an engine adapter, whose
        scheduler allocates) the same rule over its allocation."""
        ps = self.page_size
        if ps > 1 and len(req.kv_indices) % ps == 0:
            self.reached("decode-new-page")
        self.cache.evict.reset()
        self._evict_calls = 0
        own = getattr(self.cache, "decode_slot", None)
        return own(req) if own is not None else decode_slot(req.kv_indices, ps,
                                                            self.cache.alloc_with_eviction)

    def _release_no_insert(self, req: Req) -> None:
        release = getattr(self.cache, "release_req", None)
        if release is not None:
            release(req)
        else:  # an adapter: its engine's release path without insert
            self.cache.cache_finished_req(req, is_insert=False)

    def _pin(self, req: Req, admitted: int):
        match = self._match(req.tokens[:-1])
        self.verify_data(self.pool, match.indices, req.tokens, f"r{req.rid} prefix hit, ")
        self._note_shared_lock(match.last_node)
        self.cache.inc_lock_ref(match.last_node)
        return match.indices, match.last_node

    def _unpin(self, req: Req, pinned) -> None:
        self.cache.dec_lock_ref(pinned[1])

    def _place(self, req: Req, pinned, own: list[int]) -> None:
        prefix, node = pinned
        req.kv_indices = list(prefix) + own
        req.filled = req.cache_protected_len = len(prefix)
        req.last_node = node
        self.requests[req.rid] = req

    def _alloc_prefill(self, n: int):
        return self._alloc(n)

    def _free_and_evictable(self) -> int:
        return self.free_tokens() + self.cache.evictable_size_

    def _free_kv_tokens(self) -> int:
        return self.free_tokens()

    def _evict_tokens(self, n: int) -> int:
        self.cache.evict.reset()
        return self.evicted(self.cache.evict(n))

    def _free_rejected(self, req: Req, keep: int) -> None:
        own = getattr(self.cache, "free_rejected", None)
        if own is not None:
            own(req, keep)
        else:
            trim_rejected(req.kv_indices, keep, self.page_size, self.pool.free)

    def spec_decode(self, rid: int, draft: int, accepted: int) -> str:
        """One speculative step: slots for the last token + ``draft`` drafts, ``accepted + 1``
        computed, the rejected drafts' slots freed (SGLang's EAGLE worker at topk 1)."""
        self._takes("spec_decode")
        req = self._decoding(rid)
        accepted = min(accepted, draft)
        c = len(req.kv_indices)
        if not self._grow_row(req, draft + 1):
            return "out of memory, step not run"
        for _ in range(accepted + 1):
            req.tokens.append(self._sample(req))
        req.output += accepted + 1
        row = req.kv_indices
        self.pool.write(row[c:c + accepted + 1], self.expected_data(req.tokens)[c:])
        self.pool.write(row[c + accepted + 1:], [POISON] * (draft - accepted))
        req.filled = c + accepted + 1
        self._free_rejected(req, req.filled)
        self._sync_row(req)
        if accepted < draft:
            self.reached("spec-draft-rejected")
        return f"accepted {accepted} of {draft} drafts: {req.filled} tokens computed"

    # -- diffusion LM (dLLM) blocks: a trailing page rewritten every denoising step -------------
    def dllm_step(self, rid: int, resolve: int) -> str:
        """One denoising forward of a decoding dLLM request (SGLang 0.5.23's FDFO dLLM path,
        ``dllm/mixin/scheduler.py``).  The block is the request's trailing page
        (``arg_groups/overrides.py`` ``_dllm_page_size`` pins ``page_size`` to the dLLM
        ``block_size``, and blocks start on block boundaries: ``ReqDllmMixin.
        _update_block_offset_for_dllm``).  Without an in-flight block one starts: the positions
        that complete the trailing page (a whole page when the row ends on a boundary), their
        slots allocated like decode slots; the page's committed tokens stay as they are.
        Every step rewrites the new positions' ids in full (``dllm_incomplete_ids`` is
        reassigned) over the **same** KV slots (an unresolved block keeps its slots across
        rounds, ``mem_cache/allocation.py`` ``reuse_kv``, sgl-project/sglang PR #27877) and
        writes the whole page's KV again (attention is bidirectional inside a block); with
        ``resolve`` the ids are final (committed as output).  Then the step is cached as the
        engine does (``_dllm_checkpoint``)."""
        self._takes("dllm_step")
        req = self.req(rid)
        if req.filled < len(req.tokens):
            raise Skip(f"r{rid} is still prefilling")
        ps = self.page_size
        if not req.volatile:
            c = len(req.kv_indices)
            n = ps - c % ps
            if not self._grow_row(req, n):
                return "out of memory, no block started"
            req.tokens.extend((rid + i) % VOCAB for i in range(n))
            req.volatile, req.filled = n, c + n
            self._sync_row(req)
            what = "new block"
        else:  # the next version of the block: every undecided id changes
            start = len(req.tokens) - req.volatile
            req.tokens[start:] = [(t + 1) % VOCAB for t in req.tokens[start:]]
            self.reached("dllm-block-rewritten")
            what = "block rewritten"
        page = len(req.tokens) - ps
        self.pool.write(req.kv_indices[page:], self.expected_data(req.tokens)[page:])
        if resolve:
            req.output += req.volatile
            req.volatile = 0
            what += ", resolved"
        self._dllm_checkpoint(req)
        return (f"{what}: positions {page}..{len(req.tokens) - 1} are {req.tokens[page:]}; "
                f"the tree owns {req.cache_protected_len}")

    def _grow_row(self, req: Req, n: int) -> bool:
        """``n`` more slots on ``req``'s row, a decode slot each (a fresh page at a page
        boundary); out of memory: the ones taken go back, and False."""
        c = len(req.kv_indices)
        for _ in range(n):
            slot = self._decode_alloc(req)
            if slot is None:
                self.reached("out-of-memory")
                self._free_rejected(req, c)
                self._sync_row(req)
                return False
            req.kv_indices.append(slot)
        return True

    def _dllm_checkpoint(self, req: Req) -> None:
        """What the scheduler caches after a denoising forward: ``cache_unfinished_req`` every
        step (the call of ``stash_chunked_request`` as sgl-project/sglang issue #35270 describes
        it); the reference cache keys only on the final tokens (``RadixCache._cacheable_len``,
        PR #35470).  An upstream subject follows its release's scheduler."""
        self.cache.cache_unfinished_req(req)

    def _decoding(self, rid: int) -> Req:
        req = super()._decoding(rid)
        if req.volatile:  # a dLLM request generates by blocks: no decode / retract mid-block
            raise Skip(f"r{rid} has an in-flight dLLM block")
        return req

    # -- helpers --------------------------------------------------------------------------
    def _alloc(self, n: int):
        self.cache.evict.reset()
        self._evict_calls = 0
        got = self.cache.alloc_with_eviction(n)
        if self.results.out_of_memory(got):
            self.reached("out-of-memory")
            return None
        elif self._evict_calls:
            self.reached("alloc-evicted")
        return got

    # -- reachability ("sometimes") coverage: transitions seen from the outside ---------------
    def _note_shared_lock(self, node) -> None:
        if node is not self.cache.root_node and getattr(node, "lock_ref", 0) > 0:
            self.reached("shared-lock")

    def _watch_transitions(self) -> None:
        """Count node splits, leaves gaining a child and cascading evictions by wrapping
        those cache methods on this instance (the cache itself carries no harness code; a
        cache without them just reports fewer transitions)."""
        self._deleted, self._evict_calls = None, 0
        self._watch_tree(self.cache)
        self.cache.evict = self.counting_evictions(self.cache.evict)

    def counting_evictions(self, evict):  # (an engine's evict may return anything: see below)
        """``evict`` (any entry point into an eviction pass) counted as an eviction call, with
        the cascade-eviction coverage of the victims the pass reports (``note_victim``); a
        nested call counts but leaves the outermost its victims."""
        subject = self

        def watched_evict(*args, **kwargs):
            subject._evict_calls += 1
            outer = subject._deleted is None
            if outer:
                subject._deleted = []
            try:
                got = evict(*args, **kwargs)
                if outer and evicted_something(got):
                    subject.reached(PASSES)
                return got
            finally:
                if outer:
                    gone, subject._deleted = subject._deleted, None
                    ids = {vid for vid, _ in gone}
                    if any(parent in ids for _, parent in gone):
                        subject.reached("cascade-eviction")

        if hasattr(evict, "reset"):
            watched_evict.reset = evict.reset
        return watched_evict

    # -- the eviction observer (public: any engine's adapter declares where its victims go) ---
    def observe_evictions(self, obj, *, passes=(), victim: str | None = None,
                          node_id=None, parent_id=None, allocs=None) -> None:
        """Watch an engine object's own eviction path, on the instance (the class is not
        touched), so evictions the engine starts by itself -- its scheduler calling
        ``self.tree.evict`` -- are seen as well as the driver's:

        * ``passes``: names of methods of ``obj`` that are one eviction pass each (their first
          argument is the tokens asked for): the victims reported inside one call are judged
          together (``victim``, ``over-eviction``), the call is counted (coverage);
        * ``victim``: the name of the method ``obj`` calls once per node it removes, the node
          as its first argument; ``node_id(node)`` / ``parent_id(node)`` give the node's and
          its parent's ids in the tree view (default: read through ``node_fields``, relative
          to the root).  An engine without such a method calls ``note_victim`` itself;
        * ``allocs``: ``{method name: demand}`` -- allocate-with-eviction entry points of
          ``obj``, as ``alloc_demands`` (spurious-OOM and the allocation's over-eviction).
        Methods named here must exist (a typo is an error, never a silently skipped check)."""
        for name in (*passes, *(allocs or {}), *([victim] if victim else [])):
            if not callable(getattr(obj, name, None)):
                raise AttributeError(f"{type(obj).__name__} has no method {name!r} to observe")
        for name in passes:
            setattr(obj, name, self.policy_pass(self.counting_evictions(getattr(obj, name))))
        for name, demand in (allocs or {}).items():
            setattr(obj, name, self.policy_alloc(getattr(obj, name), demand))
        if victim:
            fields, subject = self.node_fields, self
            if node_id is None:
                root = self.raw_root_of(obj)
                node_id = lambda n: read(fields.id, n) - read(fields.id, root)  # noqa: E731

            def parent_of(n):
                p = read(fields.parent, n)
                return None if p is None else node_id(p)

            parent_id = parent_id or parent_of
            watch(obj, victim, before=lambda n, *a: subject.note_victim(node_id(n),
                                                                        parent_id(n)))

    def raw_root_of(self, obj):
        """The engine's root node, for ids relative to it: ``raw_tree_root()``, else
        ``obj.root_node``."""
        root = self.raw_tree_root()
        return root if root is not None else obj.root_node

    def note_victim(self, vid, parent=None) -> None:
        """Node ``vid`` (its id in the tree view; ``parent`` its parent's) is about to be
        removed: a victim of the eviction pass and the allocation in progress, judged with
        the tree as it was before the pass's first removal.  The public hook: an adapter whose
        engine has no per-victim method to observe calls it for each node it removes."""
        if self._deleted is not None:
            self._deleted.append((vid, parent))
        self.reached(VICTIMS)
        view = None
        if self._evict_victims is not None:
            if self._evict_view is None:  # the first deletion: the tree before it
                view = self._evict_view = self.tree_view(times=True)
            self._evict_victims.append(vid)
        if self._alloc_victims is not None:
            if self._alloc_view is None:
                self._alloc_view = view or self.tree_view(times=True)
            self._alloc_victims.append(vid)

    # -- policy: the right victim, no spurious OOM, no over-eviction, hits refresh ------------
    # (invariants/policy.py).  Around the cache's evict, its allocation and its match, the
    # subject captures plain data -- the view before, the victims' ids, the access times -- and
    # ``check_policy`` (after every step) checks it against the policy this subject declares.
    _evict_victims = _alloc_victims = None  # ids deleted by the evict/alloc call in progress
    _evict_view = _alloc_view = None  # the tree before that call's first deletion

    def alloc_demands(self) -> dict:
        """The cache's allocate-with-eviction entry points, each with its declared demand:
        ``demand(args, free) -> (tokens of whole pages it takes, tokens the policy needs
        evicted)`` for a call ``method(*args)`` with ``free`` tokens free.  The reference
        evicts exactly the shortfall."""
        ps = self.page_size

        def shortfall(args, free):
            alloc = ceil_pages(args[0], ps)
            return alloc, shortfall_need(alloc, free)

        return {"alloc_with_eviction": shortfall}

    def free_tokens(self) -> int:
        return len(self.pool.free_pages) * self.page_size

    def policy_pass(self, evict):
        """``evict`` wrapped as one eviction pass of the policy checks: the victims reported
        while it runs are judged together against its first argument, the tokens asked."""
        subject = self

        # the views "before" an eviction are taken lazily, at its first deletion (nothing
        # changes the tree before it); a call that deletes nothing needs no view
        def policy_evict(num_tokens, *args, **kwargs):
            if not subject.checking or subject._evict_victims is not None:
                return evict(num_tokens, *args, **kwargs)
            subject._evict_victims, subject._evict_view = [], None
            try:
                return evict(num_tokens, *args, **kwargs)
            finally:
                victims, subject._evict_victims = subject._evict_victims, None
                if victims:
                    subject._policy_events.append(("evict", num_tokens, subject._evict_view,
                                                   victims))

        if hasattr(evict, "reset"):
            policy_evict.reset = evict.reset
        return policy_evict

    def policy_alloc(self, alloc, demand):
        """An allocate-with-eviction entry point wrapped for the policy checks (``demand`` as
        in ``alloc_demands``): a failed one must not be spurious, a successful one may not
        evict past its need."""
        subject = self

        def wrapped(*args, **kwargs):
            if not subject.checking or subject._alloc_victims is not None:
                return alloc(*args, **kwargs)  # nested in another allocation
            free = subject.free_tokens()
            subject._alloc_victims, subject._alloc_view = [], None
            try:
                got = alloc(*args, **kwargs)
            finally:
                victims, subject._alloc_victims = subject._alloc_victims, None
            oom = subject.results.out_of_memory(got)
            if victims or oom:
                before = subject._alloc_view or subject.tree_view(times=True)
                subject._policy_events.append(("alloc", demand(args, free), before,
                                               victims, free, None if oom else got))
            return got
        return wrapped

    def _watch_policy(self) -> None:
        cache, subject = self.cache, self
        self._policy_events: list = []
        match = cache.match_prefix

        def policy_match(key, *args, **kwargs):
            if not subject.checking:
                return match(key, *args, **kwargs)
            latest = subject.latest_access()
            out = match(key, *args, **kwargs)
            path, node = [], out.last_node
            while node is not None and node is not cache.root_node:
                path.append((node.id, node.last_access_time))
                node = node.parent
            subject._policy_events.append(("match", len(key), latest, path[::-1]))
            return out

        cache.evict = self.policy_pass(cache.evict)
        for name, demand in self.alloc_demands().items():
            setattr(cache, name, self.policy_alloc(getattr(cache, name), demand))
        cache.match_prefix = policy_match

    def check_policy(self) -> None:
        """The policy events of the step(s) since the last check, then forget them."""
        events = self._policy_events
        if not events:  # (most steps: no eviction, allocation failure or match to check)
            return
        self._policy_events = []
        key, ps = self.policy.key, self.page_size
        for ev in events:
            if ev[0] == "evict":
                _, asked, before, victims = ev
                what = f"evict({asked})"
                check_victims(before, victims, key, what=what,
                              cascade_exposes=self.policy.cascade_exposes)
                check_no_over_eviction(what, ceil_pages(asked, ps),
                                       [(v, len(before.nodes[v].value)) for v in victims])
            elif ev[0] == "alloc":
                _, (alloc, need), before, victims, free, got = ev
                what = f"allocating {alloc} tokens ({free} free)"  # victims: evict events
                if got is None:
                    check_no_spurious_oom(what, alloc, free, evictable_tokens(before))
                else:
                    check_no_over_eviction(what, need, [(v, len(before.nodes[v].value))
                                                        for v in victims])
            else:
                _, n, latest, path = ev
                check_recency(f"match of a {n}-token key", latest, path)

    def _watch_tree(self, tree) -> None:
        """The tree-internal transitions, on ``tree`` (the cache, or the upstream tree an
        adapter wraps): splits, a leaf gaining a child, deleted leaves (for cascades)."""
        subject = self

        def add(parent, *args):
            if parent is not tree.root_node and not parent.children:
                subject.reached("leaf-gains-child")

        watch(tree, "_split_node", before=lambda *a: subject.reached("node-split"))
        watch(tree, "_add_leaf", before=add)
        if callable(getattr(tree, "_delete_leaf", None)):  # the reference's (and SGLang's) name
            base = tree.root_node.id  # SGLang numbers nodes globally: ids relative to the root
            self.observe_evictions(tree, victim="_delete_leaf", node_id=lambda n: n.id - base,
                                   parent_id=lambda n: None if n.parent is None
                                   else n.parent.id - base)

    def held_locks_below(self, node) -> int:
        held = self.held_locks()
        stack, total = [node], 0
        while stack:
            cur = stack.pop()
            total += held.get(cur.id, 0)
            stack.extend(cur.children.values())
        return total

    def _match(self, key):
        """``match_prefix`` with its contract checked: an aligned prefix of the key, and an
        empty match ends at the root.  A match that raises breaks the contract too."""
        try:
            match = self.cache.match_prefix(key)
        except Exception as exc:
            if 0 < len(key) < self.page_size:
                self.reached("sub-page-match")
            fail("match-contract", f"match of a {len(key)}-token key raised "
                 f"{type(exc).__name__}: {exc}", key_len=len(key), page_size=self.page_size)
        if 0 < len(key) < self.page_size:
            self.reached("sub-page-match")
        if self.checking:
            self._check_match(key, match)
        return match

    def _check_match(self, key, match) -> None:
        aligned = len(key) // self.page_size * self.page_size
        n = len(match.indices)
        if n > aligned or n % self.page_size:
            fail("match-contract", f"match of a {len(key)}-token key returned {n} tokens; at "
                 f"most {aligned} (page-aligned) may match", key_len=len(key), hit=n,
                 page_size=self.page_size)
        if n == 0 and match.last_node is not self.cache.root_node:
            fail("match-contract", f"match of a {len(key)}-token key returned an empty prefix "
                 f"but node {match.last_node.id} as its last node", key_len=len(key),
                 node=match.last_node.id)

    # -- views and checks -------------------------------------------------------------------
    def latest_access(self):
        """The latest access time in the tree (what a hit must be later than)."""
        latest, stack = 0, [self.cache.root_node]
        while stack:
            n = stack.pop()
            if n.last_access_time > latest:
                latest = n.last_access_time
            stack.extend(n.children.values())
        return latest

    def tree_view(self, times: bool = False) -> TreeView:
        """The tree; with ``times`` each node's ``extra["time"]`` is its last access time
        (what the policy checks read; the drawings leave it out).  Read from the engine's
        nodes through ``node_fields`` when ``raw_tree_root()`` names them."""
        raw = self.raw_tree_root()
        if raw is not None:
            return seam_tree_view(raw, self.node_fields, self.page_size, times=times)
        nodes, stack = {}, [self.cache.root_node]
        while stack:
            n = stack.pop()
            if n.id in nodes:
                continue
            nodes[n.id] = NodeView(n.id, n.parent.id if n.parent is not None else None,
                                   tuple(n.key), tuple(n.value), {"lock": n.lock_ref},
                                   {ck: c.id for ck, c in n.children.items()},
                                   {"time": n.last_access_time} if times else {})
            stack.extend(n.children.values())
        return TreeView(nodes, self.cache.root_node.id, self.page_size)

    def raw_tree_root(self):
        """The engine's own root node, read through ``node_fields`` (None: the cache's nodes
        already have kvcheck's names)."""
        return None

    def check_tree(self, tree) -> None:
        """The tree's own properties: counters, refs, links, the eviction set."""
        check_size_accounting(tree, self.cache.evictable_size_, self.cache.protected_size_)
        check_ref_balance(tree, self.held_locks())
        check_structure(tree, getattr(self, "partial_pages", False))
        check_eviction_set("evictable_leaves", [n.id for n in self.cache.evictable_leaves],
                           evictable_leaves(tree))
        self.check_policy()

    def tree_slots(self, tree: TreeView) -> list[int]:
        """The slots the tree owns (conservation); a subject whose view cannot show the
        nodes reads them from the cache instead."""
        return [s for n in tree.nodes.values() for s in n.value]

    def check(self) -> None:
        """Every invariant after every op.  On the reference cache the one-walk fast verdict
        (``radix_fast.py``) answers first, and then only the policy checks (of the evictions and
        matches this op made) run; when it sees anything wrong the view is built and every
        check runs, to say what broke.  Upstream adapters (whose caches are not
        ``RadixCache``) always take the view-based checks."""
        if self.fast_check and isinstance(self.cache, RadixCache) and radix_fast_ok(self):
            self.check_policy()
            return
        tree = self.tree_view()
        self.check_tree(tree)
        slots = self.tree_slots(tree)
        check_held_once(self.pool.name, "the tree", slots)
        pages = self.pool.pages_of
        owners = {"tree": pages(slots)}
        borrowed = {}
        for rid, req in self.requests.items():
            owners[f"request r{rid}"] = pages(req.own_indices)
            borrowed[f"request r{rid}"] = pages(req.borrowed_indices)
        check_conservation(self.pool.view(), owners, borrowed)

    fast_check = True  # False: always build the view (the fast path's side-by-side test)

    def drain(self) -> None:
        self.waiting.clear()  # a waiting request holds nothing
        for rid in self.live():  # a dLLM request mid-block finishes only on a resolved block
            if self.requests[rid].volatile:
                self.abort(rid)
        self.release_holders()
        while self.cache.evictable_size_ > 0:
            self.evict(self.pool.num_pages * self.page_size)

    def check_quiescent(self) -> None:
        check_quiescence(self.tree_view(), [self.pool.view()], {"lock": 1})

    def state(self) -> TreeState:
        """The exhaustive search's state (``canon.py``): the tree's keys, values (pages and
        offsets), fingerprints of the slots a hit reads back, lock refs, the LRU order (access
        times by ``(last_access_time, id)``: the eviction heap's order), the counters and the
        evictable-leaf set, every live request and lock, and the free-list order (it decides
        which pages the next allocation gets)."""
        ps, data = self.page_size, self.pool.data.tolist()
        return TreeState(
            self.cache.root_node,
            lambda n: (n.key, ids("kv", n.value, ps), tuple(data[v] for v in n.value),
                       n.lock_ref, Time((n.last_access_time, n.id))),
            (tuple((rid, tuple(r.tokens), ids("kv", r.kv_indices, ps),
                    tuple(data[v] for v in r.kv_indices[:r.filled]), r.filled,
                    r.cache_protected_len, Ref(r.last_node), r.max_new, r.output, r.volatile)
                   for rid, r in sorted(self.requests.items())),
             self.waiting_state(),
             tuple((hid, Ref(n)) for hid, n in sorted(self.locks.items())),
             ids("kv", self.pool.free_pages),
             Unordered(Ref(n) for n in self.cache.evictable_leaves),
             self.cache.evictable_size_, self.cache.protected_size_))

    def abstract_state(self) -> dict:
        """What ``kvcheck diff`` compares between two radix targets after each step: every
        cached token path with its lock count (not node ids, slot ids or clocks), the counters,
        and each live request's progress.  A subject that cannot show its nodes leaves
        ``tree`` out (only the fields both sides report are compared)."""
        tree = self.tree_view()
        paths = self.token_paths(tree)
        out = [(paths[n.id], n.refs.get("lock", 0)) for n in tree.walk() if n.id != tree.root]
        return {"tree": tuple(sorted(out)), **self.counters(),
                "requests": tuple((rid, r.filled, len(r.tokens))
                                  for rid, r in sorted(self.requests.items()))}

    @staticmethod
    def token_paths(tree: TreeView) -> dict:
        """Each node's token path from the root (what ``kvcheck diff`` names nodes by)."""
        paths = {tree.root: ()}
        for n in tree.walk():  # parents before children
            if n.id != tree.root:
                paths[n.id] = paths.get(n.parent, ()) + tuple(n.key)
        return paths

    def counters(self) -> dict:
        return {"evictable": self.cache.evictable_size_,
                "protected": self.cache.protected_size_,
                "free_pages": len(self.pool.free_pages), "live": len(self.requests),
                "waiting": len(self.waiting)}

    def outline(self) -> str:
        lines, held = [], self.held_locks()

        def walk(node, depth):
            if node is self.cache.root_node:
                lines.append(f"root  ref={node.lock_ref}")
            else:
                state = "protected" if node.lock_ref > 0 else "evictable"
                holders = f" held by {held[node.id]}" if held.get(node.id) else ""
                lines.append(f"{'  ' * depth}#{node.id} {list(node.key)} ref={node.lock_ref} "
                             f"{state} slots={list(node.value)}{holders}")
            for _, child in sorted(node.children.items(), key=lambda kv: str(kv[0])):
                walk(child, depth + 1)

        walk(self.cache.root_node, 0)
        for rid in self.live():
            r = self.requests[rid]
            lines.append(f"r{rid}: {r.filled}/{len(r.tokens)} computed, tree owns "
                         f"{r.cache_protected_len}, holds #{r.last_node.id}"
                         + (f", in-flight dLLM block {r.volatile}" if r.volatile else ""))
        for hid, node in sorted(self.locks.items()):
            lines.append(f"l{hid}: locks #{node.id}")
        lines.extend(self.waiting_lines())
        return "\n".join(lines)
