"""Target ``sglang``: SGLang's real KV-cache classes, registered like any plug-in
(``pyproject.toml``, entry-point group ``kvcheck.targets``).

| variant | SGLang class | adapter |
|---|---|---|
| radix | ``mem_cache.radix_cache.RadixCache`` | ``radix.py`` |
| himamba host=1 / host=0 | ``HiMambaRadixCache`` / ``MambaRadixCache`` | ``himamba.py`` / ``mamba.py`` |
| streaming-session | ``session.streaming_session.StreamingSession`` | ``streaming_session.py`` |

Adapters are imported only when a subject is built; ``unavailable`` only asks the loader
whether the pinned release imports here (a missing environment), never builds anything.
"""

from __future__ import annotations

from functools import lru_cache

from caches.target import DECLINE, FIND, Identity, Target, content_hash


def _options(known_findings):
    return {"skip_known_findings": known_findings != FIND}


def _radix(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.sglang.radix import make_subject

    return make_subject(params, fault=fault, device=device, **_options(known_findings))


def _himamba(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    if params["host"]:
        from caches.adapters.sglang.himamba import make_subject

        return make_subject(params, fault=fault, device=device, **_options(known_findings))
    from caches.adapters.sglang.mamba import make_subject  # no known findings on host=0

    return make_subject(params, fault=fault, device=device)


def _streaming_session(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.sglang.streaming_session import make_subject

    return make_subject(params, fault=fault, device=device, **_options(known_findings))


def _unavailable(src=None):
    from caches.adapters.sglang import loader

    return loader.unavailable_reason()


# the modules whose code the adapters drive: their bytes are the target's identity
_MODULES = ("sglang.srt.mem_cache.radix_cache", "sglang.srt.mem_cache.mamba_radix_cache",
            "sglang.srt.mem_cache.hi_mamba_radix_cache", "sglang.srt.mem_cache.allocator",
            "sglang.srt.mem_cache.memory_pool", "sglang.srt.mem_cache.common",
            "sglang.srt.session.streaming_session", "sglang.srt.session.session_controller")


@lru_cache(maxsize=1)
def _identify(src=None) -> Identity:
    import importlib.util

    from caches.adapters.sglang import loader

    ns = loader.require()
    files = []
    for mod in _MODULES:
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            files.append(spec.origin)
    return Identity("sglang", ns.version, content_hash(files))


TARGET = Target(
    name="sglang", engine="sglang",
    summary="SGLang's real RadixCache, (Hi)MambaRadixCache and StreamingSession "
            "(the pinned release in ci/upstream/sglang.txt)",
    builders={"radix": _radix, "himamba": _himamba, "streaming-session": _streaming_session},
    unavailable=_unavailable, identify=_identify,
    setup_hint="bash ci/upstream/setup.sh, then run with .venv-upstream/bin/kvcheck")
