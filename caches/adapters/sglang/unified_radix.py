"""``--target sglang`` / ``--target sglang-rust`` for the radix variant on SGLang 0.5.23:
``UnifiedRadixCache`` with the Full component, over the Python tree core
(``unified_cache/unified_tree_core.py``) or the Rust one (``rust_tree_core/``, the compiled
extension in the x86_64 wheel), both chosen through SGLang's own ``tree_core_registry``
(``CacheInitParams.tree_core_backend``).

The adapter keeps ``radix.py``'s interface (``SglangRadixCache``: the same allocators, request
pool, fingerprints and request-pool check); what differs on 0.5.23:

* nodes are ``NodeId`` handles.  The Python core resolves them to ``UnifiedTreeNode`` objects
  (``node_by_id``/``root_node``), so the whole tree is visible and every white-box check of the
  radix subject runs (structure, size accounting, ref balance, eviction set, and the eviction
  policy: victim, over-eviction, spurious OOM, recency -- the victims recorded where 0.5.23's
  Full walk removes them, ``UnifiedTreeCore.evict_device_leaf``, under the key its heap uses;
  ``TreeCoreViews``' "eviction policy" block).  The Rust core exposes no nodes
  (``node_by_id`` raises ``NotImplementedError`` upstream; no victim is seen there, so no
  policy check runs on it): the subject checks what is observable from outside -- the cache's
  sizes against ``all_values_flatten()`` (the tree's slots), conservation of the allocator's
  pages between tree, requests and free list, the core's own ``sanity_check``, match contract
  and KV fingerprints on every hit, quiescence -- and ``kvcheck diff radix --target sglang
  --against sglang-rust`` compares it step by step with the Python core (op results and
  counters).
* locks are receipts: ``inc_lock_ref`` returns one and ``dec_lock_ref`` takes it back
  (``TreeLock``); the adapter keeps them per node.  An unmatched unlock passes an empty receipt.
* the request path is the scheduler's of 0.5.23: a request carries SGLang's own ``ReqKvInfo``
  (``req.kv``) and ``req.lock``; a chunk is cached with ``tree_cache.checkpoint(req, up_to)``,
  and finishing/aborting is ``mem_cache.common.release_kv_cache(req, tree_cache,
  checkpoint=...)``'s steps, each the upstream call (claim_kv_row, checkpoint, free_kv_row,
  unlock, the over-allocated tail, on_release, the request-pool row).
* keys are ``array('q')`` token ids (what the Rust core demands and the scheduler passes).
* allocation is 0.5.23's (``alloc_with_eviction``): upstream's own ``evict_from_tree_cache(tree,
  extend + page)`` (mem_cache/common.py:283-289), which evicts only the shortfall against the
  allocator's free tokens through ``tree.evict_for_alloc`` (``allocator.evict_to_free_tokens``,
  allocator/base.py:155-169) -- 0.5.12.post1 evicted the whole request through ``evict``
  (``radix.py``).  The declared need is 0.5.23's (``policy.sglang_0523_scheduler_need``); the
  victims are recorded at the Full walk's seam whichever entry point ran it, and
  ``evict_for_alloc`` calls are counted for coverage (``TreeCoreViews._watch_alloc_evictions``).

Node ids in op results would differ between the two cores (the Python core numbers nodes from a
process-global counter, with gaps), so this subject's ``lock`` reports the locked depth only.
"""

from __future__ import annotations

from array import array

import torch

from caches.adapters import KnownUpstreamFinding
from caches.adapters.raw_radix import ids_of
from caches.adapters.sglang import loader
from caches.adapters.sglang.radix import (ALLOC_POLICIES, MatchResult, Node,
                                          SglangRadixCache, SglangRadixSubject)
from caches.pools import resolve_device
from caches.request import Req
from caches.subjects.base import Skip
from caches.seam import Policy
from caches.subjects.radix import RadixSubject
from invariants import NodeView, TreeView, check_conservation, check_held_once, fail
from invariants.policy import sglang_0523_scheduler_need

CORES = ("python", "rust")


class UNode:
    """A ``NodeId`` seen through our node interface (one per id, so ``is`` works); on the
    Python core its fields are the ``UnifiedTreeNode``'s, on the Rust core only the id."""

    __slots__ = ("raw", "_cache")

    def __init__(self, raw: int, cache: "UnifiedRadixAdapter"):
        self.raw, self._cache = raw, cache

    def _obj(self):
        return self._cache.tree.tree_core.node_by_id(self.raw)

    @property
    def id(self) -> int:
        return self.raw - self._cache.root_id

    @property
    def parent(self):
        if not self._cache.white_box:
            return None
        p = self._obj().parent
        return None if p is None else self._cache.node(p.id)

    @property
    def children(self) -> dict:
        if not self._cache.white_box:
            return {}
        return {ck: self._cache.node(c.id) for ck, c in self._obj().children.items()}

    @property
    def key(self) -> tuple:
        k = self._obj().key if self._cache.white_box else None
        return () if k is None else tuple(k.token_ids[:len(k)])

    @property
    def value(self) -> tuple:
        if not self._cache.white_box:
            return ()
        v = self._obj().component_data[self._cache.FULL].value
        return () if v is None else ids_of(v)

    @property
    def lock_ref(self) -> int:
        if not self._cache.white_box:
            return 0
        return self._obj().component_data[self._cache.FULL].lock_ref

    @property
    def last_access_time(self):
        return self._obj().last_access_time if self._cache.white_box else 0

    def __repr__(self) -> str:
        return f"sglang.UnifiedTreeNode({self.id})"


class _UReq:
    """The fields of 0.5.23's ``schedule_batch.Req`` that ``UnifiedRadixCache.checkpoint`` and
    ``release_kv_cache`` read, around SGLang's own ``ReqKvInfo`` record (``req.kv``)."""

    def __init__(self, rid: int, kv):
        self.rid = str(rid)
        self.kv = kv
        self.lock = None
        self.last_node = None
        self.origin_input_ids = array("q")
        self.full_untruncated_fill_ids = array("q")
        self.output_ids = []
        self.priority = 0
        self.session_id = None
        self.session = None
        self.kv_rotation_base = None
        self.extra_key = None
        self.cache_salt = None
        self.skip_radix_cache_insert = False
        self.finished_len = None
        self.finished_reason = None
        self.reasoning_tokens = 0
        self.prefix_len = 0
        self._finished = False

    def finished(self) -> bool:
        return self._finished

    def refresh_fill_ids(self) -> None:  # upstream: the fill ids are the tokens computed so far
        pass



class UnifiedRadixAdapter(SglangRadixCache):
    """``UnifiedRadixCache`` (Full component, one tree core) with the real allocators and
    request pool behind the radix subject's interface."""

    def __init__(self, page_size: int = 1, pool_pages: int = 16, device=None, *,
                 core: str = "python", alloc_policy: str = "scheduler", cache_cls=None,
                 component_override=None, req_rows: int | None = None):
        self._cache_cls, self._component_override = cache_cls, component_override
        if alloc_policy not in ALLOC_POLICIES:
            raise ValueError(f"alloc_policy must be one of {ALLOC_POLICIES}, got {alloc_policy!r}")
        if core not in CORES + ("radixcache",):
            raise ValueError(f"core must be one of {CORES}, got {core!r}")
        sg = self.sg = loader.load()
        from sglang.srt.managers.schedule_batch import ReqKvInfo

        self._ReqKvInfo = ReqKvInfo
        dev = resolve_device(device)
        self.page_size, self.alloc_policy, self.core = page_size, alloc_policy, core
        allocator = self._build_pools(sg, page_size, pool_pages, dev, False, req_rows)
        self.FULL = sg.ComponentType.FULL
        self.device = dev
        self._nodes: dict = {}
        self._reqs: dict[int, _UReq] = {}
        self._receipts: dict = {}  # node handle -> lock receipts not yet returned
        self._build_tree(sg, allocator, page_size, core)

    def _build_tree(self, sg, allocator, page_size, core) -> None:
        self.tree = sg.UnifiedRadixCache(sg.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=allocator, page_size=page_size,
            tree_components=(self.FULL,), tree_core_backend=core,
            component_registry_override=self._component_override))
        got = type(self.tree.tree_core).__name__
        want = "UnifiedTreeCore" if core == "python" else "RustUnifiedTreeCore"
        if got != want:  # the registry fell back (e.g. torch outside the Rust core's range)
            from caches.target import TargetUnavailable

            raise TargetUnavailable(f"SGLang's tree-core registry chose {got}, not {want}, "
                                    f"for the {core} core here")
        self.white_box = core == "python"
        self.root_id = self.tree.tree_core.root_node_handle()

    # -- nodes ----------------------------------------------------------------------------
    def node(self, raw: int) -> UNode:
        n = self._nodes.get(raw)
        if n is None:
            n = self._nodes[raw] = UNode(raw, self)
        return n

    @property
    def root_node(self) -> UNode:
        return self.node(self.root_id)

    @property
    def evictable_size_(self) -> int:
        return int(self.tree.tree_core.evictable_size())

    @property
    def protected_size_(self) -> int:
        return int(self.tree.tree_core.protected_size())

    @property
    def evictable_leaves(self) -> list[UNode]:
        core = self.tree.tree_core
        leaves = getattr(core, "evictable_leaves", None)
        if leaves is None:
            leaves = getattr(core, "evictable_device_leaves", None)
        if leaves is None:
            return []
        return [self.node(n.id if hasattr(n, "id") else n) for n in leaves]

    def tree_slots(self) -> list[int]:
        """Every device slot the tree holds (both cores: ``all_values_flatten``)."""
        return self.tree.tree_core.all_values_flatten().tolist()

    # -- tree API -------------------------------------------------------------------------
    def _key(self, tokens):
        return self.sg.RadixKey(array("q", tokens))

    def match_prefix(self, key) -> MatchResult:
        r = self.tree.match_prefix(self.sg.MatchPrefixParams(key=self._key(key)))
        n = r.device_prefix_len
        idx = self.tree.path_device_indices(r.last_device_node)[:n].tolist() if n else []
        return MatchResult(idx, self.node(r.last_device_node))

    def insert(self, key, value) -> int:
        return self.tree.insert(self.sg.InsertParams(key=self._key(key),
                                                     value=self._tensor(value))).prefix_len

    def inc_lock_ref(self, node: UNode) -> None:
        receipt = self.tree.inc_lock_ref(node.raw).to_dec_params()
        self._receipts.setdefault(node.raw, []).append(receipt)

    def dec_lock_ref(self, node: UNode) -> None:
        held = self._receipts.get(node.raw)
        receipt = held.pop() if held else self.sg.DecLockRefParams(node_id=node.raw)
        self.tree.dec_lock_ref(node.raw, receipt)

    def alloc_with_eviction(self, num_tokens: int) -> list[int] | None:
        """Slots for ``num_tokens`` (whole pages), evicting first; None when out of memory.

        ``scheduler`` (default) is 0.5.23's, the upstream functions themselves on the real
        tree and allocator: ``evict_from_tree_cache(tree, n)`` (mem_cache/common.py:283-289)
        with ``n`` the request size -- the extension, plus one page when paged
        (``alloc_token_slots`` / ``alloc_paged_token_slots_extend``, mem_cache/allocation.py
        152-157 / 188-201) -- which evicts only the shortfall ``n - available_size()``
        through ``tree.evict_for_alloc`` (``allocator.evict_to_free_tokens``,
        allocator/base.py:155-169), then one ``alloc``.  (0.5.12.post1 evicted all of ``n``
        through ``evict``: ``radix.py``.)  ``reference`` is the reference cache's loop."""
        ps, avail = self.page_size, self.allocator.available_size
        if self.alloc_policy == "scheduler":
            evict_from_tree_cache(self.tree, num_tokens + (ps if ps > 1 else 0))
        else:
            while avail() < num_tokens:
                if self.evictable_size_ <= 0 or self.evict(num_tokens - avail()) == 0:
                    return None
        got = self.allocator.alloc(-(-num_tokens // ps) * ps)
        return None if got is None else got[:num_tokens].tolist()

    # -- request paths --------------------------------------------------------------------
    def _sglang_req(self, req: Req) -> _UReq:
        """On first sight: a request-pool row holding the request's indices, its ``ReqKvInfo``
        and the tree lock the admission took (upstream: alloc_req_slots + write_cache_indices;
        the lock the scheduler takes with ``tree_cache.lock(last_node)``)."""
        s = self._reqs.get(req.rid)
        if s is None:
            s = _UReq(req.rid, self._ReqKvInfo())
            if self.req_to_token_pool.alloc([s]) is None:
                raise RuntimeError("the request-to-token pool is full")
            self._bind(s, req)
        s.origin_input_ids = array("q", req.tokens)
        return s

    def _bind(self, s: _UReq, req: Req) -> None:
        """``s`` (holding its row) takes ``req``'s indices and admission lock: the row is
        written (upstream: write_cache_indices) and the lock the subject took through
        ``inc_lock_ref`` becomes the request's ``TreeLock``."""
        self.req_to_token_pool.write((s.kv.req_pool_idx, slice(0, len(req.kv_indices))),
                                     torch.tensor(req.kv_indices, dtype=torch.int32,
                                                  device=self.device))
        s.kv.cache_protected_len = req.cache_protected_len
        s.kv.kv_allocated_len = len(req.kv_indices)
        node = req.last_node if req.last_node is not None else self.root_node
        s.last_node = node.raw
        s.lock = _tree_lock(node.raw, self._take_receipt(node.raw))
        self._reqs[req.rid] = s

    def _take_receipt(self, raw):
        """The receipt of a lock the subject took on ``raw`` (one is taken if none is held)."""
        held = self._receipts.get(raw)
        return held.pop() if held else self.tree.inc_lock_ref(raw).to_dec_params()

    def _row(self, s: _UReq, n: int) -> list[int]:
        return self.req_to_token_pool.req_to_token[s.kv.req_pool_idx, :n].tolist()

    def sync_row(self, req: Req) -> None:
        """A decode step grew or a verify cut ``req``'s row (upstream: ``alloc_for_decode``,
        mem_cache/allocation.py 625-660, writes ``out_cache_loc`` into ``req_to_token`` and
        the request's ``kv_allocated_len`` follows): copy it once the engine holds a row."""
        s = self._reqs.get(req.rid)
        if s is not None:
            self.req_to_token_pool.write((s.kv.req_pool_idx, slice(0, len(req.kv_indices))),
                                         torch.tensor(req.kv_indices, dtype=torch.int32,
                                                      device=self.device))
            s.kv.kv_allocated_len = len(req.kv_indices)

    # the model of F2's fix (sgl-project/sglang PR #35470 / #35781): the checkpoint keys only
    # the request's final ids (``get_cacheable_fill_ids``: not an in-flight dLLM block)
    cacheable_only = False

    def cache_unfinished_req(self, req: Req) -> None:
        """upstream: ``checkpoint_kv_cache`` -> ``tree_cache.checkpoint(req, up_to=
        req.extend_end)`` (mem_cache/common.py 271-280), the extend end being every computed
        position -- an in-flight dLLM block's too (0.5.23's tree has no
        ``get_cacheable_fill_ids``)."""
        s = self._sglang_req(req)
        s.full_untruncated_fill_ids = array("q", req.tokens[:req.filled])
        s.kv.kv_committed_len = req.filled
        up_to = req.filled - (req.volatile if self.cacheable_only else 0)
        self.tree.checkpoint(s, up_to=up_to)
        req.kv_indices = self._row(s, len(req.kv_indices))
        req.cache_protected_len = s.kv.cache_protected_len
        req.last_node = self.node(s.last_node)

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        s = self._sglang_req(req)
        s.full_untruncated_fill_ids = array("q", req.tokens[:req.filled])
        s.kv.kv_committed_len = req.filled
        s._finished = True
        self.release_kv_cache(s, checkpoint=is_insert)
        del self._reqs[req.rid]

    def release_kv_cache(self, s, *, checkpoint: bool) -> bool:
        """upstream: ``mem_cache/common.py release_kv_cache``, step by step, on the SGLang-side
        request ``s``; True when a streaming session claimed the row (``claim_kv_row``).

        Its helper ``_release_overallocated_kv_indices`` reads the process-wide published
        config (``get_spec()``/``get_serving()``, for an assertion only), and so does
        ``Req.owned_kv_len`` (``strip_thinking_cache``); neither can be published here
        (0.5.23's ``ServerArgs`` is a msgspec struct whose construction resolves a model), so
        both are taken at their defaults: no speculative decoding assertion, the owned length
        is the committed one (cut at the finished length when there is one)."""
        tree = self.tree
        assert (not s.kv.holds_kv) == s.kv.is_kv_released
        if tree.claim_kv_row(s):  # a streaming session keeps the row
            assert not s.kv.holds_kv
            return True
        owned = _owned_kv_len(s)
        if checkpoint:
            s.refresh_fill_ids()
            tree.checkpoint(s, up_to=owned)
        tree.free_kv_row(s.kv, [(s.kv.cache_protected_len, owned)])
        tree.unlock(s.lock)
        s.lock = None
        start, end = owned, s.kv.kv_allocated_len  # the over-allocated tail
        if self.page_size > 1:
            start = -(-start // self.page_size) * self.page_size
        if start < end:
            tree.free_kv_row(s.kv, [(start, end)])
        tree.on_release(s, checkpointed=checkpoint)
        self.req_to_token_pool.free(s)
        s.kv.mark_kv_released()
        return False

    def request_slots(self) -> tuple[list[int], dict[int, int]]:
        return (list(self.req_to_token_pool.free_slots),
                {rid: s.kv.req_pool_idx for rid, s in self._reqs.items()})


def evict_from_tree_cache(tree, num_tokens: int) -> None:
    """upstream (0.5.23): ``mem_cache/common.py evict_from_tree_cache`` itself, the scheduler's
    eviction before every KV allocation."""
    from sglang.srt.mem_cache.common import evict_from_tree_cache as upstream

    upstream(tree, num_tokens)


def _owned_kv_len(s) -> int:
    """upstream: ``Req.owned_kv_len`` with ``strip_thinking_cache`` off (its default)."""
    if s.finished_len is None:
        return s.kv.kv_committed_len
    return min(s.kv.kv_committed_len,
               len(s.origin_input_ids) + len(s.output_ids[:s.finished_len]))


def _tree_lock(node, receipt):
    from sglang.srt.mem_cache.base_prefix_cache import TreeLock

    return TreeLock(node, receipt)


class TreeCoreViews:
    """What every subject over ``UnifiedRadixCache`` reads the same way, on either tree core
    (a mixin in front of the variant's SGLang subject; ``self.white_box`` says which core):
    the tree view, the transition/policy watches and the core's own ``sanity_check`` -- all
    of them on the Python core, the black-box equivalents on the Rust core, which exposes no
    nodes."""

    # the need 0.5.23's scheduler declares for an allocation (``alloc_demands``): the
    # shortfall of the request (extension + a page when paged) against the free tokens
    # (invariants/policy.py ``sglang_0523_scheduler_need``; 0.5.12.post1 evicted all of it)
    scheduler_need = staticmethod(sglang_0523_scheduler_need)

    def _watch_upstream(self) -> None:
        if self.white_box:
            self._watch_core(self.cache.tree.tree_core)
        self._watch_alloc_evictions(self.cache.tree)

    def _watch_alloc_evictions(self, tree) -> None:
        """0.5.23's allocations evict through ``tree.evict_for_alloc`` (``evict_from_tree_cache``
        -> ``allocator.evict_to_free_tokens``), not through the adapter's ``evict`` that
        ``RadixSubject._watch_transitions`` counts: count those calls too, with the
        cascade-eviction coverage of the nodes they remove.  The victims themselves need no
        wrapper: they are recorded where the walk removes them (``_watch_victims``, the
        Python core's ``evict_device_leaf``; the plain ``RadixCache``'s ``_delete_leaf``),
        for the allocation in progress (``_alloc_victims``)."""
        tree.evict_for_alloc = self.counting_evictions(tree.evict_for_alloc)

    def _watch_core(self, core) -> None:
        """Splits (coverage, when the Python core has the method under this name) and the
        eviction victims (``_watch_victims``: the policy checks and cascade coverage)."""
        from caches.subjects.base import watch

        subject = self
        for name, label in (("_split_node", "node-split"),):
            if hasattr(core, name):
                watch(core, name, before=lambda *a, _l=label: subject.reached(_l))
        self._watch_victims(core)

    def _watch_policy(self) -> None:
        if self.white_box:
            super()._watch_policy()
        else:
            self._policy_events = []

    def _watch_transitions(self) -> None:
        if self.white_box:
            super()._watch_transitions()
        else:
            self._deleted, self._evict_calls = None, 0

    def _watch_tree(self, tree) -> None:  # the 0.5.12 tree's method names; see _watch_core
        pass

    # -- eviction policy (invariants/policy.py), Python core only ---------------------------
    # Declared from the 0.5.23 wheel (``urc`` = mem_cache/unified_radix_cache.py, ``utc`` =
    # unified_cache/unified_tree_core.py, ``fc`` = unified_cache/components/full.py, ``ep`` =
    # mem_cache/evict_policy.py):
    #
    # * one pass = ``UnifiedRadixCache.evict(EvictParams(n))`` (``urc`` 690 -> ``_evict`` 805
    #   -> ``_evict_components`` 952): for the Full component ``evict_device_start`` ..
    #   ``evict_device_end`` (``urc`` 1024-1058), each node it takes through
    #   ``_evict_device_leaf`` (``urc`` 1032 -> 918-923) -> ``UnifiedTreeCore.
    #   evict_device_leaf(node_id, is_write_back)`` (``utc`` 1788-1823; no host tier here, so
    #   never backed up: ``_delete_unbacked_device_leaf``, ``utc`` 1903, the node leaves the
    #   tree).  That call is the seam: every victim, in order, before it goes.
    # * the choice: a heap built at the walk's start over ``evictable_device_leaves`` keyed
    #   ``(session_ref_eviction_strategy(n), n)`` (``fc`` 209-217); without session radix
    #   caching (``CacheInitParams.enable_session_radix_cache`` off: here, and 0.5.23's
    #   streaming sessions hold tree locks instead) that is ``eviction_strategy.get_priority``
    #   (``fc`` 54-66, 205-207), ``LRUStrategy`` -> ``last_access_time`` (``ep`` 16-18; the
    #   default ``eviction_policy`` "lru").  A tie falls to ``UnifiedTreeNode.__lt__``, which
    #   compares ``last_access_time`` again (``utc`` 175-176): equal keys are equal to the
    #   heap, any of them may go (``check_victims`` allows any minimal node).  Key: ``lru_key``.
    # * the victim's parent: pushed back before the next pop if it is then an evictable leaf
    #   (``fc`` 227-236), so it competes at once -- the reference radix's rule.  Declared
    #   ``cascade_exposes=False`` (only that parent is pushed), which here judges the same as
    #   the reference's True: every node holds Full device KV, so no tombstone cascade ever
    #   removes an ancestor (``utc`` 2289-2346 deletes only nodes without Full KV).
    # * a pass stops at the first victim that meets the request (``fc`` 238, ``tracker <
    #   request_cnt``): ``check_no_over_eviction`` with the subject's declared need.  An
    #   allocation's pass is ``evict_for_alloc(EvictParams(shortfall))`` (``urc`` 697-778):
    #   the same walk, stopped at the first victim after which the allocator has free +
    #   shortfall tokens (``urc`` 1000-1058); declared ``sglang_0523_scheduler_need``.
    # The Rust core exposes no nodes: no victim is seen there and no policy check runs on it
    # (``_watch_policy`` records nothing); its evictions are compared with the Python core's
    # step by step by ``kvcheck diff ... --against sglang-rust`` (op results, counters).
    victim_hook = "evict_device_leaf"
    policy = Policy(cascade_exposes=False, tie_break="UnifiedTreeNode.__lt__: time again, so "
                    "any minimal leaf", recency="the match stamps every node it walks")

    def _watch_victims(self, core) -> None:
        """Each node the Full device walk removes, reported before it goes (``victim_hook``,
        through the public eviction observer): its id in the tree view's numbering
        (``NodeId`` - root handle) and its parent's (cascade-eviction coverage)."""
        base = self.cache.root_id

        def parent_id(node_id):
            parent = core.node_by_id(node_id).parent
            return None if parent is None else parent.id - base

        self.observe_evictions(core, victim=self.victim_hook, node_id=lambda n: n - base,
                               parent_id=parent_id)

    def tree_view(self, times: bool = False) -> TreeView:
        cache = self.cache
        if not self.white_box:  # the Rust core: the root only (it exposes no nodes)
            return TreeView({0: NodeView(0, None, (), (), {"lock": 0}, {}, {})}, 0,
                            self.page_size)
        FULL, base = cache.FULL, cache.root_id
        root = cache.tree.tree_core.root_node
        nodes, stack = {}, [root]
        while stack:
            n = stack.pop()
            nid = n.id - base
            if nid in nodes:
                continue
            d = n.component_data[FULL]
            key = () if n.key is None else tuple(n.key.token_ids[:len(n.key)])
            nodes[nid] = NodeView(nid, None if n.parent is None else n.parent.id - base, key,
                                  ids_of(d.value), {"lock": d.lock_ref},
                                  {ck: c.id - base for ck, c in n.children.items()},
                                  {"time": n.last_access_time} if times else {})
            stack.extend(n.children.values())
        return TreeView(nodes, 0, self.page_size)

    def tree_slots(self, tree: TreeView) -> list[int]:
        if self.white_box:
            return super().tree_slots(tree)
        return self.cache.tree_slots()

    def _check_sizes_black_box(self) -> None:
        """Rust core: the size counters against the tree's slots."""
        cache = self.cache
        slots = cache.tree_slots()
        ev, pr = cache.evictable_size_, cache.protected_size_
        if ev + pr != len(slots) or ev < 0 or pr < 0:
            fail("size-accounting", f"evictable {ev} + protected {pr} != {len(slots)} tokens "
                 f"the tree holds", evictable=ev, protected=pr, tree=len(slots))

    def _check_tree_empty(self) -> None:
        """Rust core: after the drain nothing is left in the tree."""
        cache = self.cache
        if cache.protected_size_ or cache.evictable_size_ or cache.tree_slots():
            fail("quiescence", f"after drain the tree still holds "
                 f"{len(cache.tree_slots())} slots (evictable {cache.evictable_size_}, "
                 f"protected {cache.protected_size_})")

    def _check_core(self) -> None:
        """The tree core's own consistency check (both cores implement ``sanity_check``)."""
        try:
            self.cache.tree.tree_core.sanity_check([], [])
        except Exception as exc:  # an upstream assertion: the core's own invariant broke
            fail("structure", f"the {self.cache.core} tree core's sanity_check failed: "
                 f"{type(exc).__name__}: {exc}")


class CoreChecked:
    """Subject mixin for a ``UnifiedRadixCache`` subject (``white_box`` per tree core): the
    subject's own white-box checks on the Python core, ``_check_black_box`` /
    ``_check_black_box_quiescent`` on the Rust core, and either way ``_check_rows`` and the
    core's own ``_check_core``."""

    def check(self) -> None:
        if self.white_box:
            super().check()
        else:
            self._check_black_box()
            self._check_rows()
        self._check_core()

    def check_quiescent(self) -> None:
        if self.white_box:
            super().check_quiescent()
        else:
            self._check_black_box_quiescent()
            self._check_rows()
        self._check_core()


class UnifiedRadixSubject(CoreChecked, TreeCoreViews, SglangRadixSubject):
    """The radix machine's subject over 0.5.23's ``UnifiedRadixCache``."""

    def abstract_state(self) -> dict:
        state = SglangRadixSubject.abstract_state(self)
        if not self.white_box:  # the Rust core shows no nodes: compare the rest
            del state["tree"]
        return state

    def __init__(self, *, page_size: int = 1, pool_pages: int = 16, device=None,
                 fault: str | None = None, alloc_policy: str = "scheduler",
                 skip_known_findings: bool | None = None, core: str = "python"):
        self.target = "sglang" if core == "python" else "sglang-rust"
        adapter = UnifiedRadixAdapter(page_size, pool_pages, device, core=core,
                                      alloc_policy=alloc_policy,
                                      component_override=full_component_override(fault, core))
        self.white_box = adapter.white_box
        # RadixSubject.__init__ over the adapter (SglangRadixSubject's builds the 0.5.12 one)
        from caches.subjects.radix import RadixSubject

        RadixSubject.__init__(self, page_size=page_size, pool_pages=pool_pages, device=device,
                              cache=adapter)
        self._known(skip_known_findings)
        self._watch_upstream()

    report_setup = None  # kvcheck report: not written for UnifiedRadixCache yet

    def _known(self, option) -> None:
        """Which known findings this subject declines (``skip_known_findings``): F1 at
        ``stray_unlock``, F2 at ``dllm_step``."""
        from caches.adapters import declined_findings

        self.declined = declined_findings(option, ("F1", "F2"))
        self.skip_known_findings = "F1" in self.declined

    # -- dLLM (``dllm_step``): sgl-project/sglang issue #35270 on 0.5.23 ------------------------
    # Driven (0.5.23 has the FDFO path: an unresolved block keeps its request-pool row and KV
    # slots and is denoised again in place, mem_cache/allocation.py ``reuse_kv``).
    lifecycle_declined: dict = {}
    fix_models = {"F2": "_fix_f2"}

    def _dllm_checkpoint(self, req: Req) -> None:
        """What 0.5.23's scheduler caches after a denoising forward: the next
        ``get_next_batch_to_run`` calls ``finish_dllm_forward`` (managers/scheduler.py 3906-3909),
        which returns **before** ``stash_chunked_request`` -> ``checkpoint`` while an FDFO
        block is unresolved (dllm/mixin/scheduler.py 207-212; the result handler
        ``process_batch_result_dllm``, 74-169, has set ``dllm_incomplete_ids`` by then: dLLM
        runs without the overlap schedule, arg_groups/overrides.py ``_dllm_overlap_disable``),
        and checkpoints once the block resolved (its ids final: "Mirror the resolved block
        into the committed fill ids", 138-147).  So the in-flight block never reaches the
        tree here.

        Known finding F2 (driven with ``--known-findings find=F2``): checkpoint after every step,
        the in-flight block included -- the call sequence sgl-project/sglang issue #35270 and
        PR #35470 describe -- and the tree keeps two nodes over the block's slots.  0.5.23's
        scheduler does not make that call: hardening (tests/upstream_findings/README.md)."""
        if req.volatile and "F2" in self.declined:
            return
        self.cache.cache_unfinished_req(req)

    def _fix_f2(self) -> None:
        """F2's fix alone (PR #35470 / #35781): the checkpoint keys only the final ids."""
        self.cache.cacheable_only = True

    def insert(self, tokens: list[int]) -> str:
        """0.5.23's insert takes ownership of the whole value: the slots of the prefix the tree
        already had (past ``prev_prefix_len``, 0 here) are freed by the insert itself
        (``FreeDeviceKV`` in ``unified_tree_core`` insert walk); the caller frees only the
        unaligned tail (0.5.12's caller freed both)."""
        slots = self._alloc(len(tokens))
        if slots is None:
            return "out of memory"
        self.pool.write(slots, self.expected_data(tokens))
        if len(tokens) % self.page_size:
            self.reached("partial-page-tail")
        prefix = self.cache.insert(tokens, slots)
        aligned = len(tokens) // self.page_size * self.page_size
        self.pool.free(slots[aligned:])
        return f"tree already had {prefix} tokens"

    def stray_unlock(self, tokens: list[int]) -> str:
        """Radix F1 (0.5.12.post1 accepts an unmatched unlock) is fixed on 0.5.23: both cores
        refuse it -- the Python core with ``AssertionError: FULL segment release hit
        lock_ref=0``, the Rust core with a panic (``RuntimeError``) after which the core's
        mutex is poisoned and every later call fails.  Declined while fuzzing (the Rust core
        would be unusable for the rest of the example); with ``known_findings="find"`` it
        runs and a refusal is ``rejected``."""
        if self.skip_known_findings:
            raise KnownUpstreamFinding(
                "sglang 0.5.23 refuses an unmatched unlock (radix F1 is fixed there; the "
                "Rust core panics and poisons itself), so it is not driven while fuzzing")
        node = self._match(tokens).last_node
        if node is self.cache.root_node or self.held_locks_below(node):
            raise Skip("the node is held by a live holder")
        try:
            self.cache.dec_lock_ref(node)
        except (AssertionError, RuntimeError) as exc:
            if "lock_ref=0" not in str(exc):
                raise
            self.reached("stray-unlock-rejected")
            return f"rejected ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        return "accepted"

    def lock(self, hid: int, tokens: list[int]) -> str:
        out = super().lock(hid, tokens)
        return out.split(" at node ")[0]  # node ids differ between the two cores

    # -- views and checks (CoreChecked: white box, or these on the Rust core) --------------
    def _check_rows(self) -> None:
        self._check_request_pool()

    def _check_black_box_quiescent(self) -> None:
        self._check_tree_empty()
        check_conservation(self.pool.view(), {})

    def _check_black_box(self) -> None:
        """Rust core: sizes against the tree's slots, no slot held twice by the tree (two
        nodes over the same pages: ``all_values_flatten`` lists each node's), and the
        allocator's pages conserved."""
        self._check_sizes_black_box()
        slots = self.cache.tree_slots()
        check_held_once(self.pool.name, "the tree", slots)
        pages = self.pool.pages_of
        owners, borrowed = {"tree": pages(slots)}, {}
        for rid, req in self.requests.items():
            owners[f"request r{rid}"] = pages(req.own_indices)
            borrowed[f"request r{rid}"] = pages(req.borrowed_indices)
        check_conservation(self.pool.view(), owners, borrowed)


def full_component_override(fault: str | None, core: str):
    """SGLang's ``component_registry_override`` carrying catalogued fault ``fault`` in the
    Full component (None without a fault); the Rust core takes none."""
    if fault is None:
        return None
    from caches.target import FaultNotInjectable

    if core != "python":
        raise FaultNotInjectable(f"the Rust tree core is compiled code: no catalogued "
                                 f"fault is patched into it (asked: {fault})")
    from caches.adapters.sglang.unified_faults import full_component_fault

    return {loader.load().ComponentType.FULL: full_component_fault(fault)}


class PlainRadixAdapter(UnifiedRadixAdapter):
    """0.5.23's plain ``RadixCache`` (``mem_cache/radix_cache.py``, still shipped: the base of
    ``PureSWARadixCache`` and ``FlexKVRadixCache``) with the same request path (``checkpoint``,
    ``release_kv_cache``'s steps): nodes are ``TreeNode`` objects, as on 0.5.12.post1."""

    white_box = True

    def _build_tree(self, sg, allocator, page_size, core) -> None:
        self.tree = self.built.make("cache", self._cache_cls or sg.RadixCache,
                                    sg.CacheInitParams(
                                        disable=False, req_to_token_pool=self.req_to_token_pool,
                                        token_to_kv_pool_allocator=allocator,
                                        page_size=page_size))
        self.root_id = self.tree.root_node.id

    def node(self, raw):
        n = self._nodes.get(id(raw))
        if n is None:
            n = self._nodes[id(raw)] = Node(raw, self)
        return n

    @property
    def root_node(self):
        return self.node(self.tree.root_node)

    @property
    def evictable_size_(self) -> int:
        return self.tree.evictable_size_

    @property
    def protected_size_(self) -> int:
        return self.tree.protected_size_

    @property
    def evictable_leaves(self):
        return [self.node(n) for n in self.tree.evictable_leaves]

    def tree_slots(self) -> list[int]:
        return self.tree.all_values_flatten().tolist()


class PlainRadixSubject(UnifiedRadixSubject):
    """``--target sglang-radixcache``: the radix machine over 0.5.23's plain ``RadixCache``;
    the white-box checks of the 0.5.12.post1 adapter (``SglangRadixSubject``)."""

    target = "sglang-radixcache"

    def __init__(self, *, page_size: int = 1, pool_pages: int = 16, device=None,
                 fault: str | None = None, alloc_policy: str = "scheduler",
                 skip_known_findings: bool | None = None):
        from caches.subjects.radix import RadixSubject

        cache_cls = None
        if fault is not None:  # the 0.5.12.post1 patches apply to 0.5.23's text unchanged
            from caches.adapters.sglang.faults import upstream_fault

            cache_cls = upstream_fault(fault)
        adapter = PlainRadixAdapter(page_size, pool_pages, device, core="radixcache",
                                    alloc_policy=alloc_policy, cache_cls=cache_cls)
        self.white_box = True
        RadixSubject.__init__(self, page_size=page_size, pool_pages=pool_pages, device=device,
                              cache=adapter)
        self._known(skip_known_findings)
        RadixSubject._watch_tree(self, adapter.tree)
        self._watch_alloc_evictions(adapter.tree)

    # 0.5.12.post1's semantics hold here: the caller frees the duplicate prefix of a bare
    # insert, an unmatched unlock is accepted (radix F1, declined unless known_findings=find)
    insert = RadixSubject.insert
    stray_unlock = SglangRadixSubject.stray_unlock
    # lock: the locked depth only (UnifiedRadixSubject.lock), comparable with the unified cache
    tree_view = SglangRadixSubject.tree_view

    report_setup = SglangRadixSubject.report_setup

    def _check_core(self) -> None:  # RadixCache has no sanity_check
        pass


def make_subject(params, fault=None, device=None, core="python", **options):
    if core == "radixcache":
        return PlainRadixSubject(page_size=params["page_size"],
                                 pool_pages=params["pool_pages"], device=device, fault=fault,
                                 **options)
    return UnifiedRadixSubject(page_size=params["page_size"], pool_pages=params["pool_pages"],
                               device=device, fault=fault, core=core, **options)
