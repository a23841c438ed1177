"""``--target sglang`` for the himamba variant (``host=1``): SGLang's real ``HiMambaRadixCache``.

Behind our reference cache's interface (``caches/himamba.py``) sit SGLang 0.5.12.post1's own
objects, each the real class:

* ``hi_mamba_radix_cache.HiMambaRadixCache`` -- the tree with both tiers, its four counters,
  three LRU lists and two cached leaf sets, driven through its public and scheduler-facing
  methods (``match_prefix``, ``insert``, ``inc/dec_lock_ref``, ``evict``, ``evict_mamba``,
  ``evict_host``, ``evict_mamba_host``, ``write_backup``, ``writing_check``,
  ``init_load_back``/``loading_check``, ``prefetch_from_storage``/``check_prefetch_progress``/
  ``release_aborted_request``, ``drain_storage_control_queues``, ``cache_unfinished_req``/
  ``cache_finished_req``);
* ``TokenToKVPoolAllocator`` (device KV slots) and ``HybridReqToTokenPool`` with its
  ``MambaPool`` (request rows and device mamba states) -- as in the ``host=0`` adapter
  (``caches/adapters/sglang/mamba.py``, whose pool wrappers this module reuses);
* ``MHATokenToKVPoolHost`` and ``MambaPoolHost`` (the host tiers' free lists), grouped in a
  real ``HostPoolGroup`` whose MAMBA entry carries the tree's ``evict_mamba_host`` /
  ``evict_mamba`` as eviction callbacks, exactly as ``build_hybrid_mamba_stack`` wires them.

**Construction.**  ``HiMambaRadixCache.__init__`` needs a ``HybridLinearKVPool`` and builds a
``HybridCacheController`` (CUDA streams, storage threads) and registers ``atexit`` hooks, so --
as SGLang's own CPU unit tests do -- the tree is made with ``object.__new__`` and given the
attributes ``__init__`` would set (``_build_tree``: each one named, with the value the real
constructor computes for our configuration), then ``MambaRadixCache.__init__`` runs for real
(it calls the Hi ``reset``).  Three thresholds are set for our few-token sequences (documented
deviations, docs/variants/himamba.md): ``load_back_threshold`` 1 (upstream 10 tokens),
``prefetch_threshold`` 1 (upstream 256), ``prefetch_stop_policy`` ``best_effort``.

**The controller stand-in** (``RecordingController``).  Everything of the real
``HybridCacheController`` that runs on the CPU is the real code, bound into the stand-in:
``write``, ``load``, ``_resolve_pool_transfers_allocation`` (host/device mamba slots with the
pool entry's eviction callback and atomic rollback), ``write_storage``, ``prefetch``,
``terminate_prefetch``, ``append_host_mem_release``, ``prefetch_rate_limited``,
``evict_device``, ``evict_host``.  What needs GPU streams or storage threads is recorded
instead:

* ``start_writing`` / ``start_loading`` merge the queued ``CacheOperation``s (real
  ``merge_ops``), copy our fingerprints (device KV <-> host KV, device mamba state <-> host
  mamba state, for the KV indices and every ``PoolTransfer``) and queue a ``HiCacheAck`` whose
  finish event has not *landed*;
* the write events land when our ``write_ack`` op says so, and the acknowledgement goes
  through the tree's own ``writing_check`` (lock release, storage backup);
* loads land at once: ``init_load_back`` is followed by ``ready_to_load_host_cache`` and the
  tree's ``loading_check`` (the reference model has no in-flight load lock either; the
  admitting request locks the node right after);
* storage: ``storage_ack`` is the backup thread finishing every queued backup (it moves them to
  ``ack_backup_queue``) and the tree's ``drain_storage_control_queues``; ``prefetch_done``
  is the prefetch thread fetching every requested token (hash chain from the last host node,
  mamba state hit) and releasing the unused host slots, then ``check_prefetch_progress`` and
  the drain; ``prefetch_abort`` is ``release_aborted_request`` plus the I/O thread releasing
  what it will no longer fill.

Host slot 0 of each host pool is held back by the adapter (allocated once, never freed), so
host ids are ``1..capacity`` like every harness pool; the host pools are sized
``capacity + 1``, and upstream's rule "host larger than device" is enforced on the capacities.

Node ids are SGLang's ``TreeNode.id`` renumbered to creation order in this tree (root 0), the
reference cache's ids for the same history.

**Known upstream findings** (tests/upstream_findings/README.md).  The subject declines, as a
``KnownUpstreamFinding`` (a no-op, decided before anything in the tree changes), the ops that
would re-find them: F1 (H5, unfixed: ``prefetch_done`` when the host insert would leave an LRU
list out of time order), F2/F3 (an ``insert``/``finish``/chunked ``prefill`` that gives a mamba
state back to a tombstone under a write-through lock; ``write_ack`` when only F2 is declined),
F4 (``prefetch``/``prefetch_done`` that would hang a host-only node below a device node that is
not backed up), F6 (an ``admit``/``insert`` whose allocation only tokens ``evict`` cannot reach
-- an ancestor a tombstone cascade exposes -- could cover).  ``skip_known_findings=False`` (or a list of the ids still to decline) turns
that off.  Without a storage backend (``storage=0``) ``prefetch`` is skipped, as
``prefetch_from_storage`` returns at once upstream.

**write_back** (``policy=2``): the release has it (``HiCacheController`` accepts it), and it is
driven as the scheduler's eviction runs it: ``_evict_device_leaf``'s write_back branch
(``write_backup(x, write_back=True)``, ``writing_check(write_back=True)``, ``_evict_to_host``),
no hit counting.  Two defects of that branch reproduce on 0.5.10.post1 (0.5.12.post1's code is
the same) and are *not* declined -- they are reported: a backup without host room is demoted
anyway and ``_evict_to_host`` asserts "not backuped" (kvcheck fault WB1; 0.5.23's
``drop_subtree_no_host``, SGLang PR #28614, drops or keeps the leaf instead), and
``load_back``'s own eviction writes a leaf back whose host eviction frees the very host copies
being loaded (``len(n.host_value)`` on None; 0.5.23 host-locks the node first).  The host
pools still have to be larger than the device ones here, so the write_back pressure regime is
0.5.23's only.
"""

from __future__ import annotations

import queue
from typing import NamedTuple

import torch

from caches.adapters import KnownUpstreamFinding, declined_findings
from caches.adapters.sglang import loader, versions
from caches.adapters.sglang.mamba import (HISTORICAL_LIFECYCLE_DECLINED, LRUView, MambaTreeAdapter,
                                          Node, RequestRowsChecked, SglangTreeInternals, _ids,
                                          _MambaReq)
from caches.himamba import POLICIES, WRITE_THROUGH
from caches.pools import _DataTensor, resolve_device
from caches.subjects.base import Skip, watch
from caches.subjects.himamba import HiMambaSubject, host_tier, mamba_fp
from invariants import PoolView

# known upstream findings (tests/upstream_findings/), per release: versions.known_findings
_H3 = ("cache_unfinished_req would insert the chunk without its chunked flag, so the chunk "
       "counts as a hit (known upstream finding sglang-0.5.10-himamba-H3, SGLang PR #23696, "
       "tests/upstream_findings/)")
_F4 = ("the fetched tokens would hang a host-only node below a device node that is not backed "
       "up, which then counts as an evictable device leaf and _evict_regular asserts "
       "'non-leaf' (known upstream finding sglang-himamba-F4, tests/upstream_findings/)")

_F5 = ("it would back up a node whose parent is not backed up (this release's write_backup has "
       "no parent guard), leaving a device node that is not backed up above a host copy: "
       "_evict_regular then asserts 'non-leaf' on it (known upstream finding "
       "sglang-0.5.10-himamba-F5, SGLang PR #22062, tests/upstream_findings/)")


_F6 = ("an eviction now could delete a device tombstone by cascade and leave its parent a device "
       "leaf the eviction heap never sees, so the allocation fails with enough evictable "
       "(SGLang hi_mamba_radix_cache.py evict; known upstream finding sglang-himamba-F6, "
       "tests/upstream_findings/sglang-himamba-F6-cascade-hides-ancestor-from-evict.json)")


def _common_len(a, b) -> int:
    """How many leading tokens ``a`` and ``b`` share (``key_match_fn`` at page size 1)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def require_larger_host(kv_slots, mamba_slots, host_kv_slots, host_mamba_slots) -> None:
    """SGLang's host pools refuse to be no larger than the device ones (``HostKVCache`` /
    ``MambaPoolHost``: "The host memory should be larger than the device memory with the
    current protocol"): say so before anything is built."""
    if host_kv_slots <= kv_slots or host_mamba_slots <= mamba_slots:
        raise ValueError(f"SGLang's HiCache needs host pools larger than the device pools "
                         f"(host_kv_slots {host_kv_slots} vs kv_slots {kv_slots}, "
                         f"host_mamba_slots {host_mamba_slots} vs mamba_slots {mamba_slots})")


# -- host pools --------------------------------------------------------------------------------
class SglangHostKVPool(_DataTensor):
    """SGLang's ``MHATokenToKVPoolHost`` as the subject's ``host_kv`` pool: its free list (slot 0
    held back by the adapter) plus a fingerprint tensor keyed by host slot (the pool's own
    buffers are float16 K/V, too narrow for a fingerprint)."""

    unit = "slot"

    def __init__(self, pool, capacity: int, name: str = "host_kv"):
        super().__init__(capacity + 1, torch.device("cpu"))
        self.pool, self.name, self.num_pages, self.page_size = pool, name, capacity, 1

    @property
    def free_pages(self) -> list[int]:
        return self.pool.free_slots.tolist()

    def available_size(self) -> int:
        return int(self.pool.available_size())

    def view(self) -> PoolView:
        return PoolView(name=self.name, unit=self.unit, capacity=self.num_pages,
                        free=tuple(self.free_pages), reserved=(0,))


class SglangHostMambaPool:
    """SGLang's ``MambaPoolHost`` as the subject's ``host_mamba`` pool: free slots, and each host
    state's fingerprint stored in the host state itself (``temporal_buffer[layer 0, slot]``)."""

    unit = "slot"

    def __init__(self, pool, capacity: int, name: str = "host_mamba"):
        self.pool, self.name, self.size = pool, name, capacity

    @property
    def free_slots(self) -> list[int]:
        return self.pool.free_slots.tolist()

    def available_size(self) -> int:
        return int(self.pool.available_size())

    @property
    def data(self) -> torch.Tensor:
        t = self.pool.temporal_buffer
        return t[0].reshape(t.shape[1], -1)[:, 0]

    def write(self, ids, values) -> None:
        ids = list(ids)
        if ids:
            self.data[torch.tensor(ids)] = torch.tensor(list(values), dtype=self.data.dtype)

    def read(self, ids) -> list[int]:
        ids = list(ids)
        return self.data[torch.tensor(ids)].tolist() if ids else []

    def view(self) -> PoolView:
        return PoolView(name=self.name, unit=self.unit, capacity=self.size,
                        free=tuple(self.free_slots), reserved=(0,))


# -- the controller stand-in -------------------------------------------------------------------
class _Landing:
    """A transfer's completion event (``torch.cuda.Event`` stand-in): it has landed once the
    harness says so; a blocking ``synchronize`` waits for it, i.e. lands it."""

    def __init__(self):
        self.landed = False

    def query(self) -> bool:
        return self.landed

    def synchronize(self) -> None:
        self.landed = True

    def record(self, *args) -> None:
        pass


def _recording_controller_class():
    """The stand-in class, built once SGLang is importable (it binds the real methods)."""
    from sglang.srt.managers.cache_controller import HiCacheAck
    from sglang.srt.managers.cache_controller import HiCacheController as Base
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache import hybrid_cache_controller as hcc

    get_hash_str = versions.hicache_hash_str(loader.load().version)

    Hybrid = hcc.HybridCacheController

    class RecordingController:
        """``HybridCacheController`` on the CPU: the real bookkeeping methods, with the GPU
        streams and storage threads replaced by recorded transfers the harness lands."""

        # the real CPU-side code of HybridCacheController / HiCacheController
        _real_write = Hybrid.write
        load = Hybrid.load
        _resolve_pool_transfers_allocation = Hybrid._resolve_pool_transfers_allocation
        write_storage = Hybrid.write_storage
        _real_prefetch = Hybrid.prefetch
        terminate_prefetch = Base.terminate_prefetch
        append_host_mem_release = Base.append_host_mem_release
        prefetch_rate_limited = Base.prefetch_rate_limited
        evict_device = Base.evict_device
        evict_host = Base.evict_host

        def __init__(self, allocator, host_pools, write_policy: str, fp: dict):
            self.mem_pool_device_allocator = allocator
            self.mem_pool_host = host_pools  # a real HostPoolGroup (KV anchor + MAMBA)
            self.write_policy = write_policy
            self.device = allocator.device
            self.page_size = 1
            self.fp = fp  # fingerprint views: kv, mamba, host_kv, host_mamba
            self.write_queue: list = []
            self.load_queue: list = []
            self.ack_write_queue: list = []
            self.ack_load_queue: list = []
            self.prefetch_queue: queue.Queue = queue.Queue()
            self.backup_queue: queue.Queue = queue.Queue()
            self.ack_backup_queue: queue.Queue = queue.Queue()
            self.prefetch_revoke_queue: queue.Queue = queue.Queue()
            self.host_mem_release_queue: queue.Queue = queue.Queue()
            self.prefetch_tokens_occupied = 0
            self.prefetch_capacity_limit = 1 << 30  # no rate limit
            self.fetching: dict = {}  # request id -> PrefetchOperation the I/O thread holds
            self.took_mamba: dict[int, bool] = {}  # upstream node id -> write lock took mamba
            self._loads = 0

        def reset(self) -> None:
            for q in (self.write_queue, self.load_queue, self.ack_write_queue,
                      self.ack_load_queue):
                q.clear()
            for q in (self.prefetch_queue, self.backup_queue, self.ack_backup_queue,
                      self.prefetch_revoke_queue, self.host_mem_release_queue):
                q.queue.clear()
            self.fetching.clear()

        # -- device <-> host transfers: copy the fingerprints, ack when the harness says ---
        def _copy(self, op, to_host: bool) -> None:
            fp = self.fp
            pairs = [("kv", "host_kv", op.device_indices, op.host_indices)]
            for t in op.pool_transfers or []:
                if t.name == PoolName.MAMBA:
                    pairs.append(("mamba", "host_mamba", t.device_indices, t.host_indices))
            for dev_name, host_name, dev, host in pairs:
                dev, host = _ids(dev), _ids(host)
                if not dev:
                    continue
                src, dst = (fp[dev_name], fp[host_name]) if to_host else (fp[host_name],
                                                                            fp[dev_name])
                s, d = (dev, host) if to_host else (host, dev)
                dst.write(d, src.read(s))

        def write(self, device_indices, priority=None, node_id: int = -1, extra_pools=None):
            got = self._real_write(device_indices, priority, node_id, extra_pools)
            if got is not None:  # write_backup locks the node; a mamba lock iff it had a state
                self.took_mamba[node_id] = extra_pools is not None
            return got

        def start_writing(self) -> None:
            if not self.write_queue:
                return
            op = hcc.CacheOperation.merge_ops(self.write_queue)
            self.write_queue.clear()
            self._copy(op, to_host=True)
            self.ack_write_queue.append(HiCacheAck(_Landing(), _Landing(), op.node_ids))

        def start_loading(self) -> int:
            if not self.load_queue:
                return -1
            op = hcc.CacheOperation.merge_ops(self.load_queue)
            self.load_queue.clear()
            self._copy(op, to_host=False)
            self.ack_load_queue.append(HiCacheAck(_Landing(), _Landing(), op.node_ids))
            self._loads += 1
            return self._loads

        def land(self, acks) -> int:
            for ack in acks:
                ack.finish_event.synchronize()
            return len(acks)

        # -- storage (L3): the prefetch and backup threads, run when the harness says -------
        def prefetch(self, request_id, host_indices, new_input_tokens, last_hash=None,
                     prefix_keys=None, extra_pools=None):
            op = self._real_prefetch(request_id, host_indices, new_input_tokens, last_hash,
                                     prefix_keys, extra_pools)
            self.fetching[request_id] = self.prefetch_queue.get_nowait()  # the thread takes it
            return op

        def fetch(self, request_id, n: int, data: list[int], state: int | None) -> None:
            """The prefetch thread got the first ``n`` tokens (``data``: their fingerprints)
            and the mamba state at their end (``state``) from storage; the host slots it will
            not fill go back through the release queue, as ``prefetch_io_aux_func`` does."""
            op = self.fetching.pop(request_id)
            host = _ids(op.host_indices)
            h, hashes = op.last_hash, []
            for t in op.token_ids[:n]:
                h = get_hash_str([t], h)
                hashes.append(h)
            self.fp["host_kv"].write(host[:n], data[:n])
            op.hash_value = hashes
            for t in op.pool_transfers or []:
                if t.name == PoolName.MAMBA and n > 0 and state is not None:
                    self.fp["host_mamba"].write(_ids(t.host_indices), [state])
                    op.pool_storage_result.update_extra_pool_hit_pages({t.name: [True]})
            op.increment(n)
            self.append_host_mem_release(op.host_indices[n:])

        def abandon(self, request_id) -> None:
            """The prefetch thread sees a terminated operation: it releases what it did not
            fill (``prefetch_io_aux_func``)."""
            op = self.fetching.pop(request_id, None)
            if op is not None:
                self.append_host_mem_release(op.host_indices[op.completed_tokens:])

        def finish_backups(self) -> int:
            """The backup thread stores every queued backup and acknowledges it."""
            n = 0
            while True:
                try:
                    op = self.backup_queue.get_nowait()
                except queue.Empty:
                    return n
                op.completed_tokens = len(op.host_indices)
                self.ack_backup_queue.put(op)
                n += 1

    return RecordingController


_CONTROLLER = None


def recording_controller_class():
    global _CONTROLLER
    if _CONTROLLER is None:
        _CONTROLLER = _recording_controller_class()
    return _CONTROLLER


class MatchResult(NamedTuple):
    device_indices: list
    last_device_node: Node
    last_host_node: Node
    best_node: Node  # the deepest matched node holding a mamba state (device or host)
    host_hit_length: int


# -- the adapter -------------------------------------------------------------------------------
class SglangHiMambaCache(MambaTreeAdapter):
    """SGLang's ``HiMambaRadixCache`` with its real pools, behind the reference cache's interface."""

    def __init__(self, kv_slots: int, mamba_slots: int, host_kv_slots: int,
                 host_mamba_slots: int, write_policy: str, storage: bool, device, *,
                 cache_cls=None, max_running: int = 2):
        require_larger_host(kv_slots, mamba_slots, host_kv_slots, host_mamba_slots)
        loader.require()  # the stand-ins, before any sglang import
        from sglang.srt.mem_cache import hi_mamba_radix_cache as hmc
        from sglang.srt.mem_cache.hicache_storage import PoolName
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.memory_pool_host import (
            HostPoolGroup,
            MambaPoolHost,
            MHATokenToKVPoolHost,
        )

        self.hmc = hmc
        self.write_policy, self.enable_storage = write_policy, storage
        self._build_device_tier(kv_slots, mamba_slots, max_running, device)
        mamba_pool = self.req_to_token_pool.mamba_pool
        # host tier: the real host pools, sized capacity + 1 (slot 0 held back below); the
        # device KV layout is only read for its shape
        kv_layout = MHATokenToKVPool(size=kv_slots, page_size=1, dtype=torch.float16,
                                     head_num=1, head_dim=1, layer_num=1, device=str(device),
                                     enable_memory_saver=False)
        kv_host = MHATokenToKVPoolHost(kv_layout, (host_kv_slots + 0.5) / kv_slots, 0, 1,
                                       "layer_first", pin_memory=False, device="cpu")
        mamba_host = MambaPoolHost(mamba_pool, (host_mamba_slots + 0.5) / mamba_slots, 0,
                                   pin_memory=False, device="cpu", layout="layer_first")
        assert kv_host.size == host_kv_slots + 1 and mamba_host.size == host_mamba_slots + 1
        self.host_kv = SglangHostKVPool(kv_host, host_kv_slots)
        self.host_mamba = SglangHostMambaPool(mamba_host, host_mamba_slots)

        tree = object.__new__(cache_cls or hmc.HiMambaRadixCache)
        self.tree = tree
        version = loader.load().version
        group = HostPoolGroup([
            versions.hicache_pool_entry(version, name=PoolName.KV, host_pool=kv_host,
                                        device_pool=kv_layout, layer=0, transfer_layer_num=2,
                                        is_anchor=True),
            versions.hicache_pool_entry(version, name=PoolName.MAMBA, host_pool=mamba_host,
                                        device_pool=mamba_pool, layer=1, transfer_layer_num=2,
                                        host_evict_fn=tree.evict_mamba_host,
                                        device_evict_fn=tree.evict_mamba)])
        self.controller = recording_controller_class()(
            self.allocator, group, write_policy,
            {"kv": self.kv, "mamba": self.mamba, "host_kv": self.host_kv,
             "host_mamba": self.host_mamba})
        self._build_tree(tree, group, kv_host, mamba_host, storage)
        for pool in (kv_host, mamba_host):  # hold back slot 0: harness ids are 1..capacity
            got = pool.alloc(1)
            assert got is not None and int(got[0]) == 0
        self._first_id = hmc.TreeNode.counter  # the next node created gets id 1
        self._nodes: dict[int, Node] = {}
        self._reqs: dict[int, _MambaReq] = {}
        self._best = None
        self._host_freed = 0
        self._watch_internals()
        self.full_lru = LRUView("full_lru_list", tree.full_lru_list, self)
        self.mamba_lru = LRUView("mamba_lru_list", tree.mamba_lru_list, self)
        self.host_mamba_lru = LRUView("mamba_host_lru_list", tree.mamba_host_lru_list, self)

    def _build_tree(self, tree, group, kv_host, mamba_host, storage: bool) -> None:
        """``HiMambaRadixCache.__init__`` (H:96-183) without the GPU pool attach: the attributes
        it sets, then the real ``MambaRadixCache.__init__`` (which runs the Hi ``reset``)."""
        from sglang.srt.mem_cache.mamba_radix_cache import MambaRadixCache

        sg = self.sg
        tree._enable_metrics_flag = False
        tree.page_size = 1
        tree.tp_group, tree.tp_world_size = None, 1
        tree.enable_storage = storage  # upstream: hicache_storage_backend is not None
        tree.enable_storage_metrics, tree.extra_metric_labels = False, None
        tree.storage_metrics_collector = None
        tree.prefetch_threshold = 1  # upstream default 256 tokens; our sequences are short
        versions.hicache_prefetch_timeout(self.sg.version, tree, page_size=1)
        tree.hicache_storage_pass_prefix_keys = False
        tree.is_prefetch_timeout = tree._prefetch_timeout_check_linear_func
        tree.prefetch_stop_policy = "best_effort"
        tree.load_cache_event = None
        # attach_hybrid_pool_to_mamba_cache: host pools, group, controller
        tree.full_kv_pool_host, tree.mamba_pool_host = kv_host, mamba_host
        tree.transfer_layer_num = 2
        tree.host_pool_group = group
        tree.cache_controller = self.controller
        tree.ongoing_write_through, tree.ongoing_load_back = {}, {}
        tree.ongoing_prefetch, tree.ongoing_backup = {}, {}
        tree.prefetch_loaded_tokens_by_reqid = {}
        tree.write_through_threshold = 1 if self.write_policy == WRITE_THROUGH else 2
        tree.load_back_threshold = 1  # upstream 10 tokens; our sequences are a few tokens
        tree.evictable_full_device_leaves, tree.evictable_full_host_leaves = set(), set()
        tree.mamba_host_lru_list = self.hmc.HostLRUList()
        MambaRadixCache.__init__(tree, sg.CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator, page_size=1))

    def _watch_internals(self) -> None:
        """Instance hooks that only *read*: the best node of a match (``_match_post_processor``'s
        argument; upstream's result names the last host node ``best_match_node``), and the
        tokens each ``_evict_host_leaf`` reports (``evict_host`` computes but returns nothing)."""
        tree, adapter = self.tree, self
        post, host_leaf = tree._match_post_processor, tree._evict_host_leaf

        def match_post_processor(params, value, best_last_node, best_value_len):
            adapter._best = best_last_node
            return post(params, value, best_last_node, best_value_len)

        def evict_host_leaf(node):
            freed = host_leaf(node)
            adapter._host_freed += freed
            return freed

        tree._match_post_processor, tree._evict_host_leaf = match_post_processor, evict_host_leaf

    # -- nodes ----------------------------------------------------------------------------
    def path_tokens(self, node: Node) -> list[int]:
        out, raw = [], node.raw
        while raw is not None and raw is not self.tree.root_node:
            out = list(raw.key.token_ids[:len(raw.key)]) + out
            raw = raw.parent
        return out

    @property
    def evictable_full_device_leaves(self) -> set:
        return {self.node(n) for n in self.tree.evictable_full_device_leaves}

    @property
    def evictable_full_host_leaves(self) -> set:
        return {self.node(n) for n in self.tree.evictable_full_host_leaves}

    @property
    def ongoing_write_through(self) -> dict:
        return {self.node_id(n): self.node(n) for n in self.tree.ongoing_write_through.values()}

    @property
    def write_lock_took_mamba(self) -> dict:
        took = self.controller.took_mamba
        return {self.node_id(n): took.get(n.id, n.mamba_value is not None)
                for n in self.tree.ongoing_write_through.values()}

    @property
    def ongoing_backup(self) -> dict:
        return {op: (self.node(n), pm) for op, (n, pm) in self.tree.ongoing_backup.items()}

    # -- tree API -------------------------------------------------------------------------
    def match_prefix(self, tokens) -> MatchResult:
        if not tokens:  # upstream returns the root before walking
            root = self.root_node
            return MatchResult([], root, root, root, 0)
        self._best = None
        r = self.tree.match_prefix(self.sg.MatchPrefixParams(key=self._key(tokens)))
        return MatchResult(_ids(r.device_indices), self.node(r.last_device_node),
                           self.node(r.last_host_node), self.node(self._best),
                           int(r.host_hit_length))

    def evict_mamba(self, mamba_num: int) -> int:
        return self.tree.evict_mamba(mamba_num)

    def evict_host(self, num_tokens: int) -> int:
        self._host_freed = 0
        self.tree.evict_host(num_tokens)
        return self._host_freed

    def evict_mamba_host(self, num: int) -> int:
        return self.tree.evict_mamba_host(num)

    # -- host tier ------------------------------------------------------------------------
    def write_backup(self, node: Node) -> int:
        return self.tree.write_backup(node.raw)

    def writing_check(self) -> int:
        """Every write-through in flight lands; the tree's ``writing_check`` acknowledges."""
        before = len(self.tree.ongoing_write_through)
        self.controller.land(self.controller.ack_write_queue)
        self.tree.writing_check()
        return before - len(self.tree.ongoing_write_through)

    def drain_backup(self) -> int:
        """Storage acknowledges every backup in flight (``_drain_backup`` releases them)."""
        self.controller.finish_backups()
        before = len(self.tree.ongoing_backup)
        self.tree.drain_storage_control_queues()
        return before - len(self.tree.ongoing_backup)

    def init_load_back(self, node: Node):
        """``init_load_back`` as the scheduler calls it (no memory quota, no request), then the
        load lands and ``loading_check`` acknowledges it."""
        loaded, last = self.tree.init_load_back(self.sg_init_load_back_params(node))
        if self.controller.load_queue:
            self.tree.ready_to_load_host_cache()
        self.controller.land(self.controller.ack_load_queue)
        self.tree.loading_check()
        return _ids(loaded), self.node(last)

    def sg_init_load_back_params(self, node: Node):
        return versions.init_load_back_params(self.sg.version, node.raw, 1)

    # -- storage prefetch -------------------------------------------------------------------
    def prefetch(self, rid: str, node: Node, tokens: list[int]) -> bool:
        """``prefetch_from_storage`` below ``node``; True if it started."""
        self.tree.prefetch_from_storage(rid, node.raw, list(tokens),
                                        node.raw.get_last_hash_value())
        return rid in self.tree.ongoing_prefetch

    def prefetch_slots(self, rid: str) -> tuple[list[int], int]:
        """(host KV slots, host mamba slot) a live prefetch holds."""
        _, _, host, op = self.tree.ongoing_prefetch[rid]
        mamba = next(iter(op.pool_transfers))
        return _ids(host), int(mamba.host_indices[0])

    def prefetch_complete(self, rid: str, n: int, data: list[int], state) -> int:
        """Storage delivers ``n`` tokens; returns how many were new to the tree (upstream's
        own ``prefetch_loaded_tokens_by_reqid``)."""
        self.controller.fetch(rid, n, data, state)
        self.tree.check_prefetch_progress(rid)
        self.tree.drain_storage_control_queues()
        return self.tree.pop_prefetch_loaded_tokens(rid)

    def prefetch_release(self, rid: str) -> None:
        self.tree.release_aborted_request(rid)
        self.controller.abandon(rid)
        self.tree.drain_storage_control_queues()


# -- the subject -------------------------------------------------------------------------------
class SglangHiMambaSubject(SglangTreeInternals, RequestRowsChecked, HiMambaSubject):
    """The himamba machine's subject (host=1) over SGLang's real ``HiMambaRadixCache``."""

    # the release's own seam: ``_evict_device_leaf`` (its write_back branch included)
    victim_hooks = {**HiMambaSubject.victim_hooks, "device": "_evict_device_leaf"}

    lifecycle_declined = HISTORICAL_LIFECYCLE_DECLINED

    variant = "himamba"
    target = "sglang"

    def __init__(self, *, kv_slots: int = 12, mamba_slots: int = 8, host_kv_slots: int = 16,
                 host_mamba_slots: int = 10, write_policy: str = WRITE_THROUGH,
                 storage: bool = True, device=None, fault: str | None = None,
                 max_running: int = 2, skip_known_findings=None):
        cache_cls = None
        if fault is not None:
            from caches.adapters.sglang.himamba_faults import upstream_fault

            cache_cls = upstream_fault(fault)
        # True: decline the ops that would re-find any known finding of the installed release
        # (versions.known_findings); False: none; or the ids of the findings to decline
        # (tests/upstream_findings/); None: decline all (the target passes --known-findings:
        # decline -> True, find -> False)
        self.declined = set(declined_findings(
            skip_known_findings, versions.known_findings(loader.require().version, "himamba")))
        self.storage = storage

        cache = SglangHiMambaCache(kv_slots, mamba_slots, host_kv_slots, host_mamba_slots,
                                   write_policy, storage, resolve_device(device),
                                   cache_cls=cache_cls, max_running=max_running)
        super().__init__(kv_slots=kv_slots, mamba_slots=mamba_slots,
                         host_kv_slots=host_kv_slots, host_mamba_slots=host_mamba_slots,
                         write_policy=write_policy, storage=storage, max_running=max_running,
                         device=device, host=True, cache=cache)  # over SGLang's own pools
        self._watch_upstream()

    # -- ops that would give a mamba state back to a write-locked tombstone -------------------
    def _revives_written_tombstone(self, tokens, chunked: bool = False) -> bool:
        """Would inserting ``tokens`` give a mamba state back to a tombstone that is under a
        write-through lock -- one in flight already, or the one this very insert starts
        (``_insert_helper`` counts the hit, and ``write_backup`` runs, *before* it sets the
        node's ``mamba_value``)?  ``write_backup`` locked the tombstone without a mamba lock;
        with a state back, the ack's ``dec_lock_ref`` drops a request's mamba lock (F2) and
        ``evict_mamba`` asserts on the node once it is a leaf (F3)."""
        c = self.cache
        node, key = c.root_node, list(tokens)
        while key:
            child = node.children.get(key[0])
            if child is None:
                return False
            ck = child.key
            if len(key) < len(ck) or list(ck) != key[:len(ck)]:
                return False  # ends inside a node (a split: a fresh tombstone) or branches off
            node, key = child, key[len(ck):]
        if node is c.root_node or node.mamba_value is not None or node.evicted:
            return False
        if node.id in c.ongoing_write_through:
            return True
        parent_backed = node.parent is c.root_node or node.parent.backuped
        return (not chunked and not node.backuped and parent_backed
                and node.hit_count + 1 >= c.tree.write_through_threshold)

    def _decline_revival(self, tokens, chunked: bool = False) -> None:
        # (not while quiescing: the drain has released every holder, so no lock can be dropped,
        # and it evicts with mamba_num=0)
        if {"F2", "F3"} <= self.declined and not self.quiescing and \
                self._revives_written_tombstone(tokens, chunked):
            raise KnownUpstreamFinding(
                "it would give a mamba state back to a tombstone under a write-through lock "
                "(taken without a mamba lock): known upstream findings sglang-himamba-F2 (the "
                "ack drops a request's mamba lock) and sglang-himamba-F3 (evict_mamba asserts "
                "on the write-locked leaf), tests/upstream_findings/")

    @host_tier
    def write_ack(self) -> str:
        # F2 on its own (when the revival is allowed, e.g. to look for F3): the ack's
        # dec_lock_ref would take a mamba lock the write never took
        took = self.cache.write_lock_took_mamba
        if "F2" in self.declined and any(
                not took[nid] and n.mamba_value is not None and n.mamba_lock_ref > 0
                for nid, n in self.cache.ongoing_write_through.items()):
            raise KnownUpstreamFinding(
                "the ack's dec_lock_ref would drop a mamba lock the write-through never took "
                "(known upstream finding sglang-himamba-F2, tests/upstream_findings/)")
        return super().write_ack()

    # -- H1 (0.5.10.post1): the tombstone cascade deletes host-protected nodes -----------------
    def _host_protected_tombstones(self) -> list:
        """Nodes the release's ``_iteratively_delete_tombstone_leaf`` may delete although a live
        prefetch/backup protects them: tombstones (no device or host mamba state) without lock
        refs, with a host ref (the cascade checks only the lock refs and mamba values)."""
        root = self.cache.root_node
        return [n for n in self._walk()
                if n is not root and n.mamba_value is None and n.raw.mamba_host_value is None
                and n.full_lock_ref == 0 and n.mamba_lock_ref == 0
                and (n.host_ref_counter > 0 or n.host_mamba_ref_counter > 0)]

    def _decline_cascade(self) -> None:
        """Decline an op that may evict (a device or host leaf, whose tombstone cascade then
        walks up) while a host-protected tombstone is in the tree (decided before anything
        changes; not while quiescing: the drain releases every host ref first)."""
        if "H1" in self.declined and not self.quiescing and self._host_protected_tombstones():
            raise KnownUpstreamFinding(
                "an eviction now could run the tombstone cascade into a node a live "
                "prefetch/backup protects (it checks lock refs, not host refs): known upstream "
                "finding sglang-0.5.10-himamba-H1 (SGLang PR #23696), tests/upstream_findings/")

    # -- F5 (0.5.10.post1): a write-through backs up a node below a parent not backed up ---------
    def _backs_up_below_unbacked(self, tokens, chunked: bool = False) -> bool:
        """Would inserting ``tokens`` (``_insert_helper``: a hit on every device node it walks,
        a split's upper half starting at 0, then the new leaf) start a ``write_backup`` of a node
        whose parent (not the root) is not backed up?  The release's ``write_backup`` has no
        parent guard, so the backed-up nodes stop being a prefix of the tree; once the child is
        demoted to host its parent is an evictable device leaf that ``_evict_regular`` asserts
        on ("non-leaf").  A parent this very insert backs up counts as backed up only while the
        host KV pool has room for it (a refused write leaves it unbacked, PR #22062's case)."""
        c = self.cache
        tree = c.tree
        if tree.cache_controller.write_policy == "write_back" or (
                chunked and "H3" not in versions.known_findings(loader.require().version,
                                                                "himamba")):
            return False  # no hits counted (this release's chunks count them: H3)
        threshold, room = tree.write_through_threshold, self.host_kv.available_size()
        node, key, parent_backed = c.root_node, list(tokens), True
        while key and key[0] in node.children:
            child = node.children[key[0]]
            ck = list(child.key)
            p = _common_len(ck, key)
            split = p < len(ck)
            if child.evicted or child.backuped:
                parent_backed = True
            elif (0 if split else child.hit_count) + 1 >= threshold:  # write_backup(child)
                if not parent_backed:
                    return True
                parent_backed = room >= p
                room -= p if parent_backed else 0
            else:
                parent_backed = False
            node, key = child, key[p:]
            if split:
                break
        return bool(key) and threshold <= 1 and not parent_backed  # the new leaf's first hit

    def _decline_unbacked_parent(self, tokens, chunked: bool = False) -> None:
        if "F5" in self.declined and self._backs_up_below_unbacked(tokens, chunked):
            raise KnownUpstreamFinding(_F5)

    # -- F6: a tombstone cascade exposes an ancestor the device eviction heap never sees -------
    def _hidden_from_evict(self, locked=(), tombstone_parents=(), mamba_may_go=False) -> int:
        """Device KV tokens one ``evict`` call cannot reach although they count as evictable:
        ``evict`` pushes only ``x.parent`` after evicting leaf ``x``, but
        ``_iteratively_delete_tombstone_leaf`` may delete that parent (a device tombstone: no
        device or host mamba state, no lock, no host ref) and further ones, leaving the first
        node it stops at -- a device node, not the root, unlocked -- an evictable leaf that is
        never pushed; it and every unlocked ancestor stay for the rest of the call.  Such a
        node is one with a child that is a device tombstone with children.  ``locked``: raw
        nodes the op locks first; ``tombstone_parents``: parents of a tombstone the op's match
        creates by a split; ``mamba_may_go``: an ``evict_mamba`` may run first and tombstone
        any unlocked internal node holding a device mamba state."""
        root = self.cache.tree.root_node
        locked = {id(n) for n in locked}

        def unlocked_device(n) -> bool:
            return n is not root and n.value is not None and n.full_lock_ref == 0 \
                and id(n) not in locked

        def may_be_tombstone(t) -> bool:
            if not unlocked_device(t) or not t.children or t.mamba_host_value is not None \
                    or t.mamba_lock_ref or t.host_ref_counter or t.host_mamba_ref_counter:
                return False
            return t.mamba_value is None or mamba_may_go

        exposed = [p for p in tombstone_parents if unlocked_device(p)]
        stack = [root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n is not root and may_be_tombstone(n) and unlocked_device(n.parent):
                exposed.append(n.parent)
        hidden: dict = {}
        for p in exposed:
            while unlocked_device(p) and id(p) not in hidden:
                hidden[id(p)] = len(p.value)
                p = p.parent
        return sum(hidden.values())

    def _decline_hidden_ancestor(self, need: int, **plan) -> None:
        """Decline an allocation of ``need`` device slots that the eviction could cover only
        by reaching hidden tokens (``_hidden_from_evict``): free + evictable covers it, free +
        what the heap reaches does not (decided before the op changes anything)."""
        if "F6" not in self.declined or self.quiescing:
            return
        free, evictable = self.kv.available_size(), self.cache.tree.full_evictable_size()
        locked = plan.get("locked", ())
        evictable -= sum(len(n.value) for n in locked
                         if n.value is not None and n.full_lock_ref == 0)
        if need > free + evictable or need <= free:
            return  # a real out-of-memory, or no eviction at all
        hidden = self._hidden_from_evict(**plan)
        if hidden and need > free + evictable - hidden:
            raise KnownUpstreamFinding(_F6)

    def _admit_plan(self, tokens) -> tuple:
        """(raw nodes an admission of ``tokens`` locks at least, the split parent, the KV it
        allocates at most) read off the tree: ``_match_and_load`` matches ``tokens[:-1]``
        and locks the deepest node with a device mamba state on the all-device path (a load
        back only locks deeper), a match ending inside a device node splits it into a
        tombstone (no mamba state) above the rest."""
        c = self.cache.tree
        node, key, path, depth, best = c.root_node, list(tokens[:-1]), [], 0, (0, 0)
        split_parent = ()
        while key and key[0] in node.children:
            child = node.children[key[0]]
            if child.value is None:
                break
            ck = child.key.token_ids[:len(child.key)]
            p = _common_len(ck, key)
            if p < len(ck):
                split_parent = (node,)
                break
            node, key = child, key[p:]
            path.append(node)
            depth += p
            if node.mamba_value is not None:
                best = (len(path), depth)
        return path[:best[0]], split_parent, len(tokens) - best[1]

    def admit(self, rid: int, tokens: list[int]) -> str:
        self._decline_cascade()
        if "F6" in self.declined and rid not in self.requests and rid not in self.waiting \
                and len(self.requests) < self.max_running:
            locked, split_parent, need = self._admit_plan(tokens)
            self._decline_hidden_ancestor(need, locked=locked, tombstone_parents=split_parent,
                                          mamba_may_go=self.mamba.available_size() == 0)
        return super().admit(rid, tokens)

    def lock(self, hid: int, tokens: list[int]) -> str:
        self._decline_cascade()  # its load back may evict (H1's cascade), as an admission's
        return super().lock(hid, tokens)

    def evict(self, n: int) -> str:
        self._decline_cascade()
        self._decline_hidden_evict(n)
        return super().evict(n)

    def _decline_hidden_evict(self, n: int) -> None:
        """Decline a bare ``evict(n)`` that only hidden tokens (``_hidden_from_evict``) could
        complete: upstream's heap frees fewer than asked while evictable tokens remain -- F6,
        the shortfall the reference (whose walk reaches the exposed ancestor) does not have."""
        if "F6" not in self.declined or self.quiescing:
            return
        evictable = self.cache.tree.full_evictable_size()
        hidden = self._hidden_from_evict()
        if hidden and min(n, evictable) > evictable - hidden:
            raise KnownUpstreamFinding(_F6)

    def evict_mamba(self, n: int) -> str:
        self._decline_cascade()
        return super().evict_mamba(n)

    def evict_host(self, n: int) -> str:
        self._decline_cascade()
        return super().evict_host(n)

    def evict_mamba_host(self, n: int) -> str:
        self._decline_cascade()
        return super().evict_mamba_host(n)

    def backup(self, tokens: list[int]) -> str:
        self._decline_cascade()
        if "F5" in self.declined:
            c = self.cache
            node, parent, key = c.root_node, None, list(tokens)  # the node backup() targets
            while key and key[0] in node.children and not node.children[key[0]].evicted:
                child, ck = node.children[key[0]], list(node.children[key[0]].key)
                p = _common_len(ck, key)
                node, parent, key = child, node, key[p:]
                if p < len(ck):
                    break  # the match splits it: the upper half (same parent) is the target
            if node is not c.root_node and not node.backuped and \
                    parent is not c.root_node and not parent.backuped:
                raise KnownUpstreamFinding(_F5)
        return super().backup(tokens)

    def insert(self, tokens: list[int]) -> str:
        self._decline_cascade()
        self._decline_revival(tokens)
        self._decline_unbacked_parent(tokens)
        self._decline_hidden_ancestor(len(tokens))  # the slots are allocated before the insert
        return super().insert(tokens)

    def prefill(self, rid: int, n: int) -> str:
        self._decline_cascade()
        req = self.requests.get(rid)
        if req is not None and req.filled + n < len(req.tokens):  # cache_unfinished_req
            if "H3" in self.declined:  # 0.5.10.post1: every chunk's insert counts a hit
                raise KnownUpstreamFinding(_H3)
            self._decline_revival(req.tokens[:req.filled + n], chunked=True)
            self._decline_unbacked_parent(req.tokens[:req.filled + n], chunked=True)
        return super().prefill(rid, n)

    def finish(self, rid: int) -> str:
        self._decline_cascade()
        req = self.requests.get(rid)
        if req is not None and req.filled == len(req.tokens):
            self._decline_revival(req.tokens)
            self._decline_unbacked_parent(req.tokens)
        return super().finish(rid)

    # -- storage prefetch through the tree's own paths ----------------------------------------
    @host_tier
    def prefetch(self, hid: int, tokens: list[int]) -> str:
        """The scheduler's ``_prefetch_kvcache``: ``prefetch_from_storage(last host node of the
        match, the tokens beyond the device + host hit)``."""
        if hid in self.prefetches:
            raise Skip(f"prefetch p{hid} is live")
        if len(self.prefetches) >= 2:
            raise Skip("two prefetches already live")
        if not self.storage:
            raise Skip("no storage backend (prefetch_from_storage returns at once)")
        c = self.cache
        if "F4" in self.declined:  # decided before the match splits anything: a no-op
            node, tail = self._prefetch_plan(tokens)
            if tail and not self._host_insert_stays_backed(node, tail):
                raise KnownUpstreamFinding(_F4)
        m = c.match_prefix(tokens)
        node = m.last_host_node
        tail = tokens[len(m.device_indices) + m.host_hit_length:]
        if not tail:
            raise Skip("nothing beyond the host hit to prefetch")
        if not c.prefetch(str(hid), node, tail):
            short = "host KV" if self.host_kv.available_size() < len(tail) else "host mamba"
            return f"prefetch refused: {short} full"
        host, mslot = c.prefetch_slots(str(hid))
        self.prefetches[hid] = {"node": node, "seq": c.path_tokens(node) + tail, "tail": tail,
                                "host": host, "mamba": mslot}
        return f"prefetching {len(tail)} tokens below #{node.id}"

    def _prefetch_plan(self, tokens) -> tuple:
        """(last host node, tokens to prefetch) that ``match_prefix(tokens)`` would give, read
        off the tree without splitting it (upstream's ``_match_prefix_helper`` +
        ``_match_post_processor`` rules: the best node is the deepest with a device or host
        mamba state; a split's upper half never has one)."""
        c = self.cache
        node, key, dev, best, best_dev = c.root_node, list(tokens), 0, c.root_node, 0
        while key and key[0] in node.children:
            child = node.children[key[0]]
            if child.evicted and not child.backuped:
                break
            if node.mamba_value is not None or node.mamba_backuped:
                best, best_dev = node, dev
            ck = list(child.key)
            p = _common_len(ck, key)
            if p < len(ck):
                node = None  # the split's upper half: no mamba state, never the best
                break
            dev += 0 if child.evicted else len(ck)
            node, key = child, key[p:]
        if node is not None and (node.mamba_value is not None or node.mamba_backuped):
            best, best_dev = node, dev
        host_hit, n = 0, best
        while n is not c.root_node and n.evicted:
            host_hit += len(n.host_value)
            n = n.parent
        last_host = best
        while last_host is not c.root_node and not last_host.backuped:
            last_host = last_host.parent
        if last_host.mamba_value is None and last_host.mamba_backuped:
            host_hit = max(host_hit, 1)
        return last_host, list(tokens[best_dev + host_hit:])

    @host_tier
    def prefetch_done(self, hid: int) -> str:
        if hid not in self.prefetches:
            raise Skip(f"prefetch p{hid} is not live")
        p = self.prefetches[hid]
        if "F4" in self.declined and not self._host_insert_stays_backed(p["node"], p["tail"]):
            raise KnownUpstreamFinding(_F4)  # the tree changed since the prefetch began
        if "F1" in self.declined and self._host_insert_breaks_lru_order(p["node"], p["tail"]):
            raise KnownUpstreamFinding(
                "completing it runs _insert_helper_host, which stamps new access times on the "
                "nodes it passes without moving them in the full LRU list (nor the start node in "
                "the mamba list), so the lists leave access-time order (catalogue fault H5, "
                "unfixed in the pinned release: known upstream finding sglang-himamba-F1, "
                "tests/upstream_findings/)")
        del self.prefetches[hid]
        seq, tail = p["seq"], p["tail"]
        c = self.cache
        new = c.prefetch_complete(str(hid), len(tail),
                                  self.expected_data(seq)[len(seq) - len(tail):], mamba_fp(seq))
        matched = len(tail) - new
        if new > 0:
            self.reached("prefetch-inserted")
        return f"prefetched: {matched} tokens were already there, {new} new on host"

    def _host_insert_breaks_lru_order(self, node, tail) -> bool:
        """Would ``_insert_helper_host(node, tail)`` leave the full or mamba LRU list out of
        access-time order?  It stamps a new time on the start node and on every node its walk
        passes (and a split stamps the split halves), but moves only the walked nodes that
        hold a device mamba state to the front of the mamba list -- never anything in the full
        list, nor the start node in the mamba list (H5).  Simulated on the lists' order and
        the nodes' times, without touching the tree."""
        c = self.cache
        full = [n.id for n in c.full_lru.mru_first()]
        mamba = [n.id for n in c.mamba_lru.mru_first()]
        times = {n.id: n.last_access_time for n in self._walk()}
        clock = [max(times.values()) + 1]

        def stamp(i):
            times[i] = clock[0]
            clock[0] += 1

        def to_front(lst, i):
            lst.remove(i)
            lst.insert(0, i)

        if node is not c.root_node:
            stamp(node.id)
        key = list(tail)
        while key and key[0] in node.children:
            child = node.children[key[0]]
            stamp(child.id)
            if child.mamba_value is not None:
                to_front(mamba, child.id)
            ck, p = list(child.key), 0
            while p < min(len(ck), len(key)) and ck[p] == key[p]:
                p += 1
            key = key[p:]
            if p < len(ck):  # split: the upper half is created (stamped), then the child
                upper = ("split", child.id)
                stamp(upper)
                stamp(child.id)
                if not child.evicted:
                    full.remove(child.id)
                    full[:0] = [child.id, upper]
                    if child.mamba_value is not None:
                        to_front(mamba, child.id)
                break  # the rest (if any) becomes a new host-only leaf below the upper half
            node = child

        def in_order(lst):
            return all(times[x] > times[y] for x, y in zip(lst, lst[1:]))

        return not (in_order(full) and in_order(mamba))

    @host_tier
    def prefetch_abort(self, hid: int) -> str:
        if hid not in self.prefetches:
            raise Skip(f"prefetch p{hid} is not live")
        self.prefetches.pop(hid)
        self.cache.prefetch_release(str(hid))
        self.reached("prefetch-aborted")
        return "prefetch released"

    # -- coverage: the transitions the reference subject watches, on the real tree -----------
    def _watch_upstream(self) -> None:
        tree, subject = self.cache.tree, self
        state = {"host_evicting": 0}

        def wrap(name, before=None, after=None):
            assert watch(tree, name, before, after), f"HiMambaRadixCache has no {name}"

        def split(key, child, split_len):
            subject.reached("node-split")
            if child.value is None:
                subject.reached("inner-host-node")

        def to_host(node):
            if node.children:
                subject.reached("inner-host-node")
            subject.reached("evict-to-host")

        def host_in(node):
            state["host_evicting"] += 1
            subject.reached("host-eviction")

        def host_out(out, note, node):
            state["host_evicting"] -= 1

        def tombstone_deleted(node):
            subject.reached("host-eviction-cascade" if state["host_evicting"]
                            else "tombstone-cascade")

        def cascade_ended(out, note, node):
            last = out[0]
            p = last.parent
            if p is None or p.children or p is tree.root_node or p.mamba_value is not None \
                    or p.mamba_host_value is not None:
                return
            if p.full_lock_ref > 0 or p.mamba_lock_ref > 0:
                subject.reached("cascade-stopped-by-lock")
            if p.host_ref_counter > 0 or p.host_mamba_ref_counter > 0:
                subject.reached("cascade-stopped-by-host-ref")

        def load_note(node, *args):
            return (node.value is None, node.mamba_value is None
                    and node.mamba_host_value is not None)

        def loaded(out, note, node, *args):
            if out is not None:
                if note[0]:
                    subject.reached("load-back")
                if note[1]:
                    subject.reached("host-mamba-restored")

        wrap("_split_node", before=split)
        wrap("_tombstone_internal_node", before=lambda n: subject.reached("tombstone-created"))
        wrap("_evict_to_host", before=to_host)
        wrap("_evict_host_leaf", before=host_in, after=host_out)
        wrap("_delete_tombstone_leaf", before=tombstone_deleted)
        wrap("_iteratively_delete_tombstone_leaf", after=cascade_ended)
        wrap("load_back", before=load_note, after=loaded)
        wrap("write_backup", after=lambda out, note, *a: out and subject.reached("host-backup"))
        wrap("write_backup_storage", before=lambda n: subject.reached("storage-backup"))
        # write_back (policy=2): ``_evict_device_leaf`` calls ``write_backup(x, write_back=True)``
        # (the release checks no result: a failed one goes on to ``_evict_to_host``, which
        # asserts "not backuped" -- kvcheck fault WB1, docs/variants/himamba.md)
        tree, write = self.cache.tree, self.cache.tree.write_backup

        def write_backup(node, write_back=False):
            out = write(node, write_back=write_back)
            if write_back:
                subject.reached("write-back" if out else "write-back-failed")
            return out
        tree.write_backup = write_backup


def make_subject(params, fault=None, device=None, **options) -> SglangHiMambaSubject:
    """The factory ``state_machines/himamba.py`` uses for target ``sglang`` at host=1."""
    if not params.get("host", 1):
        raise ValueError("caches.adapters.sglang.himamba serves host=1 (HiMambaRadixCache); "
                         "host=0 is caches.adapters.sglang.mamba")
    return SglangHiMambaSubject(
        kv_slots=params["kv_slots"], mamba_slots=params["mamba_slots"],
        host_kv_slots=params["host_kv_slots"], host_mamba_slots=params["host_mamba_slots"],
        write_policy=POLICIES[params["policy"]], storage=bool(params["storage"]),
        device=device, fault=fault, **options)
