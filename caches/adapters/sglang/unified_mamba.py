"""``--target sglang`` / ``--target sglang-rust`` for the himamba variant at ``host=0`` on SGLang
0.5.23: ``UnifiedRadixCache`` with the Full and Mamba components (what ``mem_cache/registry.py``
builds for a hybrid SSM model: ``tree_components=(FULL, MAMBA)``), over the Python tree core or
the Rust one, both chosen through SGLang's ``tree_core_registry`` (no silent fallback).

0.5.23 removed ``MambaRadixCache``; ``mamba.py`` drives it on 0.5.12.post1.  This adapter keeps
that module's interface (``SglangKVPool``, ``SglangMambaPool``, the request-row check) and
``unified_radix.py``'s request path, over SGLang's own objects:

* ``TokenToKVPoolAllocator`` (page 1: the Mamba component asserts it without the extra buffer);
* ``HybridReqToTokenPool`` with its real ``MambaPool`` (states, one layer, int64 so the
  fingerprint fits in ``temporal``) and ``MambaSlotAllocator`` (the free slots: on 0.5.23 the
  allocator is separate from the state pool);
* the tree: ``match_prefix``, ``insert`` (``InsertParams.mamba_value``), ``inc/dec_lock_ref``
  with receipts, ``evict(EvictParams(num_tokens, mamba_num))``; a prefill chunk is
  ``checkpoint(req, up_to)`` (the Mamba component forks the running state into a fresh slot and
  donates it to the tree, or frees the fork when the tree already had one); finish/abort are
  ``release_kv_cache``'s steps (``unified_radix.UnifiedRadixAdapter.cache_finished_req``): a
  finished request's state is handed to the tree (``prepare_for_caching_req(is_finished)``),
  an abort frees it (``on_release`` -> ``cleanup_after_caching_req``).

Where the adapter stands in for scheduler code (``upstream:``): the admission's copy-on-write is
the subject's (``HiMambaSubject.admit``: allocate one state, on failure lock the matched node,
evict one mamba state, retry -- ``MambaComponent.finalize_match_result_in_cache``'s steps), and the
request's row is allocated on its first ``checkpoint``/release with the admission's state slot
already in ``req.kv.mamba_pool_idx`` (``HybridReqToTokenPool.alloc`` keeps a held slot).  KV
slots are taken as 0.5.23's ``alloc_token_slots`` takes them: upstream's own
``evict_from_tree_cache(tree, n)`` (``UnifiedMambaCache.evict_for_kv_alloc``), which evicts only
the shortfall through ``tree.evict_for_alloc`` (allocator/base.py:155-169), then ``alloc``; that
eviction is a device pass of its own for the policy checks (``UnifiedMambaSubject._watch_policy``).
The admission's state eviction is still ``evict(EvictParams(0, 1))``; 0.5.23's
``ensure_mamba_capacity`` asks ``evict_for_alloc(EvictParams(0, mamba_num=shortfall))``
(allocation.py:298-325), the same count of one state here, not driven through that call yet.

Past the prefill (the lifecycle ops, ``caches/subjects/lifecycle.py``), as 0.5.23's scheduler
runs them (``sb`` = managers/schedule_batch.py, ``sp`` = managers/schedule_policy.py):

* ``decode``: ``ScheduleBatch.prepare_for_decode`` (``sb`` 3736) -> ``alloc_for_decode``
  (mem_cache/allocation.py 729, ``alloc_for_decode_default`` 625-660): one KV slot per step from
  ``alloc_token_slots`` (the same ``evict_from_tree_cache`` + ``alloc`` as the prefill),
  written into the request's ``req_to_token`` row; the adapter copies the grown row into the
  engine's row once the engine holds one (``sync_row``, the subject's ``_sync_row`` hook;
  without it the engine releases the prompt's row only and the decode slots leak --
  ``conservation``).  The mamba state advances in place in the request's own slot
  (``req.kv.mamba_pool_idx``).  Track buffers do not enter: ``prepare_for_decode`` touches the
  ping-pong track buffers only with ``enable_mamba_extra_buffer`` (``sb`` 3802-3830, every
  ``mamba_track_interval`` tokens), i.e. ``--mamba-radix-cache-strategy extra_buffer[_lazy]``;
  this adapter builds the ``no_buffer`` pools (``enable_mamba_extra_buffer=False``: what
  ``auto`` resolves to without overlap scheduling and page 1, arg_groups/overrides.py 476-486,
  and what the Mamba component asserts at page 1), where no track slot is allocated and a
  finished request donates its own slot.  ``finish`` is ``release_kv_cache(checkpoint=True)``
  over prompt + output (``cache_finished_req`` below).
* ``retract``: ``ScheduleBatch.retract_decode`` (``sb`` 3451) -> ``release_req`` (``sb`` 2360)
  -> ``release_kv_cache(req, tree, checkpoint=False)`` (mem_cache/common.py 400-440: the KV
  past the locked prefix freed, the lock dropped, ``on_release`` frees the request's mamba
  state, the row freed), then ``reset_for_retract`` (``sb`` 2049-2073: ``mamba_pool_idx``
  None); re-admitted through the normal match (``init_next_round_input``, ``sb`` 1692-1738,
  ``cow_mamba`` from ``supports_mamba()``: the matched node's state copied into a fresh slot --
  the subject's ``_pin``).  Not modelled: ``release_req``'s extra
  ``evict_from_tree_cache(tree, remaining * SGLANG_RETRACT_DECODE_STEPS)`` (``sb`` 2392), as on
  the radix targets.
* ``schedule``: ``PrefillAdder.add_one_req`` (``caches/admission.py``).  Its mamba-slot term
  (``sp`` 692-715, 1414-1424: ``mamba_gap_reserve`` and ``rem_mamba_slots``) exists only over
  the shared-byte ``UnifiedMambaTokenToKVPoolAllocator``; with the separate ``MambaPool`` built
  here ``_mamba_slot_cost`` is 0 and the budget is the plain one.  The state slot is secured
  when the request is matched and pinned (``ensure_mamba_capacity``'s eviction, allocation.py
  298-325; refused when none can be had, as the scheduler stops its pass, scheduler.py
  4270-4300).

The process-wide config the Mamba component reads at construction
(``get_exec().mamba.mamba_max_states_per_path``) is published with SGLang's own test hook,
``get_context().override_server_args()`` (a dummy model path; its defaults).

White box (Python core): nodes are ``UnifiedTreeNode`` objects, per-component data in
``component_data[FULL|MAMBA]``; the LRU lists are the core's ``lru_lists`` read in order; the
device eviction set is the core's ``evictable_device_leaves``.  Every himamba invariant runs,
the eviction-policy checks too (``invariants/policy.py``), against the policy 0.5.23 declares in
its code -- Full by a heap on ``last_access_time``, Mamba by its own LRU list's order, the host
tier by a heap on ``last_access_time`` -- with the seams and file:line references in
``UnifiedMambaSubject``'s "eviction policy" block.  Black box
(Rust core: ``node_by_id`` raises upstream): sizes per component against
``all_values_flatten()`` / ``all_mamba_values_flatten()``, conservation of both pools between the
tree, the live requests and the free lists, the request rows, the core's ``sanity_check``,
fingerprints on every hit, quiescence; ``kvcheck diff himamba --param host=0 --target sglang
--against sglang-rust`` compares the two cores step by step.
"""

from __future__ import annotations

import re
from array import array

import torch

from caches.adapters.raw_radix import ids_of
from caches.adapters.sglang import loader
from caches.adapters.sglang.mamba import (LRUView, MambaTreeAdapter, MatchResult, NoHostTier,
                                          RequestRowsChecked, _NoHostLRU)
from caches.adapters.sglang.unified_radix import (CORES, CoreChecked, TreeCoreViews,
                                                  UnifiedRadixAdapter, _tree_lock, _UReq)
from caches.himamba import HiReq
from caches.pools import resolve_device
from caches.subjects.base import watch
from caches.subjects.himamba import HiMambaSubject
from invariants import NodeView, TreeView, check_conservation, fail
from invariants.tiers import check_hit_counts_once


class UMNode:
    """A ``UnifiedTreeNode`` through the himamba node interface (one per node; Python core)."""

    __slots__ = ("raw", "_cache")

    def __init__(self, raw, cache: "UnifiedMambaCache"):
        self.raw, self._cache = raw, cache

    def _d(self, ct):
        return self.raw.component_data[ct]

    @property
    def id(self) -> int:
        return self.raw.id - self._cache.root_id

    @property
    def parent(self):
        p = self.raw.parent
        return None if p is None else self._cache.node(p)

    @property
    def children(self) -> dict:
        return {ck: self._cache.node(c) for ck, c in self.raw.children.items()}

    @property
    def key(self) -> tuple:
        k = self.raw.key
        return () if k is None else tuple(k.token_ids[:len(k)])

    @property
    def value(self):
        v = self._d(self._cache.FULL).value
        return None if v is None else list(ids_of(v))

    @property
    def mamba_value(self):
        m = self._d(self._cache.MAMBA).value
        return None if m is None else int(m.view(-1)[0])

    full_lock_ref = property(lambda self: self._d(self._cache.FULL).lock_ref)
    mamba_lock_ref = property(lambda self: self._d(self._cache.MAMBA).lock_ref)
    hit_count = property(lambda self: self.raw.hit_count)
    last_access_time = property(lambda self: float(self.raw.last_access_time))
    evicted = property(lambda self: self._d(self._cache.FULL).value is None)
    # no host tier at host=0
    host_value = mamba_host_value = None
    host_ref_counter = host_mamba_ref_counter = 0
    backuped = mamba_backuped = False

    def __repr__(self) -> str:
        return f"sglang.UnifiedTreeNode({self.id}, key={list(self.key)})"


class UnifiedLRUView(LRUView):
    """A core ``UnifiedLRUList`` read in order (head = most recently used): its links are
    per-component slots (``lru_next[pt]``), and a session partition's sentinels are no nodes."""

    def _after(self, x):
        return x.lru_next[self.lru._pt]

    def _member(self, x) -> bool:
        return x is not self.lru.mid and x is not self.lru.cursor


MAMBA_CACHE_CHUNK = 64  # FLA's CHUNK_SIZE: what mamba_cache_chunk_size() gives at page 1


class AccessOrder:
    """A list the himamba checks read in access-time order, where 0.5.23 keeps none in that order:

    * Full has no LRU list (Full eviction takes the oldest ``last_access_time`` from the
      ``evictable_device_leaves`` set, which is checked against the tree every step): ``lru``
      None, the members are the device nodes;
    * the Mamba LRU is ordered by *state use*, deliberately (``MambaComponent.refresh_lru``: only
      a match's end node is refreshed; an insert walk touches node times but not the list):
      ``lru`` is the real list, whose *membership* is what the checks see.

    Either way the order the checks see is access-time order by construction: the LRU-order
    check is vacuous on 0.5.23, the membership check is not (docs/engines/sglang.md)."""

    def __init__(self, name: str, cache: "UnifiedMambaCache", lru=None):
        self.name, self._cache, self.real = name, cache, lru

    def _members(self) -> list:
        if self.real is not None:
            return self.real.mru_first()
        c = self._cache
        nodes, stack = [], list(c.root_node.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if not n.evicted:
                nodes.append(n)
        return nodes

    def mru_first(self) -> list:
        return sorted(self._members(), key=lambda n: -n.last_access_time)

    def lru_first(self) -> list:
        return self.mru_first()[::-1]


def publish_server_config() -> None:
    """Publish SGLang's process-wide config once: its own test hook (defaults, a dummy model),
    seeded with the mamba cache chunk a real model resolves to at page 1 (the hook's documented
    seed, so no HF config is fetched)."""
    from sglang.srt.runtime_context import get_context

    try:
        from sglang.srt.runtime_context import get_exec

        get_exec().mamba
    except (ValueError, AttributeError):
        get_context().override_server_args(
            _mamba_cache_chunk_size=MAMBA_CACHE_CHUNK).install()


class UnifiedMambaCache(NoHostTier):
    """``UnifiedRadixCache`` (Full + Mamba, one tree core) with the real pools, behind the
    himamba subject's cache interface."""

    node_view = None  # the node view class (``UMNode``; a host tier adds its fields)

    def __init__(self, kv_slots: int, mamba_slots: int, device, *, core: str = "python",
                 max_running: int = 2, component_override=None, core_backend=None):
        """``core_backend``: the name the tree core is registered under when it is not
        ``core``'s own (a fault's patched ``UnifiedTreeCore``, ``unified_faults``)."""
        if core not in CORES:
            raise ValueError(f"core must be one of {CORES}, got {core!r}")
        MambaTreeAdapter._build_device_tier(self, kv_slots, mamba_slots, max_running, device,
                                            publish=publish_server_config, hybrid_kv=True)
        from sglang.srt.managers.schedule_batch import ReqKvInfo

        sg = self.sg
        self._ReqKvInfo = ReqKvInfo
        self.core, self.page_size = core, 1
        self.FULL, self.MAMBA = sg.ComponentType.FULL, sg.ComponentType.MAMBA
        self.tree = sg.UnifiedRadixCache(sg.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator, page_size=1,
            tree_components=(self.FULL, self.MAMBA), tree_core_backend=core_backend or core,
            component_registry_override=component_override))
        got = type(self.tree.tree_core)
        want = "UnifiedTreeCore" if core == "python" else "RustUnifiedTreeCore"
        if want not in {c.__name__ for c in got.__mro__}:
            from caches.target import TargetUnavailable

            raise TargetUnavailable(f"SGLang's tree-core registry chose {got.__name__}, not "
                                    f"{want}, "
                                    f"for the {core} core here")
        self.white_box = core == "python"
        self.root_id = self.tree.tree_core.root_node_handle()
        self._nodes: dict = {}
        self._reqs: dict[int, _UReq] = {}
        self._receipts: dict = {}  # node handle -> lock receipts not yet returned
        if self.white_box:
            lru = self.tree.tree_core.lru_lists
            self.full_lru = AccessOrder("full (no LRU on 0.5.23: access order)", self)
            self.mamba_lru = AccessOrder("mamba_lru_list", self, UnifiedLRUView(
                "mamba_lru_list", lru[self.MAMBA], self))
        self.host_mamba_lru = _NoHostLRU()

    # no host tier: nothing is ever written back, backed up or protected on host (never
    # mutated; a host tier's adapter overrides them)
    ongoing_write_through: dict = {}
    write_lock_took_mamba: dict = {}
    ongoing_backup: dict = {}
    evictable_full_host_leaves: set = frozenset()

    # -- nodes ----------------------------------------------------------------------------
    def node(self, raw) -> UMNode:
        """A node view from a ``UnifiedTreeNode`` or a ``NodeId`` (an int)."""
        if not self.white_box:
            n = self._nodes.get(raw)
            if n is None:
                n = self._nodes[raw] = _Handle(raw, self)
            return n
        if isinstance(raw, int):
            raw = self.tree.tree_core.node_by_id(raw)
        n = self._nodes.get(id(raw))
        if n is None:
            n = self._nodes[id(raw)] = (self.node_view or UMNode)(raw, self)
        return n

    @property
    def root_node(self):
        return self.node(self.root_id)

    def handle(self, node) -> int:
        return node.raw.id if isinstance(node, UMNode) else node.raw

    def path_tokens(self, node) -> list[int]:
        out = []
        while node is not None and node.id != 0:
            out = list(node.key) + out
            node = node.parent
        return out

    @property
    def evictable_full_device_leaves(self) -> set:
        return {self.node(n) for n in self.tree.tree_core.evictable_device_leaves}

    def _size(self, what: str) -> int:
        return int(getattr(self.tree.tree_core, what)())

    full_evictable_size_ = property(lambda self: self._size("full_evictable_size"))
    full_protected_size_ = property(lambda self: self._size("full_protected_size"))
    mamba_evictable_size_ = property(lambda self: self._size("mamba_evictable_size"))
    mamba_protected_size_ = property(lambda self: self._size("mamba_protected_size"))

    def tree_slots(self) -> list[int]:
        return self.tree.tree_core.all_values_flatten().tolist()

    def tree_mamba_slots(self) -> list[int]:
        return self.tree.tree_core.all_mamba_values_flatten().view(-1).tolist()

    # -- tree API -------------------------------------------------------------------------
    def _key(self, tokens):
        return self.sg.RadixKey(array("q", tokens))

    def _tensor(self, ids) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.int64, device=self.device)

    def match_prefix(self, tokens) -> MatchResult:
        root = self.root_node
        if not tokens:
            return MatchResult([], root, root, root)
        r = self.tree.match_prefix(self.sg.MatchPrefixParams(key=self._key(tokens)))
        n = r.device_prefix_len
        idx = self.tree.path_device_indices(r.last_device_node)[:n].tolist() if n else []
        return MatchResult(idx, self.node(r.last_device_node), self.node(r.best_match_node),
                           self.node(r.last_host_node), int(r.host_hit_length or 0))

    def insert(self, key, value, mamba_value, *, chunked: bool = False,
               prev_prefix_len: int = 0):
        """0.5.23's insert frees the KV of the prefix the tree already had (past
        ``prev_prefix_len``) itself; the mamba value stays the caller's when ``mamba_exist``."""
        r = self.tree.insert(self.sg.InsertParams(
            key=self._key(key), value=self._tensor(value),
            mamba_value=self._tensor([mamba_value]), prev_prefix_len=prev_prefix_len))
        return r.prefix_len, r.mamba_exist

    def inc_lock_ref(self, node) -> None:
        h = self.handle(node)
        self._receipts.setdefault(h, []).append(self.tree.inc_lock_ref(h).to_dec_params())

    def dec_lock_ref(self, node) -> None:
        h = self.handle(node)
        held = self._receipts.get(h)
        receipt = held.pop() if held else self.sg.DecLockRefParams(node_id=h)
        self.tree.dec_lock_ref(h, receipt)

    def evict(self, num_tokens: int, mamba_num: int = 0) -> int:
        return self.tree.evict(self.sg.EvictParams(num_tokens=num_tokens,
                                                   mamba_num=mamba_num)).num_tokens_evicted

    def evict_for_kv_alloc(self, num_tokens: int) -> None:
        """The scheduler's eviction before allocating ``num_tokens`` KV slots (page 1:
        ``alloc_token_slots``, mem_cache/allocation.py:152-157): upstream's own
        ``evict_from_tree_cache(tree, num_tokens)`` (mem_cache/common.py:283-289), which
        evicts only the shortfall ``num_tokens - available_size()`` through
        ``tree.evict_for_alloc`` (allocator/base.py:155-169)."""
        from caches.adapters.sglang.unified_radix import evict_from_tree_cache

        evict_from_tree_cache(self.tree, num_tokens)

    def evict_mamba(self, mamba_num: int) -> int:
        return self.tree.evict(self.sg.EvictParams(num_tokens=0,
                                                   mamba_num=mamba_num)).mamba_num_evicted

    # -- request paths --------------------------------------------------------------------
    def _sglang_req(self, req: HiReq) -> _UReq:
        """On first sight: SGLang's ``ReqKvInfo`` holding the admission's mamba slot, a request
        row (``HybridReqToTokenPool.alloc`` keeps a held slot and maps the row to it), the
        request's KV indices in the row, and the admission's lock as the request's
        ``TreeLock``."""
        s = self._reqs.get(req.rid)
        if s is None:
            s = _UReq(req.rid, self._ReqKvInfo())
            s.kv.mamba_pool_idx = torch.tensor(req.mamba_slot, dtype=torch.int64,
                                               device=self.device)
            if self.req_to_token_pool.alloc([s]) is None:
                raise RuntimeError("the request-to-token pool is full")
            self.req_to_token_pool.write((s.kv.req_pool_idx, slice(0, len(req.kv_indices))),
                                         torch.tensor(req.kv_indices, dtype=torch.int32,
                                                      device=self.device))
            s.kv.cache_protected_len = req.cache_protected_len
            s.kv.kv_allocated_len = len(req.kv_indices)
            h = self.handle(req.last_node)
            s.last_node = h
            held = self._receipts.get(h)
            receipt = held.pop() if held else self.tree.inc_lock_ref(h).to_dec_params()
            s.lock = _tree_lock(h, receipt)
            self._reqs[req.rid] = s
        s.origin_input_ids = array("q", req.tokens)
        return s

    def _row(self, s: _UReq, n: int) -> list[int]:
        return self.req_to_token_pool.req_to_token[s.kv.req_pool_idx, :n].tolist()

    def cache_unfinished_req(self, req: HiReq, chunked: bool = False) -> None:
        s = self._sglang_req(req)
        s.full_untruncated_fill_ids = array("q", req.tokens[:req.filled])
        s.kv.kv_committed_len = req.filled
        self.tree.checkpoint(s, up_to=req.filled)
        req.kv_indices = self._row(s, len(req.kv_indices))
        req.cache_protected_len = s.kv.cache_protected_len
        req.last_node = self.node(s.last_node)
        req.mamba_slot = int(s.kv.mamba_pool_idx)

    release_kv_cache = UnifiedRadixAdapter.release_kv_cache
    sync_row = UnifiedRadixAdapter.sync_row

    def cache_finished_req(self, req: HiReq, is_insert: bool = True) -> None:
        """``release_kv_cache``'s steps, each the upstream call (``unified_radix.py``); the
        request's state is the tree's now (donated) or freed (``cleanup_after_caching_req``)."""
        UnifiedRadixAdapter.cache_finished_req(self, req, is_insert)
        req.mamba_slot = None

    def request_rows(self) -> tuple[list[int], dict[int, int]]:
        return (list(self.req_to_token_pool.free_slots),
                {rid: s.kv.req_pool_idx for rid, s in self._reqs.items()})


class _Handle:
    """A ``NodeId`` of the Rust core (no fields visible): the root is id 0, the rest opaque."""

    __slots__ = ("raw", "_cache")
    mamba_value = -1  # unknown: never treated as a tombstone by the driver
    children: dict = {}

    def __init__(self, raw: int, cache):
        self.raw, self._cache = raw, cache

    def __eq__(self, other):
        return isinstance(other, _Handle) and other.raw == self.raw

    def __hash__(self):
        return hash(self.raw)

    @property
    def id(self) -> int:
        return self.raw - self._cache.root_id

    parent = None
    key = ()
    value = ()


class UnifiedMambaSubject(CoreChecked, RequestRowsChecked, HiMambaSubject):
    """The himamba machine's subject (host=0) over 0.5.23's ``UnifiedRadixCache`` (Full +
    Mamba); ``core`` picks the tree core."""

    variant = "himamba"

    def __init__(self, *, kv_slots: int = 12, mamba_slots: int = 8, device=None,
                 fault: str | None = None, max_running: int = 2, core: str = "python",
                 **host_tier):
        """``host_tier``: a subclass's host-tier parameters (``unified_hicache.py``), passed
        on to ``_build_cache`` and the himamba subject; none at host=0."""
        if fault is not None and core != "python":
            from caches.target import FaultNotInjectable

            raise FaultNotInjectable(f"the Rust tree core is compiled code: no catalogued "
                                     f"fault is patched into it (asked: {fault})")
        self.target = "sglang" if core == "python" else "sglang-rust"
        cache = self._build_cache(kv_slots, mamba_slots, resolve_device(device), core,
                                  max_running, fault, **host_tier)
        self.white_box = cache.white_box
        super().__init__(kv_slots=kv_slots, mamba_slots=mamba_slots, device=device,
                         max_running=max_running, host=bool(host_tier), cache=cache,
                         **host_tier)
        # 0.5.23's Full walk is a heap at host=0 too: only a victim's own parent is pushed back
        # (the himamba subject sets 0.5.12 MambaRadixCache's restart for host=0)
        self.device_cascade_exposes = False
        if self.white_box:
            core_obj, subject = cache.tree.tree_core, self
            watch(core_obj, "_split_node", before=lambda *a: subject.reached("node-split"))

    def _alloc_kv(self, n: int):
        """KV slots the way 0.5.23's scheduler takes them (``alloc_token_slots``): upstream's
        ``evict_from_tree_cache`` first -- only the shortfall, through ``evict_for_alloc``
        (``UnifiedMambaCache.evict_for_kv_alloc``) -- then one ``alloc``.  (The himamba
        subject's own: alloc, and on failure ``evict`` the shortfall, the same need.)"""
        if n == 0:
            return []
        self.cache.evict.reset()
        self.cache.evict_for_kv_alloc(n)
        return self.kv.alloc(n)

    def _watch_policy(self) -> None:
        """The himamba subject's watches, and the allocation's eviction (``evict_for_kv_alloc``,
        which bypasses the adapter's ``evict``) recorded as a device pass of its own: asked the
        shortfall (what ``evict_to_free_tokens`` passes ``evict_for_alloc``), its victims seen
        at the Full walk's seam as an ``evict`` pass's are, so the allocation's policy check
        (``HiMambaSubject.check_policy``, "alloc") reads them."""
        super()._watch_policy()
        if self.policy_internals() is None:
            return
        kv = self.kv
        self.cache.evict_for_kv_alloc = self._recorded_pass(
            "evict", self.cache.evict_for_kv_alloc, "full",
            asked=lambda n: n - kv.available_size())

    def _build_cache(self, kv_slots, mamba_slots, device, core, max_running, fault):
        override = None
        if fault is not None:
            from caches.adapters.sglang.unified_faults import himamba_component_override

            override = himamba_component_override(fault)
        return UnifiedMambaCache(kv_slots, mamba_slots, device, core=core,
                                 max_running=max_running, component_override=override)

    # -- eviction policy (invariants/policy.py), Python core only ---------------------------
    # Declared from the 0.5.23 wheel (``urc`` = mem_cache/unified_radix_cache.py, ``utc`` =
    # mem_cache/unified_cache/unified_tree_core.py, ``fc`` / ``mc`` =
    # unified_cache/components/full.py / mamba.py, ``ep`` = mem_cache/evict_policy.py):
    #
    # * one pass = one ``_evict_components`` walk per component (``urc`` 952-1058:
    #   ``evict_device_start`` .. ``evict_device_end``); ``evict(EvictParams(n, 0))`` walks Full
    #   only, ``evict(EvictParams(0, m))`` Mamba only (``urc`` 1017-1018 skip a component whose
    #   request is met).  Every node a walk removes whole goes through
    #   ``UnifiedTreeCore.evict_device_leaf(node_id)`` (``urc`` 1032 -> 923; ``utc`` 1788-1823:
    #   demote if backed up, else ``_delete_unbacked_device_leaf``): the device seam.
    # * Full: a heap built at the walk's start over ``evictable_device_leaves`` keyed
    #   ``(eviction_strategy.get_priority(n), n)`` (``fc`` 209-217, 62-66), the strategy
    #   ``LRUStrategy`` -> ``last_access_time`` (``ep`` 16-18; ``CacheInitParams.eviction_policy``
    #   "lru"), ties by ``UnifiedTreeNode.__lt__``, ``last_access_time`` again (``utc`` 175-176);
    #   after each victim only its own parent is pushed back, if it is an evictable leaf then
    #   (``fc`` 227-236).  Key: ``lru_key`` (node time), ``cascade_exposes`` False.  A leaf is
    #   one no lock of *any* component holds (``utc`` 2348-2364 ``_is_device_leaf``).
    # * Mamba: no heap, a cursor from the Mamba LRU list's LRU end toward its MRU end over the
    #   mamba-unlocked nodes (``mc`` 373-383 ``get_lru_no_lock``, 385-457 ``get_prev_no_lock``;
    #   ``utc`` 360-386): an evictable device leaf is returned and goes whole through the device
    #   seam (``mc`` 418-425); any other node gives up its state in place, a tombstone (``mc``
    #   438-454, ``_evict_component_and_detach_lru(x, mamba)``: the tombstone seam).  Key: the
    #   node's *position in that list*, not its time -- the list is ordered by state use
    #   (``mc`` 127-149 ``refresh_lru``: a match refreshes only its end node, an insert walk
    #   none; 227-253: a new or re-stated node enters at the MRU end), deliberately apart from
    #   node times.
    # * host (host=1): ``evict_host(n, FULL)`` (``urc`` 1433-1445) -> ``FullComponent.
    #   drive_host_eviction`` (``fc`` 250-281): the same heap over ``evictable_host_leaves``
    #   (``utc`` 2366-2385: no host lock and no device lock of any component, no child), by
    #   ``last_access_time``, the victim's parent pushed back; victims through
    #   ``_evict_host_leaf`` (``utc`` 2046-2075).
    # * cascades: a removed node's childless ancestors with no Full KV on either tier are
    #   deleted (``utc`` 2289-2346, ``_remove_leaf_from_parent`` at 2343); at host=0 every
    #   node holds Full device KV, so a cascade never happens there.
    victim_hooks = {"device": "evict_device_leaf", "tombstone": None,
                    "host": "_evict_host_leaf", "cascade": None}
    device_victim_counters = ("full", "mamba", "tombstone_mamba")
    host_victim_counters = ("host", "host_mamba", "full", "mamba", "tombstone_mamba")

    @staticmethod
    def state_victim_key(node) -> tuple:
        """The Mamba walk's order: the node's place in the Mamba LRU list, LRU end first
        (``extra["mamba_lru"]``, read into the view by ``_views``)."""
        return (node.extra["mamba_lru"],)

    def policy_internals(self):
        """The Python core (node handles -> view ids); None on the Rust core, which exposes
        no nodes, so no victim is ever seen there."""
        if not self.white_box:
            return None
        base = self.cache.root_id
        return self.cache.tree.tree_core, \
            (lambda h: (h if isinstance(h, int) else h.id) - base)

    def _watch_victims(self, owner, note, cascade) -> None:
        """The device and host seams by name (``victim_hooks``); the two 0.5.23 has no method
        of its own for, by scope: a Mamba state given up inside the Mamba walk's step (the
        component's ``_evict_device_next_node``) is a tombstone victim, and a node removed
        inside ``_iteratively_delete_tombstone_ancestors`` a cascade."""
        from caches.subjects.base import watch

        hooks = self.victim_hooks
        watch(owner, hooks["device"], before=note("evict", "evict_mamba"))
        watch(owner, hooks["host"], before=note("evict_host"))
        mamba = owner.components_by_type[self.cache.MAMBA]
        inside = {"step": 0, "cascade": 0}
        tombstone = note("evict_mamba")

        def scoped(obj, name, scope):
            orig = getattr(obj, name)

            def run(*args, **kwargs):
                inside[scope] += 1
                try:
                    return orig(*args, **kwargs)
                finally:
                    inside[scope] -= 1
            setattr(obj, name, run)

        scoped(mamba, "_evict_device_next_node", "step")
        scoped(owner, "_finish_internal_component_eviction", "step")  # write-back's resume
        scoped(owner, "_iteratively_delete_tombstone_ancestors", "cascade")
        detach, remove = owner._evict_component_and_detach_lru, owner._remove_leaf_from_parent

        def detach_seen(node, comp, *args, **kwargs):
            if inside["step"] and comp is mamba and not inside["cascade"]:
                tombstone(node)
            return detach(node, comp, *args, **kwargs)

        def remove_seen(node, *args, **kwargs):
            if inside["cascade"]:
                cascade(node)
            return remove(node, *args, **kwargs)

        owner._evict_component_and_detach_lru = detach_seen
        owner._remove_leaf_from_parent = remove_seen

    def _views(self, kinds=("all", "full", "mamba")) -> dict:
        """Each node's place in the Mamba LRU list (0 = the LRU end) as ``extra["mamba_lru"]``
        (the Mamba walk's key, ``state_victim_key``); nodes off the list have none."""
        views = super()._views(kinds)
        if self.white_box:
            lru = self.cache.mamba_lru.real
            rank = {n.id: i for i, n in enumerate(lru.lru_first())}
            for view in views.values():
                for nid, n in view.nodes.items():
                    if nid in rank:
                        n.extra["mamba_lru"] = rank[nid]
        return views

    def _path_kv(self, node) -> list[int]:
        """The node's path KV as the cache reports it (both cores)."""
        if node is self.cache.root_node:
            return []
        return self.cache.tree.path_device_indices(node.raw if isinstance(node.raw, int)
                                                   else node.raw.id).tolist()

    def _copy_mamba(self, slot: int, node) -> None:
        if node is self.cache.root_node:
            self.mamba.write([slot], [0])
        elif self.white_box:
            self.mamba.write([slot], self.mamba.read([node.mamba_value]))
        else:
            src = self.cache.tree.tree_core.get_component_device_value(node.raw,
                                                                        self.cache.MAMBA)
            self.mamba.write([slot], self.mamba.read([int(src.view(-1)[0])]))

    # -- op results: nodes named by depth (node ids differ between the two cores) -----------
    def _by_depth(self, out: str) -> str:
        def depth(m):
            nid = int(m.group(1))
            if nid == 0:
                return "root"
            node = self.cache.node(nid + self.cache.root_id)
            return f"depth {len(self._path_kv(node))}"
        return re.sub(r"#(\d+)", depth, out)

    def admit(self, rid: int, tokens: list[int]) -> str:
        return self._by_depth(super().admit(rid, tokens))

    def match(self, tokens: list[int]) -> str:
        return self._by_depth(super().match(tokens))

    def lock(self, hid: int, tokens: list[int]) -> str:
        return self._by_depth(super().lock(hid, tokens))

    def drain(self) -> None:
        super().drain()  # walks the root's children: the Rust core shows none
        c = self.cache
        for _ in range(64):
            if not c.tree_slots():
                break
            c.evict.reset()
            c.evict(self.kv.num_pages)
            self.check()

    # -- checks (CoreChecked: white box on the Python core, these on the Rust core) ----------
    def _check_rows(self) -> None:
        self._check_request_rows()

    _check_core = TreeCoreViews._check_core

    def _check_black_box(self) -> None:
        """Rust core: per-component sizes against the tree's values, both pools conserved."""
        c = self.cache
        slots, states = c.tree_slots(), c.tree_mamba_slots()
        for label, ev, pr, n in (("full", c.full_evictable_size_, c.full_protected_size_,
                                  len(slots)),
                                 ("mamba", c.mamba_evictable_size_, c.mamba_protected_size_,
                                  len(states))):
            if ev + pr != n or ev < 0 or pr < 0:
                fail("size-accounting", f"{label}: evictable {ev} + protected {pr} != {n} "
                     f"the tree holds", label=label, evictable=ev, protected=pr, tree=n)
        reqs = {f"request r{rid}": r for rid, r in self.requests.items()}
        check_conservation(self.kv.view(),
                           {"tree": slots, **{h: r.own_indices for h, r in reqs.items()}},
                           {h: r.borrowed_indices for h, r in reqs.items()})
        check_conservation(self.mamba.view(),
                           {"tree": states, **{h: [r.mamba_slot] for h, r in reqs.items()}})

    def _check_black_box_quiescent(self) -> None:
        c = self.cache
        sizes = (c.full_evictable_size_, c.full_protected_size_, c.mamba_evictable_size_,
                 c.mamba_protected_size_)
        if any(sizes) or c.tree_slots() or c.tree_mamba_slots():
            fail("quiescence", f"after drain the tree still holds {len(c.tree_slots())} "
                 f"KV slots and {len(c.tree_mamba_slots())} mamba states (sizes {sizes})")
        check_conservation(self.kv.view(), {})
        check_conservation(self.mamba.view(), {})

    def tree_view(self, kind: str = "all") -> TreeView:
        if self.white_box:
            return super().tree_view(kind)
        return TreeView({0: NodeView(0, None, (), (), {"full": 1, "mamba": 1}, {}, {})}, 0, 1)

    def _hits(self):
        return super()._hits() if self.white_box else ({}, set())

    def _before_chunk(self, req) -> int:
        s = self.cache._reqs.get(req.rid)
        return 0 if s is None else s.kv.cache_inserted_len

    def _check_chunk_hits(self, req, before, backed, inserted_before) -> None:
        """0.5.23 changed the contract 0.5.12's check encodes (no hit for a chunk): a request
        counts each node of its path once, the first time a checkpoint inserts past it
        (``InsertParams.inserted_len``)."""
        if not self.white_box:
            return
        after, _ = self._hits()
        may, node = set(), req.last_node
        while node is not self.cache.root_node:
            if len(self.cache.path_tokens(node)) > inserted_before:
                may.add(node.id)
            node = node.parent
        check_hit_counts_once(before, after, may, what=f"r{req.rid} chunk: ")

    def outline(self) -> str:
        if self.white_box:
            return super().outline()
        c = self.cache
        return (f"rust core: {len(c.tree_slots())} KV slots, {len(c.tree_mamba_slots())} "
                f"mamba states in the tree; live {sorted(self.requests)}")

    def state(self):
        if not self.white_box:
            raise NotImplementedError("the Rust core exposes no nodes: no exhaustive search")
        return super().state()


def make_subject(params, fault=None, device=None, core="python", **options):
    if params.get("host", 0):
        raise ValueError("caches.adapters.sglang.unified_mamba serves host=0 on 0.5.23")
    return UnifiedMambaSubject(kv_slots=params["kv_slots"], mamba_slots=params["mamba_slots"],
                               device=device, fault=fault, core=core, **options)
