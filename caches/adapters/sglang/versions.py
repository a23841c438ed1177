"""Which SGLang release is installed, and what kvcheck drives on it -- the one place where the
adapters' version differences live (no copies of adapters per release).

One environment per release (``ci/upstream/setup.sh [VERSION]``): ``.venv-upstream`` holds the
newest pinned release, ``.venv-upstream-VERSION`` a historical one.  The adapters ask this
module, never ``sglang.__version__`` directly:

| release | radix (``sglang`` / ``sglang-rust``) | himamba | streaming-session |
|---|---|---|---|
| 0.5.23 (newest) | ``UnifiedRadixCache`` (Full), Python / Rust tree core (``unified_radix.py``); the plain ``RadixCache`` as ``sglang-radixcache`` | ``UnifiedRadixCache`` (Full + Mamba), both cores: host=0 (``unified_mamba.py``), host=1 with HiCache and its L3 storage (``unified_hicache.py``); older releases refuse host pools not larger than the device ones (``himamba_host_unsupported``) | ``UnifiedRadixCache``'s ``StreamingSession``, both cores (``unified_streaming_session.py``) |
| 0.5.12.post1 (historical) | ``RadixCache`` (``radix.py``) / -- | ``(Hi)MambaRadixCache`` | ``StreamingSession`` |
| 0.5.10.post1 (historical) | ``RadixCache`` (``radix.py``) / -- | ``(Hi)MambaRadixCache`` | ``SessionAwareCache`` (``streaming_session.py``) |

0.5.10.post1 runs the 0.5.12.post1 adapters unpatched through the shims below (request rows
from 0, ``insert`` leaving key alignment to its callers, the streaming wrapper's module and
class names, no ``try_match_prefix``, the HiCache pool entries, hash and prefetch timeout of
``hicache_pool_entry``/``hicache_hash_str``/``hicache_prefetch_timeout``, the load-back
parameters and the mamba match result), declares the rule that release had and a later one
changed (``session_abort_saves_turn``), and its known findings (``KNOWN_FINDINGS``: the seeds'
defects it still had, declined one by one while fuzzing).

0.5.23 removed ``MambaRadixCache``/``HiMambaRadixCache`` (Full, Mamba and SWA caching became
components of ``UnifiedRadixCache``) and changed the request path (``checkpoint``/
``release_kv_cache`` over ``req.kv`` instead of ``cache_unfinished_req``/``cache_finished_req``),
so the 0.5.12.post1 adapters stay on their release and say so, instead of failing deep inside.
"""

from __future__ import annotations

import importlib.metadata
import re

NEWEST = "0.5.23"  # ci/upstream/sglang.txt
HISTORICAL = ("0.5.12.post1",  # ci/upstream/sglang-0.5.12.post1.txt
              "0.5.10.post1")  # sglang.txt with the sglang== line changed (setup.sh does it)
SUPPORTED = (NEWEST,) + HISTORICAL

# (release, target) -> the variants kvcheck drives there
VARIANTS = {
    ("0.5.23", "sglang"): ("radix", "himamba", "streaming-session", "hybrid-swa"),
    ("0.5.23", "sglang-rust"): ("radix", "himamba", "streaming-session", "hybrid-swa"),
    ("0.5.23", "sglang-radixcache"): ("radix",),
    ("0.5.12.post1", "sglang"): ("radix", "himamba", "streaming-session"),
    ("0.5.10.post1", "sglang"): ("radix", "himamba", "streaming-session"),
}


# (release, variant) -> the ids of that release's known findings the ``sglang`` target's subject
# declines while fuzzing (tests/upstream_findings/README.md).  0.5.10.post1 has the HiMamba
# defects SGLang PR #23696 fixed in 0.5.12.post1: H1 (the tombstone cascade ignores host refs,
# the wheel's mem_cache/hi_mamba_radix_cache.py 691-719) and H3 (``cache_unfinished_req``
# drops the chunked flag, mem_cache/mamba_radix_cache.py 605-640); and F5, the non-leaf
# eviction crash SGLang PR #22062 reports: ``write_backup`` (hi_mamba_radix_cache.py 279-310)
# backs up a node whose parent is not backed up (0.5.12.post1 refuses it, its 205-213), and
# ``_evict_regular`` (604) then asserts "non-leaf" on that parent.
# Both historical releases have F6: ``evict`` (0.5.12.post1's hi_mamba_radix_cache.py 685-716,
# 0.5.10.post1's 738-770) pushes only the evicted leaf's parent, which the tombstone cascade
# (``_iteratively_delete_tombstone_leaf``) may have deleted: the ancestor it exposed as a device
# leaf is never evicted in that call, and the allocation fails with enough evictable.
# 0.5.10.post1's ``SessionAwareCache`` predates SGLang PR #22862: its ``match_prefix`` resumes
# a slot at ``min(kv_committed_len, len(token_ids) - 1)`` (S4; the wheel's
# mem_cache/session_aware_cache.py 186-187) and never frees the slot's tail past that prefix,
# which the next turn's allocation overwrites: a speculative over-allocation (S1) or the tail
# of an aborted turn this release saves as the slot (F2, ``session_abort_saves_turn``) leaks.
KNOWN_FINDINGS = {
    ("0.5.23", "radix"): ("F1", "F2"), ("0.5.12.post1", "radix"): ("F1",),
    ("0.5.10.post1", "radix"): ("F1",),
    ("0.5.23", "streaming-session"): ("F1",), ("0.5.12.post1", "streaming-session"): ("F1",),
    ("0.5.10.post1", "streaming-session"): ("F1", "F2", "S1", "S4", "S7"),
    ("0.5.12.post1", "himamba"): ("F1", "F2", "F3", "F4", "F6"),
    ("0.5.10.post1", "himamba"): ("F1", "F2", "F3", "F4", "F5", "F6", "H1", "H3"),
    ("0.5.23", "himamba"): ("F7",),  # mamba-slot exhaustion under write-through pins (#40416)
}


def known_findings(version: str, variant: str) -> tuple:
    """The ids of ``version``'s known findings in ``variant`` (empty when none; a version newer
    than the newest pinned one has that one's, ``adapter_release``)."""
    return KNOWN_FINDINGS.get((adapter_release(version) or version, variant), ())


def findings_by_variant() -> dict:
    """Every id a variant's findings have on some release (variant -> sorted ids): what a
    target may name in ``--known-findings find=ID``; a subject declines only its release's."""
    out: dict = {}
    for (_, variant), ids in KNOWN_FINDINGS.items():
        out.setdefault(variant, set()).update(ids)
    return {v: tuple(sorted(ids)) for v, ids in out.items()}


_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_VERSION = re.compile(r"v?(?P<release>\d+(?:\.\d+)*)"
                      r"(?:[-_.]?(?P<pre>a|alpha|b|beta|c|rc|pre|preview)[-_.]?(?P<pre_n>\d*))?"
                      r"(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?"
                      r"(?:[-_.]?dev[-_.]?(?P<dev>\d*))?"
                      r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?", re.IGNORECASE)


def version_key(version: str) -> tuple | None:
    """A sort key that orders versions as PEP 440 does (``packaging`` is not installed in
    every env): ``0.5.23.dev0 < 0.5.23rc1 < 0.5.23 < 0.5.23+g1a2b < 0.5.23.post1 <
    0.5.24.dev0``; None for a string that is no version."""
    m = _VERSION.fullmatch(version.strip())
    if m is None:
        return None
    release = tuple(int(x) for x in m["release"].split("."))
    release += (0,) * (6 - len(release))
    pre, post, dev = m["pre"], m["post"], m["dev"]
    if pre:
        pre_key = (0, _PRE[pre.lower()], int(m["pre_n"] or 0))
    elif dev is not None and post is None:
        pre_key = (-1, 0, 0)  # 1.0.dev0 comes before 1.0a0
    else:
        pre_key = (1, 0, 0)
    post_key = (int(post or 0),) if post is not None else (-1,)
    dev_key = (int(dev or 0),) if dev is not None else (float("inf"),)
    local = tuple((0, int(p), "") if p.isdigit() else (-1, 0, p.lower())
                  for p in re.split(r"[-_.]", m["local"])) if m["local"] else ()
    return release, pre_key, post_key, dev_key, local


def newer_than_newest(version: str) -> bool:
    """Whether ``version`` (dev and local versions included) is newer than the newest release
    kvcheck pins (``NEWEST``): an engine branch past the last tag, an editable dev build."""
    key = version_key(version)
    return key is not None and key > version_key(NEWEST)


def adapter_release(version: str) -> str | None:
    """The release whose adapters drive ``version``: itself when kvcheck pins it, the newest
    pinned one for a newer version, None for an older unsupported one (refused)."""
    if version in SUPPORTED:
        return version
    return NEWEST if newer_than_newest(version) else None


def newer_note(version: str) -> str | None:
    """The one-line note a run on a version newer than the newest pinned one carries."""
    if version in SUPPORTED or not newer_than_newest(version):
        return None
    return (f"engine version {version} is newer than the newest one kvcheck was tested on "
            f"({NEWEST})")


def setup_hint(version: str = NEWEST) -> str:
    if version == NEWEST:
        return "bash ci/upstream/setup.sh  (then run with .venv-upstream/bin/python)"
    return f"bash ci/upstream/setup.sh {version}  (then run with " \
           f".venv-upstream-{version}/bin/python)"


def installed() -> str | None:
    """The installed SGLang release (from its metadata; nothing is imported), or None."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def unified(version: str) -> bool:
    """Whether the release has ``UnifiedRadixCache`` as its radix cache (0.5.23 on)."""
    return version not in HISTORICAL


def variant_unsupported(version: str, target: str, variant: str) -> str | None:
    """Why ``target``'s ``variant`` cannot be driven on ``version`` (None when it can); a
    version newer than the newest pinned one is driven as the newest (``adapter_release``)."""
    have = VARIANTS.get((adapter_release(version) or version, target), ())
    if variant in have:
        return None
    where = [v for (v, t), vs in VARIANTS.items() if t == target and variant in vs]
    hint = f"; it runs on sglang {where[0]}: {setup_hint(where[0])}" if where else ""
    why = f" ({UNIFIED_ONLY[variant]})" if variant in UNIFIED_ONLY and not unified(version) \
        else ""
    return f"target {target!r} drives {variant!r} on sglang {', '.join(where) or 'no release'}, " \
           f"not on the installed {version}{why}{hint}"


# variants whose SGLang form is a component of 0.5.23's ``UnifiedRadixCache``: why an older
# release cannot drive them
UNIFIED_ONLY = {
    "hybrid-swa": "this release has no unified SWA component (unified_cache/components/swa.py "
                  "is 0.5.23's); its sliding-window cache is mem_cache/swa_radix_cache.py "
                  "SWARadixCache, which kvcheck does not drive"}


def himamba_host_unsupported(version: str, params) -> str | None:
    """Why himamba ``params`` cannot run on ``version`` (None when they can): before 0.5.23
    HiCache refuses host pools not larger than the device ones (``require_larger_host``); 0.5.23
    only warns (SGLang PR #28614), which is what lets a write_back backup fail there."""
    if unified(version) or not params.get("host", 1):
        return None
    if params.get("host_kv_slots", 1) <= params.get("kv_slots", 0) or \
            params.get("host_mamba_slots", 1) <= params.get("mamba_slots", 0):
        return (f"sglang {version}'s HiCache asserts host pools larger than the device ones "
                f"(host_kv_slots {params.get('host_kv_slots')} vs kv_slots "
                f"{params.get('kv_slots')}, host_mamba_slots {params.get('host_mamba_slots')} vs "
                f"mamba_slots {params.get('mamba_slots')}); 0.5.23 drops the rule (SGLang PR "
                f"#28614)")
    return None


def reserved_request_rows(version: str) -> tuple:
    """The ``ReqToTokenPool`` rows never handed out: from 0.5.12.post1 on row 0 is a padding
    row (rows ``1..size``); 0.5.10.post1 hands out ``0..size-1``."""
    return () if version == "0.5.10.post1" else (0,)


def request_rows_base(version: str) -> int:
    """The first ``ReqToTokenPool`` row handed out (the ``PoolView`` base): 0 on 0.5.10.post1
    (``memory_pool.py`` 147, ``list(range(size))``), 1 from 0.5.12.post1 on."""
    return 0 if version == "0.5.10.post1" else 1


def insert_aligns_keys(version: str) -> bool:
    """Whether ``RadixCache.insert`` cuts the key to whole pages itself (0.5.12.post1 on:
    ``key.page_aligned``); on 0.5.10.post1 its callers do (``page_align_keys`` in
    ``cache_finished_req``/``cache_unfinished_req``), so the adapter does it for them."""
    return version != "0.5.10.post1"


def streaming_modules(version: str) -> tuple[str, str, str]:
    """(module of the streaming-session cache, its class, module of the session controller).
    0.5.10.post1 called the wrapper ``SessionAwareCache`` (``mem_cache/session_aware_cache.py``)
    and kept the controller in ``managers/``; 0.5.12.post1 on: ``session/``."""
    if version == "0.5.10.post1":
        return ("sglang.srt.mem_cache.session_aware_cache", "SessionAwareCache",
                "sglang.srt.managers.session_controller")
    return ("sglang.srt.session.streaming_session", "StreamingSession",
            "sglang.srt.session.session_controller")


def session_abort_saves_turn(version: str) -> bool:
    """Whether an aborted streaming turn is saved as its session's slot.  0.5.10.post1's
    ``SessionAwareCache.cache_finished_req`` has no abort branch: every streaming finish,
    ``FINISH_ABORT`` included, goes to ``SessionSlot.save_from_req`` (the wheel's
    ``mem_cache/session_aware_cache.py`` 199-210), and ``Session.create_req`` has already made
    the turn the session's last request, so the next turn appends to the aborted turn's tokens
    (``managers/session_controller.py`` 135-137, 240-242).  That was the release's rule; SGLang
    PR #22790 made an abort release the slot (0.5.12.post1 on)."""
    return version == "0.5.10.post1"


def session_try_match(session, params):
    """``StreamingSession.try_match_prefix(params)``: the slot's match, or None when the
    request has no active slot.  0.5.10.post1's ``SessionAwareCache`` has no ``try_`` entry
    (its ``match_prefix`` falls through to the inner tree itself); the same question is asked
    first -- a streaming request whose session holds a slot with a row -- and only then its
    ``match_prefix``."""
    if hasattr(session, "try_match_prefix"):
        return session.try_match_prefix(params)
    req = params.req
    if req is None or req.session is None or not req.session.streaming:
        return None
    slot = session.slots.get(req.session.session_id)
    if slot is None or slot.req_pool_idx is None:
        return None
    return session.match_prefix(params)


def allocator_free_pages(allocator) -> list[int]:
    """The allocator's free pages: 0.5.12.post1 keeps ``free_pages`` + ``release_pages``;
    0.5.23's paged allocator stages frees in ``staged_pages`` (``get_all_free_pages()``)."""
    if hasattr(allocator, "get_all_free_pages"):
        return allocator.get_all_free_pages().tolist()
    return allocator.free_pages.tolist() + allocator.release_pages.tolist()


# -- HiCache (himamba host=1) ------------------------------------------------------------------
# 0.5.10.post1 (``.venv-upstream-0.5.10.post1/lib/python3.11/site-packages/sglang/srt/``, "the
# wheel" below) has the same ``HiMambaRadixCache``/``HybridCacheController`` protocol as
# 0.5.12.post1; three helpers it builds them from sit elsewhere or do not exist yet.

def hicache_pool_entry(version: str, *, name, host_pool, device_pool, layer: int,
                       transfer_layer_num: int, is_anchor: bool = False,
                       host_evict_fn=None, device_evict_fn=None):
    """One ``HostPoolGroup`` entry mapping transfer layer ``layer`` to the pool's layer 0.
    0.5.12.post1 on: ``hybrid_cache/hybrid_pool_assembler.build_pool_entry`` (a
    ``layer_mapping`` dict); 0.5.10.post1 has no assembler: ``HiMambaRadixCache.__init__``
    builds ``memory_pool_host.PoolEntry`` itself with a ``layer_mapper`` function and
    ``is_primary_index_anchor`` (the wheel's ``mem_cache/hi_mamba_radix_cache.py`` 146-173,
    ``mem_cache/memory_pool_host.py`` 1592-1603)."""
    if version == "0.5.10.post1":
        from sglang.srt.mem_cache.memory_pool_host import PoolEntry

        def mapper(layer_id: int):
            return 0 if layer_id == layer and 0 <= layer_id < transfer_layer_num else None

        return PoolEntry(name=name, host_pool=host_pool, device_pool=device_pool,
                         layer_mapper=mapper, is_primary_index_anchor=is_anchor,
                         host_evict_fn=host_evict_fn, device_evict_fn=device_evict_fn)
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_pool_entry

    return build_pool_entry(name=name, host_pool=host_pool, device_pool=device_pool,
                            layer_mapping={layer: 0}, transfer_layer_num=transfer_layer_num,
                            is_anchor=is_anchor, host_evict_fn=host_evict_fn,
                            device_evict_fn=device_evict_fn)


def hicache_hash_str(version: str):
    """The storage key chain ``get_hash_str``: ``mem_cache/utils.py`` from 0.5.12.post1 on,
    ``mem_cache/hicache_storage.py`` 17 on 0.5.10.post1."""
    if version == "0.5.10.post1":
        from sglang.srt.mem_cache.hicache_storage import get_hash_str
    else:
        from sglang.srt.mem_cache.utils import get_hash_str
    return get_hash_str


def hicache_prefetch_timeout(version: str, tree, page_size: int) -> None:
    """Give ``tree`` the prefetch timeout its ``_prefetch_timeout_check_linear_func`` reads,
    with upstream's defaults.  0.5.12.post1 on: one ``hicache_storage.PrefetchTimeoutConfig``;
    0.5.10.post1: two attributes set by ``_apply_storage_runtime_config`` (the wheel's
    ``mem_cache/hi_mamba_radix_cache.py`` 1301-1303 and 1320-1321; defaults 1 s and 0.25 s per
    1024 tokens, 1598-1600)."""
    if version == "0.5.10.post1":
        tree.prefetch_timeout_base = 1
        tree.prefetch_timeout_per_page = page_size / 1024 * 0.25
        return
    from sglang.srt.mem_cache.hicache_storage import PrefetchTimeoutConfig

    tree.prefetch_timeout_config = PrefetchTimeoutConfig()


def init_load_back_params(version: str, node, host_hit_length: int):
    """``InitLoadBackParams`` for a load back of ``node`` as the scheduler builds them (no memory
    quota, no request).  0.5.12.post1 names the node ``best_match_node``; 0.5.10.post1
    ``last_host_node`` (the wheel's ``mem_cache/base_prefix_cache.py`` 114-120, filled by
    ``managers/schedule_policy.py`` 776)."""
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

    if version == "0.5.10.post1":
        return InitLoadBackParams(last_host_node=node, host_hit_length=host_hit_length)
    return InitLoadBackParams(best_match_node=node, host_hit_length=host_hit_length)


def mamba_match_best_node(result):
    """The node a ``MambaRadixCache.match_prefix`` result resumes from (the deepest matched node
    with a mamba state).  0.5.12.post1 names it ``best_match_node`` (the same node as
    ``last_device_node``); 0.5.10.post1's ``MatchResult`` has no such field and returns that
    node as ``last_device_node`` (the wheel's ``mem_cache/mamba_radix_cache.py`` 1074-1079)."""
    return getattr(result, "best_match_node", result.last_device_node)
