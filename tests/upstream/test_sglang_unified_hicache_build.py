"""Spike for issue #14 (himamba host=1 on SGLang 0.5.23): the real ``UnifiedRadixCache`` (Full +
Mamba) gets a real ``HybridCacheController`` on CPU through the real ``init_hicache``, and one
insert's write-through backup and load-back go round trip.  Not an adapter yet: docs/adapters.md,
"himamba host=1 on 0.5.23 (not driven yet): what it takes".

What is not SGLang's here: the host pools are built unpinned by a stack strategy registered with
SGLang's own ``register_stack_strategy`` (the stock assembler pins them with cudaHostRegister), and
the controller's ``l2_transfer_engine`` is a recording stand-in (the real one calls CUDA-only
``sgl_kernel.kvcacheio`` kernels); its completion events land when the test says so.

Run with the default upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream/test_sglang_unified_hicache_build.py``.
Where sglang is not importable, or another release is installed, the module skips, saying why.
"""

import atexit
from array import array

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.23")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

import torch  # noqa: E402

KV, MAMBA = 8, 6


class Landing:
    """A completion event that has landed once the test says so."""

    def __init__(self):
        self.landed = False

    def query(self) -> bool:
        return self.landed

    def synchronize(self) -> None:
        self.landed = True

    def record(self, *args) -> None:
        pass


class RecordingEngine:
    """``L2TransferEngine`` stand-in: records each submission; copies nothing."""

    def __init__(self, real):
        self.device_to_host_stream = real.device_to_host_stream
        self.host_to_device_stream = real.host_to_device_stream
        self.submitted = []  # (direction, {host pool type: (host ids, device ids)}, event)

    def _record(self, direction, transfers):
        from sglang.srt.mem_cache.l2_transfer import TransferCompletion

        done = Landing()
        self.submitted.append((direction, {type(t.host_pool).__name__: (
            t.host_indices.tolist(), t.device_indices.tolist()) for t in transfers}, done))
        return TransferCompletion(Landing(), done, False)

    def submit_device_to_host(self, transfers):
        return self._record("d2h", transfers)

    def submit_host_to_device(self, transfers, *, transfer_layer_id_max, start_event=None,
                              on_layer_done=None):
        if on_layer_done is not None:
            for layer in range(transfer_layer_id_max):
                on_layer_done(layer)
        return self._record("h2d", transfers)

    def land_all(self):
        for *_, done in self.submitted:
            done.synchronize()


@pytest.fixture(params=["python", "rust"])
def hicache(request):
    sg = loader.load()
    from sglang.srt.configs.mamba_utils import (Mamba2CacheParams, Mamba2StateDType,
                                                Mamba2StateShape)
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
    from sglang.srt.mem_cache.pool_host import HostPoolGroup
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    from sglang.srt.runtime_context import get_context, get_memory

    FULL, MB = sg.ComponentType.FULL, sg.ComponentType.MAMBA
    # the hicache fields init_hicache and the assembler read; page_first_direct because
    # MambaPoolHost accepts only the page_first layouts (pool_host/mamba.py)
    published = get_context().override_server_args(
        _mamba_cache_chunk_size=64, hicache_io_backend="direct",
        hicache_mem_layout="page_first_direct", hicache_write_policy="write_through",
        hicache_ratio=2.0)
    server_args = published.install()
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=2, n_groups=1,
                                    num_heads=1, head_dim=1, state_size=1, conv_kernel=2)
    rtp = HybridReqToTokenPool(
        size=3, mamba_size=MAMBA, mamba_spec_state_size=MAMBA, max_context_len=2 * KV + 2,
        device="cpu", enable_memory_saver=False,
        cache_params=Mamba2CacheParams(shape=shape, layers=[1], dtype=Mamba2StateDType(
            conv=torch.int64, temporal=torch.int64)),
        mamba_layer_ids=[1], enable_mamba_extra_buffer=False, enable_overlap_schedule=False)
    kv_pool = HybridLinearKVPool(size=KV, dtype=torch.float32, page_size=1, head_num=1,
                                 head_dim=1, full_attention_layer_ids=[0], device="cpu",
                                 enable_memory_saver=False, mamba_pool=rtp.mamba_pool)
    allocator = TokenToKVPoolAllocator(size=KV, dtype=torch.float32, device="cpu",
                                       kvcache=kv_pool, need_sort=False)
    params = sg.CacheInitParams(disable=False, req_to_token_pool=rtp,
                                token_to_kv_pool_allocator=allocator, page_size=1,
                                tree_components=(FULL, MB), tree_core_backend=request.param)
    cache = sg.UnifiedRadixCache(params)
    want = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}[request.param]
    assert type(cache.tree_core).__name__ == want

    class UnpinnedMambaStack(hpa.StackStrategy):
        """``_MambaStrategy.build`` for kvcheck's pool only, with unpinned host pools."""

        def matches(self, kvcache, components):
            return kvcache is kv_pool

        def build(self, *, cache, kvcache, params, load_cache_event, **_):
            full = kvcache.full_kv_pool
            cls, info, kw = hpa._mha_host_inputs(full)
            kv_host = cls(info, 2.0, 0, 1, "page_first_direct", pin_memory=False, device="cpu",
                           **kw)
            mamba_pool = params.req_to_token_pool.mamba_pool
            (minfo,) = mamba_pool.get_device_pool_infos()
            mamba_host = MambaPoolHost(minfo.buffer_info, 2.0, 0, device_capacity=(
                getattr(mamba_pool, "host_capacity_tokens", None) or mamba_pool.size),
                pin_memory=False, layout="page_first_direct")
            full_map = hpa._stage_local_layer_mapping(kvcache.full_attention_layer_id_mapping,
                                                      kvcache.start_layer)
            mamba_map = {layer - kvcache.start_layer: i
                         for i, layer in enumerate(minfo.layer_ids)}
            top = max(full_map.keys() | mamba_map.keys()) + 1
            slots = params.req_to_token_pool.mamba_allocator
            group = HostPoolGroup([
                hpa.build_pool_entry(name=PoolName.KV, host_pool=kv_host, device_pool=full,
                                     layer_mapping=full_map, transfer_layer_id_max=top,
                                     is_anchor=True),
                hpa.build_pool_entry(
                    name=PoolName.MAMBA, host_pool=mamba_host, device_pool=mamba_pool,
                    layer_mapping=mamba_map, transfer_layer_id_max=top,
                    host_evict_fn=lambda n: cache.evict_host(n, MB),
                    device_evict_fn=lambda n: hpa._evict_mamba_for_device_alloc(cache, n),
                    device_alloc_fn=slots.alloc, device_free_fn=slots.free)])
            controller = HybridCacheController(
                params.token_to_kv_pool_allocator, group, 1, None,
                load_cache_event=load_cache_event,
                write_policy=get_memory().hicache_write_policy,
                io_backend=get_memory().hicache_io_backend, transfer_layer_id_max=top,
                host_memory_mode="cache")
            return hpa.StackBuildResult(
                host_pool_group=group, cache_controller=controller,
                component_host_pools={FULL: kv_host, MB: mamba_host},
                register_req_to_token_counter=True, pools_desc="KV + MAMBA (kvcheck, CPU)")

    strategy = UnpinnedMambaStack()
    hpa.register_stack_strategy(strategy)
    try:
        cache.init_hicache(server_args, params)
    finally:
        hpa._STRATEGIES.remove(strategy)
    atexit.unregister(cache.shutdown)
    cache.load_back_threshold = 1  # upstream 10 tokens; ours are 3
    yield sg, cache, allocator, rtp
    cache.release_host_resources()
    published.restore()


def key(sg, tokens):
    return sg.RadixKey(array("q", tokens))


def test_init_hicache_builds_the_real_controller_on_cpu(hicache):
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    sg, cache, *_ = hicache
    cc = cache.cache_controller
    assert type(cc) is HybridCacheController
    assert type(cc.l2_transfer_engine).__name__ == "L2TransferEngine"
    assert type(cc.l2_transfer_engine.device_to_host_stream) is torch.cpu.Stream
    assert not cc.enable_storage  # no storage backend: no thread started
    assert cache.write_through_threshold == 1  # write_through
    assert [e.name.value for e in cc.mem_pool_host.entries] == ["kv", "mamba"]


def test_one_insert_backs_up_and_loads_back(hicache):
    sg, cache, allocator, rtp = hicache
    cc = cache.cache_controller
    engine = cc.l2_transfer_engine = RecordingEngine(cc.l2_transfer_engine)
    kv = allocator.alloc(3)
    state = rtp.mamba_allocator.alloc(1)
    cache.insert(sg.InsertParams(key=key(sg, [1, 2, 3]), value=kv, mamba_value=state))
    node = cache.match_prefix(sg.MatchPrefixParams(key=key(sg, [1, 2, 3]))).last_device_node
    # write-through, threshold 1: the insert's hit queued the node's backup (not submitted yet)
    assert list(cache.ongoing_write_through) == [node]
    assert len(cc.write_queue) == 1 and not engine.submitted
    cache.flush_pending_backups()
    ((direction, pools, _),) = engine.submitted
    assert direction == "d2h" and pools["MHATokenToKVPoolHost"][1] == kv.tolist()
    assert pools["MambaPoolHost"][1] == state.tolist()
    cache.writing_check()
    assert list(cache.ongoing_write_through) == [node]  # in flight until it lands
    engine.land_all()
    cache.writing_check()
    assert not cache.ongoing_write_through and cache.tree_core.is_backuped(node)
    host_kv = pools["MHATokenToKVPoolHost"][0]

    assert cache.evict(sg.EvictParams(num_tokens=3)).num_tokens_evicted == 3
    miss = cache.match_prefix(sg.MatchPrefixParams(key=key(sg, [1, 2, 3])))
    assert miss.device_prefix_len == 0 and miss.host_hit_length == 3
    assert cache.load_back(miss.best_match_node)
    assert cache.ready_to_load_host_cache() != -1
    direction, pools, _ = engine.submitted[-1]
    assert direction == "h2d" and pools["MHATokenToKVPoolHost"][0] == host_kv
    engine.land_all()
    cache.loading_check()
    hit = cache.match_prefix(sg.MatchPrefixParams(key=key(sg, [1, 2, 3])))
    assert hit.device_prefix_len == 3
    cache.sanity_check()
