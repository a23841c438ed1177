"""``--target sglang`` / ``--target sglang-rust`` for the hybrid-swa variant on SGLang 0.5.23:
``UnifiedRadixCache`` with the Full and SWA components (what ``mem_cache/registry.py``
``create_unified_radix_cache`` builds for a hybrid sliding-window model:
``tree_components=(FULL, SWA)``), over the Python tree core or the Rust one, both chosen through
SGLang's own ``tree_core_registry`` (no silent fallback, as ``unified_radix.py``).

The objects are SGLang's own, tiny and on CPU (the construction of SGLang's unit-test kit,
``sglang/test/kits/unified_radix_cache/fixtures.py`` ``build_fixture``, with a window pool
smaller than the full one):

* ``SWAKVPool`` (one full and one SWA layer, one head of dim 1: the KV buffers are never read;
  fingerprints live in the harness pool) and ``SWATokenToKVPoolAllocator`` over it -- a full
  allocator, a window allocator and the full -> window map ``full_to_swa_index_mapping`` (0 =
  no window slot: the window pool's padding slot/page 0, the sentinel);
* ``ReqToTokenPool`` and ``CacheInitParams(sliding_window_size=W, tree_components=(FULL, SWA),
  tree_core_backend=core)``.

The request path is ``unified_radix.py``'s (0.5.23's ``checkpoint`` / ``release_kv_cache``
steps over SGLang's ``ReqKvInfo``), which here also moves the request's window: a chunk's
``checkpoint`` frees the out-of-window slots of an unfinished request itself
(``checkpoint_into_tree`` -> ``SWAComponent.free_out_of_window_slots``, on by default:
``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS``), and the release frees the row by
segments that know the request's SWA eviction cursor (``free_kv_row`` ->
``free_kv_row_segments(swa_evicted_seqlen=...)``).  What this variant adds (``upstream:``):

* ``alloc_with_eviction``: upstream's ``evict_from_tree_cache(tree, n)``, which on the SWA
  allocator evicts the shortfall of *both* pools (``SWATokenToKVPoolAllocator.
  evict_to_free_tokens`` -> ``tree.evict_for_alloc(EvictParams(num_tokens=full_shortfall,
  swa_num_tokens=swa_shortfall))``), then a paired allocation: at page 1 the allocator's own
  ``alloc`` (full + window slots, the map set); paged, what ``alloc_extend`` does at a page
  boundary (its Triton kernel does not run on CPU): fresh pages from both sub-allocators, the
  map set for every slot of them (``set_full_to_swa_mapping``), after the same
  ``new_pages_available`` check;
* ``evict_swa(n)``: ``tree.evict(EvictParams(swa_num_tokens=n))`` -- the SWA LRU walk: a leaf
  goes whole (Full too), an internal node is tombstoned (``SWAComponent._evict_device_next_node``);
  returns the window tokens freed;
* ``free_out_of_window(req)``: one decode step's ``ScheduleBatch.maybe_evict_swa``
  (managers/schedule_batch.py 4068-4123) for this request, run as upstream's own method over a
  one-request batch (``_DecodeBatch``): its gate (``req.kv.holds_kv``, ``_swa_eviction_trigger``;
  ``decode_batch_idx >= 1`` is the caller's, the subject calls from the second decode step on)
  and ``_evict_swa`` -> ``tree.evict_sliding_windows(req,
  req.seqlen - 1)`` -> ``free_swa_out_of_window_slots`` inside the allocator's
  ``free_group_begin/end``.  Run with ``SGLANG_SWA_EVICTION_INTERVAL`` = ``eviction_interval``
  (1 here: the default 128 never fires in pools of a few pages) and
  ``SGLANG_OPT_RELEASE_PREFILL_SWA`` off (its default: the early release is its own op);
* ``release_window(req)``: ``tree.release_swa_prefix_lock(req)`` (``UnifiedRadixCache`` 1116:
  ``release_swa`` -> ``tree_core.dec_swa_lock_only``), what ``maybe_evict_swa`` calls once
  ``decode_batch_idx >= swa_retain_window`` when ``SGLANG_OPT_RELEASE_PREFILL_SWA`` is set
  (off by default: an opt-in configuration);
* ``mapping``, ``window_free_pages``, ``request_windows``, ``lock_receipts``: the plain facts
  ``UnifiedSWASubject.window_state`` reads from the real objects (below).

White box (Python core): each node's ``component_data[FULL].value`` (full slots) and
``component_data[SWA]`` (``value``: window slots, None = tombstone; ``lock_ref``).  Black box
(Rust core: ``node_by_id`` raises upstream, and the test-only inspection binding,
``mem_cache_inspection``, is not in the wheel): no nodes; the window pool, the full -> window
map, the live requests' windows and cursors are all the allocator's and the request pool's,
readable on either core, and the tree's window tokens are checked against
``swa_evictable_size() + swa_protected_size()``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from caches.adapters.raw_radix import ids_of
from caches.adapters.sglang import loader, versions
from caches.adapters.sglang.radix import SglangPool, SglangRadixSubject
from caches.adapters.sglang.unified_radix import (CORES, UnifiedRadixAdapter,
                                                  UnifiedRadixSubject, _UReq,
                                                  evict_from_tree_cache)
from caches.reporting import Built
from caches.request import Req
from caches.subjects.base import Skip
from caches.subjects.hybrid_swa import HybridSWASubject
from invariants import check_conservation, fail
from invariants.window import WindowNode, WindowRequest, WindowState, check_window

SENTINEL = 0  # the window pool's padding slot (page 0): what an unmapped full slot maps to


class _SWAReq(_UReq):
    """``_UReq`` plus the fields of 0.5.23's ``schedule_batch.Req`` that the SWA paths read:
    ``seqlen`` (``_swa_eviction_trigger``, ``maybe_evict_swa``), ``decode_batch_idx``,
    ``swa_branching_seqlen`` (``SWAComponent.prepare_for_caching_req``: None outside PD
    decode radix caching) and ``get_fill_ids``."""

    swa_branching_seqlen = None
    decode_batch_idx = 0

    @property
    def seqlen(self) -> int:  # upstream: schedule_batch.py Req.seqlen (1490)
        return len(self.origin_input_ids) + len(self.output_ids)

    def get_fill_ids(self):
        return self.full_untruncated_fill_ids


class _DecodeBatch:
    """The fields of ``ScheduleBatch`` that ``maybe_evict_swa`` reads, for a decode batch of
    the given requests; its methods are upstream's own (``ScheduleBatch.maybe_evict_swa``,
    ``_swa_eviction_trigger``, ``_evict_swa``, bound to this object)."""

    def __init__(self, tree, reqs):
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        self.tree_cache, self.reqs = tree, reqs
        self.token_to_kv_pool_allocator = tree.token_to_kv_pool_allocator
        self.forward_mode, self.forward_iter = ForwardMode.DECODE, 0
        self.prefix_lens, self.enable_overlap = [0] * len(reqs), False
        self._upstream = ScheduleBatch

    def maybe_evict_swa(self) -> None:
        self._upstream.maybe_evict_swa(self)

    def _swa_eviction_trigger(self, window: int, interval: int):
        return self._upstream._swa_eviction_trigger(self, window, interval)

    def _evict_swa(self, req, pre_len: int, *, eviction_interval: int = 1) -> None:
        self._upstream._evict_swa(self, req, pre_len, eviction_interval=eviction_interval)


@contextmanager
def _env(**values):
    """SGLang's environment flags (read at call time through ``sglang.srt.environ.envs``) set
    for the block, and restored after it even when it raises."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class SWAFullPool(SglangPool):
    """The full KV pool as the harness sees it: the full sub-allocator's free list, the
    fingerprints; ``free`` goes through the SWA allocator (window peers first, then the full
    slots: ``SWATokenToKVPoolAllocator.free``)."""

    @property
    def free_pages(self) -> list[int]:
        return versions.allocator_free_pages(self.allocator.full_attn_allocator)

    def full_available_size(self) -> int:
        return int(self.allocator.full_available_size())


class UnifiedSWAAdapter(UnifiedRadixAdapter):
    """``UnifiedRadixCache`` (Full + SWA, one tree core) with SGLang's SWA allocator and pools
    behind the radix subject's interface, plus the window calls (module doc)."""

    def __init__(self, page_size: int = 1, pool_pages: int = 16, swa_pages: int = 8,
                 window: int = 4, device=None, *, core: str = "python",
                 alloc_policy: str = "scheduler", component_override=None, cache_cls=None,
                 eviction_interval: int = 1):
        if core not in CORES:
            raise ValueError(f"core must be one of {CORES}, got {core!r}")
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        self.swa_pages, self.window, self.eviction_interval = swa_pages, window, eviction_interval
        super().__init__(page_size, pool_pages, device, core=core, alloc_policy=alloc_policy,
                         component_override=component_override, cache_cls=cache_cls)
        self.SWA = self.sg.ComponentType.SWA

    # -- construction ---------------------------------------------------------------------
    def _build_pools(self, sg, page_size, pool_pages, dev, need_sort, req_rows=None):
        """SGLang's ``SWAKVPool`` and ``SWATokenToKVPoolAllocator`` (full: ``pool_pages``
        pages, window: ``swa_pages``) and a ``ReqToTokenPool``; returns the allocator."""
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        self.built = Built()
        full, swa = pool_pages * page_size, self.swa_pages * page_size
        kv = self.built.make("kv_pool", SWAKVPool, size=full, size_swa=swa,
                             page_size=page_size, dtype=torch.float16, head_num=1, head_dim=1,
                             swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
                             device=dev)
        allocator = self.built.make("allocator", SWATokenToKVPoolAllocator, size=full,
                                    size_swa=swa, page_size=page_size, dtype=torch.float16,
                                    device=dev, kvcache=kv, need_sort=need_sort)
        tokens = pool_pages * page_size
        self.req_to_token_pool = self.built.make("req_to_token_pool", sg.ReqToTokenPool,
                                                 req_rows or tokens, 2 * tokens + page_size,
                                                 dev, False)
        self.allocator = allocator
        self.pool = SWAFullPool(allocator, pool_pages, page_size, dev)
        self.window_pool = SglangPool(allocator.swa_attn_allocator, self.swa_pages, page_size,
                                      dev, name="window")
        self.pool.window = self.window_pool  # the subject reads the window pool there
        return allocator

    def _build_tree(self, sg, allocator, page_size, core) -> None:
        self.tree = (self._cache_cls or sg.UnifiedRadixCache)(sg.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=allocator, page_size=page_size,
            sliding_window_size=self.window,
            tree_components=(self.FULL, sg.ComponentType.SWA), tree_core_backend=core,
            component_registry_override=self._component_override))
        got = type(self.tree.tree_core).__name__
        want = "UnifiedTreeCore" if core == "python" else "RustUnifiedTreeCore"
        if got != want:
            from caches.target import TargetUnavailable

            raise TargetUnavailable(f"SGLang's tree-core registry chose {got}, not {want}, "
                                    f"for the {core} core here")
        self.white_box = core == "python"
        self.root_id = self.tree.tree_core.root_node_handle()

    # -- allocation -----------------------------------------------------------------------
    def alloc_with_eviction(self, num_tokens: int) -> list[int] | None:
        """Paired full + window slots for ``num_tokens`` (whole pages), evicting first; None
        when out of memory.  ``scheduler``: upstream's ``evict_from_tree_cache(tree, extend +
        page)`` (both pools' shortfalls, module doc); ``reference``: evict each pool's
        shortfall until it fits or nothing goes (``kvcheck diff``)."""
        ps = self.page_size
        if self.alloc_policy == "scheduler":
            evict_from_tree_cache(self.tree, num_tokens + (ps if ps > 1 else 0))
        else:
            a = self.allocator
            while a.available_size() < num_tokens:
                full_short = num_tokens - a.full_available_size()
                swa_short = num_tokens - a.swa_available_size()
                r = self.tree.evict(self.sg.EvictParams(num_tokens=max(full_short, 0),
                                                        swa_num_tokens=max(swa_short, 0)))
                if not (r.num_tokens_evicted or r.swa_num_tokens_evicted):
                    return None
        got = self._alloc_pairs(-(-num_tokens // ps) * ps)
        return None if got is None else got[:num_tokens].tolist()

    def _alloc_pairs(self, n: int):
        """``n`` (whole pages) full slots, each with a window slot mapped to it."""
        a, ps = self.allocator, self.page_size
        if ps == 1:
            return a.alloc(n)
        pages = n // ps
        if not a.new_pages_available(pages, pages):  # upstream: alloc_extend's check
            return None
        full = a.full_attn_allocator.alloc(n)
        window = a.swa_attn_allocator.alloc(n)
        a.set_full_to_swa_mapping(full, window)
        return full

    # -- the window calls -----------------------------------------------------------------
    def _sglang_req(self, req: Req):
        s = super()._sglang_req(req)
        if type(s) is _UReq:  # first sight: the SWA fields of the scheduler's Req
            s.__class__ = _SWAReq
        return s

    def cache_unfinished_req(self, req: Req) -> None:
        """``unified_radix``'s checkpoint; the chunk's own out-of-window free (module doc)
        moves the request's SWA eviction cursor, read back into ``req.swa_evicted_seqlen``."""
        super().cache_unfinished_req(req)
        req.swa_evicted_seqlen = self.evicted_seqlen(req)

    @property
    def swa_evictable_size_(self) -> int:
        return int(self.tree.tree_core.swa_evictable_size())

    @property
    def swa_protected_size_(self) -> int:
        return int(self.tree.tree_core.swa_protected_size())

    def evict_swa(self, num_tokens: int) -> int:
        """``tree.evict(EvictParams(swa_num_tokens=n))``: the window tokens it freed."""
        r = self.tree.evict(self.sg.EvictParams(num_tokens=0, swa_num_tokens=num_tokens))
        return int(r.swa_num_tokens_evicted)

    def free_out_of_window(self, req: Req, pre_len: int | None = None) -> None:
        """One decode step's ``maybe_evict_swa`` for ``req`` (module doc), upstream's own
        method, before the step's allocation.  ``pre_len`` (default ``req.filled``): the
        positions computed so far -- upstream's ``req.seqlen - 1``, the sampled token whose KV
        this step computes counted in ``seqlen`` (``output_ids`` holds it by then; here a
        placeholder id).  The caller says this is not the request's first decode batch
        (``decode_batch_idx >= 1`` is the subject's gate: ``HybridSWASubject._decode_alloc``).
        The request's SWA eviction cursor comes back in ``req.swa_evicted_seqlen``."""
        pre_len = req.filled if pre_len is None else pre_len
        s = self._sglang_req(req)
        s.decode_batch_idx = max(s.decode_batch_idx, 1)
        if pre_len != len(s.origin_input_ids):
            raise RuntimeError(f"kvcheck adapter: free_out_of_window(r{req.rid}, pre_len="
                               f"{pre_len}) with {len(s.origin_input_ids)} tokens computed: "
                               f"the caller's pre_len is not the positions computed so far")
        s.output_ids = [-1]  # upstream: the sampled token this step computes (seqlen - 1)
        try:
            with _env(SGLANG_SWA_EVICTION_INTERVAL=self.eviction_interval,
                      SGLANG_OPT_RELEASE_PREFILL_SWA="false"):
                _DecodeBatch(self.tree, [s]).maybe_evict_swa()
        except AssertionError:
            self._over_freed(f"r{req.rid}'s out-of-window release (maybe_evict_swa)")
            raise
        finally:
            s.output_ids = []
        s.decode_batch_idx += 1  # upstream: prepare_for_decode, after the allocation
        req.swa_evicted_seqlen = self.evicted_seqlen(req)

    def _over_freed(self, what: str) -> None:
        """After an upstream assertion in a window free: when the window allocator now counts
        more free slots than it has (its own guard, ``free_group_end``'s ``available_size()
        <= size``), report that as the conservation violation it is (with the numbers)."""
        a = self.allocator.swa_attn_allocator
        avail, size = int(a.available_size()), int(a.size)
        if avail > size:
            fail("conservation", f"window pool: {avail} slots free of {size} after {what}: "
                 f"something was freed twice or was never allocated (SGLang's allocator "
                 f"guard asserted)", pool="window", free=avail, capacity=size)

    def release_window(self, req: Req) -> bool:
        """``tree.release_swa_prefix_lock(req)``: the SWA part of the request's tree lock
        released early (once; False when there was none to release)."""
        s = self._sglang_req(req)
        lock = s.lock
        if lock is None or lock.swa_released:
            return False
        self.tree.release_swa_prefix_lock(s)
        return bool(lock.swa_released)

    def evicted_seqlen(self, req: Req) -> int:
        """The request's SWA eviction cursor (``req.kv.get_evicted_seqlen(SWA)``; 0 before
        the engine holds a record of it)."""
        s = self._reqs.get(req.rid)
        return 0 if s is None else int(s.kv.get_evicted_seqlen(self.SWA))

    # -- plain facts for the window checks --------------------------------------------------
    def mapping(self) -> dict[int, int]:
        """full slot -> window slot, for every full slot that maps to one (non-zero)."""
        m = self.allocator.full_to_swa_index_mapping[:-1]  # the trailing -1 is last_loc's
        idx = torch.nonzero(m, as_tuple=False).flatten().tolist()
        return dict(zip(idx, m[idx].tolist()))

    def window_free_pages(self) -> list[int]:
        return versions.allocator_free_pages(self.allocator.swa_attn_allocator)

    def request_windows(self) -> dict[int, tuple[dict[int, int], int]]:
        """rid -> ({position: window slot} for each of its row's positions that maps one,
        its SWA eviction cursor), over the live requests the engine holds a row for."""
        m = self.allocator.full_to_swa_index_mapping
        out = {}
        for rid, s in self._reqs.items():
            if s.kv.req_pool_idx is None:
                continue
            n = s.kv.kv_allocated_len
            row = self.req_to_token_pool.req_to_token[s.kv.req_pool_idx, :n].long()
            win = m[row].tolist()
            out[rid] = ({p: w for p, w in enumerate(win) if w != SENTINEL},
                        int(s.kv.get_evicted_seqlen(self.SWA)))
        return out

    def lock_receipts(self) -> list[tuple[int, object, bool]]:
        """(node handle, SWA segment stamp or None, window part released) for every tree lock
        held: the receipts of bare locks and of admissions not yet bound to a request
        (``_receipts``), and each request's ``TreeLock`` (``req.lock``)."""
        SWA, out = self.SWA, []
        for raw, held in self._receipts.items():
            out += [(raw, r.component_lock_uuids.get(SWA), False) for r in held]
        for s in self._reqs.values():
            if s.lock is not None:
                out.append((s.lock.node, s.lock.receipt.component_lock_uuids.get(SWA),
                            bool(s.lock.swa_released)))
        return out

    def node_stamp(self, node) -> object:
        """The window-lock boundary stamp on a ``UnifiedTreeNode`` (``metadata["uuid"]``)."""
        return node.component_data[self.SWA].metadata.get("uuid")


class UnifiedSWASubject(UnifiedRadixSubject, HybridSWASubject):
    """The hybrid-swa machine's subject over 0.5.23's ``UnifiedRadixCache`` (Full + SWA): the
    radix request path and checks of ``UnifiedRadixSubject`` (white box on the Python core,
    black box on the Rust one), the window ops and checks of ``HybridSWASubject`` with the
    window snapshot read from SGLang's objects (``window_state``)."""

    def __init__(self, *, page_size: int = 1, pool_pages: int = 12, swa_pages: int = 6,
                 window: int = 4, device=None, fault: str | None = None,
                 alloc_policy: str = "scheduler", skip_known_findings: bool | None = None,
                 core: str = "python", adapter_options: dict | None = None):
        """``adapter_options``: a subclass's ``adapter_cls`` keywords (``unified_swa_mamba``)."""
        self.target = "sglang" if core == "python" else "sglang-rust"
        override, cache_cls = swa_fault_classes(fault, core)
        adapter = self.adapter_cls(page_size, pool_pages, swa_pages, window, device,
                                   core=core, alloc_policy=alloc_policy,
                                   component_override=override, cache_cls=cache_cls,
                                   **(adapter_options or {}))
        self.white_box = adapter.white_box
        HybridSWASubject.__init__(self, page_size=page_size, pool_pages=pool_pages,
                                  swa_pages=swa_pages, window=window, device=device,
                                  cache=adapter)
        self._known(skip_known_findings)
        self._watch_upstream()

    adapter_cls = UnifiedSWAAdapter
    lifecycle_declined = {"dllm_step": "not an op of the hybrid-swa variant"}
    insert = UnifiedRadixSubject.insert  # 0.5.23's insert owns the whole value
    # the allocation policy is not judged on this variant (HybridSWASubject: a failed
    # allocation may be short in either pool)
    alloc_demands = HybridSWASubject.alloc_demands

    # -- the window ops, as the scheduler calls them ------------------------------------------
    def release_window(self, rid: int) -> str:
        """``tree.release_swa_prefix_lock(req)`` on the request's own lock (upstream releases
        a lock's window part only when its segment carries an SWA stamp: a locked path
        shorter than the window reached the root and has none)."""
        req = self._decoding(rid)
        if req.output < self.window:
            raise Skip(f"r{rid} has decoded {req.output} < window {self.window} tokens")
        if req.last_node is self.cache.root_node:
            raise Skip(f"r{rid} holds no tree lock")
        if not self.cache.release_window(req):
            raise Skip(f"r{rid}'s lock has no window part to release (released already, or "
                       f"its window segment reached the root: no SWA stamp)")
        self.reached("window-lock-released")
        return f"released r{rid}'s window lock"

    # -- views and checks -----------------------------------------------------------------------
    def window_spans(self, match) -> list:
        """Python core: the matched path's nodes (root first); Rust core (no nodes): each
        matched token as a span of its own, live when its full slot maps a window slot."""
        cache = self.cache
        if not self.white_box:
            mapping = cache.mapping()
            return [(f"slot {s}", 1, s in mapping) for s in match.indices]
        core, spans = cache.tree.tree_core, []
        node = core.node_by_id(match.last_node.raw)
        while node is not core.root_node:
            spans.append((node.id - cache.root_id, len(node.key),
                          node.component_data[cache.SWA].value is not None))
            node = node.parent
        return spans[::-1]

    def window_state(self) -> WindowState:
        """The window snapshot from SGLang's objects: nodes (Python core: every node's Full
        and SWA component data and SWA stamp; Rust core: the tree's slots as two aggregate
        nodes -- mapped and tombstoned -- read from ``all_values_flatten`` and the map), the
        window allocator's free pages, the full -> window map, each live request's row
        (SGLang's ``req_to_token`` once it holds one) and SWA cursor, the lock receipts and
        the tree core's window counters."""
        cache, mapping = self.cache, self.cache.mapping()
        rows = cache.request_windows()
        requests = []
        for rid, r in sorted(self.requests.items()):
            own, evicted = rows.get(rid, (None, r.swa_evicted_seqlen))
            if own is None:  # the engine holds no row for it yet: the admission's slots
                own = {p: mapping[s] for p, s in enumerate(r.kv_indices) if s in mapping}
            own = {p: w for p, w in own.items() if p >= r.cache_protected_len}
            requests.append(WindowRequest(rid, own, r.cache_protected_len, evicted,
                                          self.frontiers.get(rid)))
        root = 0
        if self.white_box:
            nodes, receipts = self._window_nodes(), self._window_receipts()
            holders = {k: v for k, v in self.held_locks().items() if k != root}
            ev, pr = cache.swa_evictable_size_, cache.swa_protected_size_
        else:
            slots = cache.tree_slots()
            live = tuple(s for s in slots if s in mapping)
            dead = tuple(s for s in slots if s not in mapping)
            nodes = {root: WindowNode(root, None, (), None, 0),
                     -1: WindowNode(-1, root, live, tuple(mapping[s] for s in live), 0),
                     -2: WindowNode(-2, root, dead, None, 0)}
            receipts, holders, ev, pr = (), {}, None, None
        return WindowState(self.window, self.page_size, cache.window_pool.view(), root, nodes,
                           mapping, tuple(requests), receipts, ev, pr, holders=holders,
                           free_full=tuple(self.pool.free_pages))

    def _window_nodes(self) -> dict:
        cache = self.cache
        FULL, SWA, base = cache.FULL, cache.SWA, cache.root_id
        nodes, stack = {}, [cache.tree.tree_core.root_node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            w = n.component_data[SWA]
            nid = n.id - base
            nodes[nid] = WindowNode(nid, None if n.parent is None else n.parent.id - base,
                                    ids_of(n.component_data[FULL].value),
                                    None if w.value is None else ids_of(w.value),
                                    int(w.lock_ref), cache.node_stamp(n))
        return nodes

    def _window_receipts(self) -> tuple:
        base = self.cache.root_id  # a lock on the root locks no segment (no receipt)
        return tuple((raw - base, stamp, released)
                     for raw, stamp, released in self.cache.lock_receipts() if raw != base)

    def check(self) -> None:
        """White box: ``UnifiedRadixSubject``'s checks, then the window's (``HybridSWASubject.
        check`` in the chain).  Black box: the radix black-box checks, then the window
        snapshot's sentinel / pool / request checks and the window counters' total."""
        super().check()
        if not self.white_box:
            state = self.window_state()
            self._window_transitions(state)  # tombstones made / recovered, seen by slot
            check_window(state)
            self._check_window_total(state)

    def _check_window_total(self, state: WindowState) -> None:
        """Rust core: the tree's live window tokens (its full slots that map a window slot)
        == the core's SWA evictable + protected counters."""
        ev, pr = self.cache.swa_evictable_size_, self.cache.swa_protected_size_
        live = len(state.nodes[-1].window)
        if ev + pr != live or ev < 0 or pr < 0:
            fail("size-accounting", f"window counters evictable={ev} protected={pr}, but the "
                 f"tree's full slots map {live} live window slots", evictable=ev,
                 protected=pr, live=live)

    def _check_black_box_quiescent(self) -> None:
        super()._check_black_box_quiescent()
        check_conservation(self.cache.window_pool.view(), {})

    def check_quiescent(self) -> None:
        if self.white_box:
            HybridSWASubject.check_quiescent(self)
            self._check_rows()
            self._check_core()
        else:
            super().check_quiescent()

    def outline(self) -> str:
        lines = [SglangRadixSubject.outline(self) if self.white_box else "", "window:"]
        state = self.window_state()
        for nid, n in sorted(state.nodes.items(), key=lambda kv: kv[0]):
            if nid != state.root:
                lines.append(f"  #{nid} " + ("tombstone" if n.window is None
                                              else f"window={list(n.window)}")
                             + f" wlock={n.lock}" + (f" stamp={n.stamp}" if n.stamp else ""))
        for r in state.requests:
            lines.append(f"  r{r.rid}: window freed below {r.evicted}")
        return "\n".join(lines)

    def state(self):
        return None  # no exhaustive search over the upstream caches (``kvcheck check``)

    def abstract_state(self) -> dict:
        """``HybridSWASubject``'s (the radix state and each node's window state by token path;
        the Rust core shows neither), plus each live request's SWA eviction cursor (compared
        when both sides report it: the two tree cores)."""
        state = HybridSWASubject.abstract_state(self)
        if not self.white_box:
            state.pop("tree", None)
            state.pop("window", None)
        state["swa_evicted"] = tuple((rid, r.swa_evicted_seqlen)
                                     for rid, r in sorted(self.requests.items()))
        return state


def swa_fault_classes(fault: str | None, core: str) -> tuple:
    """(``component_registry_override``, ``UnifiedRadixCache`` subclass or None) carrying
    catalogued fault ``fault`` (``swa_faults.py``); (None, None) without one.  The Rust core
    takes none (compiled code)."""
    if fault is None:
        return None, None
    from caches.target import FaultNotInjectable

    if core != "python":
        raise FaultNotInjectable(f"the Rust tree core is compiled code: no catalogued "
                                 f"fault is patched into it (asked: {fault})")
    types = loader.load().ComponentType  # (SGLang imported through the loader first)
    from caches.adapters.sglang.swa_faults import swa_fault

    component, cache_cls = swa_fault(fault)
    return (None if component is None else {types.SWA: component}), cache_cls


def make_subject(params, fault=None, device=None, core="python", **options):
    return UnifiedSWASubject(page_size=params["page_size"], pool_pages=params["pool_pages"],
                             swa_pages=params["swa_pages"], window=params["window"],
                             device=device, fault=fault, core=core, **options)
