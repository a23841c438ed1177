"""The fault catalog as code: each catalogued defect (``docs/faults.md``) is a small, named
mutation of a clean cache.

A fault is a subclass of the clean reference cache that overrides the one method the defect
lives in, registered with its catalog id, its catalogue name, the variant, the upstream it
comes from, and the property the harness must report when it catches it.  The clean caches
never know about faults.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Mapping

# one module per variant; each registers its faults when imported (a module not written yet
# is skipped; any other import error propagates)
_MODULES = ("caches.faults.radix", "caches.faults.paged_bigpage",
            "caches.faults.streaming_session", "caches.faults.himamba",
            "caches.faults.continuation_state", "caches.faults.block_hash",
            "caches.faults.hybrid_swa", "caches.faults.hangs")


@dataclass(frozen=True)
class Fault:
    id: str  # catalog id: "R1"
    name: str  # catalog name: "add-leaf-subtracts-parent"
    variant: str
    summary: str
    upstream: str
    properties: tuple  # property ids that count as catching it
    cls: type  # the mutated cache class
    params: Mapping[str, object] = field(default_factory=dict)  # regime it needs, if any


_REGISTRY: dict[str, Fault] = {}


def fault(fid: str, name: str, *, variant: str, summary: str, upstream: str,
          properties: tuple, params: Mapping[str, object] | None = None):
    """Class decorator: register ``cls`` as fault ``fid``."""

    def register(cls):
        _REGISTRY[fid] = Fault(fid, name, variant, summary, upstream, tuple(properties), cls,
                               dict(params or {}))
        cls.fault_id = fid
        return cls

    return register


def all_faults() -> dict[str, Fault]:
    for mod in _MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise
    return dict(_REGISTRY)


def faults_of(variant: str) -> list[Fault]:
    return sorted((f for f in all_faults().values() if f.variant == variant),
                  key=lambda f: (len(f.id), f.id))


def get_fault(fid: str) -> Fault:
    faults = all_faults()
    if fid not in faults:
        raise KeyError(f"unknown fault id {fid!r}; known: {', '.join(sorted(faults))}")
    return faults[fid]
