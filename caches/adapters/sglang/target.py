"""Target ``sglang``: SGLang's real KV-cache classes, registered like any plug-in
(``pyproject.toml``, entry-point group ``kvcheck.targets``).

| variant | SGLang class | adapter |
|---|---|---|
| radix (0.5.23) | ``mem_cache.unified_radix_cache.UnifiedRadixCache`` (Full), Python tree core | ``unified_radix.py`` |
| radix (0.5.12.post1) | ``mem_cache.radix_cache.RadixCache`` | ``radix.py`` |
| himamba host=0 (0.5.23) | ``UnifiedRadixCache`` (Full + Mamba), Python tree core | ``unified_mamba.py`` |
| himamba host=1 (0.5.23) | the same with HiCache (``init_hicache``, ``HybridCacheController``; storage=1: its L3 backend and storage threads' bodies, ``unified_storage.py``) | ``unified_hicache.py`` |
| himamba host=1 / host=0 (0.5.12.post1) | ``HiMambaRadixCache`` / ``MambaRadixCache`` | ``himamba.py`` / ``mamba.py`` |
| streaming-session (0.5.23) | ``UnifiedRadixCache`` + its ``StreamingSession``, Python tree core | ``unified_streaming_session.py`` |
| streaming-session (0.5.12.post1) | ``session.streaming_session.StreamingSession`` | ``streaming_session.py`` |
| hybrid-swa (0.5.23) | ``UnifiedRadixCache`` (Full + SWA) over ``SWATokenToKVPoolAllocator``, Python tree core | ``unified_swa.py`` |
| hybrid-swa mamba=1 (0.5.23) | the same with the Mamba component (Full + SWA + Mamba) and ``HybridReqToTokenPool`` | ``unified_swa_mamba.py`` |

Target ``sglang-rust`` (``TARGET_RUST``): radix, himamba (host=0; host=1, storage 0 and 1),
streaming-session and hybrid-swa on 0.5.23's
``UnifiedRadixCache`` over the Rust tree core.  Which release drives which variant is ``versions.py``'s table; a variant the
installed release lacks is ``TargetUnavailable`` naming the env to build.

Adapters are imported only when a subject is built; ``unavailable`` only asks the loader
whether the pinned release imports here (a missing environment), never builds anything.
"""

from __future__ import annotations

from functools import lru_cache

from caches.adapters.sglang import versions
from caches.target import DECLINE, Identity, Param, Target, finds

# the known upstream findings each variant's subjects decline, over every pinned release
# (``versions.KNOWN_FINDINGS``; tests/upstream_findings/): what ``--known-findings find=ID``
# accepts -- a subject declines only those of the release it loaded
FINDINGS = versions.findings_by_variant()


def _options(known_findings, variant="radix"):
    """The subjects' ``skip_known_findings``: the ids of ``variant``'s findings not driven."""
    return {"skip_known_findings": [i for i in FINDINGS[variant]
                                    if not finds(known_findings, i)]}


def _radix(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.sglang import loader, versions

    ns = loader.require_variant("sglang", "radix", src)
    if versions.unified(ns.release):
        from caches.adapters.sglang.unified_radix import make_subject

        return make_subject(params, fault=fault, device=device, core="python",
                            **_options(known_findings))
    from caches.adapters.sglang.radix import make_subject

    return make_subject(params, fault=fault, device=device, **_options(known_findings))


def _radix_rust(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.sglang import loader
    from caches.adapters.sglang.unified_radix import make_subject

    loader.require_variant("sglang-rust", "radix", src)
    return make_subject(params, fault=fault, device=device, core="rust",
                        **_options(known_findings))


def _radixcache(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.sglang import loader
    from caches.adapters.sglang.unified_radix import make_subject

    loader.require_variant("sglang-radixcache", "radix", src)
    return make_subject(params, fault=fault, device=device, core="radixcache",
                        **_options(known_findings))


def _himamba(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.sglang import loader, versions

    ns = loader.require_variant("sglang", "himamba", src)
    if versions.unified(ns.release):
        return _himamba_unified(params, fault, device, "python", known_findings)
    if params["host"]:
        from caches.adapters.sglang.himamba import make_subject

        return make_subject(params, fault=fault, device=device, **_options(known_findings, 'himamba'))
    from caches.adapters.sglang.mamba import make_subject  # no known findings on host=0

    return make_subject(params, fault=fault, device=device)


def _himamba_rust(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.sglang import loader

    ns = loader.require_variant("sglang-rust", "himamba", src)
    return _himamba_unified(params, fault, device, "rust", known_findings)


def _himamba_unified(params, fault, device, core, known_findings):
    """0.5.23: ``UnifiedRadixCache`` (Full + Mamba) at host=0, with HiCache at host=1 (with
    its L3 storage backend at storage=1), where it declines the known findings
    ``--known-findings`` does not drive (F7)."""
    if params["host"]:
        from caches.adapters.sglang.unified_hicache import make_subject

        return make_subject(params, fault=fault, device=device, core=core,
                            **_options(known_findings, "himamba"))
    from caches.adapters.sglang.unified_mamba import make_subject  # no known finding at host=0

    return make_subject(params, fault=fault, device=device, core=core)


def _streaming_session(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.sglang import loader, versions

    ns = loader.require_variant("sglang", "streaming-session", src)
    if versions.unified(ns.release):
        from caches.adapters.sglang.unified_streaming_session import make_subject

        return make_subject(params, fault=fault, device=device, core="python",
                            **_options(known_findings, 'streaming-session'))
    from caches.adapters.sglang.streaming_session import make_subject

    return make_subject(params, fault=fault, device=device, **_options(known_findings, 'streaming-session'))


def _streaming_session_rust(params, *, fault=None, device=None, src=None,
                            known_findings=DECLINE):
    from caches.adapters.sglang import loader
    from caches.adapters.sglang.unified_streaming_session import make_subject

    loader.require_variant("sglang-rust", "streaming-session", src)
    return make_subject(params, fault=fault, device=device, core="rust",
                        **_options(known_findings, 'streaming-session'))


def _hybrid_swa(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    """0.5.23: ``UnifiedRadixCache`` (Full + SWA) on the Python tree core
    (``unified_swa.py``).  No known finding of its own; the unmatched unlock is declined as on
    radix (``UnifiedRadixSubject.stray_unlock``: both cores refuse it)."""
    from caches.adapters.sglang import loader

    loader.require_variant("sglang", "hybrid-swa", src)
    return _hybrid_swa_subject(params, fault, device, "python")


def _hybrid_swa_rust(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.sglang import loader

    loader.require_variant("sglang-rust", "hybrid-swa", src)
    return _hybrid_swa_subject(params, fault, device, "rust")


def _hybrid_swa_subject(params, fault, device, core):
    """``mamba=1``: Full + SWA + Mamba (``unified_swa_mamba.py``); else Full + SWA."""
    if params.get("mamba"):
        from caches.adapters.sglang.unified_swa_mamba import make_subject
    else:
        from caches.adapters.sglang.unified_swa import make_subject
    return make_subject(params, fault=fault, device=device, core=core)


def _unavailable(src=None):
    from caches.adapters.sglang import loader

    return loader.use(src) or loader.unavailable_reason()


def _unavailable_rust(src=None):
    """As ``_unavailable``, and the Rust tree core must be built (a checkout has none)."""
    from caches.adapters.sglang import loader

    return _unavailable(src) or loader.rust_core_unavailable()


def _params_unavailable(variant, params):
    """(The SGLang the last ``loader.use`` chose: the CLI asks after the target-level check.)"""
    from caches.adapters.sglang import loader, versions

    if variant == "hybrid-swa" and params.get("mamba") and params["page_size"] != 1:
        return ("hybrid-swa mamba=1 runs at page_size 1 only: without the extra buffer "
                "SGLang's Mamba component asserts page 1 (unified_swa_mamba.py)")
    if variant != "himamba" or loader.unavailable_reason() is not None:
        return None
    return versions.himamba_host_unsupported(loader.load().release, params)


def _variant_unavailable(target):
    def why(variant, src=None):
        from caches.adapters.sglang import loader, versions

        if _unavailable(src) is not None:
            return None  # the target-level reason says it
        return versions.variant_unsupported(loader.load().version, target, variant)
    return why


# the code the adapters drive, whose bytes are the target's identity: every module of SGLang's
# KV-cache and session packages (allocators, pools, radix caches, the unified tree core and its
# components, the Rust core's Python side), and the request class the session paths call
_PACKAGES = ("sglang/srt/mem_cache", "sglang/srt/session")
_FILES = ("sglang/srt/managers/schedule_batch.py",)


def _loaded_files(ns, suffixes=(".py",)) -> list:
    """The files of ``_PACKAGES`` (recursively) and ``_FILES`` in the driven SGLang."""
    from pathlib import Path

    base = Path(ns.sglang_file).resolve().parent.parent  # the folder holding sglang/
    files = [p for pkg in _PACKAGES for p in (base / pkg).rglob("*")
             if p.suffix in suffixes and "__pycache__" not in p.parts]
    return sorted(files + [base / f for f in _FILES if (base / f).exists()])


def _identity(src, suffixes) -> Identity:
    from caches.adapters.sglang import loader
    from caches.target import source_identity

    why = loader.use(src)
    if why:
        raise ImportError(why)
    ns = loader.require()
    return Identity("sglang", ns.version, source_identity(src, _loaded_files(ns, suffixes)),
                    note=ns.note or "")


@lru_cache(maxsize=None)
def _identify(src=None) -> Identity:
    return _identity(src, (".py",))


@lru_cache(maxsize=None)
def _identify_rust(src=None) -> Identity:
    """The Python tree core's files and the compiled Rust core (the ``.so`` is the code run)."""
    return _identity(src, (".py", ".so"))


# himamba's regimes on SGLang: the variant's own three (state_machines/himamba.py SPEC: two at
# host=1 storage=1), and two small-pool host=1 ones.  One at storage=0, where the device KV is
# short enough that the tree calls a load-back off (3 KV slots: the ci profile's examples reach
# it; at 4-6 they did not) (``UnifiedRadixCache.load_back`` returns False after too little
# eviction): what ``MambaComponent.finalize_load_back`` must then give back (SGLang PR #30986) is
# checked only where that happens (unified_hicache.py, ``_check_called_off_load_backs``).  One
# at storage=1 with host pools one slot above the device ones, where host writes, load-backs and
# the staging of a prefetch hit fail (``_called_off_storage`` checks each refused or aborted
# prefetch).  And one under write_back (policy=2) with host pools smaller than the device ones,
# where a write-back backup fails and the eviction drops the subtree or keeps the leaf (SGLang
# PR #27108; older releases refuse such pools, ``versions.himamba_host_unsupported``).
HIMAMBA_REGIMES = ({"policy": 0}, {"policy": 1}, {"host": 0, "kv_slots": 6, "mamba_slots": 6},
                   {"policy": 0, "storage": 0, "kv_slots": 3, "mamba_slots": 6},
                   {"policy": 0, "storage": 1, "kv_slots": 3, "mamba_slots": 6,
                    "host_kv_slots": 4, "host_mamba_slots": 7},
                   {"policy": 2, "storage": 0, "kv_slots": 6, "mamba_slots": 4,
                    "host_kv_slots": 3, "host_mamba_slots": 2})

# hybrid-swa's target-only parameters: ``mamba=1`` adds the Mamba component (Full + SWA +
# Mamba, a hybrid model with mamba layers: ``unified_swa_mamba.py``), with ``mamba_slots`` state
# slots (the server runs mamba_slots // 3 requests); the reference takes neither.  Its regimes:
# the variant's, and one at mamba=1 (page 1, the variant's first regime's pools, two running
# requests by SGLang's own sizing rule, so the known finding F7's starvation cannot arise)
HYBRID_SWA_PARAMS = {"mamba": Param(0, 0, 1, "1: add the Mamba component (Full + SWA + Mamba)"),
                     "mamba_slots": Param(6, 3, 4096, "mamba state slots at mamba=1 "
                                                      "(mamba_slots // 3 running requests)")}
# (the first two are the variant's own, state_machines/hybrid_swa.py: tests/upstream/
# test_sglang_unified_swa_mamba.py keeps them equal)
HYBRID_SWA_REGIMES = ({"page_size": 1, "pool_pages": 24, "swa_pages": 10, "window": 2},
                      {"page_size": 2, "pool_pages": 14, "swa_pages": 7, "window": 3},
                      {"page_size": 1, "pool_pages": 24, "swa_pages": 10, "window": 2,
                       "mamba": 1, "mamba_slots": 6})

_SETUP = ("bash ci/upstream/setup.sh, then run with .venv-upstream/bin/kvcheck (or --src "
          "CHECKOUT: an SGLang checkout's python/ over that env)")

TARGET = Target(
    name="sglang", engine="sglang",
    summary="SGLang's real RadixCache, (Hi)MambaRadixCache and StreamingSession, and "
            "0.5.23's UnifiedRadixCache with the SWA component (the pinned release in "
            "ci/upstream/sglang.txt)",
    builders={"radix": _radix, "himamba": _himamba, "streaming-session": _streaming_session,
              "hybrid-swa": _hybrid_swa},
    findings=FINDINGS,
    unavailable=_unavailable, identify=_identify, takes_src=True, src_optional=True,
    variant_unavailable=_variant_unavailable("sglang"), params_unavailable=_params_unavailable,
    regimes={"himamba": HIMAMBA_REGIMES, "hybrid-swa": HYBRID_SWA_REGIMES},
    params={"hybrid-swa": HYBRID_SWA_PARAMS},
    setup_hint=_SETUP)


TARGET_RUST = Target(
    name="sglang-rust", engine="sglang",
    summary="SGLang 0.5.23's UnifiedRadixCache (Full; Full + Mamba, with HiCache and its L3 "
            "storage at himamba host=1; Full + SWA) and its StreamingSession "
            "over its Rust tree core (rust_tree_core, the compiled extension in the x86_64 "
            "wheel)",
    builders={"radix": _radix_rust, "himamba": _himamba_rust,
              "streaming-session": _streaming_session_rust, "hybrid-swa": _hybrid_swa_rust},
    findings={v: versions.known_findings(versions.NEWEST, v)
              for v in ("radix", "streaming-session", "himamba")},
    unavailable=_unavailable_rust, identify=_identify_rust, takes_src=True,
    src_optional=True,
    variant_unavailable=_variant_unavailable("sglang-rust"), params_unavailable=_params_unavailable,
    regimes={"himamba": HIMAMBA_REGIMES, "hybrid-swa": HYBRID_SWA_REGIMES},
    params={"hybrid-swa": HYBRID_SWA_PARAMS},
    setup_hint=_SETUP)


TARGET_RADIXCACHE = Target(
    name="sglang-radixcache", engine="sglang",
    summary="SGLang 0.5.23's plain RadixCache (still shipped: the base of PureSWARadixCache "
            "and FlexKVRadixCache), with 0.5.23's request path",
    builders={"radix": _radixcache}, findings={"radix": FINDINGS["radix"]},
    unavailable=_unavailable, identify=_identify, takes_src=True, src_optional=True,
    variant_unavailable=_variant_unavailable("sglang-radixcache"),
    setup_hint=_SETUP)
