"""Target ``vllm``: vLLM's real ``KVCacheManager`` + ``BlockPool`` (one full-attention KV cache
group; with ``--param window=W`` a full-attention and a sliding-window group under its
``HybridKVCacheCoordinator``) driven the way vLLM's scheduler drives them.

| variant | vLLM | adapter |
|---|---|---|
| block-hash | ``vllm.v1.core.kv_cache_manager.KVCacheManager`` over its ``BlockPool`` | ``block_hash.py`` |

The installed wheel (``ci/upstream/vllm-setup.sh``, pinned 0.33.0) runs by default; ``--src
CHECKOUT`` runs a vLLM checkout's KV-cache modules over that env instead (``loader.use``).  The
identity is the version and the checkout's commit (``+dirty.<hash>``) or a content hash of the
KV-cache modules.  Faults K1-K5, K8 and (hybrid only) K9-K11 are
patched into the real instances (``faults.py``); K6 and K7 are refused.
"""

from __future__ import annotations

from functools import lru_cache

from caches.adapters.vllm.loader import SETUP_HINT
from caches.target import DECLINE, Identity, Target, source_identity


def _block_hash(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.vllm.faults import check_injectable

    check_injectable(fault)  # refused before anything is built
    from caches.adapters.vllm import loader
    from caches.adapters.vllm.block_hash import make_subject
    from caches.target import TargetUnavailable

    why = loader.unavailable_reason(src)
    if why:
        raise TargetUnavailable(why)

    return make_subject(params, fault=fault, device=device)


def _unavailable(src=None):
    from caches.adapters.vllm import loader

    return loader.unavailable_reason(src)


@lru_cache(maxsize=None)
def _identify(src=None) -> Identity:
    from caches.adapters.vllm import loader

    if loader.unavailable_reason(src):
        return Identity("vllm", "", "unknown:")
    return Identity("vllm", loader.version(), source_identity(src, loader.files()))


TARGET = Target(
    name="vllm", engine="vllm",
    summary="vLLM's real KVCacheManager + BlockPool (v1 prefix caching, one full-attention "
            "group; window > 0: full + sliding-window groups, HybridKVCacheCoordinator)",
    builders={"block-hash": _block_hash},
    unavailable=_unavailable, identify=_identify, takes_src=True, src_optional=True,
    setup_hint=SETUP_HINT)
