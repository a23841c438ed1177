"""Target ``lightllm``: LightLLM's real ``LinearAttPagedRadixCache`` from a source checkout
(``--src PATH``), registered like any plug-in (``pyproject.toml``, entry-point group
``kvcheck.targets``).

| variant | LightLLM class | adapter |
|---|---|---|
| paged-bigpage | ``server/router/dynamic_prompt/linear_att_radix_cache.LinearAttPagedRadixCache`` | ``paged_bigpage.py`` |

The adapter is imported only when a subject is built; ``unavailable`` asks the loader whether
the checkout imports here (a missing environment), never builds anything.

Known findings: with ``--known-findings decline`` (default) the adapter compensates the root
ref LightLLM keeps at the miss / trim / deref exits (L2-L4: every first admission misses, so
no op can be declined without starving the run); ``find`` leaves it (``paged_bigpage.py``).
"""

from __future__ import annotations

from functools import lru_cache

from caches.target import DECLINE, Identity, Target, finds, source_identity


def _paged_bigpage(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.lightllm.paged_bigpage import KNOWN, make_subject

    return make_subject(params, src=src, fault=fault, device=device,
                        compensate=tuple(where for where, fid in KNOWN.items()
                                         if not finds(known_findings, fid)))


def _unavailable(src=None):
    from caches.adapters.lightllm import loader

    return loader.unavailable_reason(src)


@lru_cache(maxsize=None)
def _identify(src=None) -> Identity:
    from caches.adapters.lightllm import loader

    if src is None:
        return Identity("lightllm", "", "unknown:")
    return Identity("lightllm", "", source_identity(src, loader.require(src).files))


TARGET = Target(
    name="lightllm", engine="lightllm",
    summary="LightLLM's real LinearAttPagedRadixCache from a source checkout (--src PATH)",
    builders={"paged-bigpage": _paged_bigpage},
    findings={"paged-bigpage": ("L2", "L3", "L4")},  # paged_bigpage.KNOWN's ids
    unavailable=_unavailable, identify=_identify, takes_src=True,
    setup_hint="pip install 'kvcheck[engines]', then pass --src PATH to a LightLLM checkout")
