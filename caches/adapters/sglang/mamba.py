"""``--target sglang`` for the himamba variant at ``host=0``: SGLang's real ``MambaRadixCache``.

``host=0`` is the himamba model without its host tier, which is exactly SGLang's plain mamba
radix cache (full KV + one mamba state per node, tombstones, two LRU lists, four counters).
Behind our reference cache's interface sit SGLang's own objects:

* ``mamba_radix_cache.MambaRadixCache`` -- the tree, driven through ``match_prefix``,
  ``insert``, ``inc/dec_lock_ref``, ``evict`` (full tokens / mamba states) and the request
  paths ``cache_unfinished_req`` / ``cache_finished_req``;
* ``TokenToKVPoolAllocator`` -- device KV slots (``SglangKVPool``: its free list for the
  conservation check, plus a fingerprint tensor keyed by slot);
* ``HybridReqToTokenPool`` with its real ``MambaPool`` -- request rows, the row -> mamba-slot
  map ``cache_unfinished_req`` forks from, and the state slots themselves.  The fingerprints of
  mamba states live *in the real state tensor* (``SglangMambaPool``: int64 states, one element
  per slot carries the fingerprint), so the pool's own ``fork_from``/``copy_from`` must carry
  them, and a fork that copied the wrong slot shows up as a data-integrity violation.

Where the adapter stands in for scheduler code (marked ``upstream:``): the admission's
copy-on-write match is done by the subject with the same steps upstream's
``_match_post_processor`` takes (allocate one state, on failure lock the node, evict one mamba
state, retry), the request row is allocated on a request's first ``cache_*_req`` call
(``alloc_req_slots`` at admission upstream), and finishing/aborting is ``release_kv_cache``'s
cache part (``cache_finished_req``, then the unfilled tail, then the row).

``MambaRadixCache`` keeps no cached leaf sets and no host tier: the views report its evictable
device leaves by upstream's own criterion (``get_prev_leaf_no_lock``: in the full LRU list, no
children, no full lock) and empty host structures, so the shared checks run unchanged; the LRU
lists are read from upstream's linked lists, in order.

Node ids are SGLang's ``TreeNode.id`` renumbered to creation order in this tree (root 0), the
reference cache's ids for the same history.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from caches.adapters.sglang import loader, versions
from caches.adapters.sglang.radix import SglangPool
from caches.himamba import HiReq
from caches.pools import resolve_device
from caches.subjects.base import watch
from caches.subjects.himamba import HiMambaSubject
from invariants import PoolView, check_conservation

MAMBA_LAYERS = [0]  # one mamba layer is enough: the fingerprint lives in its temporal state


# -- pools ---------------------------------------------------------------------------------------
class SglangKVPool(SglangPool):
    """SGLang's token allocator as the subject's ``kv`` pool (page size 1)."""

    def alloc(self, n: int) -> list[int] | None:
        got = self.allocator.alloc(n)
        return None if got is None else got.tolist()


class SglangMambaPool:
    """SGLang's ``MambaPool`` as the subject's ``mamba`` pool: free slots, and the fingerprint of
    each state stored in the state itself (``temporal[layer 0, slot]``, first element).  The
    free slots are the pool's own on 0.5.12.post1; 0.5.23 keeps them in a separate
    ``MambaSlotAllocator`` (``allocator``)."""

    unit = "slot"

    def __init__(self, pool, name: str = "mamba", allocator=None):
        self.pool, self.name = pool, name
        self.slots = pool if allocator is None else allocator
        self.size = self.slots.size

    @property
    def free_slots(self) -> list[int]:
        return self.slots.free_slots.tolist()

    def available_size(self) -> int:
        return int(self.slots.available_size())

    def alloc(self, n: int = 1) -> list[int] | None:
        got = self.slots.alloc(n)
        return None if got is None else got.tolist()

    def free(self, ids) -> None:
        ids = list(ids)
        if ids:
            self.slots.free(torch.tensor(ids, dtype=torch.int64, device=self.slots.device))

    @property
    def data(self) -> torch.Tensor:
        t = self.pool.mamba_cache.temporal
        return t[0].reshape(t.shape[1], -1)[:, 0]

    def write(self, ids, values) -> None:
        ids = list(ids)
        if ids:
            self.data[torch.tensor(ids)] = torch.tensor(list(values), dtype=self.data.dtype,
                                                       device=self.data.device)

    def read(self, ids) -> list[int]:
        ids = list(ids)
        return self.data[torch.tensor(ids)].tolist() if ids else []

    def view(self) -> PoolView:
        return PoolView(name=self.name, unit=self.unit, capacity=self.size,
                        free=tuple(self.free_slots), reserved=(0,))


def _ids(t) -> list[int]:
    """A tensor (or list) of slot ids as a list of ints; None as []."""
    if t is None:
        return []
    return t.tolist() if isinstance(t, torch.Tensor) else list(t)


# -- nodes and lists -----------------------------------------------------------------------------
class Node:
    """One SGLang mamba ``TreeNode`` through the reference node's interface (one per node; the
    same class serves ``HiMambaRadixCache``, whose host fields stay empty in the plain cache)."""

    __slots__ = ("raw", "_cache")

    def __init__(self, raw, cache: "SglangMambaCache"):
        self.raw, self._cache = raw, cache

    @property
    def id(self) -> int:
        return self._cache.node_id(self.raw)

    @property
    def parent(self):
        return None if self.raw.parent is None else self._cache.node(self.raw.parent)

    @property
    def children(self) -> dict:
        return {ck: self._cache.node(c) for ck, c in self.raw.children.items()}

    @property
    def key(self) -> tuple:
        return tuple(self.raw.key.token_ids[:len(self.raw.key)])

    @property
    def value(self):
        v = self.raw.value
        return None if v is None else _ids(v)

    @property
    def host_value(self):
        v = self.raw.host_value
        return None if v is None else _ids(v)

    @property
    def mamba_value(self):
        m = self.raw.mamba_value
        return None if m is None else int(m[0])

    @property
    def mamba_host_value(self):
        m = self.raw.mamba_host_value
        return None if m is None else int(m[0])

    full_lock_ref = property(lambda self: self.raw.full_lock_ref)
    mamba_lock_ref = property(lambda self: self.raw.mamba_lock_ref)
    host_ref_counter = property(lambda self: self.raw.host_ref_counter)
    host_mamba_ref_counter = property(lambda self: self.raw.host_mamba_ref_counter)
    hit_count = property(lambda self: self.raw.hit_count)
    last_access_time = property(lambda self: float(self.raw.last_access_time))
    evicted = property(lambda self: self.raw.value is None)
    backuped = property(lambda self: self.raw.host_value is not None)
    mamba_backuped = property(lambda self: self.raw.mamba_host_value is not None)

    def __repr__(self) -> str:
        return f"sglang.mamba.TreeNode({self.id}, key={list(self.key)})"


class LRUView:
    """An upstream ``LRUList`` read in order (head = most recently used)."""

    def __init__(self, name: str, lru, cache: "SglangMambaCache"):
        self.name, self.lru, self._cache = name, lru, cache

    def mru_first(self) -> list[Node]:
        out, x = [], self._after(self.lru.head)
        while x is not self.lru.tail and x is not None:
            if self._member(x):
                out.append(self._cache.node(x))
            x = self._after(x)
        return out

    def _after(self, x):
        return getattr(x, self.lru.nxt)

    def _member(self, x) -> bool:
        return True

    def lru_first(self) -> list[Node]:
        return self.mru_first()[::-1]

    def __contains__(self, node) -> bool:
        return node.raw.id in self.lru.cache


class _NoHostLRU:
    """The host-mamba LRU list a cache without a host tier does not have."""

    name = "mamba_host_lru_list"

    def mru_first(self):
        return []

    lru_first = mru_first

    def __contains__(self, node) -> bool:
        return False


class MatchResult(NamedTuple):
    device_indices: list
    last_device_node: Node
    best_node: Node
    last_host_node: Node
    host_hit_length: int = 0


class _MambaReq:
    """The fields of SGLang's ``Req`` that ``MambaRadixCache.cache_*_req`` and
    ``HybridReqToTokenPool.alloc`` read and write (the real class needs global server state)."""

    def __init__(self, rid: int, mamba_slot: int, device):
        self.rid = rid
        self.req_pool_idx = None
        self.mamba_pool_idx = torch.tensor(mamba_slot, dtype=torch.int64, device=device)
        self.origin_input_ids: list[int] = []
        self.output_ids: list[int] = []
        self.fill_ids: list[int] = []
        self.extra_key = None
        self.is_chunked = 0
        self.cache_protected_len = 0
        self.last_node = None
        self.prefix_indices = None
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.kv_committed_freed = False
        self.mamba_last_track_seqlen = None
        self.mamba_ping_pong_track_buffer = None
        self.mamba_next_track_idx = None

    def pop_committed_kv_cache(self) -> int:  # upstream: schedule_batch.py Req, same assert
        assert not self.kv_committed_freed, \
            f"Committed KV cache already freed ({self.kv_committed_len=})"
        self.kv_committed_freed = True
        return self.kv_committed_len


class MambaTreeAdapter:
    """What SGLang's two mamba caches (``MambaRadixCache`` and the Hi subclass) share behind
    the reference cache's interface: node views, counters, insert/lock/evict, and the request
    paths -- our ``HiReq`` in, SGLang's ``cache_unfinished_req``/``cache_finished_req`` on a
    request row mapped to the request's mamba slot, the row read back out.  Needs ``sg``,
    ``tree``, ``req_to_token_pool`` (a ``HybridReqToTokenPool``), ``allocator``, ``device``,
    ``_first_id``, ``_nodes`` and ``_reqs``."""

    def _build_device_tier(self, kv_slots: int, mamba_slots: int, max_running: int,
                           device, publish=None, hybrid_kv: bool = False) -> None:
        """SGLang's device pools for a mamba cache: a ``TokenToKVPoolAllocator`` (page 1) and a
        ``HybridReqToTokenPool`` with its real ``MambaPool`` (one layer, int64 states so the
        fingerprints fit), and their views ``kv``/``mamba``.  Sets ``sg``, ``device`` too.
        ``publish`` installs the process-wide config the release reads (default: 0.5.12's
        ``ServerArgs`` stand-in).  ``hybrid_kv``: the allocator's ``kvcache`` is a real one-layer
        ``HybridLinearKVPool`` (full attention layer 0, the mamba layer 1, over the same
        ``MambaPool``) -- what 0.5.23's HiCache stack selection matches (``kv_pool``); the
        KV fingerprints stay in ``kv`` beside it either way."""
        self.sg = sg = loader.require()
        if publish is None:
            loader.install_server_args(page_size=1)
        else:
            publish()
        from sglang.srt.configs.mamba_utils import (Mamba2CacheParams, Mamba2StateDType,
                                                    Mamba2StateShape)
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

        self.device = device
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=2, n_groups=1,
                                        num_heads=1, head_dim=1, state_size=1, conv_kernel=2)
        layers = [1] if hybrid_kv else MAMBA_LAYERS
        params = Mamba2CacheParams(shape=shape, layers=layers,
                                   dtype=Mamba2StateDType(conv=torch.int64,
                                                          temporal=torch.int64))
        self.req_to_token_pool = HybridReqToTokenPool(
            size=max_running + 1, mamba_size=mamba_slots, mamba_spec_state_size=mamba_slots,
            max_context_len=2 * kv_slots + 2, device=str(device), enable_memory_saver=False,
            cache_params=params, mamba_layer_ids=layers, enable_mamba_extra_buffer=False,
            enable_overlap_schedule=False)
        self.kv_pool = None
        if hybrid_kv:
            from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool

            self.kv_pool = HybridLinearKVPool(
                size=kv_slots, dtype=torch.float16, page_size=1, head_num=1, head_dim=1,
                full_attention_layer_ids=[0], device=str(device), enable_memory_saver=False,
                mamba_pool=self.req_to_token_pool.mamba_pool)
        self.allocator = sg.TokenToKVPoolAllocator(kv_slots, torch.float16, device,
                                                   self.kv_pool, False)
        self.kv = SglangKVPool(self.allocator, kv_slots, 1, device)
        self.mamba = SglangMambaPool(self.req_to_token_pool.mamba_pool, allocator=getattr(
            self.req_to_token_pool, "mamba_allocator", None))  # 0.5.23 keeps slots apart

    def node(self, raw) -> Node:
        n = self._nodes.get(id(raw))
        if n is None:
            n = self._nodes[id(raw)] = Node(raw, self)
        return n

    def node_id(self, raw) -> int:
        return 0 if raw is self.tree.root_node else raw.id - self._first_id + 1

    @property
    def root_node(self) -> Node:
        return self.node(self.tree.root_node)

    full_evictable_size_ = property(lambda self: self.tree.full_evictable_size_)
    full_protected_size_ = property(lambda self: self.tree.full_protected_size_)
    mamba_evictable_size_ = property(lambda self: self.tree.mamba_evictable_size_)
    mamba_protected_size_ = property(lambda self: self.tree.mamba_protected_size_)

    def _key(self, tokens):
        return self.sg.RadixKey(list(tokens))

    def _tensor(self, ids) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.int64, device=self.device)

    def insert(self, key, value, mamba_value, *, chunked: bool = False,
               prev_prefix_len: int = 0):
        r = self.tree.insert(self.sg.InsertParams(
            key=self._key(key), value=self._tensor(value),
            mamba_value=self._tensor([mamba_value]), chunked=chunked,
            prev_prefix_len=prev_prefix_len))
        return r.prefix_len, r.mamba_exist

    def inc_lock_ref(self, node: Node) -> None:
        self.tree.inc_lock_ref(node.raw)

    def dec_lock_ref(self, node: Node) -> None:
        self.tree.dec_lock_ref(node.raw)

    def evict(self, num_tokens: int, mamba_num: int = 0) -> int:
        return self.tree.evict(self.sg.EvictParams(num_tokens=num_tokens,
                                                   mamba_num=mamba_num)).num_tokens_evicted

    # -- request paths --------------------------------------------------------------------
    def _sglang_req(self, req: HiReq) -> _MambaReq:
        """The SGLang-side request: on first sight a request row mapped to the request's mamba
        slot, holding its KV indices (upstream: alloc_req_slots + write at admission)."""
        s = self._reqs.get(req.rid)
        if s is None:
            s = _MambaReq(req.rid, req.mamba_slot, self.device)
            if self.req_to_token_pool.alloc([s]) is None:
                raise RuntimeError("the request-to-token pool is full")
            self._reqs[req.rid] = s
            self.req_to_token_pool.write((s.req_pool_idx, slice(0, len(req.kv_indices))),
                                         torch.tensor(req.kv_indices, dtype=torch.int32,
                                                      device=self.device))
            s.cache_protected_len = req.cache_protected_len
            s.last_node = req.last_node.raw
        s.origin_input_ids = list(req.tokens)
        return s

    def _row(self, s: _MambaReq, n: int) -> list[int]:
        return self.req_to_token_pool.req_to_token[s.req_pool_idx, :n].tolist()

    def cache_unfinished_req(self, req: HiReq, chunked: bool = False) -> None:
        s = self._sglang_req(req)
        s.fill_ids = list(req.tokens[:req.filled])
        s.is_chunked = int(chunked)
        self.tree.cache_unfinished_req(s, chunked=chunked)
        req.kv_indices = self._row(s, len(req.kv_indices))
        req.cache_protected_len = s.cache_protected_len
        req.last_node = self.node(s.last_node)

    def cache_finished_req(self, req: HiReq, is_insert: bool = True) -> None:
        """upstream: mem_cache/common.py release_kv_cache -- ``cache_finished_req``, then the
        allocated-but-unfilled tail ``[committed, allocated)``, then the request row."""
        s = self._sglang_req(req)
        s.kv_committed_len, s.kv_allocated_len = req.filled, len(req.kv_indices)
        self.tree.cache_finished_req(s, is_insert=is_insert)
        if req.filled < s.kv_allocated_len:
            row = self.req_to_token_pool.req_to_token[s.req_pool_idx]
            self.allocator.free(row[req.filled:s.kv_allocated_len].to(torch.int64))
        self.req_to_token_pool.free(s)
        del self._reqs[req.rid]
        req.mamba_slot = None  # the tree's now, or freed

    def request_rows(self) -> tuple[list[int], dict[int, int]]:
        """(free request rows, {rid: row} of live requests)."""
        return (list(self.req_to_token_pool.free_slots),
                {rid: s.req_pool_idx for rid, s in self._reqs.items()})


class RequestRowsChecked:
    """Subject mixin: every request row is free or held by exactly one live request, checked
    after every step and at quiescence."""

    def check(self) -> None:
        super().check()
        self._check_request_rows()

    def check_quiescent(self) -> None:
        super().check_quiescent()
        self._check_request_rows()

    def _check_request_rows(self) -> None:
        free, held = self.cache.request_rows()
        size = self.cache.req_to_token_pool.size
        pool = PoolView("req_to_token", "slot", size, tuple(free),
                        versions.reserved_request_rows(self.cache.sg.version),
                        base=versions.request_rows_base(self.cache.sg.version))
        check_conservation(pool, {f"request r{rid}": [i] for rid, i in held.items()})


class NoHostTier:
    """Cache-adapter mixin for a mamba tree without a host tier: the drain's host steps have
    nothing to do, and nothing is ever on host only to load back."""

    def writing_check(self) -> int:
        return 0

    def drain_backup(self) -> int:
        return 0

    def evict_host(self, num_tokens: int) -> int:
        return 0

    def init_load_back(self, node):  # never called: nothing is ever on host only
        raise AssertionError(f"{type(self).__name__} has no host tier to load back from")


# -- the adapter ---------------------------------------------------------------------------------
class SglangMambaCache(NoHostTier, MambaTreeAdapter):
    """SGLang's ``MambaRadixCache`` with its real pools, behind the reference cache's interface."""

    def __init__(self, kv_slots: int, mamba_slots: int, device, *, cache_cls=None,
                 max_running: int = 2):
        self._build_device_tier(kv_slots, mamba_slots, max_running, device)
        from sglang.srt.mem_cache import mamba_radix_cache as mrc

        self.mrc = mrc
        self.tree = (cache_cls or mrc.MambaRadixCache)(self.sg.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator, page_size=1))
        self._first_id = mrc.TreeNode.counter  # the next node created gets id 1
        self._nodes: dict[int, Node] = {}
        self._reqs: dict[int, _MambaReq] = {}
        self.full_lru = LRUView("full_lru_list", self.tree.full_lru_list, self)
        self.mamba_lru = LRUView("mamba_lru_list", self.tree.mamba_lru_list, self)
        self.host_mamba_lru = _NoHostLRU()
        # no host tier: nothing is ever written back, backed up or protected on host
        self.ongoing_write_through: dict = {}
        self.write_lock_took_mamba: dict = {}
        self.ongoing_backup: dict = {}
        self.evictable_full_host_leaves: set = set()

    # -- nodes ----------------------------------------------------------------------------
    def path_tokens(self, node: Node) -> list[int]:
        out, raw = [], node.raw
        while raw is not self.tree.root_node and raw is not None:
            out = list(raw.key.token_ids[:len(raw.key)]) + out
            raw = raw.parent
        return out

    @property
    def evictable_full_device_leaves(self) -> set:
        """Upstream's eviction candidates (``get_prev_leaf_no_lock``'s test over the full LRU)."""
        return {n for n in self.full_lru.mru_first()
                if not n.raw.children and n.raw.full_lock_ref == 0}

    # -- tree API -------------------------------------------------------------------------
    def match_prefix(self, tokens) -> MatchResult:
        if not tokens:
            root = self.root_node
            return MatchResult([], root, root, root)
        r = self.tree.match_prefix(self.sg.MatchPrefixParams(key=self._key(tokens)))
        last = self.node(r.last_device_node)
        return MatchResult(r.device_indices.tolist(), last,
                           self.node(versions.mamba_match_best_node(r)),
                           self.node(r.last_host_node))

    def evict_mamba(self, mamba_num: int) -> int:
        return self.tree.evict(self.sg.EvictParams(num_tokens=0,
                                                   mamba_num=mamba_num)).mamba_num_evicted


class SglangTreeInternals:
    """Where the policy checks watch an SGLang mamba tree's eviction internals: on the real
    tree (``cache.tree``), its nodes named by the adapter's ids."""

    def policy_internals(self):
        return self.cache.tree, self.cache.node_id


# The lifecycle ops past the prefill (caches/subjects/lifecycle.py) on the 0.5.12.post1 /
# 0.5.10.post1 ``MambaRadixCache`` / ``HiMambaRadixCache`` adapters: declined.  These adapters
# keep no copy of a decode step's slot in the engine's ``req_to_token`` row (``sync_row``), so
# the engine's release would free the prompt's row only, and their retract and re-admission
# were not read against those releases' schedulers.  0.5.23's targets drive all three
# (``unified_mamba.py``, ``unified_hicache.py``).
HISTORICAL_LIFECYCLE_DECLINED = {
    op: "not driven on SGLang 0.5.12.post1/0.5.10.post1's MambaRadixCache adapters (no copy of "
        "a decode step's slot into the engine's request row; retract not read against those "
        "schedulers); SGLang 0.5.23's targets drive it"
    for op in ("decode", "retract", "schedule")}


class SglangMambaSubject(SglangTreeInternals, RequestRowsChecked, HiMambaSubject):
    """The himamba machine's subject (host=0) over SGLang's real ``MambaRadixCache``.

    Declared policy (upstream ``evict_full`` / ``evict_mamba``): the device victim is the least
    recently used unlocked leaf of the full LRU list, and when a victim's tombstone cascade
    leaves a childless ancestor the walk restarts from the list's LRU end -- so an ancestor a
    cascade exposes competes at once (``cascade_exposes``, set for every host=0 subject: the
    reference's model does the same), unlike HiMamba's heap.  Both
    passes evict a leaf through ``_evict_leaf_node``."""

    lifecycle_declined = HISTORICAL_LIFECYCLE_DECLINED

    variant = "himamba"
    target = "sglang"
    victim_hooks = {**HiMambaSubject.victim_hooks, "device": "_evict_leaf_node"}

    def __init__(self, *, kv_slots: int = 12, mamba_slots: int = 8, device=None,
                 fault: str | None = None, max_running: int = 2):
        cache_cls = None
        if fault is not None:
            from caches.adapters.sglang.mamba_faults import upstream_fault

            cache_cls = upstream_fault(fault)
        cache = SglangMambaCache(kv_slots, mamba_slots, resolve_device(device),
                                 cache_cls=cache_cls, max_running=max_running)
        super().__init__(kv_slots=kv_slots, mamba_slots=mamba_slots, device=device,
                         max_running=max_running, host=False, cache=cache)  # SGLang's pools
        self._watch_upstream()

    # -- coverage: the transitions the reference subject watches, on the real tree -----------
    def _watch_upstream(self) -> None:
        tree, subject = self.cache.tree, self
        watch(tree, "_split_node", before=lambda *a: subject.reached("node-split"))
        watch(tree, "_tombstone_internal_node",
              before=lambda *a: subject.reached("tombstone-created"))
        watch(tree, "_delete_tombstone_leaf",
              before=lambda *a: subject.reached("tombstone-cascade"))


def make_subject(params, fault=None, device=None, **options) -> SglangMambaSubject:
    """The factory ``state_machines/himamba.py`` uses for target ``sglang`` at host=0."""
    if params.get("host", 0):
        raise ValueError("caches.adapters.sglang.mamba serves host=0 (MambaRadixCache); "
                         "host=1 is caches.adapters.sglang.himamba")
    return SglangMambaSubject(kv_slots=params["kv_slots"], mamba_slots=params["mamba_slots"],
                              device=device, fault=fault, **options)
