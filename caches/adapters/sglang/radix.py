"""``--target sglang`` for the radix variant: SGLang's real ``RadixCache`` under our machine.

Three pieces, from the inside out:

* ``SglangRadixCache`` -- an adapter with our reference cache's interface (``match_prefix`` ->
  ``MatchResult(indices, last_node)``, ``insert``, ``inc/dec_lock_ref``, ``evict``,
  ``alloc_with_eviction``, ``cache_unfinished_req``/``cache_finished_req`` taking our
  ``caches.request.Req``, and ``root_node``/``evictable_size_``/``protected_size_``/
  ``evictable_leaves``).  Behind it sit SGLang's own objects: ``radix_cache.RadixCache``,
  ``TokenToKVPoolAllocator`` (page 1) or ``PagedTokenToKVPoolAllocator`` (page > 1), and a
  ``ReqToTokenPool``.  The request paths are SGLang's: each of our requests gets a request-pool
  row holding its KV indices and a ``_SglangReq`` carrying exactly the fields
  ``RadixCache.cache_*_req`` read; after each call the request's indices, protected length and
  locked node are read back from SGLang's row and request object.
* ``SglangPool`` -- the harness's view of SGLang's allocator: its free list (``free_pages`` +
  ``release_pages``) for the conservation check, plus a fingerprint tensor the subject writes
  on prefill and reads back on every hit.
* ``SglangRadixSubject`` -- ``RadixSubject`` (the same ops, driver and invariants as the
  reference) over the adapter and that pool, plus the request-pool's own conservation.

Where the adapter stands in for scheduler code that cannot run here (all marked ``upstream:``):
allocation is ``evict_from_tree_cache`` + the allocator's plain ``alloc`` of whole pages (the
Triton ``alloc_extend`` is GPU-only; every allocation here starts on a page boundary, where
``alloc_extend`` hands out the same pages), and finishing/aborting is ``release_kv_cache``'s
cache part: ``cache_finished_req``, then the over-allocated tail, then the request-pool slot.

Node ids are SGLang's own ``TreeNode.id`` minus the root's, i.e. creation order in this tree --
deterministic per run and equal to the reference cache's ids for the same history.
"""

from __future__ import annotations

from typing import Iterable

import torch

from caches.adapters import KnownUpstreamFinding, declined_findings
from caches.adapters.raw_radix import MatchResult, RawNode, RawNodes, check_request_rows
from caches.seam import NodeFields
from caches.seam import tree_view as seam_tree_view
from caches.adapters.sglang import loader, versions
from caches.pools import _DataTensor, resolve_device
from caches.reporting import Built
from caches.request import Req
from caches.subjects.radix import RadixSubject
from invariants import PoolView, TreeView
from invariants.policy import ceil_pages, sglang_scheduler_need, shortfall_need

ALLOC_POLICIES = ("scheduler", "reference")


class Node(RawNode):
    """One SGLang ``TreeNode`` (its key may be longer than the tokens it holds)."""

    __slots__ = ()
    engine = "sglang"


# a ``TreeNode``'s key may be longer than the tokens it holds
SGLANG_FIELDS = NodeFields(key=lambda raw: tuple(raw.key.token_ids[:len(raw.key)]))


class _SglangReq:
    """The fields of ``sglang.srt.managers.schedule_batch.Req`` that ``RadixCache.cache_*_req``
    read and write (the real class needs the global server args to be constructed)."""

    def __init__(self, rid: int, req_pool_idx: int):
        self.rid = rid
        self.req_pool_idx = req_pool_idx
        self.origin_input_ids: list[int] = []
        self.output_ids: list[int] = []
        self.fill_ids: list[int] = []
        self.extra_key = None
        self.priority = 0
        self.is_chunked = 0
        self.cache_protected_len = 0
        self.last_node = None
        self.prefix_indices = None
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.kv_committed_freed = False

    def pop_committed_kv_cache(self) -> int:  # upstream: schedule_batch.py Req, same asserts
        assert not self.kv_committed_freed, \
            f"Committed KV cache already freed ({self.kv_committed_len=})"
        self.kv_committed_freed = True
        return self.kv_committed_len


class SglangPool(_DataTensor):
    """SGLang's token allocator as a harness pool: free list, fingerprints, page bookkeeping."""

    unit = "page"

    def __init__(self, allocator, num_pages: int, page_size: int, device, name: str = "kv"):
        super().__init__((num_pages + 1) * page_size, device)
        self.allocator, self.num_pages, self.page_size, self.name = \
            allocator, num_pages, page_size, name

    @property
    def free_pages(self) -> list[int]:
        return versions.allocator_free_pages(self.allocator)

    def available_size(self) -> int:
        return int(self.allocator.available_size())

    def free(self, slot_ids: Iterable[int]) -> None:
        ids = list(slot_ids)
        if ids:
            self.allocator.free(torch.tensor(ids, dtype=torch.int64, device=self.device))

    def pages_of(self, slot_ids: Iterable[int]) -> list[int]:
        ps = self.page_size
        return list(dict.fromkeys(s // ps for s in slot_ids))

    def view(self) -> PoolView:
        return PoolView(name=self.name, unit=self.unit, capacity=self.num_pages,
                        free=tuple(self.free_pages), reserved=(0,))


class SglangRadixCache(RawNodes):
    """SGLang's ``RadixCache`` with its real allocators and request pool, behind our interface."""

    node_class = Node
    node_fields = SGLANG_FIELDS

    def __init__(self, page_size: int = 1, pool_pages: int = 16, device=None, *,
                 cache_cls=None, alloc_policy: str = "scheduler", need_sort: bool = False):
        if alloc_policy not in ALLOC_POLICIES:
            raise ValueError(f"alloc_policy must be one of {ALLOC_POLICIES}, got {alloc_policy!r}")
        sg = self.sg = loader.require()
        dev = resolve_device(device)
        self.page_size, self.alloc_policy = page_size, alloc_policy
        allocator = self._build_pools(sg, page_size, pool_pages, dev, need_sort)
        self.tree = self.built.make("cache", cache_cls or sg.RadixCache, sg.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=allocator, page_size=page_size))
        self.device = dev
        self._nodes: dict[int, Node] = {}  # id(raw node) -> its Node (keeps raw nodes alive)
        self._reqs: dict[int, _SglangReq] = {}  # our rid -> SGLang-side request

    def _build_pools(self, sg, page_size, pool_pages, dev, need_sort, req_rows=None):
        """SGLang's allocator (page 1: ``TokenToKVPoolAllocator``, else the paged one) and
        ``ReqToTokenPool`` (``req_rows`` rows, default one per token), built through
        ``self.built`` (``kvcheck report`` writes that construction into its scripts);
        returns the allocator."""
        self.built = Built()
        if page_size == 1:
            allocator = self.built.make("allocator", sg.TokenToKVPoolAllocator, pool_pages,
                                        torch.float16, dev, None, need_sort)
        else:
            allocator = self.built.make("allocator", sg.PagedTokenToKVPoolAllocator,
                                        pool_pages * page_size, page_size, torch.float16, dev,
                                        None, need_sort)
        tokens = pool_pages * page_size
        # a live request holds at least one token of its own: at most `tokens` requests, each
        # at most the tree's tokens plus its own -- unless the variant sizes the request pool
        # itself (streaming-session's req_rows)
        self.req_to_token_pool = self.built.make("req_to_token_pool", sg.ReqToTokenPool,
                                                 req_rows or tokens, 2 * tokens + page_size,
                                                 dev, False)
        self.allocator = allocator
        self.pool = SglangPool(allocator, pool_pages, page_size, dev)
        return allocator

    # -- nodes ----------------------------------------------------------------------------
    @property
    def evictable_size_(self) -> int:
        return self.tree.evictable_size_

    @property
    def protected_size_(self) -> int:
        return self.tree.protected_size_

    @property
    def evictable_leaves(self) -> list[Node]:
        return [self.node(n) for n in self.tree.evictable_leaves]

    # -- tree API -------------------------------------------------------------------------
    def _key(self, tokens):
        return self.sg.RadixKey(list(tokens))

    def _tensor(self, ids) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.int64, device=self.device)

    def match_prefix(self, key) -> MatchResult:
        r = self.tree.match_prefix(self.sg.MatchPrefixParams(key=self._key(key)))
        return MatchResult(r.device_indices.tolist(), self.node(r.last_device_node))

    def insert(self, key, value) -> int:
        if not versions.insert_aligns_keys(self.sg.version):  # the caller aligns there
            n = len(key) // self.page_size * self.page_size
            key, value = list(key)[:n], list(value)[:n]
        return self.tree.insert(self.sg.InsertParams(key=self._key(key),
                                                     value=self._tensor(value))).prefix_len

    def inc_lock_ref(self, node: Node) -> None:
        self.tree.inc_lock_ref(node.raw)

    def dec_lock_ref(self, node: Node) -> None:
        self.tree.dec_lock_ref(node.raw)

    def evict(self, num_tokens: int) -> int:
        return self.tree.evict(self.sg.EvictParams(num_tokens=num_tokens)).num_tokens_evicted

    def alloc_with_eviction(self, num_tokens: int) -> list[int] | None:
        """Slots for ``num_tokens`` (whole pages), evicting first; None when out of memory.

        ``scheduler`` (default) is SGLang's: ``evict_from_tree_cache`` evicts the whole request
        size once when the allocator is short (page > 1: plus one page per request, as
        ``alloc_paged_token_slots_extend`` over-estimates), then one ``alloc``.  ``reference``
        is the reference cache's loop (evict the shortfall until it fits or nothing goes),
        for comparing the caches under one driver (``kvcheck diff``)."""
        ps, avail = self.page_size, self.allocator.available_size
        if self.alloc_policy == "scheduler":
            need = num_tokens + (ps if ps > 1 else 0)
            if avail() < need:  # upstream: mem_cache/common.py evict_from_tree_cache
                self.evict(need)
        else:
            while avail() < num_tokens:
                if self.tree.evictable_size_ <= 0 or self.evict(num_tokens - avail()) == 0:
                    return None
        got = self.allocator.alloc(-(-num_tokens // ps) * ps)
        return None if got is None else got[:num_tokens].tolist()

    # -- request paths --------------------------------------------------------------------
    def _sglang_req(self, req: Req) -> _SglangReq:
        """The SGLang-side request: on first sight a request-pool row holding its indices
        (upstream: alloc_req_slots + write_cache_indices at admission)."""
        s = self._reqs.get(req.rid)
        if s is None:
            idx = self.req_to_token_pool.alloc([_Unslotted()])
            if idx is None:
                raise RuntimeError("the request-to-token pool is full")
            s = self._reqs[req.rid] = _SglangReq(req.rid, idx[0])
            self.req_to_token_pool.write((s.req_pool_idx, slice(0, len(req.kv_indices))),
                                         torch.tensor(req.kv_indices, dtype=torch.int32,
                                                      device=self.device))
            s.cache_protected_len = req.cache_protected_len
            s.last_node = req.last_node.raw if req.last_node is not None else None
        s.origin_input_ids = list(req.tokens)
        return s

    def _row(self, s: _SglangReq, n: int) -> list[int]:
        return self.req_to_token_pool.req_to_token[s.req_pool_idx, :n].tolist()

    def sync_row(self, req: Req) -> None:
        """A decode step grew or a verify cut ``req``'s row (upstream: ``alloc_for_decode``
        writes the step's ``out_cache_loc`` into ``req_to_token``): copy it to the request's
        row once the engine holds one (before, the first cache call writes it whole)."""
        s = self._reqs.get(req.rid)
        if s is not None:
            self.req_to_token_pool.write((s.req_pool_idx, slice(0, len(req.kv_indices))),
                                         torch.tensor(req.kv_indices, dtype=torch.int32,
                                                      device=self.device))

    def cache_unfinished_req(self, req: Req) -> None:
        s = self._sglang_req(req)
        s.fill_ids = list(req.tokens[:req.filled])
        s.is_chunked = 1
        self.tree.cache_unfinished_req(s, chunked=True)
        req.kv_indices = self._row(s, len(req.kv_indices))
        req.cache_protected_len = s.cache_protected_len
        req.last_node = self.node(s.last_node)

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        """upstream: mem_cache/common.py release_kv_cache -- ``cache_finished_req``, then the
        over-allocated tail ``[ceil_align(committed), allocated)``, then the request slot."""
        s = self._sglang_req(req)
        s.kv_committed_len, s.kv_allocated_len = req.filled, len(req.kv_indices)
        self.tree.cache_finished_req(s, is_insert=is_insert)
        ps = self.page_size
        start = -(-req.filled // ps) * ps
        if start < s.kv_allocated_len:
            row = self.req_to_token_pool.req_to_token[s.req_pool_idx]
            self.allocator.free(row[start:s.kv_allocated_len])
        self.req_to_token_pool.free(s)
        s.req_pool_idx = None
        del self._reqs[req.rid]

    # -- the request pool, for the subject's checks -----------------------------------------
    def request_slots(self) -> tuple[list[int], dict[int, int]]:
        """(free request-pool slots, {rid: slot} of live requests)."""
        return (list(self.req_to_token_pool.free_slots),
                {rid: s.req_pool_idx for rid, s in self._reqs.items()})


class _Unslotted:
    """What ``ReqToTokenPool.alloc`` reads off a new request."""

    req_pool_idx = None
    is_chunked = 0
    kv_committed_len = 0


class SglangRadixSubject(RadixSubject):
    """The radix machine's subject over SGLang's real cache (same ops, driver, invariants)."""

    variant = "radix"
    target = "sglang"

    def __init__(self, *, page_size: int = 1, pool_pages: int = 16, device=None,
                 fault: str | None = None, alloc_policy: str = "scheduler",
                 skip_known_findings: bool | None = None):
        cache_cls = None
        if fault is not None:
            from caches.adapters.sglang.faults import upstream_fault

            cache_cls = upstream_fault(fault)
        adapter = SglangRadixCache(page_size, pool_pages, device, cache_cls=cache_cls,
                                   alloc_policy=alloc_policy)
        super().__init__(page_size=page_size, pool_pages=pool_pages, device=device,
                         cache=adapter)  # over SGLang's own allocator (adapter.pool)
        # F1 alone is this subject's (``skip_known_findings`` may list other releases' ids)
        self.skip_known_findings = "F1" in declined_findings(skip_known_findings, ("F1",))
        self._watch_upstream()

    # The dLLM step (``dllm_step``, sgl-project/sglang issue #35270) is 0.5.23's FDFO path: an
    # unresolved block kept over its slots and denoised again next round (PR #27551, #27877).
    # The dLLM scheduler of the releases this adapter loads decodes a block whole in one
    # forward and writes its ids once (0.5.10.post1's dllm/mixin/scheduler.py
    # process_batch_result_dllm: no ``dllm_incomplete_ids``), so no block is rewritten there.
    lifecycle_declined = {"dllm_step": "this release's dLLM scheduler decodes a block whole in "
                          "one forward: no in-flight block is rewritten across steps (that is "
                          "0.5.23's FDFO path, sgl-project/sglang PR #27877)"}

    # -- ops that differ from the reference subject ------------------------------------------
    def stray_unlock(self, tokens: list[int]) -> str:
        if self.skip_known_findings:
            raise KnownUpstreamFinding("SGLang's dec_lock_ref accepts an unmatched unlock "
                                       "(known upstream finding sglang-radix-F1, "
                                       "tests/upstream_findings/)")
        return super().stray_unlock(tokens)

    def report_setup(self):
        """``kvcheck report``: the construction, stand-ins and checks in RadixCache's terms."""
        from caches.adapters.sglang.report import radix_setup

        return radix_setup(self.cache)

    def prepare_for_diff(self) -> None:
        """``kvcheck diff``: allocate with the reference cache's eviction loop, so the diff
        compares the two caches rather than two allocation policies."""
        self.cache.alloc_policy = "reference"

    # -- views and checks ------------------------------------------------------------------
    # the need the scheduler's allocation declares (extension, free tokens, page size) ->
    # tokens to evict: 0.5.12.post1's ``evict_from_tree_cache``; 0.5.23's adapters declare
    # theirs (``unified_radix.TreeCoreViews``)
    scheduler_need = staticmethod(sglang_scheduler_need)

    def alloc_demands(self) -> dict:
        """Declared policy difference: with ``alloc_policy="scheduler"`` SGLang's
        ``evict_from_tree_cache`` evicts by ``scheduler_need`` (0.5.12.post1: the whole
        request, + a page when paged, once the allocator is short of it, not the shortfall;
        invariants/policy.py ``sglang_scheduler_need``); ``"reference"`` is the reference's
        shortfall loop."""
        ps, cache, need = self.page_size, self.cache, self.scheduler_need

        def demand(args, free):
            alloc = ceil_pages(args[0], ps)
            if cache.alloc_policy == "scheduler":
                return alloc, need(args[0], free, ps)
            return alloc, shortfall_need(alloc, free)

        return {"alloc_with_eviction": demand}

    def tree_view(self, times: bool = False) -> TreeView:
        return seam_tree_view(self.cache.tree.root_node, SGLANG_FIELDS, self.page_size,
                              times=times)

    def check(self) -> None:
        super().check()
        self._check_request_pool()

    def check_quiescent(self) -> None:
        super().check_quiescent()
        self._check_request_pool()

    def _check_request_pool(self) -> None:
        """Every request-pool slot is free or held by exactly one live request."""
        free, held = self.cache.request_slots()
        check_request_rows(free, self.cache.req_to_token_pool.size, held, self.requests,
                           reserved=versions.reserved_request_rows(self.cache.sg.version),
                           base=versions.request_rows_base(self.cache.sg.version))

    def counters(self) -> dict:
        return {**super().counters(),
                "free_req_slots": len(self.cache.req_to_token_pool.free_slots)}

    # -- coverage: the transitions RadixSubject watches on the reference cache -----------------
    def _watch_upstream(self) -> None:
        self._watch_tree(self.cache.tree)


def make_subject(params, fault=None, device=None, **options) -> SglangRadixSubject:
    """The factory ``state_machines/radix.py`` lists as target ``sglang``."""
    return SglangRadixSubject(page_size=params["page_size"], pool_pages=params["pool_pages"],
                              device=device, fault=fault, **options)
