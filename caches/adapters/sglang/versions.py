"""Which SGLang release is installed, and what kvcheck drives on it -- the one place where the
adapters' version differences live (no copies of adapters per release).

One environment per release (``ci/upstream/setup.sh [VERSION]``): ``.venv-upstream`` holds the
newest pinned release, ``.venv-upstream-VERSION`` a historical one.  The adapters ask this
module, never ``sglang.__version__`` directly:

| release | radix (``sglang`` / ``sglang-rust``) | himamba | streaming-session |
|---|---|---|---|
| 0.5.23 (newest) | ``UnifiedRadixCache`` (Full), Python / Rust tree core (``unified_radix.py``); the plain ``RadixCache`` as ``sglang-radixcache`` | ``UnifiedRadixCache`` (Full + Mamba), both cores: host=0 (``unified_mamba.py``), host=1 storage=0 with HiCache (``unified_hicache.py``); storage=1 refused (``himamba_host_unsupported``) | ``UnifiedRadixCache``'s ``StreamingSession``, both cores (``unified_streaming_session.py``) |
| 0.5.12.post1 (historical) | ``RadixCache`` (``radix.py``) / -- | ``(Hi)MambaRadixCache`` | ``StreamingSession`` |
| 0.5.10.post1 (historical) | ``RadixCache`` (``radix.py``) / -- | not driven | ``SessionAwareCache`` (``streaming_session.py``) |

0.5.10.post1 runs the 0.5.12.post1 adapters unpatched through the shims below (request rows
from 0, ``insert`` leaving key alignment to its callers, the streaming wrapper's module and
class names, no ``try_match_prefix``).  Its HiCache modules differ too much for one-line shims
(no ``hybrid_pool_assembler``, ``get_hash_str`` and ``PrefetchTimeoutConfig`` elsewhere or
absent), so himamba is not driven there.

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
    ("0.5.23", "sglang"): ("radix", "himamba", "streaming-session"),
    ("0.5.23", "sglang-rust"): ("radix", "himamba", "streaming-session"),
    ("0.5.23", "sglang-radixcache"): ("radix",),
    ("0.5.12.post1", "sglang"): ("radix", "himamba", "streaming-session"),
    ("0.5.10.post1", "sglang"): ("radix", "streaming-session"),
}


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
    return f"target {target!r} drives {variant!r} on sglang {', '.join(where) or 'no release'}, " \
           f"not on the installed {version}{hint}"


def himamba_host_unsupported(version: str, params) -> str | None:
    """Why himamba ``params`` cannot run on ``version`` (None when they can): on 0.5.23 the
    HiCache tier (``host=1``) is driven without a storage backend only (``storage=0``,
    ``unified_hicache.py``); its storage (L3) pipeline has no stand-in yet."""
    if unified(version) and params.get("host", 1) and params.get("storage", 1):  # defaults
        return f"himamba host=1 storage=1 (HiCache with an L3 storage backend) is not " \
               f"ported to sglang {version}'s UnifiedRadixCache (its storage threads and " \
               f"backend have no kvcheck stand-in yet); use --param storage=0, or storage=1 " \
               f"on sglang 0.5.12.post1: {setup_hint('0.5.12.post1')}"
    return None


def reserved_request_rows(version: str) -> tuple:
    """The ``ReqToTokenPool`` rows never handed out: from 0.5.12.post1 on row 0 is a padding
    row (rows ``1..size``); 0.5.10.post1 hands out ``0..size-1``."""
    return () if version == "0.5.10.post1" else (0,)


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
