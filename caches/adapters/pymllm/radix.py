"""``--target pymllm`` for the radix variant: pymllm's real ``RadixCache`` under our machine.

pymllm (``pymllm/mem_cache/radix_cache.py`` of UbiquitousLearning/mllm, loaded from ``--src``
by ``loader.py``) is derived from SGLang's cache, but its scheduler drives it differently, and
the driver is part of this target.  Behind the adapter sit pymllm's own objects: ``RadixCache``
(no sliding window, no eviction callback: the plain-attention configuration),
``TokenToKVPoolAllocator`` and ``ReqToTokenPool`` -- all build on CPU, nothing is stood in.

Pools as pymllm's model runner wires them (``executor/model_runner.py``
``make_full_attention_net_mem_pool``): the allocator is always token-granular (its
``page_size`` is left at 1, ``need_sort=True``), while the tree takes the server's
``radix_cache_page_size`` (any value >= 1, ``configs/server_config.py``).  The regime's
``page_size`` is that tree page size; ``pool_pages * page_size`` is the allocator's size in
tokens (slot ids 1..size; slot 0 is pymllm's padding slot, never handed out).

The driver: pymllm has no ``cache_unfinished_req``/``cache_finished_req``; its
``orchestrator/model_runner_process.py`` (``ModelRunnerProcess``) calls the tree directly.
Each op follows it (line numbers of b9c307020b):

* ``admit`` = ``_allocate_extend`` (651-880): ``match_prefix`` of the **whole** prompt (not all
  but the last token); if the hit leaves fewer than 2 tokens to extend, it is cut to
  ``len - 2`` (the node stays the matched one); ``inc_lock_ref`` on the matched node only when
  the (cut) hit is non-empty, *before* allocating; a request-table row
  (``ReqToTokenPool.alloc``); then ``_alloc_kv_with_eviction`` (896-940): ``alloc``, and when
  short, up to 3 rounds of "``evictable_size() == 0`` -> fail, else
  ``evict(max(n, 10% of the pool))`` and ``alloc`` again".  On failure the row is freed and the
  lock rolled back (``_unlock_matched_nodes``) -- the harness reports "out of memory".
* ``prefill`` = the forward of that extend: pymllm has no chunked prefill and calls nothing on
  the cache until the extend's forward is done, so a chunk that leaves tokens uncomputed only
  writes their fingerprints; the chunk that completes the prompt (``n`` = 0 tokens is allowed
  when the hit left nothing to compute) runs ``_insert_into_radix_cache`` (511-649): ``insert``
  the prompt with the request's row, free the duplicates ``row[cache_protected_len:
  prefix_len]``, ``match_prefix`` again and write the tree's indices back into the row,
  ``cache_protected_len = len(rematch)``, move the lock (``dec_lock_ref`` old,
  ``inc_lock_ref`` on the rematched node when non-empty).  The page-1 assert on the rematch
  length is upstream's and kept.
* ``finish`` and ``abort`` of a request whose extend ran = ``_free_rid_resources`` (994-1119):
  ``insert`` the sequence again, free ``row[cache_protected_len:prefix_len]``, ``dec_lock_ref``,
  free the row.  pymllm's abort only flags the request (``Req.abort``); it is freed after the
  batch by the same function, so an abort is a finish.  After ``decode`` steps ``tokens`` is
  the prompt + output and the finish inserts both.
* ``decode`` = ``_allocate_decode``: one slot per step (token-granular allocator, the same
  eviction rounds), written into the request's row.
* ``abort`` of a request whose extend has not completed = ``_free_rid_resources``' branch for
  a release without insert ("cache enabled but insert skipped"): free
  ``row[cache_protected_len:]``, ``dec_lock_ref``, free the row.
* ``insert``/``match``/``lock``/``unlock``/``evict`` call the tree API directly (a bare insert
  frees what the tree already had, ``[0, prefix_len)``, like the runner's dedup with nothing
  protected).  ``stray_unlock`` is an unmatched ``dec_lock_ref``.

Ledger: after the post-extend insert the tree owns every slot of the prompt and the request
only reads its row (the runner's own ownership comment, 1002-1016), whatever pymllm's
``cache_protected_len`` says; the driver keeps pymllm's value separately, for the frees it
drives.

Partial pages: pymllm's ``insert`` does not page-align the key (only ``match_prefix`` does), so
at page_size > 1 its tree keeps partial last pages; the subject declares ``partial_pages`` and
the structure check then allows a non-page-multiple key on a leaf only (a partial page can only
end a path: a walk enters a child only by a whole first page or by an identical partial one).

Not reached: ``retract``, ``schedule``, ``spec_decode`` and ``dllm_step`` (declined,
``lifecycle_declined``: the checkout this target loads holds ``pymllm/mem_cache`` only, not the
scheduler, whose dLLM path -- if it has one -- the diffusion step would follow); the
sliding-window (SWA tombstone) paths; the GDN track-slot eviction
callback of hybrid models; ``ChunkCache``.

Node ids are pymllm's ``TreeNode.id`` minus the root's: creation order in this tree.
"""

from __future__ import annotations

import inspect
from typing import Iterable

import torch

from caches.adapters import KnownUpstreamFinding, declined_findings
from caches.adapters.raw_radix import (RADIX_KEY_FIELDS, MatchResult, RawNode, RawNodes,
                                       check_request_rows)
from caches.seam import tree_view as seam_tree_view
from caches.adapters.pymllm import loader
from caches.pools import _DataTensor, resolve_device
from caches.radix import LockUnderflow
from caches.reporting import Built
from caches.request import Req
from caches.subjects.base import Skip
from caches.subjects.radix import RadixSubject
from invariants import PoolView, TreeView

EVICT_FRACTION = 0.10  # upstream: model_runner_process.py _EVICT_FRACTION
MAX_EVICT_RETRIES = 3  # upstream: _MAX_EVICT_RETRIES


class Node(RawNode):
    """One pymllm ``TreeNode``."""

    __slots__ = ()
    engine = "pymllm"


class PymllmPool(_DataTensor):
    """pymllm's ``TokenToKVPoolAllocator`` (token-granular) as a harness pool: its free list
    (``free_slots`` + the lazily merged ``release_slots``), plus the fingerprint tensor."""

    unit = "slot"
    page_size = 1

    def __init__(self, allocator, size: int, device, name: str = "kv"):
        super().__init__(size + 1, device)
        self.allocator, self.num_pages, self.name = allocator, size, name

    @property
    def free_pages(self) -> list[int]:
        a = self.allocator
        return a.free_slots.tolist() + a.release_slots.tolist()

    def free(self, slot_ids: Iterable[int]) -> None:
        ids = list(slot_ids)
        if ids:
            self.allocator.free(torch.tensor(ids, dtype=torch.int64, device=self.device))

    def pages_of(self, slot_ids: Iterable[int]) -> list[int]:
        return list(dict.fromkeys(slot_ids))

    def view(self) -> PoolView:
        return PoolView(name=self.name, unit=self.unit, capacity=self.num_pages,
                        free=tuple(self.free_pages), reserved=(0,))


class PymllmRadixCache(RawNodes):
    """pymllm's ``RadixCache`` with its real allocator and request table, behind our interface."""

    node_class = Node

    def __init__(self, src, page_size: int = 1, pool_pages: int = 16, device=None, *,
                 cache_cls=None, alloc_policy: str = "scheduler"):
        ns = self.ns = loader.load(src)
        dev = resolve_device(device)
        self.page_size, self.alloc_policy, self.device = page_size, alloc_policy, dev
        size = pool_pages * page_size
        # upstream: make_full_attention_net_mem_pool -> TokenToKVPoolAllocator(size, device)
        self.src = ns.root
        built = self.built = Built()  # kvcheck report writes these constructions
        self.allocator = built.make("allocator", ns.TokenToKVPoolAllocator, size=size,
                                    device=dev, page_size=1, need_sort=True)
        self.req_to_token_pool = built.make("req_to_token_pool", ns.ReqToTokenPool,
                                            max_reqs=size + 16,
                                            max_context_len=max(64, 2 * size + page_size),
                                            device=dev)
        self.pool = PymllmPool(self.allocator, size, dev)
        self.tree = built.make("cache", cache_cls or ns.RadixCache, page_size=page_size,
                               token_to_kv_pool_allocator=self.allocator)
        self._nodes: dict[int, Node] = {}

    # -- nodes ----------------------------------------------------------------------------
    @property
    def evictable_size_(self) -> int:
        return self.tree.evictable_size()

    @property
    def protected_size_(self) -> int:
        return self.tree.protected_size()

    @property
    def evictable_leaves(self) -> list[Node]:
        return [self.node(n) for n in self.tree._collect_evictable_leaves()]

    # -- tree API -------------------------------------------------------------------------
    def key(self, tokens):
        return self.ns.RadixKey(list(tokens))

    def tensor(self, ids) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.int64, device=self.device)

    def match_prefix(self, key) -> MatchResult:
        r = self.tree.match_prefix(self.key(key))
        return MatchResult(r.indices.tolist(), self.node(r.last_node))

    def insert(self, key, value) -> int:
        return self.insert_raw(key, self.tensor(value)).prefix_len

    def insert_raw(self, key, value: torch.Tensor):
        return self.tree.insert(self.key(key), value)

    def inc_lock_ref(self, node: Node) -> None:
        self.tree.inc_lock_ref(node.raw)

    def dec_lock_ref(self, node: Node) -> None:
        self.tree.dec_lock_ref(node.raw)

    def evict(self, num_tokens: int) -> int:
        return self.tree.evict(num_tokens).full_evicted

    def alloc_with_eviction(self, num_tokens: int) -> list[int] | None:
        """``scheduler`` (default): pymllm's ``_alloc_kv_with_eviction`` -- try ``alloc``; when
        short, up to 3 rounds of (nothing evictable -> fail; ``evict(max(n, 10% of the
        pool))``; ``alloc``).  ``reference``: the reference cache's loop (evict the shortfall
        until it fits or nothing goes), for ``kvcheck diff``."""
        if num_tokens == 0:
            return []
        alloc = self.allocator.alloc
        got = alloc(num_tokens)
        if got is not None:
            return got.tolist()
        if self.alloc_policy == "scheduler":
            for _ in range(MAX_EVICT_RETRIES):
                if self.tree.evictable_size() == 0:
                    return None
                self.evict(max(num_tokens, int(self.allocator.size * EVICT_FRACTION)))
                got = alloc(num_tokens)
                if got is not None:
                    return got.tolist()
            return None
        while self.allocator.available_size() < num_tokens:
            short = num_tokens - self.allocator.available_size()
            if self.tree.evictable_size() <= 0 or self.evict(short) == 0:
                return None
        got = alloc(num_tokens)
        return None if got is None else got.tolist()

    # -- what the loaded code does (decides which known findings apply) -------------------------
    def has_r1(self) -> bool:
        """``_add_leaf`` subtracts a leaf-turned-parent's tokens from ``_evictable_size``
        (pymllm PR #656 removes it)."""
        return "self._evictable_size -= len(parent.key)" in self._source("_add_leaf")

    def has_r2(self) -> bool:
        """``dec_lock_ref`` decrements without an underflow guard."""
        src = self._source("dec_lock_ref")
        return "raise" not in src and "assert" not in src

    def _source(self, method: str) -> str:
        """The checkout's own source of ``method`` (a fault's patched method has none: then the
        real class's -- a fault is what kvcheck adds, not what upstream has)."""
        try:
            return inspect.getsource(getattr(type(self.tree), method))
        except OSError:
            return inspect.getsource(getattr(self.ns.RadixCache, method))

    def r1_parent(self, tokens):
        """The node R1 would hit if ``tokens`` were inserted now: the walk of
        ``_insert_normal`` (read-only, with pymllm's own ``_child_key``/``_key_match``) ends at
        an unlocked non-root leaf with key left to add.  None when no such node."""
        rc, ps = self.ns.radix_cache, self.page_size
        key, node = self.key(tokens), self.tree.root_node
        if len(key) == 0:
            return None
        ck = rc._child_key(key, ps)
        while len(key) > 0 and ck in node.children:
            node = node.children[ck]
            plen = rc._key_match(node.key, key, ps)
            key = key[plen:]
            if plen < len(node.key):
                return None  # a split: the new leaf goes below a node that has a child
            if len(key) > 0:
                ck = rc._child_key(key, ps)
        if (len(key) > 0 and node is not self.tree.root_node and len(node.children) == 0
                and node.lock_ref == 0 and not node.evicted):
            return self.node(node)
        return None

    # -- the request table, for the subject's checks ---------------------------------------------
    def request_slots(self) -> list[int]:
        return list(self.req_to_token_pool._free_slots)


class PymllmRadixSubject(RadixSubject):
    """The radix machine's subject over pymllm's real cache, driven as pymllm's model runner
    drives it (module docstring)."""

    variant = "radix"
    target = "pymllm"

    def __init__(self, src, *, page_size: int = 1, pool_pages: int = 16, device=None,
                 fault: str | None = None, skip_known_findings: bool | None = None):
        cache_cls = None
        if fault is not None:
            from caches.adapters.pymllm.faults import upstream_fault

            cache_cls = upstream_fault(fault, src)
        adapter = PymllmRadixCache(src, page_size, pool_pages, device, cache_cls=cache_cls)
        self.partial_pages = page_size > 1
        super().__init__(page_size=page_size, pool_pages=pool_pages, device=device,
                         cache=adapter)  # over pymllm's own allocator (adapter.pool)
        declined = declined_findings(skip_known_findings, ("R1", "R2", "F1"))
        self.skip_known_findings = bool(declined)
        self._decline_r1 = "R1" in declined and adapter.has_r1()
        self._decline_r2 = "R2" in declined and adapter.has_r2()
        self._decline_f1 = "F1" in declined and page_size > 1
        self.r1_compensated = 0  # drain-time R1 hits whose wrongly taken tokens were returned
        self._rows: dict[int, int] = {}  # rid -> request-table row
        self._cp: dict[int, int] = {}  # rid -> pymllm's cache_protected_len
        self._locked: dict[int, object] = {}  # rid -> the node pymllm holds locked, or None
        self._extended: set[int] = set()  # rids whose extend ran (post-extend insert done)
        self._watch_tree(adapter.tree)

    # -- known findings -------------------------------------------------------------------------
    # Each finding's minimal fix model (``Subject.fix_models``): a failing trace is that finding
    # only if it passes with that one model installed (state_machines/failures.py).
    fix_models = {"R1": "_fix_r1", "R2": "_fix_r2", "F1": "_fix_f1"}

    def _fix_r1(self) -> None:
        """PR #656: ``_add_leaf`` adds the new leaf's tokens to ``_evictable_size`` and takes
        nothing from its parent's."""
        tree = self.cache.tree
        add_leaf = tree._add_leaf

        def fixed(parent, key, value, *args, **kwargs):
            before = tree._evictable_size
            node = add_leaf(parent, key, value, *args, **kwargs)
            tree._evictable_size = before + len(key)
            return node

        tree._add_leaf = fixed

    def _fix_r2(self) -> None:
        """An underflow guard in ``dec_lock_ref``: an unlock that would take a lock ref on
        the path below 0 is refused before anything changes (the reference's
        ``LockUnderflow``)."""
        tree = self.cache.tree
        dec = tree.dec_lock_ref

        def fixed(node, *args, **kwargs):
            cur = node
            while cur is not None and cur is not tree.root_node:
                if cur.lock_ref <= 0:
                    raise LockUnderflow(f"dec_lock_ref: a node on the path has lock_ref "
                                        f"{cur.lock_ref}")
                cur = cur.parent
            return dec(node, *args, **kwargs)

        tree.dec_lock_ref = fixed

    def _fix_f1(self) -> None:
        """F1's mechanism is the post-extend bookkeeping: the insert gives the partial last
        page to the tree (or finds it there) but the re-match is page-aligned, so
        ``cache_protected_len`` and the request's row stop short of what the tree owns.
        The model re-matches the whole prompt, partial last page included (pymllm's own
        ``_match_normal`` on the unaligned key): the row, ``cache_protected_len`` and the
        lock then cover every token the tree owns.  The tree itself is unchanged -- it
        still keeps partial pages (a broader fix, SGLang #10637's page-aligned insert,
        would remove more than F1)."""
        cache = self.cache

        def whole(tokens):
            values, last = cache.tree._match_normal(cache.key(tokens))
            indices = torch.cat(values).tolist() if values else []
            return MatchResult(indices, cache.node(last))

        self._post_extend_match = whole

    def report_setup(self):
        """``kvcheck report``: the construction, the checkout on ``sys.path`` and the checks
        in pymllm's terms."""
        from caches.adapters.pymllm.report import radix_setup

        return radix_setup(self.cache)

    def _r1_guard(self, tokens, what: str) -> int:
        """With R1 declined, an insert of ``tokens`` that R1 would hit is declined -- except in
        a drain, which cannot decline a release (since decode, a finish inserts output the tree
        never saw, so the drain's own finishes meet R1): there it runs, and this returns the
        tokens ``_add_leaf`` will wrongly take from ``_evictable_size``, which
        ``_give_back_r1`` returns after the insert (the line PR #656 removes), counted in
        ``r1_compensated``.  0 when nothing is owed."""
        if not self._decline_r1:
            return 0
        node = self.cache.r1_parent(tokens)
        if node is None:
            return 0
        if self.quiescing:
            return len(node.raw.key)
        raise KnownUpstreamFinding(
            f"{what} would add a leaf below the unlocked leaf #{node.id}, and pymllm's "
            "_add_leaf subtracts that leaf's tokens from _evictable_size (known "
            "upstream finding pymllm-radix-R1, PR #656; tests/upstream_findings/)")

    def _give_back_r1(self, owed: int) -> None:
        if owed:
            self.cache.tree._evictable_size += owed
            self.r1_compensated += 1

    # -- ops ------------------------------------------------------------------------------------
    def admit(self, rid: int, tokens: list[int]) -> str:
        if rid in self.requests or rid in self.waiting:
            raise Skip(f"r{rid} is already live or waiting")
        n, cache = len(tokens), self.cache
        if self._decline_f1 and n % self.page_size:
            raise KnownUpstreamFinding(
                f"a {n}-token prompt is not page-aligned: its post-extend insert puts the "
                "partial last page into the tree while cache_protected_len stays page-aligned, "
                "so the release frees the tree's slot (known upstream finding "
                "pymllm-radix-F1, tests/upstream_findings/)")
        match = self._match(tokens)  # upstream: the whole prompt is matched
        indices, last = list(match.indices), match.last_node
        self.verify_data(self.pool, indices, tokens, f"r{rid} prefix hit, ")
        prefix = len(indices)
        if prefix >= n - 1 and n >= 2:  # upstream: "ensure at least 2 tokens are extended"
            prefix = n - 2
            indices = indices[:prefix]
        locked = None
        if prefix > 0:
            self.reached("prefix-hit")
            self._note_shared_lock(last)
            cache.inc_lock_ref(last)  # upstream: locked BEFORE allocating
            locked = last
        slots = cache.req_to_token_pool.alloc(1)
        if slots is None:
            if locked is not None:
                cache.dec_lock_ref(locked)
            return f"no request-table row free, r{rid} not admitted"
        own = self._alloc(n - prefix)
        if own is None:
            cache.req_to_token_pool.free(slots[0])
            if locked is not None:
                cache.dec_lock_ref(locked)
            return f"out of memory: {n - prefix} tokens needed, r{rid} not admitted"
        row = slots[0]
        cache.req_to_token_pool.write((row, slice(0, n)),
                                      torch.tensor(indices + own, dtype=torch.int32,
                                                   device=cache.device))
        self._rows[rid], self._cp[rid], self._locked[rid] = row, prefix, locked
        self.requests[rid] = Req(rid, list(tokens), indices + own, filled=prefix,
                                 cache_protected_len=prefix,
                                 last_node=locked if locked is not None else cache.root_node)
        return f"hit {prefix} of {n} tokens, allocated {len(own)}"

    def prefill(self, rid: int, n: int) -> str:
        req = self.req(rid)
        if rid in self._extended:
            raise Skip(f"r{rid} is fully prefilled")
        k = min(n, len(req.tokens) - req.filled)
        if req.filled + k == len(req.tokens):
            self._r1_guard(req.tokens, f"r{rid}'s post-extend insert")
        span = req.kv_indices[req.filled:req.filled + k]
        self.pool.write(span, self.expected_data(req.tokens)[req.filled:req.filled + k])
        req.filled += k
        if req.filled < len(req.tokens):
            return f"computed {k} tokens ({req.filled}/{len(req.tokens)})"
        self._insert_after_extend(req)
        self._extended.add(rid)
        return f"computed {k} tokens, prefill complete"

    # -- past the prefill (caches/subjects/lifecycle.py) ---------------------------------------
    # decode = ``_allocate_decode``: one slot per step from the token-granular allocator (with
    # the same eviction rounds as the extend), written into the request's row; the finish
    # then inserts prompt + output (``_free_rid_resources`` inserts the whole sequence).
    # Not driven: the checkout this target loads holds ``pymllm/mem_cache`` only, not the
    # scheduler whose retract, batch budget and speculative path these would follow.
    lifecycle_declined = {
        op: "pymllm's scheduler is not in the loaded checkout (pymllm/mem_cache only)"
        for op in ("retract", "schedule", "spec_decode")}
    lifecycle_declined["dllm_step"] = ("pymllm's scheduler (and any diffusion-LM path of it) "
                                       "is not in the loaded checkout (pymllm/mem_cache only)")

    def _decoding(self, rid: int) -> Req:
        req = super()._decoding(rid)
        if rid not in self._extended:
            raise Skip(f"r{rid}'s extend has not run")
        return req

    def _decode_alloc(self, req: Req):
        got = self._alloc(1)
        return None if got is None else got[0]

    def _sync_row(self, req: Req) -> None:
        n = len(req.kv_indices)
        self.cache.req_to_token_pool.write(
            (self._rows[req.rid], slice(n - 1, n)),
            torch.tensor(req.kv_indices[n - 1:], dtype=torch.int32, device=self.cache.device))

    def _row(self, rid: int, n: int) -> torch.Tensor:
        return self.cache.req_to_token_pool.req_to_token[self._rows[rid], :n].to(torch.int64)

    def _insert_after_extend(self, req: Req) -> int:
        """upstream: ``_insert_into_radix_cache`` for one request."""
        cache, rid, n = self.cache, req.rid, len(req.tokens)
        kv = self._row(rid, n)
        new_prefix = cache.insert_raw(req.tokens, kv).prefix_len
        cp = self._cp[rid]
        if new_prefix > cp:
            dup = kv[cp:new_prefix]
            if dup.numel() > 0:
                cache.allocator.free(dup)
        rematch = self._post_extend_match(req.tokens)
        new = rematch.indices
        if self.page_size == 1:
            assert len(new) == n, (f"Re-match length mismatch after insert: {len(new)=}, "
                                   f"seq_len={n}, rid={rid}")  # upstream's own assert
        if len(new) > cp:
            cache.req_to_token_pool.write(
                (self._rows[rid], slice(cp, len(new))),
                torch.tensor(new[cp:], dtype=torch.int32, device=cache.device))
        self._cp[rid] = len(new)
        if req.cache_protected_len < len(new):
            self.reached("chunk-cached")
        old = self._locked.pop(rid, None)
        if old is not None:
            cache.dec_lock_ref(old)
        locked = None
        if len(new) > 0:
            self._note_shared_lock(rematch.last_node)
            cache.inc_lock_ref(rematch.last_node)
            locked = rematch.last_node
        self._locked[rid] = locked
        req.kv_indices = self._row(rid, n).tolist()
        req.cache_protected_len = n  # the tree owns the whole prompt; the request reads it
        req.last_node = locked if locked is not None else cache.root_node
        return new_prefix

    def _post_extend_match(self, tokens):
        """upstream: the re-match after the post-extend insert (``match_prefix``, which
        page-aligns the key)."""
        return self._match(tokens)

    def finish(self, rid: int) -> str:
        req = self.req(rid)
        if rid not in self._extended:
            raise Skip(f"r{rid} is still prefilling")
        self.verify_data(self.pool, req.kv_indices, req.tokens, f"r{rid} at finish, ")
        if len(req.tokens) % self.page_size:
            self.reached("partial-page-tail")
        owed = self._r1_guard(req.tokens, f"r{rid}'s release insert")
        self._release(req, insert=True)
        self._give_back_r1(owed)
        return "finished, KV handed to the tree"

    def abort(self, rid: int) -> str:
        req = self.req(rid)
        if rid in self._extended:  # upstream: Req.abort() only flags it; freed as a finish
            owed = self._r1_guard(req.tokens, f"r{rid}'s release insert")
            self._release(req, insert=True)
            self._give_back_r1(owed)
            return f"aborted after {req.filled}/{len(req.tokens)} tokens"
        self.reached("abort-mid-prefill")
        self._release(req, insert=False)
        return f"aborted after {req.filled}/{len(req.tokens)} tokens"

    def _release(self, req: Req, insert: bool) -> str:
        """upstream: ``_free_rid_resources`` (cache enabled, no output tokens)."""
        cache, rid, n = self.cache, req.rid, len(req.tokens)
        all_kv = self._row(rid, n)
        cp, locked = self._cp.pop(rid), self._locked.pop(rid, None)
        out = "released without insert"
        if insert:
            new_prefix = cache.insert_raw(req.tokens, all_kv).prefix_len
            if new_prefix > cp:
                dup = all_kv[cp:new_prefix]
                if dup.numel() > 0:
                    cache.allocator.free(dup)
            out = f"KV handed to the tree (it had {new_prefix})"
        if locked is not None:
            cache.dec_lock_ref(locked)
        if not insert:
            tail = all_kv[cp:]
            if tail.numel() > 0:
                cache.allocator.free(tail)
        cache.req_to_token_pool.free(self._rows.pop(rid))
        self._extended.discard(rid)
        del self.requests[rid]
        return out

    def insert(self, tokens: list[int]) -> str:
        self._r1_guard(tokens, "the insert")
        slots = self._alloc(len(tokens))
        if slots is None:
            return "out of memory"
        try:
            self._r1_guard(tokens, "the insert (after its allocation evicted)")
        except KnownUpstreamFinding:
            self.pool.free(slots)
            raise
        self.pool.write(slots, self.expected_data(tokens))
        if len(tokens) % self.page_size:
            self.reached("partial-page-tail")
        prefix = self.cache.insert(tokens, slots)
        self.pool.free(slots[:prefix])  # what the tree already had (pymllm keeps the tail)
        return f"tree already had {prefix} tokens"

    def stray_unlock(self, tokens: list[int]) -> str:
        if self._decline_r2:
            raise KnownUpstreamFinding("pymllm's dec_lock_ref accepts an unmatched unlock "
                                       "(known upstream finding pymllm-radix-R2, "
                                       "tests/upstream_findings/)")
        return super().stray_unlock(tokens)

    def release_holders(self) -> None:
        for rid in self.live():
            if rid in self._extended:
                self.finish(rid)
            else:
                self.abort(rid)
        for hid in sorted(self.locks):
            self.unlock(hid)

    def prepare_for_diff(self) -> None:
        """``kvcheck diff``: allocate with the reference cache's eviction loop."""
        self.cache.alloc_policy = "reference"

    # -- policy ----------------------------------------------------------------------------------
    def free_tokens(self) -> int:
        return len(self.pool.free_pages)

    def alloc_demands(self) -> dict:
        """Declared policy: the allocator is token-granular; when it is short, pymllm evicts
        ``max(n, 10% of the pool)`` -- the whole request, not the shortfall
        (``_alloc_kv_with_eviction``); with ``alloc_policy="reference"`` the shortfall."""
        cache = self.cache

        def demand(args, free):
            n = args[0]
            if n <= free:
                return n, 0
            if cache.alloc_policy == "scheduler":
                return n, max(n, int(cache.allocator.size * EVICT_FRACTION))
            return n, n - free

        return {"alloc_with_eviction": demand}

    # -- views and checks ------------------------------------------------------------------------
    def tree_view(self, times: bool = False) -> TreeView:
        return seam_tree_view(self.cache.tree.root_node, RADIX_KEY_FIELDS, self.page_size,
                              times=times)

    def check(self) -> None:
        super().check()
        self._check_request_table()

    def check_quiescent(self) -> None:
        super().check_quiescent()
        self._check_request_table()

    def _check_request_table(self) -> None:
        """Every request-table row is free or held by exactly one live request (rows are
        numbered from 1 in the view: pymllm's rows 0..max_reqs-1, shifted by one)."""
        check_request_rows([r + 1 for r in self.cache.request_slots()],
                           self.cache.req_to_token_pool.size,
                           {rid: i + 1 for rid, i in self._rows.items()}, self.requests, "row")

    def counters(self) -> dict:
        return {**super().counters(),
                "free_req_rows": len(self.cache.req_to_token_pool._free_slots)}


def make_subject(params, fault=None, device=None, src=None, **options) -> PymllmRadixSubject:
    return PymllmRadixSubject(src, page_size=params["page_size"],
                              pool_pages=params["pool_pages"], device=device, fault=fault,
                              **options)
