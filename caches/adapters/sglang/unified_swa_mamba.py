"""``--target sglang`` / ``--target sglang-rust`` for the hybrid-swa variant at ``--param mamba=1``
on SGLang 0.5.23: ``UnifiedRadixCache`` with the Full, SWA and Mamba components -- what
``mem_cache/registry.py`` ``create_unified_radix_cache`` builds for a model with sliding-window,
full-attention and mamba layers (``is_hybrid_swa`` and ``is_hybrid_ssm``: ``tree_components=
(FULL, SWA, MAMBA)``, appended in that order to the ``CacheInitParams``), over the Python tree
core or the Rust one (``tree_core_registry``, no silent fallback).

Everything of ``unified_swa.py`` (the ``SWAKVPool`` / ``SWATokenToKVPoolAllocator`` pair, the
request path, the window calls, the window snapshot and checks), with the request pool of
``unified_mamba.py`` in place of the plain ``ReqToTokenPool``: a ``HybridReqToTokenPool`` with
its real ``MambaPool`` and ``MambaSlotAllocator`` (built by ``mamba.MambaTreeAdapter.
_build_device_tier``, whose own full allocator is not used here; the process-wide config the
Mamba component reads is published as ``unified_mamba.publish_server_config`` does).  Page 1
only: without the extra buffer the Mamba component asserts page 1 (``--mamba-radix-cache-
strategy no_buffer``, what ``auto`` resolves to at page 1 without overlap scheduling).

The mamba request path, each step the upstream call where there is one (``upstream:``):

* admission: upstream's ``alloc_req_slots`` runs ``ensure_mamba_capacity`` (mem_cache/
  allocation.py 298-325: evict ``needed - available`` states through ``tree.evict_for_alloc(
  EvictParams(0, mamba_num))``) and ``HybridReqToTokenPool.alloc`` (memory_pool.py 1572-1630:
  a row, and a state slot for a request that holds none) *before* the KV allocation
  (``prepare_for_extend``); here the adapter calls ``ensure_mamba_capacity`` itself (upstream's
  function) right before the admission's KV allocation, and binds the request (its row, its
  slot: ``HybridReqToTokenPool.alloc``) right after it.  The copy-on-write of the matched
  node's state into that slot (``MambaComponent.finalize_match_result_in_cache``) is a state
  copy: the state contents are not checked on this variant (no fingerprints), only slots;
* a chunk's ``checkpoint`` forks the running state into a fresh slot for the tree
  (``MambaComponent.prepare_for_caching_req`` -> ``_alloc_mamba_slot``, its own eviction);
* finish donates the request's slot to the tree, abort / retract free it (``on_release``);
* the bare ``insert`` donates a fresh state (0.5.23's insert asserts a ``mamba_value`` on a
  Mamba tree -- the Rust core panics "mamba insert requires a donated mamba_value"), freed
  again when the tree already had one (``InsertResult.mamba_exist``).

The running requests are capped as the server caps them: ``max_running_requests`` =
``mamba_slots // 3`` (``kv_cache_configurator.py`` 227-229
``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO``, ``resolve_max_num_reqs``), the request pool
sized to it.  What only a bare ``lock`` holder (not the scheduler) can bring about is declined,
as the himamba subject declines it at host=0 (``HiMambaSubject._fork_starved``): a chunk whose
fork finds no state free and none evictable, and an admission whose state cannot be had
(``ensure_mamba_capacity`` False) -- with at most ``mamba_slots // 3`` running requests, each
pinning one state, the scheduler alone cannot starve either.  The known finding F7 (write-through
pins at host=1) does not arise: there is no host tier here.

Checks, on top of the hybrid-swa subject's: mamba-pool conservation (free + the tree's states
+ each live request's slot == capacity, no slot twice; both cores, the tree's states from
``all_mamba_values_flatten``), the Mamba counters against the tree's states
(``size-accounting``), and on the Python core each node's Mamba lock against the live lock
receipts that took it (``ref-balance``, ``invariants/tiers.check_node_refs``) and Full >= Mamba
lock on every node (``check_lock_order``).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from caches.adapters.sglang.unified_radix import _UReq
from caches.adapters.sglang.unified_swa import UnifiedSWAAdapter, UnifiedSWASubject
from caches.subjects.base import Skip
from invariants import TreeView, check_conservation, fail
from invariants.conservation import check_held_once
from invariants.tiers import check_lock_order, check_node_refs

# upstream: mem_cache/kv_cache_configurator.py MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
# (without the extra buffer): the server runs at most mamba_slots // 3 requests
STATES_PER_RUNNING_REQUEST = 3


class UnifiedSWAMambaAdapter(UnifiedSWAAdapter):
    """``UnifiedSWAAdapter`` with the Mamba component and ``HybridReqToTokenPool`` (module
    doc)."""

    def __init__(self, page_size: int = 1, pool_pages: int = 16, swa_pages: int = 8,
                 window: int = 4, device=None, *, mamba_slots: int = 6, core: str = "python",
                 alloc_policy: str = "scheduler", component_override=None, cache_cls=None):
        if page_size != 1:
            raise ValueError(f"mamba=1 runs at page_size 1 only (the Mamba component asserts "
                             f"page 1 without the extra buffer), got page_size={page_size}")
        self.max_running = mamba_slots // STATES_PER_RUNNING_REQUEST
        if self.max_running < 1:
            raise ValueError(f"mamba_slots must be >= {STATES_PER_RUNNING_REQUEST} (SGLang "
                             f"runs mamba_slots // {STATES_PER_RUNNING_REQUEST} requests), "
                             f"got {mamba_slots}")
        self.mamba_slots, self._pending_mamba = mamba_slots, None
        super().__init__(page_size, pool_pages, swa_pages, window, device, core=core,
                         alloc_policy=alloc_policy, component_override=component_override,
                         cache_cls=self._with_mamba(cache_cls))
        self.MAMBA = self.sg.ComponentType.MAMBA

    def _with_mamba(self, cache_cls):
        """The tree class, built as ``create_unified_radix_cache`` builds it for a hybrid SSM
        model: MAMBA appended to the params' ``tree_components``."""
        def build(params):
            params.tree_components = tuple(params.tree_components) + (
                self.sg.ComponentType.MAMBA,)
            return (cache_cls or self.sg.UnifiedRadixCache)(params)
        return build

    def _build_pools(self, sg, page_size, pool_pages, dev, need_sort, req_rows=None):
        """``UnifiedSWAAdapter``'s pools, with the request pool replaced by ``unified_mamba``'s
        ``HybridReqToTokenPool`` (``max_running`` rows) and its mamba pool view ``mamba``."""
        from caches.adapters.sglang.mamba import MambaTreeAdapter
        from caches.adapters.sglang.unified_mamba import publish_server_config

        allocator = super()._build_pools(sg, page_size, pool_pages, dev, need_sort, req_rows)
        tier = SimpleNamespace()
        MambaTreeAdapter._build_device_tier(tier, pool_pages * page_size, self.mamba_slots,
                                            self.max_running, dev,
                                            publish=publish_server_config)
        self.req_to_token_pool, self.mamba = tier.req_to_token_pool, tier.mamba
        return allocator

    # -- the mamba request path -------------------------------------------------------------
    def ensure_mamba(self, needed: int = 1) -> bool:
        """upstream: ``ensure_mamba_capacity`` for ``needed`` requests that hold no state yet
        (it evicts the shortfall); True when that many slots are free after it."""
        from sglang.srt.mem_cache.allocation import ensure_mamba_capacity

        fresh = [_UReq(-1, self._ReqKvInfo()) for _ in range(needed)]
        return bool(ensure_mamba_capacity(self.req_to_token_pool, fresh, self.tree))

    def mamba_obtainable(self) -> int:
        """State slots free or evictable (what an eviction could give back)."""
        return self.mamba.available_size() + self.mamba_evictable_size_

    def bind(self, req) -> None:
        """The admitted request's row and state slot (``HybridReqToTokenPool.alloc``)."""
        self._sglang_req(req)

    def request_mamba_slots(self) -> dict[int, int]:
        return {rid: int(s.kv.mamba_pool_idx) for rid, s in self._reqs.items()
                if s.kv.mamba_pool_idx is not None}

    def alloc_mamba_state(self) -> int | None:
        """One state slot for a bare insert: ``alloc(1)``, else ``evict_for_alloc(
        EvictParams(0, mamba_num=1))`` and again (``MambaComponent._alloc_mamba_slot``'s
        steps, without its assertion); None when none can be had."""
        slots = self.req_to_token_pool.mamba_allocator
        got = slots.alloc(1)
        if got is None:
            self.tree.evict_for_alloc(self.sg.EvictParams(num_tokens=0, mamba_num=1))
            got = slots.alloc(1)
        return None if got is None else int(got[0])

    def insert(self, key, value) -> int:
        """The bare insert, donating the pending state (``alloc_mamba_state``); a state the
        tree already had leaves the donated one the caller's, freed here."""
        m, self._pending_mamba = self._pending_mamba, None
        if m is None:
            raise RuntimeError("kvcheck adapter: a bare insert on the Mamba tree without a "
                               "state to donate")
        r = self.tree.insert(self.sg.InsertParams(
            key=self._key(key), value=self._tensor(value),
            mamba_value=torch.tensor([m], dtype=torch.int64, device=self.device)))
        if r.mamba_exist:
            self.mamba.free([m])
        return r.prefix_len

    # -- the tree's states ------------------------------------------------------------------
    def tree_mamba_slots(self) -> list[int]:
        return self.tree.tree_core.all_mamba_values_flatten().view(-1).tolist()

    mamba_evictable_size_ = property(
        lambda self: int(self.tree.tree_core.mamba_evictable_size()))
    mamba_protected_size_ = property(
        lambda self: int(self.tree.tree_core.mamba_protected_size()))

    def mamba_holders(self) -> dict[int, int]:
        """node handle -> the live lock receipts that took its Mamba lock (the receipts of
        bare locks and pins not yet bound, and each request's ``TreeLock``) and still hold
        it: an early window release (``release_swa`` -> ``dec_swa_lock_only``,
        unified_tree_core.py 834-864) drops the locks of lower eviction priority co-located
        on the node -- Mamba's -- with the SWA part, and the final ``unlock`` skips them
        (``skip_swa_and_below``)."""
        MAMBA, held = self.MAMBA, {}
        receipts = [r for rs in self._receipts.values() for r in rs]
        receipts += [s.lock.receipt for s in self._reqs.values()
                     if s.lock is not None and not s.lock.swa_released]
        for r in receipts:
            if MAMBA not in r.skipped_lock_components:
                held[r.node_id] = held.get(r.node_id, 0) + 1
        return held


class UnifiedSWAMambaSubject(UnifiedSWASubject):
    """The hybrid-swa subject over ``UnifiedRadixCache`` (Full + SWA + Mamba): the mamba
    request path and checks of the module doc on top of ``UnifiedSWASubject``."""

    adapter_cls = UnifiedSWAMambaAdapter

    def __init__(self, *, mamba_slots: int = 6, **options):
        self._admitting = self._starved = False
        super().__init__(adapter_options={"mamba_slots": mamba_slots}, **options)

    # -- admission ---------------------------------------------------------------------------
    def _running_full(self, admitted: int = 0) -> bool:
        return len(self.requests) + admitted >= self.cache.max_running

    def admit(self, rid: int, tokens: list[int]) -> str:
        if rid not in self.requests and rid not in self.waiting and self._running_full():
            return (f"not admitted: {self.cache.max_running} requests running "
                    f"(max_running_requests = mamba_slots // {STATES_PER_RUNNING_REQUEST})")
        self._admitting, self._starved = True, False
        try:
            out = super().admit(rid, tokens)
        finally:
            self._admitting = False
        if rid in self.requests:
            self.cache.bind(self.requests[rid])
        elif self._starved:
            raise Skip("no mamba state can be had for the admission (bare locks pin every "
                       "state: not the scheduler's doing)")
        return out

    def _alloc(self, n: int):
        """At an admission: upstream's ``ensure_mamba_capacity`` first (``alloc_req_slots``
        runs before the KV allocation)."""
        if self._admitting and not self.cache.ensure_mamba(1):
            self._starved = True
            return None
        return super()._alloc(n)

    def _pin(self, req, admitted: int):
        """A batch pass refuses past ``max_running_requests``, and (declined, see the module
        doc) a request whose state could not be had besides the pass's earlier ones."""
        if self._running_full(admitted):
            return None
        pinned = super()._pin(req, admitted)
        if pinned is not None and self.cache.mamba_obtainable() < admitted + 1:
            self._unpin(req, pinned)
            return None
        return pinned

    def _alloc_prefill(self, n: int):
        if not self.cache.ensure_mamba(1):
            return None  # admitted yet starved: admission-sound reports it
        return super()._alloc_prefill(n)

    def _place(self, req, pinned, own) -> None:
        super()._place(req, pinned, own)
        self.cache.bind(req)

    # -- chunks and the bare insert ----------------------------------------------------------
    def prefill(self, rid: int, n: int) -> str:
        req = self.req(rid)
        if req.filled + n < len(req.tokens) and self.cache.mamba_obtainable() == 0:
            raise Skip("no mamba state can be freed for the chunk's fork")
        return super().prefill(rid, n)

    def insert(self, tokens: list[int]) -> str:
        m = self.cache.alloc_mamba_state()
        if m is None:
            self.reached("out-of-memory")
            return "out of mamba states"
        self.cache._pending_mamba = m
        try:
            return super().insert(tokens)
        finally:
            left, self.cache._pending_mamba = self.cache._pending_mamba, None
            if left is not None:  # the KV allocation failed: the state was never donated
                self.cache.mamba.free([left])

    # -- checks --------------------------------------------------------------------------------
    def check(self) -> None:
        """The mamba checks first (a Mamba lock left held also keeps its node out of the
        eviction set, which the radix checks would report less precisely), then
        ``UnifiedSWASubject``'s."""
        self._check_mamba()
        super().check()

    def _check_mamba(self) -> None:
        c = self.cache
        states = c.tree_mamba_slots()
        check_held_once(c.mamba.name, "the tree", states)
        reqs = c.request_mamba_slots()
        check_conservation(c.mamba.view(), {"tree": states, **{f"request r{rid}": [m]
                                                               for rid, m in reqs.items()}})
        ev, pr = c.mamba_evictable_size_, c.mamba_protected_size_
        if ev + pr != len(states) or ev < 0 or pr < 0:
            fail("size-accounting", f"mamba: evictable {ev} + protected {pr} != "
                 f"{len(states)} states the tree holds", label="mamba", evictable=ev,
                 protected=pr, tree=len(states))
        if self.white_box:
            tree = self._mamba_tree()
            held = {h - c.root_id: k for h, k in c.mamba_holders().items() if h != c.root_id}
            check_node_refs(tree, "mamba", held, root_baseline=1)  # the root is pinned
            check_lock_order(tree)

    def _mamba_tree(self) -> TreeView:
        """Python core: the radix tree view (``TreeCoreViews.tree_view``) with each node's
        Full and Mamba lock counts as ``refs``."""
        c = self.cache
        view, node_by_id, base = self.tree_view(), c.tree.tree_core.node_by_id, c.root_id
        return TreeView({nid: n._replace(refs={
            "full": n.refs["lock"],
            "mamba": int(node_by_id(nid + base).component_data[c.MAMBA].lock_ref)})
            for nid, n in view.nodes.items()}, view.root, view.page_size)

    def check_quiescent(self) -> None:
        super().check_quiescent()
        if self.cache.tree_mamba_slots():
            fail("quiescence", f"after drain the tree still holds "
                 f"{len(self.cache.tree_mamba_slots())} mamba states")
        check_conservation(self.cache.mamba.view(), {})

    def abstract_state(self) -> dict:
        """``UnifiedSWASubject``'s, plus how many states the tree and the requests hold
        (compared between the two cores)."""
        state = super().abstract_state()
        state["mamba"] = (len(self.cache.tree_mamba_slots()),
                          tuple(sorted(self.cache.request_mamba_slots())))
        return state


def make_subject(params, fault=None, device=None, core="python", **options):
    return UnifiedSWAMambaSubject(page_size=params["page_size"], pool_pages=params["pool_pages"],
                                  swa_pages=params["swa_pages"], window=params["window"],
                                  mamba_slots=params["mamba_slots"], device=device,
                                  fault=fault, core=core, **options)
