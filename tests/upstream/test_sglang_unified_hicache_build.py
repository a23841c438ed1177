"""The HiCache build spike, now through the adapter (``caches/adapters/sglang/unified_hicache.py``): the
real ``UnifiedRadixCache`` (Full + Mamba) gets a real ``HybridCacheController`` on CPU through
the real ``init_hicache``, and one insert's write-through backup and load-back go round trip,
driven on the tree's own methods (below the subject's ops).

What is not SGLang's: the host pools are built unpinned by a stack strategy registered with
SGLang's own ``register_stack_strategy`` (the stock assembler pins them with cudaHostRegister),
and the controller's ``l2_transfer_engine`` is the adapter's recording engine (the real one
calls CUDA-only ``sgl_kernel.kvcacheio`` kernels); its completion events land when the test
says so.

Run with the default upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream/test_sglang_unified_hicache_build.py``.
Where sglang is not importable, or another release is installed, the module skips, saying why.
"""

from array import array

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.23")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

import torch  # noqa: E402

from caches.adapters.sglang.unified_hicache import (RecordingEngine,  # noqa: E402
                                                    UnifiedHiMambaCache)
from caches.himamba import WRITE_THROUGH  # noqa: E402

KV, MAMBA = 8, 6


@pytest.fixture(params=["python", "rust"])
def hicache(request):
    c = UnifiedHiMambaCache(KV, MAMBA, 2 * KV, 2 * MAMBA, WRITE_THROUGH, torch.device("cpu"),
                            core=request.param)
    want = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}[request.param]
    assert type(c.tree.tree_core).__name__ == want
    yield c
    c.tree.release_host_resources()


def key(sg, tokens):
    return sg.RadixKey(array("q", tokens))


def test_init_hicache_builds_the_real_controller_on_cpu(hicache):
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    cc = hicache.tree.cache_controller
    assert type(cc) is HybridCacheController
    assert type(cc.l2_transfer_engine) is RecordingEngine  # the real one was built, then
    assert type(cc.l2_transfer_engine.device_to_host_stream) is torch.cpu.Stream  # swapped
    assert not cc.enable_storage  # no storage backend: no thread started
    assert hicache.tree.write_through_threshold == 1  # write_through
    assert [e.name.value for e in cc.mem_pool_host.entries] == ["kv", "mamba"]
    # 2 x 8 KV slots and 2 x 6 states plus the padding slot, which the adapter holds back
    assert (hicache.host_kv.pool.size, hicache.host_mamba.pool.size) == (17, 13)


def test_one_insert_backs_up_and_loads_back(hicache):
    c = hicache
    sg, tree, cc, engine = c.sg, c.tree, c.tree.cache_controller, c.engine
    kv = c.allocator.alloc(3)
    state = c.req_to_token_pool.mamba_allocator.alloc(1)
    c.kv.write(kv.tolist(), [11, 12, 13])
    c.mamba.write(state.tolist(), [99])
    tree.insert(sg.InsertParams(key=key(sg, [1, 2, 3]), value=kv, mamba_value=state))
    node = tree.match_prefix(sg.MatchPrefixParams(key=key(sg, [1, 2, 3]))).last_device_node
    # write-through, threshold 1: the insert's hit queued the node's backup (not submitted yet)
    assert list(tree.ongoing_write_through) == [node]
    assert len(cc.write_queue) == 1 and not engine.writes
    host_kv = cc.write_queue[0].host_indices.tolist()
    tree.flush_pending_backups()
    assert len(engine.writes) == 1 and c.host_kv.read(host_kv) == [11, 12, 13]
    (host_state,) = engine.written["host_mamba"]
    assert c.host_mamba.read([host_state]) == [99]
    tree.writing_check()
    assert list(tree.ongoing_write_through) == [node]  # in flight until it lands
    engine.land(engine.writes)
    tree.writing_check()
    assert not tree.ongoing_write_through and tree.tree_core.is_backuped(node)

    assert tree.evict(sg.EvictParams(num_tokens=3)).num_tokens_evicted == 3
    c.kv.write(kv.tolist(), [0, 0, 0])  # the freed device slots forget the data
    miss = tree.match_prefix(sg.MatchPrefixParams(key=key(sg, [1, 2, 3])))
    assert miss.device_prefix_len == 0 and miss.host_hit_length == 3
    assert tree.load_back(miss.best_match_node)
    assert tree.ready_to_load_host_cache() != -1
    assert len(engine.loads) == 1
    engine.land(engine.loads)
    tree.loading_check()
    hit = tree.match_prefix(sg.MatchPrefixParams(key=key(sg, [1, 2, 3])))
    assert hit.device_prefix_len == 3
    loaded = tree.path_device_indices(hit.last_device_node)[:3].tolist()
    assert c.kv.read(loaded) == [11, 12, 13]  # copied back from the host slots
    tree.sanity_check()


@pytest.mark.parametrize("core", ["python", "rust"])
def test_storage_1_attaches_the_factory_backend_with_its_threads_unstarted(core):
    """storage=1: ``init_hicache`` reads the published ``dynamic`` backend, the controller's
    own ``attach_storage_backend`` builds kvcheck's ``FingerprintStorage`` through SGLang's
    ``StorageBackendFactory`` (zero-copy v1 calls) and the queues, and builds the four storage
    threads without starting them; one backup then travels write -> storage -> ack."""
    import threading

    from caches.adapters.sglang.unified_storage import FingerprintStorage, run_backups

    before = threading.active_count()
    c = UnifiedHiMambaCache(KV, MAMBA, 2 * KV, 2 * MAMBA, WRITE_THROUGH, torch.device("cpu"),
                            core=core, storage=True)
    cc, tree = c.tree.cache_controller, c.tree
    assert type(cc.storage_backend) is FingerprintStorage and c.storage is cc.storage_backend
    assert cc.enable_storage and tree.enable_storage and tree.prefetch_threshold == 1
    assert cc.page_set_func == cc._page_set_zero_copy  # interface_v1: the backend sees slots
    assert threading.active_count() == before  # nothing started
    assert not any(t.is_alive() for t in (cc.prefetch_thread, cc.backup_thread,
                                          cc.prefetch_io_aux_thread, cc.prefetch_sync_thread))
    sg = c.sg
    tree.insert(sg.InsertParams(key=key(sg, [1, 2, 3]), value=c.allocator.alloc(3),
                                mamba_value=c.req_to_token_pool.mamba_allocator.alloc(1)))
    assert c.writing_check() == 1  # the write lands and is acked: its storage backup queues
    assert len(tree.ongoing_backup) == 1 and cc.backup_queue.qsize() == 1
    assert len(run_backups(cc)) == 1 and len(c.storage.writes) == 4  # 3 KV pages + the state
    tree.drain_storage_control_queues()
    assert not tree.ongoing_backup
    tree.release_host_resources()
