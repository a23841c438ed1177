"""HiCache's L3 storage tier on SGLang 0.5.23, driven on CPU (himamba ``host=1 storage=1``).

What runs is SGLang's: ``HybridCacheController.attach_storage_backend`` (the backend built by
its own ``StorageBackendFactory`` through the ``dynamic`` route, ``storage/backend_factory.py``),
``write_storage``/``prefetch``/``terminate_prefetch``, the hit query
(``HybridCacheController._storage_hit_query``), the page transfers (``_page_transfer``,
``_page_backup`` with the zero-copy v1 calls and the Mamba v2 sidecar), the ack reduction, and
the tree's own queue drains.  What is kvcheck's:

* the storage *threads* are built but never started (``attach_unstarted``): each of their loop
  bodies runs one pass when a kvcheck op says so (``run_backups``, ``run_hit_queries``,
  ``run_transfers``, ``run_syncs`` -- one queue item per iteration, as the threads' loops take
  them), so a backup or a prefetch in flight is a real state between ops;
* the backend is ``FingerprintStorage``, an in-process ``HiCacheStorage``: a page written is
  kvcheck's fingerprint of its host slot (a KV page, or the Mamba state at the page's end),
  filed under the key SGLang gave it, and a page read writes that fingerprint into the host
  slot SGLang names.  It records every key written, with the host slot it came from, for the
  stored-key property (``invariants/storage_keys.py``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from types import SimpleNamespace

from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, PoolHitPolicy, PoolName,
                                                  PoolTransferResult)

BACKEND = "dynamic"  # SGLang's factory route for a backend class named by module and class


def extra_config(prefetch_threshold: int = 1) -> str:
    """``hicache_storage_backend_extra_config`` for ``FingerprintStorage`` (the zero-copy v1
    interface, so the backend sees host slots; a prefetch threshold of one page, as
    0.5.12.post1's adapter sets it: our sequences are 1-3 tokens)."""
    return json.dumps({"backend_name": "kvcheck-fingerprints", "module_path": __name__,
                       "class_name": "FingerprintStorage", "interface_v1": 1,
                       "prefetch_threshold": prefetch_threshold})


@lru_cache(maxsize=None)
def warm_key_scheme() -> None:
    """Load SGLang's page-hash extension once per process (``get_hash_str``'s first call
    takes seconds: measured 6.4 s on this machine), when the cache is built rather than
    inside the first op that hashes (an insert with storage on, a prefetch), where it would
    overrun the per-op deadline as a ``hang``."""
    from sglang.srt.mem_cache.utils import get_hash_str

    get_hash_str([0], None, page_size=1)


def _ints(t) -> list[int]:
    return [] if t is None else [int(x) for x in t.view(-1).tolist()]


class FingerprintStorage(HiCacheStorage):
    """An in-process L3 store of kvcheck fingerprints (``bind`` names the host pools' data
    tensors: ``{PoolName.KV: host_kv, PoolName.MAMBA: host_mamba}``, kvcheck's wrappers with
    ``read``/``write``)."""

    def __init__(self, storage_config, kwargs=None):
        self.config = storage_config
        self.store: dict[tuple, int] = {}  # (pool, key) -> fingerprint
        self.writes: list[tuple] = []  # (pool, key, host slot, op id) per page written
        self.op = None  # the backup operation being written (``run_backups`` sets it)
        self.fetched: dict[str, set] = {}  # host pool name -> slots a prefetch read into
        self.pools: dict = {}

    def bind(self, pools: dict) -> None:
        self.pools = pools

    # -- v1 (KV, zero copy: the controller hands host slots) ---------------------------------
    def batch_set_v1(self, keys, host_indices, extra_info=None) -> list[bool]:
        slots = _ints(host_indices)
        data = self.pools[PoolName.KV].read(slots)
        for key, slot, fp in zip(keys, slots, data):
            self.store[(PoolName.KV, key)] = fp
            self.writes.append((PoolName.KV, key, slot, self.op))
        return [True] * len(keys)

    def batch_get_v1(self, keys, host_indices, extra_info=None) -> list[bool]:
        slots = _ints(host_indices)
        out = []
        for key, slot in zip(keys, slots):
            fp = self.store.get((PoolName.KV, key))
            if fp is None:
                out.append(False)
                continue
            self._fill(PoolName.KV, slot, fp)
            out.append(True)
        return out

    def _fill(self, pool, slot: int, fp: int) -> None:
        self.pools[pool].write([slot], [fp])
        self.fetched.setdefault(self.pools[pool].name, set()).add(slot)

    def batch_exists(self, keys, extra_info=None) -> int:
        for i, key in enumerate(keys):
            if (PoolName.KV, key) not in self.store:
                return i
        return len(keys)

    # -- v2 (the Mamba sidecar: one trailing page per node) ------------------------------------
    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None) -> PoolTransferResult:
        kv = self.batch_exists(keys, extra_info)
        hits = {PoolName.KV: kv} if kv else {}
        restorable = list(range(1, kv + 1))
        for t in pool_transfers or ():
            if not restorable:
                break
            if t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                ok = {p for p in restorable if (t.name, keys[p - 1]) in self.store}
            else:
                ok = set()
                for p in restorable:
                    if (t.name, keys[p - 1]) not in self.store:
                        break
                    ok.add(p)
            if ok:
                hits[t.name] = max(ok)
            restorable = [p for p in restorable if p in ok]
        return PoolTransferResult(restorable[-1] if restorable else 0, hits, restorable)

    def batch_set_v2(self, transfers, extra_info=None) -> dict:
        out = {}
        for t in transfers:
            slots, keys = _ints(t.host_indices), list(t.keys or ())
            data = self.pools[t.name].read(slots) if slots else []
            for key, slot, fp in zip(keys, slots, data):
                self.store[(t.name, key)] = fp
                self.writes.append((t.name, key, slot, self.op))
            out[t.name] = [True] * len(keys) if len(slots) == len(keys) else [False] * len(keys)
        return out

    def batch_get_v2(self, transfers, extra_info=None) -> dict:
        out = {}
        for t in transfers:
            slots, keys = _ints(t.host_indices), list(t.keys or ())
            res = []
            for key, slot in zip(keys, slots):
                fp = self.store.get((t.name, key))
                if fp is not None:
                    self._fill(t.name, slot, fp)
                res.append(fp is not None)
            out[t.name] = res + [False] * (len(keys) - len(res))
        return out

    # -- the abstract (pre-v1) interface: never called with ``interface_v1`` ------------------
    def exists(self, key) -> bool:
        return (PoolName.KV, key) in self.store

    def _v0(self, *args, **kwargs):
        raise NotImplementedError("FingerprintStorage is driven through the v1/v2 interface")

    get = batch_get = set = batch_set = _v0


class _Unstarted:
    """A ``threading.Thread`` that is built and never started: its loop body is run by
    kvcheck's ops instead (``join`` on it is what an unstarted thread answers: nothing)."""

    def __init__(self, target=None, daemon=None, **_):
        self.target = target

    def start(self) -> None:
        pass

    def join(self, timeout=None) -> None:
        pass

    def is_alive(self) -> bool:
        return False


def attach_unstarted(controller, backend: str, prefetch_threshold: int, model_name,
                     extra: dict, host_pools) -> None:
    """``controller.attach_storage_backend`` as SGLang runs it, the storage threads built but
    not started (the controller's module sees ``_Unstarted`` as ``threading.Thread`` for the
    time of the call; nothing else in it starts a thread), at rank 0 of one."""
    import threading

    from sglang.srt.managers import cache_controller as cc_mod

    real = cc_mod.threading
    cc_mod.threading = SimpleNamespace(**{k: getattr(threading, k) for k in dir(threading)
                                          if not k.startswith("__")})
    cc_mod.threading.Thread = _Unstarted
    from sglang.srt.runtime_context import get_parallel

    try:
        # the storage config names this rank's place (one rank: no process group)
        with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                     attn_dcp_rank=0):
            controller.attach_storage_backend(
                storage_backend=backend, prefetch_threshold=prefetch_threshold,
                model_name=model_name, storage_backend_extra_config=extra,
                host_pools=host_pools)
    finally:
        cc_mod.threading = real


def _take(q) -> list:
    out = []
    while not q.empty():
        item = q.get_nowait()
        if item is not None:
            out.append(item)
    return out


# -- the storage threads' loop bodies, one pass per queued item ------------------------------
# (``HybridCacheController.backup_thread_func``, ``HiCacheController.prefetch_thread_func``,
# ``prefetch_io_aux_func``, ``HybridCacheController.prefetch_sync_thread_func``: the loops
# around these bodies only wait on their queues and on the stop event)
def run_backups(cc) -> list:
    """The backup thread takes every queued backup: ``_page_backup_or_log`` (H -> storage),
    then the ack (``ack_backup_queue``)."""
    ops = _take(cc.backup_queue)
    for op in ops:
        cc.storage_backend.op = op.id
        cc._page_backup_or_log(op)
        cc.ack_backup_queue.put(op)
    return ops


def run_hit_queries(cc) -> list:
    """The prefetch thread takes every submitted prefetch: the hit query against the backend
    (none for a terminated one), the rank sync (a no-op at one rank), ``prefetch_hit_queue``."""
    ops = _take(cc.prefetch_queue)
    for op in ops:
        hashes, hit = ([], 0) if op.is_terminated() else cc._storage_hit_query(op)
        hit = cc._sync_prefetch_hit_query(op, hit)
        op.hash_value = hashes[:hit // cc.page_size]
        op.storage_hit_count = hit
        cc.prefetch_hit_queue.put(op)
    return ops


def run_transfers(cc) -> list:
    """The IO thread takes every staged prefetch: ``_page_transfer`` (storage -> host, KV then
    the Mamba sidecar), then the completion ack (``prefetch_sync_queue``)."""
    ops = _take(cc.prefetch_buffer)
    for op in ops:
        try:
            cc._page_transfer(op)
        finally:
            from sglang.srt.managers.cache_controller import PrefetchAck

            cc.prefetch_sync_queue.put(PrefetchAck(rid=op.request_id, completed_req=True,
                                                   operation=op))
    return ops


def run_syncs(cc) -> int:
    """The sync thread takes every ack: ``_reduce_prefetch_ack``, ``ack_prefetch_queue``."""
    acks = _take(cc.prefetch_sync_queue)
    for ack in acks:
        cc._reduce_prefetch_ack(ack)
        cc.ack_prefetch_queue.put(ack)
    return len(acks)
