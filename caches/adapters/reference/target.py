"""Target ``reference``: kvcheck's own reference model of each variant and its catalogued
faults, registered like every other target (``pyproject.toml``, entry-point group
``kvcheck.targets``; ``state_machines/targets.py`` BUILTIN).

| variant | cache | subject |
|---|---|---|
| radix | ``caches/radix.py`` | ``caches/subjects/radix.py`` |
| paged-bigpage | ``caches/paged_bigpage.py`` | ``caches/subjects/paged_bigpage.py`` |
| streaming-session | ``caches/streaming_session.py`` | ``caches/subjects/streaming_session.py`` |
| himamba | ``caches/himamba.py`` | ``caches/subjects/himamba.py`` |
| continuation-state | ``caches/continuation_state.py`` | ``caches/subjects/continuation_state.py`` |
| block-hash | ``caches/block_hash.py`` | ``caches/subjects/block_hash.py`` |
| hybrid-swa | ``caches/hybrid_swa.py`` | ``caches/subjects/hybrid_swa.py`` |

A fault (``--fault ID``) swaps the clean cache class for the fault's mutated subclass.  The
identity is the hash of the model's files: ``caches/`` without the engines' adapters.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import metadata
from pathlib import Path

from caches.block_hash import BlockHashCache
from caches.continuation_state import ContinuationStateCache
from caches.himamba import POLICIES, HiMambaRadixCache
from caches.hybrid_swa import HybridSWARadixCache
from caches.paged_bigpage import LinearAttPagedRadixCache
from caches.radix import RadixCache
from caches.streaming_session import StreamingSessionCache
from caches.subjects.block_hash import BlockHashSubject
from caches.subjects.continuation_state import ContinuationStateSubject
from caches.subjects.himamba import HiMambaSubject
from caches.subjects.hybrid_swa import HybridSWASubject
from caches.subjects.paged_bigpage import PagedBigPageSubject
from caches.subjects.radix import RadixSubject
from caches.subjects.streaming_session import StreamingSessionSubject
from caches.target import DECLINE, FaultNotInjectable, Identity, Target, content_hash


def _radix(params, cache_cls, device):
    return RadixSubject(cache_cls or RadixCache, page_size=params["page_size"],
                        pool_pages=params["pool_pages"], device=device)


def _paged_bigpage(params, cache_cls, device):
    return PagedBigPageSubject(cache_cls or LinearAttPagedRadixCache,
                               hash_page_size=params["hash_page_size"],
                               big_page_num=params["big_page_num"],
                               kv_tokens=params["kv_tokens"],
                               small_buffers=params["small_buffers"],
                               max_req_total_len=params["max_req_total_len"], device=device)


def _streaming_session(params, cache_cls, device):
    return StreamingSessionSubject(cache_cls or StreamingSessionCache,
                                   page_size=params["page_size"],
                                   pool_pages=params["pool_pages"],
                                   req_rows=params["req_rows"], device=device)


def _himamba(params, cache_cls, device):
    return HiMambaSubject(cache_cls or HiMambaRadixCache, kv_slots=params["kv_slots"],
                          mamba_slots=params["mamba_slots"],
                          host_kv_slots=params["host_kv_slots"],
                          host_mamba_slots=params["host_mamba_slots"],
                          write_policy=POLICIES[params["policy"]],
                          storage=bool(params["storage"]), device=device,
                          host=bool(params["host"]))


def _continuation_state(params, cache_cls, device):
    return ContinuationStateSubject(cache_cls or ContinuationStateCache,
                                    state_required=bool(params["state_required"]),
                                    pool_pages=params["pool_pages"], window=params["window"],
                                    device=device)


def _block_hash(params, cache_cls, device):
    return BlockHashSubject(cache_cls or BlockHashCache, block_size=params["block_size"],
                            num_blocks=params["num_blocks"], max_len=params["max_len"],
                            window=params.get("window", 0), device=device)


def _hybrid_swa(params, cache_cls, device):
    return HybridSWASubject(cache_cls or HybridSWARadixCache, page_size=params["page_size"],
                            pool_pages=params["pool_pages"], swa_pages=params["swa_pages"],
                            window=params["window"], device=device)


MODELS = {"radix": _radix, "paged-bigpage": _paged_bigpage,
          "streaming-session": _streaming_session, "himamba": _himamba,
          "continuation-state": _continuation_state, "block-hash": _block_hash,
          "hybrid-swa": _hybrid_swa}


def _with_fault(variant, model):
    """A target builder over ``model``: the clean cache, or a catalogued fault's subclass."""

    def build(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
        cache_cls = None
        if fault is not None:
            from caches.faults import get_fault

            f = get_fault(fault)
            if f.variant != variant:
                raise FaultNotInjectable(f"fault {fault} belongs to variant {f.variant}, "
                                         f"not {variant}")
            cache_cls = f.cls
        return model(params, cache_cls, device)

    return build


@lru_cache(maxsize=1)
def _identify(src=None) -> Identity:
    root = Path(__file__).resolve().parents[2]  # caches/
    try:
        version = metadata.version("kvcheck")
    except metadata.PackageNotFoundError:
        version = "checkout"
    files = [p for p in root.rglob("*.py") if "adapters" not in p.relative_to(root).parts]
    return Identity("kvcheck", version, content_hash(sorted(files)))


TARGET = Target(
    name="reference", engine="kvcheck",
    summary="kvcheck's own reference model of each variant (and its catalogued faults)",
    builders={name: _with_fault(name, model) for name, model in MODELS.items()},
    identify=_identify)
