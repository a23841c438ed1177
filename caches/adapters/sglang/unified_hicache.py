"""``--target sglang`` / ``--target sglang-rust`` for the himamba variant at ``host=1``
(storage 0 and 1) on SGLang 0.5.23: ``UnifiedRadixCache`` (Full + Mamba) with its HiCache tier,
over the Python tree core (white box) or the Rust one (black box).  The host=0 adapter
(``unified_mamba.py``) supplies the device tier, the request paths (the lifecycle ops past the
prefill included: ``decode``, ``retract``, ``schedule``, as its docstring says) and the
black-box checks; this module adds the host tier (docs/engines/sglang.md, "himamba host=1 on
0.5.23").

What runs is SGLang's: the device pools with a real one-layer ``HybridLinearKVPool`` (what
the HiCache stack selection matches), the real ``init_hicache``, the real
``HybridCacheController`` (host allocation with reclaim and rollback, the write/load queues,
``merge_ops``, the acks), ``MHATokenToKVPoolHost`` + ``MambaPoolHost`` in a ``HostPoolGroup``,
the tree's backup/ack/demote/load-back/host-eviction code.  What is kvcheck's:

* the host stack is built by ``UnpinnedMambaStack``, registered with SGLang's own
  ``register_stack_strategy`` seam for the time ``init_hicache`` runs: ``_MambaStrategy``'s
  stack for kvcheck's pool only, with the host pools unpinned (the stock one pins them with
  cudaHostRegister);
* ``cache_controller.l2_transfer_engine`` is ``RecordingEngine``: the real one calls CUDA-only
  ``sgl_kernel.kvcacheio`` kernels.  It copies kvcheck's fingerprints between the tiers and
  returns a completion whose ``finish_event`` lands when the harness says so (``write_ack``),
  so a write in flight is a real state;
* thresholds: ``write_through_threshold`` 1 (write_through) or 2 (selective), as
  ``init_hicache`` sets them from the published policy; ``load_back_threshold`` 1 (upstream 10
  tokens; our sequences are 1-3 tokens), as on 0.5.12.post1;
* host slot 0 of each host pool is held back (host ids ``1..capacity``, like every harness
  pool); the pools are sized ``capacity + 1`` through ``hicache_ratio``.

Ops (0.5.12.post1's names, 0.5.23's calls): ``backup`` is what ``_apply_cache_action(BackupKV)``
runs, ``_execute_and_commit_kv_backup(build_backup_kv_action(node))`` -- it backs up the
node's unbacked ancestors too (0.5.12.post1 refused such a node: a changed contract), each
under a write lock *receipt*; ``write_ack`` is ``flush_pending_backups`` (a backup is queued
with ``flush=False``), every submitted write landing, then ``writing_check``; a host hit at
``admit``/``lock`` is ``init_load_back(InitLoadBackParams(best, host_hit_length, req))`` with the
request the scheduler passes, then ``ready_to_load_host_cache``, the load landing and
``loading_check``: a host-only mamba state is loaded into the *request's own* state slot
(``MambaComponent.prepare_load_back``), which the admitted request then runs on (no
copy-on-write from the node), once the admission has the state slots the scheduler reserves
for it (else the request is deferred, "not admitted"); a bare ``lock`` has no request, so its
load-back is ``load_back(best)`` without one (what ``init_load_back`` runs).
``evict_host``/``evict_mamba_host`` are ``evict_host(n, FULL|MAMBA)``.  Storage (``storage=1``):
the controller's own L3 attach with an in-process backend and its storage threads built but
not started, their loop bodies run by ``storage_ack`` (backups), ``prefetch`` (the scheduler's
``_prefetch_kvcache``, the hit query, the staging at the drain), ``prefetch_done`` (the IO and
sync bodies, the drain's host insert, ``check_prefetch_progress``) and ``prefetch_abort``
(``release_aborted_request``): ``unified_storage.py``, docs/engines/sglang.md.

Known contract differences the checks accept (docs/engines/sglang.md): the mamba lock counts
tombstones (``MambaComponent.acquire_component_lock``: "Tombstones are counted too"), so a
write lock on a tombstone of the backup chain holds a mamba ref there.
"""

from __future__ import annotations

from array import array

from caches.adapters.sglang import loader
from caches.adapters.sglang.himamba import SglangHostKVPool, _Landing
from caches.adapters.sglang.mamba import _ids
from caches.adapters.sglang.unified_mamba import (MAMBA_CACHE_CHUNK, UMNode, UnifiedLRUView,
                                                  UnifiedMambaCache, UnifiedMambaSubject,
                                                  publish_server_config)
from caches.adapters.sglang.unified_radix import _UReq
from caches.himamba import POLICIES, WRITE_THROUGH
from caches.subjects.base import Skip
from caches.subjects.himamba import host_tier

# SGLang sizes the mamba pool at 3 states per running request without the extra buffer:
# max_running_requests = max_mamba_cache_size // 3 (0.5.23 mem_cache/kv_cache_configurator.py
# 227-229, 3062-3088, 3134-3150)
MAMBA_STATES_PER_REQUEST = 3
from invariants import check_conservation, fail

LAYOUT = "page_first_direct"  # MambaPoolHost accepts only the page_first layouts


# -- host pools ----------------------------------------------------------------------------------
class HostPool(SglangHostKVPool):
    """A real host pool (``MHATokenToKVPoolHost`` / ``MambaPoolHost``) as the subject's
    ``host_kv`` / ``host_mamba`` pool: 0.5.12.post1's host KV pool wrapper (slot 0 held back,
    kvcheck's fingerprints in a tensor beside the pool), whose free slots on 0.5.23 also count
    the freed slots the pool merges lazily (``release_slots``)."""

    def __init__(self, pool, name: str):
        super().__init__(pool, pool.size - 1, name)
        self.size = self.num_pages
        got = pool.alloc(1)
        assert got is not None and int(got[0]) == 0, "host slot 0 was not the first handed out"

    @property
    def free_pages(self) -> list[int]:
        out = self.pool.free_slots.tolist()
        for released in self.pool.release_slots:
            out.extend(released.tolist())
        return out

    free_slots = free_pages


# -- the transfer engine stand-in ----------------------------------------------------------------
class RecordingEngine:
    """``L2TransferEngine`` stand-in (the only part of the controller that is not SGLang's):
    each submission copies the fingerprints of its transfers between the tiers, and its
    completion's ``finish_event`` lands when ``land`` says so."""

    def __init__(self, real, pairs: dict):
        self.io_backend = real.io_backend
        self.device_to_host_stream = real.device_to_host_stream
        self.host_to_device_stream = real.host_to_device_stream
        self._pairs = pairs  # id(host pool) -> (device fingerprints, host fingerprints)
        self.writes: list = []  # completions not landed yet
        self.loads: list = []
        self.written: dict[str, set] = {}  # host pool name -> slots a backup wrote (black box)

    def _copy(self, transfers, to_host: bool) -> None:
        for t in transfers:
            dev, host = self._pairs[id(t.host_pool)]
            d, h = _ids(t.device_indices), _ids(t.host_indices)
            if to_host:
                host.write(h, dev.read(d))
                self.written.setdefault(host.name, set()).update(h)
            else:
                dev.write(d, host.read(h))

    @staticmethod
    def _completion(pending: list):
        from sglang.srt.mem_cache.l2_transfer import TransferCompletion

        done = _Landing()
        pending.append(done)
        return TransferCompletion(_Landing(), done, False)

    def submit_device_to_host(self, transfers):
        self._copy(transfers, to_host=True)
        return self._completion(self.writes)

    def submit_host_to_device(self, transfers, *, transfer_layer_id_max, start_event=None,
                              on_layer_done=None):
        self._copy(transfers, to_host=False)
        if on_layer_done is not None:
            for layer in range(transfer_layer_id_max):
                on_layer_done(layer)
        return self._completion(self.loads)

    @staticmethod
    def land(pending: list) -> int:
        for done in pending:
            done.synchronize()
        n = len(pending)
        pending.clear()
        return n


def unpinned_mamba_stack(kv_pool, kv_ratio: float, mamba_ratio: float):
    """A ``StackStrategy`` that builds ``_MambaStrategy``'s stack (``build_hybrid_mamba_stack``)
    for ``kv_pool`` only, with unpinned host pools.  Upstream sizes both host pools with one
    ``hicache_ratio``; here each gets its own, so the regime's ``host_kv_slots`` and
    ``host_mamba_slots`` are both honoured."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.pool_host import HostPoolGroup
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.runtime_context import get_memory

    class UnpinnedMambaStack(hpa.StackStrategy):
        def matches(self, kvcache, components):
            return kvcache is kv_pool

        def build(self, *, cache, kvcache, params, load_cache_event, storage_backend=None,
                  storage_backend_extra_config=None, prefetch_threshold=256, model_name=None,
                  **_):
            mem = get_memory()
            full = kvcache.full_kv_pool
            cls, info, kw = hpa._mha_host_inputs(full)
            kv_host = cls(info, kv_ratio, 0, 1, LAYOUT, pin_memory=False,
                          device="cpu", **kw)
            mamba_pool = params.req_to_token_pool.mamba_pool
            (minfo,) = mamba_pool.get_device_pool_infos()
            mamba_host = MambaPoolHost(minfo.buffer_info, mamba_ratio, 0,
                                       device_capacity=mamba_pool.size, pin_memory=False,
                                       layout=LAYOUT)
            full_map = hpa._stage_local_layer_mapping(kvcache.full_attention_layer_id_mapping,
                                                      kvcache.start_layer)
            mamba_map = {layer - kvcache.start_layer: i
                         for i, layer in enumerate(minfo.layer_ids)}
            top = max(full_map.keys() | mamba_map.keys()) + 1
            slots = params.req_to_token_pool.mamba_allocator
            mb = ComponentType.MAMBA
            group = HostPoolGroup([
                hpa.build_pool_entry(name=PoolName.KV, host_pool=kv_host, device_pool=full,
                                     layer_mapping=full_map, transfer_layer_id_max=top,
                                     is_anchor=True),
                hpa.build_pool_entry(
                    name=PoolName.MAMBA, host_pool=mamba_host, device_pool=mamba_pool,
                    layer_mapping=mamba_map, transfer_layer_id_max=top,
                    host_evict_fn=lambda n: cache.evict_host(n, mb),
                    device_evict_fn=lambda n: hpa._evict_mamba_for_device_alloc(cache, n),
                    device_alloc_fn=slots.alloc, device_free_fn=slots.free)])
            controller = HybridCacheController(
                params.token_to_kv_pool_allocator, group, 1, None,
                load_cache_event=load_cache_event, write_policy=mem.hicache_write_policy,
                io_backend=mem.hicache_io_backend, transfer_layer_id_max=top,
                host_memory_mode="cache")
            if storage_backend is not None:  # storage=1: SGLang's attach, threads not started
                from caches.adapters.sglang.unified_storage import attach_unstarted

                attach_unstarted(controller, storage_backend, prefetch_threshold, model_name,
                                 storage_backend_extra_config, group.entries)
            return hpa.StackBuildResult(
                host_pool_group=group, cache_controller=controller,
                component_host_pools={ComponentType.FULL: kv_host, mb: mamba_host},
                register_req_to_token_counter=True, pools_desc="KV + MAMBA (kvcheck, CPU)")

    return UnpinnedMambaStack()


# -- nodes ---------------------------------------------------------------------------------------
class HostUMNode(UMNode):
    """A ``UnifiedTreeNode`` with its host-tier fields (Python core)."""

    __slots__ = ()

    @property
    def host_value(self):
        v = self._d(self._cache.FULL).host_value
        return None if v is None else _ids(v)

    @property
    def mamba_host_value(self):
        m = self._d(self._cache.MAMBA).host_value
        return None if m is None else int(m.view(-1)[0])

    host_ref_counter = property(lambda self: self._d(self._cache.FULL).host_lock_ref)
    host_mamba_ref_counter = property(lambda self: self._d(self._cache.MAMBA).host_lock_ref)
    backuped = property(lambda self: self._d(self._cache.FULL).host_value is not None)
    mamba_backuped = property(lambda self: self._d(self._cache.MAMBA).host_value is not None)


class HostStateList:
    """The Mamba host LRU as the himamba checks read it.  0.5.23 lists only *host-only*
    states there (no device state: ``MambaComponent`` inserts a node when its device state is
    evicted, and ``sanity_check`` holds it to exactly that set), where 0.5.12.post1 listed
    every host state; the view adds the backed-up states still on device, unreferenced, so
    the shared membership check holds the real list to 0.5.23's rule exactly."""

    name = "mamba_host_lru_list"

    def __init__(self, lru: UnifiedLRUView, cache):
        self.real, self._cache = lru, cache

    def mru_first(self) -> list:
        # a host-locked state (a storage backup or a prefetch anchor holds it) is left out:
        # 0.5.23 takes it off the list when the lock is taken, but lists it again when its
        # device state goes under the lock (``MambaComponent.evict_component``) or a prefetch
        # commits it; its host eviction walk skips host-locked entries
        # (``get_lru_no_host_lock``), so the list's rule holds for unlocked states only
        out = [n for n in self.real.mru_first() if not n.host_mamba_ref_counter]
        seen = {n.id for n in out}
        nodes, stack = [], list(self._cache.root_node.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.id not in seen and n.mamba_value is not None and \
                    n.mamba_host_value is not None and n.host_mamba_ref_counter == 0:
                nodes.append(n)
        return out + nodes

    def lru_first(self) -> list:
        return self.mru_first()[::-1]


class _DeviceSide:
    """A node seen without its host copies (a write in flight: not valid yet)."""

    __slots__ = ("_n",)
    host_value = mamba_host_value = None

    def __init__(self, node):
        self._n = node

    def __getattr__(self, name):
        return getattr(self._n, name)


def _storage_fields(storage: bool) -> dict:
    """The server fields ``init_hicache`` reads for an L3 backend: at storage=1 kvcheck's
    in-process ``FingerprintStorage`` through SGLang's ``dynamic`` backend route
    (``unified_storage.py``), best-effort prefetch (the default policy)."""
    if not storage:
        return {}
    from caches.adapters.sglang.unified_storage import BACKEND, extra_config

    return {"hicache_storage_backend": BACKEND,
            "hicache_storage_backend_extra_config": extra_config(),
            "hicache_storage_prefetch_policy": "best_effort"}


class _ExpectedWarnings:
    """A ``logging`` filter for the warnings upstream logs on what kvcheck drives on purpose,
    once per subject or per eviction (the subject counts these events itself): a host pool
    smaller than the device one, and a write_back backup that failed under host memory
    pressure ("write_back: KV subtree dropped ...", "... subtree drop declined ...")."""

    PREFIXES = ("HiCache kv host pool", "HiCache host KV pool", "write_back:")

    @classmethod
    def filter(cls, record) -> bool:
        return not record.getMessage().startswith(cls.PREFIXES)


def _quiet_expected_warnings() -> None:
    import logging

    for name in ("sglang.srt.mem_cache.pool_host.base", "sglang.srt.mem_cache.pool_host.mamba",
                 "sglang.srt.mem_cache.unified_radix_cache"):
        log = logging.getLogger(name)
        if _ExpectedWarnings not in log.filters:
            log.addFilter(_ExpectedWarnings)


# -- the cache -----------------------------------------------------------------------------------
class UnifiedHiMambaCache(UnifiedMambaCache):
    """``UnifiedRadixCache`` (Full + Mamba) with the real HiCache stack, behind the himamba
    subject's cache interface (host tier included)."""

    node_view = HostUMNode

    def __init__(self, kv_slots: int, mamba_slots: int, host_kv_slots: int,
                 host_mamba_slots: int, write_policy: str, device, *, core: str = "python",
                 max_running: int = 2, component_override=None, core_backend=None,
                 storage: bool = False):
        # (no "host larger than device" rule here: 0.5.23's host pools only warn when they are
        # not larger -- pool_host/base.py ``_allocate_host_buffer``, pool_host/mamba.py
        # ``MambaPoolHost.__init__`` -- since SGLang PR #28614 removed the constraint; a
        # smaller host is what makes a write_back backup fail)
        self.write_policy = write_policy  # what the himamba subject reads (write_back)
        _quiet_expected_warnings()
        loader.require()  # the stand-ins, before any sglang import
        from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa
        from sglang.srt.runtime_context import get_context

        # the hicache fields init_hicache and the stack read, for the time they are built
        # (ratios +0.5 so int(device * ratio) is the capacity exactly)
        kv_ratio = (host_kv_slots + 0.5) / kv_slots
        published = get_context().override_server_args(
            _mamba_cache_chunk_size=MAMBA_CACHE_CHUNK, hicache_io_backend="direct",
            hicache_mem_layout=LAYOUT, hicache_write_policy=write_policy, hicache_ratio=kv_ratio,
            **_storage_fields(storage))
        server_args = published.install()
        try:
            super().__init__(kv_slots, mamba_slots, device, core=core, max_running=max_running,
                             component_override=component_override, core_backend=core_backend)
            strategy = unpinned_mamba_stack(self.kv_pool, kv_ratio,
                                            (host_mamba_slots + 0.5) / mamba_slots)
            hpa.register_stack_strategy(strategy)
            try:
                self.tree.init_hicache(server_args, self._init_params())
            finally:
                hpa._STRATEGIES.remove(strategy)
        finally:
            published.restore()
            publish_server_config()  # what host=0 keeps published (if nothing else is)
        import atexit

        atexit.unregister(self.tree.shutdown)  # nothing to detach: no storage thread started
        tree = self.tree
        tree.load_back_threshold = 1  # upstream 10 tokens; our sequences are 1-3 tokens
        assert tree.write_through_threshold == (1 if write_policy == WRITE_THROUGH else 2)
        cc = self.controller = tree.cache_controller
        kv_host, mamba_host = tree.full_kv_pool_host, tree.mamba_pool_host
        self.host_kv = HostPool(kv_host, "host_kv")
        self.host_mamba = HostPool(mamba_host, "host_mamba")
        assert (self.host_kv.size, self.host_mamba.size) == (host_kv_slots, host_mamba_slots)
        self.engine = cc.l2_transfer_engine = RecordingEngine(
            cc.l2_transfer_engine, {id(kv_host): (self.kv, self.host_kv),
                                    id(mamba_host): (self.mamba, self.host_mamba)})
        self.storage = self._bind_storage(storage)  # the L3 backend (None at storage=0)
        if self.white_box:
            self.host_mamba_lru = HostStateList(UnifiedLRUView(
                "mamba_host_lru_list", tree.tree_core.host_lru_lists[self.MAMBA], self), self)
        self.loaded_slot = None  # the request state slot the last admission's load filled

    # -- storage (L3): the backend, and the storage threads' bodies run by the ops ----------
    def _bind_storage(self, storage: bool):
        """The controller's ``FingerprintStorage`` (built by SGLang's factory at attach),
        bound to kvcheck's host fingerprints; None at storage=0."""
        from sglang.srt.mem_cache.hicache_storage import PoolName

        tree = self.tree
        if not storage:
            assert not tree.enable_storage
            return None
        assert tree.enable_storage and self.controller.enable_storage
        assert tree.prefetch_threshold == 1, tree.prefetch_threshold
        from caches.adapters.sglang.unified_storage import warm_key_scheme

        warm_key_scheme()
        backend = self.controller.storage_backend
        backend.bind({PoolName.KV: self.host_kv, PoolName.MAMBA: self.host_mamba})
        self.handles: dict = {}  # hid -> CacheRequestHandle of a prefetch kvcheck started
        self._record_backup_prefixes()
        return backend

    def _record_backup_prefixes(self) -> None:
        """op id -> (label, the node's whole prefix) per storage backup queued: what the
        stored-key property checks the keys the backend received against (white box: the
        Rust core's nodes show no keys)."""
        if not self.white_box:
            return
        tree, cc, cache = self.tree, self.controller, self
        self.backup_prefixes: dict = {}
        queued = [None]
        write_backup_storage, write_storage = tree.write_backup_storage, cc.write_storage

        def on_node(node_id):
            queued[0] = cache.node(node_id)
            try:
                return write_backup_storage(node_id)
            finally:
                queued[0] = None

        def on_write(*args, **kwargs):
            op = write_storage(*args, **kwargs)
            node = queued[0]
            cache.backup_prefixes[op] = (f"storage backup of #{node.id} (op {op})",
                                         cache.path_tokens(node))
            return op

        tree.write_backup_storage, cc.write_storage = on_node, on_write

    def stored_writes(self) -> list:
        """The plain view ``check_storage_keys`` reads: (label, prefix, KV keys, state keys)
        per storage backup the backend wrote."""
        from sglang.srt.mem_cache.hicache_storage import PoolName

        by_op: dict = {}
        for pool, key, _, op in self.storage.writes:
            by_op.setdefault(op, ([], []))[0 if pool == PoolName.KV else 1].append(key)
        return [(*self.backup_prefixes[op], kv, st) for op, (kv, st) in by_op.items()]

    def drain_storage(self) -> None:
        """The scheduler's per-iteration ``drain_storage_control_queues``, twice: host slots a
        drain hands back through the release queues (a revoked prefetch's staging) are freed
        by the next one (the queue sizes are read before the drain starts)."""
        self.tree.drain_storage_control_queues()
        self.tree.drain_storage_control_queues()

    @property
    def ongoing_backup(self) -> dict:
        """op id -> (node view, protects the host state) per storage backup in flight (the
        host lock a backup takes holds both components; on 0.5.23 the Mamba one counts a
        node without a host state too)."""
        if self.storage is None:
            return {}
        return {op: (self.node(nid), True) for op, (nid, _) in self.tree.ongoing_backup.items()}

    def storage_receipts(self):
        """(anchor view, host-lock receipt) per storage holder: backups in flight, prefetch
        anchors."""
        tree = self.tree
        for nid, receipt in tree.ongoing_backup.values():
            yield self.node(nid), receipt
        for info in tree.ongoing_prefetch.values():
            yield self.node(info.anchor_node_id), info.anchor_lock_params

    def host_segment(self, anchor, receipt) -> list:
        """The nodes a Full host lock holds (white box): 0.5.23's host lock is a *segment*,
        from its anchor up to the node carrying the receipt's boundary uuid -- a split of a
        host-locked node extends it through the new parent (``FullComponent.
        redistribute_on_node_split`` moves the boundary up; ``release_component_lock`` walks
        the same segment).  Empty where the receipt did not take it."""
        uuid = receipt.component_host_lock_uuids.get(self.FULL)
        if self.FULL not in receipt.component_host_lock_uuids:
            return []
        out, node = [anchor], anchor
        while node._d(self.FULL).metadata.get("host_uuid") != uuid:
            node = self.node(node.raw.parent)
            out.append(node)
        return out

    def drain_backup(self) -> int:
        """The backup thread writes every queued backup to storage; the drain releases them."""
        from caches.adapters.sglang.unified_storage import run_backups

        if self.storage is None:  # storage=0: no backup thread, nothing in flight
            return 0
        before = len(self.tree.ongoing_backup)
        run_backups(self.controller)
        self.drain_storage()
        return before - len(self.tree.ongoing_backup)

    def prefetch_submit(self, hid: int, tokens: list[int]):
        """The scheduler's ``_prefetch_kvcache`` for a request of ``tokens``: the match, then
        ``prefetch_from_storage`` below its last host node (backed up, or the root) with the
        tokens past the device + host hit; then the prefetch thread's hit query and the drain
        that stages the hit on host (``_drain_and_alloc_storage_hit``).  Returns (tokens the
        device + host hit covers, tail, the operation's hit count -- None where
        ``prefetch_rate_limited`` declined it before submission -- whether it is live), or None
        when there is nothing to fetch."""
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        from caches.adapters.sglang.unified_storage import run_hit_queries

        tree = self.tree
        r = self.match_prefix_raw(tokens)
        anchor = r.last_host_node
        matched = int(r.device_prefix_len) + int(r.host_hit_length or 0)
        tail = list(tokens[matched:])
        if not tail or not (tree.is_backuped(anchor) or tree.is_root(anchor)):
            return None
        handle = CacheRequestHandle(f"p{hid}", 0)
        limited = tree._prefetch_outcome_stats["declined_rate_limited"]
        # the scheduler's token arrays (``Req.full_untruncated_fill_ids`` is an array("q"))
        tree.prefetch_from_storage(handle, anchor, array("q", tail),
                                   tree.get_last_hash_value(anchor), None,
                                   matched_prefix_tokens=array("q", tokens[:matched]))
        ops = run_hit_queries(self.controller)
        self.drain_storage()
        if not ops and tree._prefetch_outcome_stats["declined_rate_limited"] > limited:
            return matched, tail, None, False  # prefetch_rate_limited: nothing submitted
        hit = ops[0].storage_hit_count if ops else 0
        live = handle in tree.ongoing_prefetch
        if live:
            self.handles[hid] = handle
        return matched, tail, hit, live

    def prefetch_finish(self, hid: int) -> int:
        """The IO thread reads the staged hit from storage, the sync thread acks it, the drain
        inserts it on host (``_handle_prefetch_result``), and the scheduler's
        ``check_prefetch_progress`` / ``pop_prefetch_loaded_span`` read the outcome.  Returns
        the tokens new to the tree."""
        from caches.adapters.sglang.unified_storage import run_syncs, run_transfers

        handle, tree = self.handles.pop(hid), self.tree
        run_transfers(self.controller)
        run_syncs(self.controller)
        self.drain_storage()
        assert tree.check_prefetch_progress(handle)
        loaded, _ = tree.pop_prefetch_loaded_span(handle)
        return int(loaded)

    def prefetch_release(self, hid: int) -> None:
        """The request is aborted: ``release_aborted_request`` terminates the prefetch, the
        IO thread then sees it terminated (what it fetched is dropped), the drain releases."""
        from caches.adapters.sglang.unified_storage import run_syncs, run_transfers

        handle = self.handles.pop(hid)
        self.tree.release_aborted_request(handle)
        run_transfers(self.controller)
        run_syncs(self.controller)
        self.drain_storage()

    def live_prefetches(self) -> dict:
        """hid -> {"node": anchor view, "host": staged host KV slots, "mamba": staged host
        state} per prefetch in ``ongoing_prefetch`` (the staging is allocated when the hit is
        drained, so a live one has it)."""
        out = {}
        for hid, handle in getattr(self, "handles", {}).items():
            info = self.tree.ongoing_prefetch.get(handle)
            if info is None:
                continue
            mamba = [s for xs in info.comp_xfers.values() for t in xs
                     for s in _ids(t.host_indices)]
            out[hid] = {"node": self.node(info.anchor_node_id), "host": _ids(info.host_indices),
                        "mamba": mamba[0] if mamba else None}
        return out

    def _init_params(self):
        sg = self.sg
        return sg.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator, page_size=1,
            tree_components=(self.FULL, self.MAMBA), tree_core_backend=self.core)

    # -- host-tier views ------------------------------------------------------------------
    @property
    def ongoing_write_through(self) -> dict:
        """view id -> node under a write lock (one per backup in flight)."""
        out = {}
        for w in self.tree.ongoing_write_through.values():
            n = self.node(w[0])
            out[n.id] = n
        return out

    def _write_locks(self):
        """(node view, whether the write lock's receipt took the node's mamba lock) per
        write-through in flight."""
        for w in self.tree.ongoing_write_through.values():
            receipt = w[1]
            yield self.node(w[0]), receipt is not None and \
                self.MAMBA not in receipt.skipped_lock_components

    @property
    def write_lock_took_mamba(self) -> dict:
        """view id -> whether the write lock holds a mamba ref on a node *with a state* (one
        on a tombstone is counted apart: ``UnifiedHiMambaSubject._views``)."""
        return {n.id: took and (not self.white_box or n.mamba_value is not None)
                for n, took in self._write_locks()}

    @property
    def evictable_full_host_leaves(self) -> set:
        if not self.white_box:
            return set()
        return {self.node(n) for n in self.tree.tree_core.evictable_host_leaves}

    # -- host-tier ops --------------------------------------------------------------------
    def write_backup(self, node) -> int:
        """What ``_apply_cache_action(BackupKV)`` runs for the node (its unbacked ancestors
        first); the write is queued (``flush=False``) until ``writing_check``."""
        tree = self.tree
        return tree._execute_and_commit_kv_backup(
            tree.tree_core.build_backup_kv_action(self.handle(node)))

    def is_backuped(self, node) -> bool:
        return bool(self.tree.tree_core.is_backuped(self.handle(node)))

    def writing_check(self) -> int:
        """``flush_pending_backups``, every submitted write lands, ``writing_check``."""
        before = len(self.tree.ongoing_write_through)
        self.tree.flush_pending_backups()
        self.engine.land(self.engine.writes)
        self.tree.writing_check()
        return before - len(self.tree.ongoing_write_through)

    def evict_host(self, num_tokens: int) -> int:
        return int(self.tree.evict_host(num_tokens, self.FULL))

    def evict_mamba_host(self, num: int) -> int:
        return int(self.tree.evict_host(num, self.MAMBA))

    def host_load(self, raw_match, for_request: bool):
        """A host hit loaded back, then ``ready_to_load_host_cache``, the load landing and
        ``loading_check``.  For an admission, ``init_load_back`` as ``schedule_policy`` calls
        it, with the request (``InitLoadBackParams(best, host_hit_length, req)``): a host-only
        state is loaded into the request's own slot, kept in ``loaded_slot``.  A bare lock has
        no request, so it runs what ``init_load_back`` runs, ``load_back(best)``, without one.
        Returns (node to lock, tokens loaded, whether a request slot was filled)."""
        from sglang.srt.managers.schedule_batch import ReqKvInfo
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

        tree, best = self.tree, raw_match.best_match_node
        s = None
        if for_request:
            s = _UReq(-1, ReqKvInfo())
            s.last_node = raw_match.last_device_node
            s.host_hit_length = int(raw_match.host_hit_length or 0)
            s.mamba_host_hit_length = int(raw_match.mamba_host_hit_length or 0)
            s.swa_host_hit_length = int(raw_match.swa_host_hit_length or 0)
            loaded, last = tree.init_load_back(InitLoadBackParams(
                best_match_node=best, host_hit_length=s.host_hit_length, req=s))
        else:
            ok = tree.load_back(best)
            loaded, last = (1, best) if ok else (0, raw_match.last_device_node)
        tree.ready_to_load_host_cache()
        self.engine.land(self.engine.loads)
        tree.loading_check()
        slot = None if s is None else s.kv.mamba_pool_idx
        if slot is not None:
            self.loaded_slot = int(slot)
        return self.node(last), loaded, slot is not None

    def match_prefix_raw(self, tokens):
        """The scheduler's match (what ``match_prefix_for_req`` reads off it)."""
        return self.tree.match_prefix(self.sg.MatchPrefixParams(key=self._key(tokens)))


# -- the subject ---------------------------------------------------------------------------------
def _slot_of(req):
    """The request's device state slot as an int (None when it holds none)."""
    idx = req.kv.mamba_pool_idx
    return None if idx is None else int(idx.view(-1)[0]) if hasattr(idx, "view") else int(idx)


class _Deferred(Exception):
    """The scheduler would not admit the request now (its load-back's state slots)."""


class UnifiedHiMambaSubject(UnifiedMambaSubject):
    """The himamba machine's subject at host=1 (storage 0 and 1) over 0.5.23's ``UnifiedRadixCache``
    (Full + Mamba) with HiCache; ``core`` picks the tree core."""

    def __init__(self, *, skip_known_findings=None, **kwargs):
        """Coverage: backups (any, the inserts' included) and refused host writes, demotions,
        host evictions, called-off load-backs; at storage=1 storage backups, and the prefetch
        outcomes (staged, storage miss, refused for host staging, inserted, aborted) in the
        prefetch ops.  ``skip_known_findings``: True/None declines every known finding of the
        installed release, False none, or the ids to decline (the target passes the ones
        ``--known-findings`` does not drive)."""
        super().__init__(**kwargs)
        from caches.adapters import declined_findings
        from caches.adapters.sglang import versions

        self.mamba_slots = kwargs["mamba_slots"]
        self.declined = set(declined_findings(
            skip_known_findings, versions.known_findings(loader.require().version, "himamba")))
        from caches.subjects.base import watch

        subject = self
        watch(self.cache.tree, "_execute_and_commit_kv_backup",
              after=lambda out, *a: out and subject.reached("host-backup"))
        # a host write refused (no host slots after the reclaim: the chain stops there), and
        # at storage=1 every storage backup queued (``write_backup_storage``'s write_storage)
        watch(self.cache.tree, "_execute_kv_backup",
              after=lambda out, *a: out is None and subject.reached("host-write-refused"))
        if self.cache.storage is not None:
            watch(self.cache.controller, "write_storage",
                  after=lambda *a: subject.reached("storage-backup"))
        if self.white_box:
            core = self.cache.tree.tree_core
            watch(core, "_demote", before=lambda *a: subject.reached("evict-to-host"))
            watch(core, "_evict_host_leaf", before=lambda *a: subject.reached("host-eviction"))
        self._check_called_off_load_backs()
        if self.write_back:
            self._watch_write_back()

    def _fork_starved(self, req) -> None:
        """No mamba state free and none evictable for a chunk's fork: the chunk's checkpoint
        (``prepare_for_caching_req`` -> ``MambaComponent._alloc_mamba_slot``) asserts "Can not
        alloc mamba cache".  Below SGLang's sizing rule that is misconfiguration (a Skip); at or
        above it, finding F7 (every state pinned by write-throughs in flight and the running
        requests' locks): declined, or driven to the real assertion."""
        if self.mamba_slots < MAMBA_STATES_PER_REQUEST * self.max_running:
            raise Skip("no mamba state can be freed for the chunk's fork (the pool is below "
                       "SGLang's sizing rule, 3 states per running request)")
        if "F7" in self.declined:
            from caches.adapters import KnownUpstreamFinding

            raise KnownUpstreamFinding(
                "every mamba state is pinned (write-throughs in flight, running requests' "
                "locks): the chunk's checkpoint would assert 'Can not alloc mamba cache' (known "
                "upstream finding sglang-0.5.23-himamba-F7, SGLang PRs #36770, #40416, "
                "tests/upstream_findings/)")
        # find: the real checkpoint runs (MambaComponent._alloc_mamba_slot asserts: crash)

    # -- write_back (policy=2): what the eviction walk runs (urc ``_evict_components``) --------
    kept_hook = None  # (0.5.23 keeps a leaf in _drop_subtree_no_host: _watch_write_back)

    def _watch_write_back(self) -> None:
        """Coverage and the policy checks of 0.5.23's write_back: a leaf the walk picks that is
        not backed up is written back (``_execute_and_commit_kv_backup(.., write_back=True)``,
        then the blocking ``writing_check(write_back=True)`` and ``_demote``) -- "write-back";
        when that backup fails (host memory pressure), ``_drop_subtree_no_host`` drops the
        subtree or declines, and the leaf stays on device (a ``KEPT`` entry of the pass, and
        an excuse for an eviction that freed nothing) -- "write-back-failed", as is a failed
        backup of a node whose Mamba state the walk takes (``backup_node_for_write_back``)."""
        from caches.subjects.base import watch

        tree, subject = self.cache.tree, self
        internals = self.policy_internals()
        id_of = internals[1] if internals is not None else None
        backup = tree._execute_and_commit_kv_backup

        def execute(action, write_back=False):
            written = backup(action, write_back=write_back)
            if write_back and written:
                subject.reached("write-back")
            return written
        tree._execute_and_commit_kv_backup = execute

        def dropped(out, note, node_id, *args):
            if not out:
                subject._kept += 1
                if id_of is not None:
                    subject._note_kept(id_of(node_id))
        watch(tree, "_drop_subtree_no_host",
              before=lambda *a: subject.reached("write-back-failed"), after=dropped)
        watch(tree, "backup_node_for_write_back",
              after=lambda out, *a: out or subject.reached("write-back-failed"))

    def _check_called_off_load_backs(self) -> None:
        """A state check on every load-back the engine itself calls off (``load_back`` returns
        False: memory quota, too little eviction, the controller's ``load`` refused): the H->D
        copy never ran, so the request must keep no state slot it did not hold before, and no
        mamba slot the load-back took may stay allocated (``MambaComponent.finalize_load_back``
        gives back what ``prepare_load_back`` took: SGLang PR #30986).  Without this, the slot
        handed to the request shows only as data-integrity, and only when its stale bytes
        differ -- luck, not a check."""
        tree, subject = self.cache.tree, self
        orig = tree.load_back

        def load_back(node_id, mem_quota=None, req=None):
            held = None if req is None else _slot_of(req)
            free = set(subject.mamba.free_slots)
            ok = orig(node_id, mem_quota, req=req)
            if not ok:
                subject._called_off_load_back(req, held, free)
            return ok

        tree.load_back = load_back

    def _called_off_load_back(self, req, held, free_before: set) -> None:
        self.reached("load-back-called-off")
        if req is not None and _slot_of(req) != held:
            fail("conservation", f"a called-off load-back left state slot {_slot_of(req)} "
                 f"on the request (it held {held}; the H->D copy never ran)",
                 slot=_slot_of(req), held=held)
        kept = sorted(free_before - set(self.mamba.free_slots))
        if kept:
            fail("conservation", f"a called-off load-back kept mamba slot(s) {kept} allocated "
                 f"(free before it, neither freed nor loaded)", slots=kept)
        self._check_host_copies("called-off load-back")

    def _build_cache(self, kv_slots, mamba_slots, device, core, max_running, fault, *,
                     host_kv_slots, host_mamba_slots, write_policy, storage):
        override = backend = None
        if fault is not None:
            from caches.adapters.sglang.unified_faults import hicache_fault

            override, backend = hicache_fault(fault)
        return UnifiedHiMambaCache(kv_slots, mamba_slots, host_kv_slots, host_mamba_slots,
                                   write_policy, device, core=core, max_running=max_running,
                                   component_override=override, core_backend=backend,
                                   storage=storage)

    # -- admission: a host hit loads back into the request's own state slot ------------------
    def _match_and_load(self, tokens):
        c = self.cache
        c.loaded_slot = None
        if not tokens:
            return c.root_node
        r = c.match_prefix_raw(tokens)
        n = r.device_prefix_len
        idx = c.tree.path_device_indices(r.last_device_node)[:n].tolist() if n else []
        self.verify_data(self.kv, idx, tokens, "match hit, ")
        node = c.node(r.last_device_node)
        if (r.host_hit_length or 0) > 0 or (r.mamba_host_hit_length or 0) > 0:
            if self._admitting:
                # schedule_policy reserves the request's state slot and the host state's
                # before init_load_back binds them (_mamba_gap_budget_for_req with the host
                # hit, against free + mamba-evictable states); without them it defers the
                # request (AddReqResult.NO_TOKEN)
                need = 1 + int(r.mamba_host_hit_length or 0)
                if self.mamba.available_size() + c.mamba_evictable_size_ < need:
                    raise _Deferred(need)
            node, loaded, state = c.host_load(r, self._admitting)
            if loaded:
                self.reached("load-back")
            if state:
                self.reached("host-mamba-restored")
        while self.white_box and node is not c.root_node and node.mamba_value is None:
            node = node.parent  # never lock a tombstone (as at host=0)
        return node

    _admitting = False  # inside admit: a load-back's state slot becomes the request's

    def admit(self, rid: int, tokens: list[int]) -> str:
        self._admitting = rid not in self.requests and len(self.requests) < self.max_running
        try:
            return super().admit(rid, tokens)
        except _Deferred as d:
            self.reached("out-of-memory")
            return f"out of mamba states for the load-back ({d.args[0]} needed), r{rid} " \
                   f"not admitted"
        finally:
            self._admitting = False
            if self.cache.loaded_slot is not None:  # admission refused before taking it
                self.cache.mamba.free([self.cache.loaded_slot])
                self.cache.loaded_slot = None

    def _alloc_mamba(self, protect=None):
        c = self.cache
        if protect is not None and c.loaded_slot is not None:
            slot, c.loaded_slot = c.loaded_slot, None
            self._loaded = slot
            return slot
        return super()._alloc_mamba(protect)

    _loaded = None

    def _copy_mamba(self, slot: int, node) -> None:
        if slot == self._loaded:  # the load-back filled it: the admission's check reads it
            self._loaded = None
            return
        super()._copy_mamba(slot, node)

    # -- host-tier ops --------------------------------------------------------------------
    @host_tier
    def backup(self, tokens: list[int]) -> str:
        """The backup of the device node the tokens' match ends at (a hit reaching its
        threshold: the node and its unbacked ancestors)."""
        if self.write_back:  # _should_backup_after_insert: never a hit's backup
            raise Skip("write_back backs a node up only when eviction picks it")
        c = self.cache
        m = c.match_prefix(tokens)  # splits at the end of the tokens, like any match
        node = m.last_device_node
        if node is c.root_node or c.is_backuped(node):
            raise Skip("nothing to back up")
        got = c.write_backup(node)
        return self._by_depth(f"backing up #{node.id} ({got} tokens)" if got
                              else "backup refused")

    # -- checks ---------------------------------------------------------------------------
    def _views(self, kinds=("all", "full", "mamba")) -> dict:
        """0.5.23 counts a lock's mamba ref on a tombstone too (``MambaComponent.
        acquire_component_lock``: "Tombstones are counted too"); the only such lock here is a
        write lock on a tombstone of a backup chain.  The views report that ref apart
        (``tombstone_mamba``), so the tombstone check keeps 0.5.12's rule for every other
        holder, and ``check_state`` holds it to the write locks there."""
        views = super()._views(kinds)
        root = self.cache.root_node.id
        for n in next(iter(views.values())).nodes.values():
            if n.id != root and not n.extra["mamba"] and n.refs.get("mamba"):
                n.refs["tombstone_mamba"] = n.refs.pop("mamba")
        return views

    def check_state(self) -> None:
        super().check_state()
        if self.cache.storage is not None:
            self._check_storage_keys()
        want: dict = {}
        for n, took in self.cache._write_locks():
            if took and n.mamba_value is None:
                want[n.id] = want.get(n.id, 0) + 1
        for n in self._walk():
            got = n.mamba_lock_ref if n.mamba_value is None and n is not self.cache.root_node \
                else 0
            if got != want.get(n.id, 0):
                fail("ref-balance", f"tombstone node {n.id} has mamba lock {got}, but "
                     f"{want.get(n.id, 0)} write lock(s) on it took one", node=n.id,
                     counter="mamba")

    # -- storage (L3): backups to storage, prefetches from it (unified_storage.py) ----------
    @property
    def prefetches(self) -> dict:
        """The live prefetches as the himamba checks read them (anchor, staged host slots),
        from the tree's own ``ongoing_prefetch``."""
        return self.cache.live_prefetches() if self.cache.storage is not None else {}

    @prefetches.setter
    def prefetches(self, value) -> None:  # the base subject's initial {}: nothing to keep
        assert not value

    @host_tier
    def prefetch(self, hid: int, tokens: list[int]) -> str:
        """The scheduler's ``_prefetch_kvcache`` (``UnifiedHiMambaCache.prefetch_submit``):
        ``prefetch_from_storage``, the hit query, the drain that stages the hit on host."""
        c = self.cache
        if c.storage is None:
            raise Skip("no storage backend (prefetch_from_storage returns at once)")
        if hid in c.handles:
            raise Skip(f"prefetch p{hid} is live")
        if len(c.handles) >= 2:
            raise Skip("two prefetches already live")
        free = self._host_free()
        got = c.prefetch_submit(hid, tokens)
        if got is None:
            raise Skip("nothing beyond the host hit to prefetch (or its anchor is not "
                       "backed up)")
        matched, tail, hit, live = got
        if live:
            self.reached("prefetch-staged")
            return f"prefetching {hit} of {len(tail)} tokens past a hit of {matched}"
        self._called_off_storage("prefetch", free)
        if hit is None:
            self.reached("prefetch-declined")
            return "prefetch declined: the prefetches in flight hold half the host pool"
        if hit == 0:
            self.reached("prefetch-miss")
            return f"prefetch of {len(tail)} tokens: storage miss (revoked)"
        self.reached("prefetch-refused")
        return f"prefetch refused: {hit} tokens hit, no host staging for them (revoked)"

    def _live_prefetch(self, hid: int):
        c = self.cache
        if c.storage is None or hid not in c.handles:
            raise Skip(f"prefetch p{hid} is not live")
        return c

    @host_tier
    def prefetch_done(self, hid: int) -> str:
        new = self._live_prefetch(hid).prefetch_finish(hid)
        if new:
            self.reached("prefetch-inserted")
        return f"prefetched: {new} tokens new on host"

    @host_tier
    def prefetch_abort(self, hid: int) -> str:
        c = self._live_prefetch(hid)
        staged = c.live_prefetches().get(hid, {})
        free = self._host_free()
        c.prefetch_release(hid)
        self.reached("prefetch-aborted")
        # what the prefetch staged goes back; nothing else that was free is taken
        free["host_kv"] |= set(staged.get("host", ()))
        if staged.get("mamba") is not None:
            free["host_mamba"].add(staged["mamba"])
        self._called_off_storage("prefetch abort", free)
        return "prefetch released"

    def held_ledger(self):
        """The himamba ledger, with 0.5.23's host-lock receipts: a storage holder (a backup in
        flight, a prefetch anchor) holds the Full host lock only where its receipt took it
        (``FullComponent`` skips a node without a host value: the root anchor), on every node
        of its segment (``host_segment``: a split extends it), and the Mamba host lock on its
        anchor unless that is the root (a split gives the new parent none)."""
        full, mamba, host, host_mamba = super().held_ledger()
        c = self.cache
        if c.storage is None:
            return full, mamba, host, host_mamba
        root = c.root_node.id
        for anchor, receipt in c.storage_receipts():
            host[anchor.id] -= 1  # the base counted the anchor: count the segment instead
            if self.white_box:
                for n in c.host_segment(anchor, receipt):
                    host[n.id] = host.get(n.id, 0) + 1
            if anchor.id == root:
                host_mamba[root] -= 1
        return full, mamba, host, host_mamba

    def _check_storage_keys(self) -> None:
        """The stored-key property (``invariants/storage_keys.py``) over every backup the
        backend wrote, with SGLang's own key scheme (``get_hash_str``: one key per page, each
        folding in the one before; no namespace seed: requests here carry no extra key)."""
        from sglang.srt.mem_cache.utils import get_hash_str

        from invariants.storage_keys import check_storage_keys

        check_storage_keys(self.cache.stored_writes(),
                           lambda tokens: get_hash_str(list(tokens), None, page_size=1))

    def _host_free(self) -> dict:
        return {"host_kv": set(self.host_kv.free_pages),
                "host_mamba": set(self.host_mamba.free_pages)}

    def _called_off_storage(self, what: str, free_before: dict) -> None:
        """A storage operation refused or called off (a prefetch revoked: storage miss, no
        host staging; a prefetch aborted) leaves nothing it allocated allocated: every host
        slot free before it is free after it (its host reclaim may free more), it holds no
        anchor lock (``ongoing_prefetch`` no longer has it: the host refs are checked against
        the holders every step), and every node the reclaim evicted to host has its host
        copy (``_check_host_copies``)."""
        after = self._host_free()
        for pool in ("host_kv", "host_mamba"):
            kept = sorted(free_before[pool] - after[pool])
            if kept:
                fail("conservation", f"a {what} that was called off kept {pool} slot(s) "
                     f"{kept} allocated (free before it, inserted nowhere)", pool=pool,
                     slots=kept)
        self._check_host_copies(what)

    def _check_host_copies(self, what: str) -> None:
        """Every node off the device keeps its Full KV on host (0.5.23 deletes a node that has
        it on neither tier: ``_iteratively_delete_tombstone_ancestors``)."""
        if not self.white_box:
            return
        for n in self._walk():
            if n is self.cache.root_node or n.value is not None:
                continue
            if n.host_value is None:
                fail("conservation", f"after a {what}, node {n.id} is off the device with no "
                     f"host copy (its KV is lost, the node stays in the tree)", node=n.id)

    def _check_data(self, nodes) -> None:
        """A backup is committed (host value set) when it is queued, and its copy runs when it
        is submitted: the host copy holds the data once the write has landed, so a node whose
        write-through is pending (``write_through_pending_id``) has its device data checked
        only."""
        ready, pending = [], []
        for n in nodes:
            (pending if n.raw.write_through_pending_id is not None else ready).append(n)
        super()._check_data(ready + [_DeviceSide(n) for n in pending])

    def _check_black_box(self) -> None:
        super()._check_black_box()
        self._check_host_black_box()

    def _check_host_black_box(self) -> None:
        """Rust core (the tree's host values are not visible): every host slot that is not
        free was given to a backup -- one the engine copied, or one still queued in the
        controller's ``write_queue`` (``flush=False``) -- or, at storage=1, to a prefetch (the
        staging of a live one, or a slot the storage read a page into)."""
        from sglang.srt.mem_cache.hicache_storage import PoolName

        given = {"host_kv": set(), "host_mamba": set()}
        for name, slots in self.cache.engine.written.items():
            given[name] |= slots
        if self.cache.storage is not None:  # storage=1: what prefetches staged or read
            for name, slots in self.cache.storage.fetched.items():
                given[name] |= slots
            for p in self.cache.live_prefetches().values():
                given["host_kv"].update(p["host"])
                given["host_mamba"].update([] if p["mamba"] is None else [p["mamba"]])
        for op in self.cache.controller.write_queue:
            given["host_kv"].update(_ids(op.host_indices))
            for t in op.pool_transfers or ():
                if t.name == PoolName.MAMBA:
                    given["host_mamba"].update(_ids(t.host_indices))
        for pool in (self.host_kv, self.host_mamba):
            free = set(pool.free_pages)
            held = sorted(i for i in given[pool.name] if i not in free)
            check_conservation(pool.view(), {"tree (backups given)": held})

    def _check_black_box_quiescent(self) -> None:
        super()._check_black_box_quiescent()
        check_conservation(self.host_kv.view(), {})
        check_conservation(self.host_mamba.view(), {})

    def drain(self) -> None:
        super().drain()
        if self.white_box:
            return
        c = self.cache
        for _ in range(64):
            if self.host_kv.available_size() == self.host_kv.size and \
                    self.host_mamba.available_size() == self.host_mamba.size:
                break
            if not (c.evict_host(self.host_kv.size) or c.evict_mamba_host(self.host_mamba.size)):
                break
            self.check()

    def outline(self) -> str:
        out = super().outline()
        if not self.white_box:
            out += (f"; host: {self.host_kv.size - self.host_kv.available_size()} KV slots, "
                    f"{self.host_mamba.size - self.host_mamba.available_size()} states held")
        return out


def make_subject(params, fault=None, device=None, core="python", **options):
    if not params.get("host", 0):
        raise ValueError("caches.adapters.sglang.unified_hicache serves host=1 on 0.5.23 "
                         "(host=0 is unified_mamba.py)")
    return UnifiedHiMambaSubject(
        kv_slots=params["kv_slots"], mamba_slots=params["mamba_slots"], device=device,
        fault=fault, core=core, host_kv_slots=params["host_kv_slots"],
        host_mamba_slots=params["host_mamba_slots"], write_policy=POLICIES[params["policy"]],
        storage=bool(params["storage"]), **options)
