"""Target ``pymllm``: pymllm's real ``RadixCache`` from a source checkout (``--src PATH``: the
root of a UbiquitousLearning/mllm checkout, holding ``pymllm/`` and ``mllm-kernel/``).

| variant | pymllm class | adapter |
|---|---|---|
| radix | ``pymllm.mem_cache.radix_cache.RadixCache`` | ``radix.py`` |

``MambaRadixCache`` (the himamba variant with host=0 would fit) is not wired yet.
``unavailable(src)`` only checks the layout and imports the modules (a missing environment);
it never builds a subject.  Identity: the checkout's git commit when ``src`` is a git checkout,
else a content hash of the cache modules (the test snapshots are plain folders).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from caches.target import DECLINE, Identity, Target, finds, source_identity


# the known upstream findings each variant's subject declines (tests/upstream_findings/)
FINDINGS = {"radix": ("R1", "R2", "F1")}


def _radix(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.pymllm.radix import make_subject

    return make_subject(params, fault=fault, device=device, src=src,
                        skip_known_findings=[i for i in FINDINGS["radix"]
                                             if not finds(known_findings, i)])


def _unavailable(src=None):
    from caches.adapters.pymllm import loader

    return loader.unavailable_reason(src)


@lru_cache(maxsize=8)
def _identify(src=None) -> Identity:
    from caches.adapters.pymllm import loader

    if src is None:
        return Identity("pymllm", "", "unknown:")
    files = [Path(src) / f for f in loader.SOURCE_FILES]
    return Identity("pymllm", "", source_identity(src, files))


TARGET = Target(
    name="pymllm", engine="pymllm",
    summary="pymllm's real RadixCache (UbiquitousLearning/mllm) from a source checkout",
    builders={"radix": _radix}, findings=FINDINGS,
    unavailable=_unavailable, identify=_identify, takes_src=True,
    setup_hint="pass --src PATH (a checkout of UbiquitousLearning/mllm)")
