"""Shared helpers for the harness's own tests: run a fault once per session, list regimes."""

from __future__ import annotations

import functools

from caches.faults import all_faults
from state_machines.fuzz import fuzz
from state_machines.variants import all_variants, get_variant

MAX_SHRUNK_STEPS = 12


def all_regimes():
    """(variant, params) for every regime of every landed variant."""
    return [(spec.name, spec.check_params(r)) for spec in all_variants().values()
            for r in spec.regimes]


def landed_faults():
    variants = all_variants()
    return sorted((f for f in all_faults().values() if f.variant in variants),
                  key=lambda f: (f.variant, len(f.id), f.id))


@functools.lru_cache(maxsize=None)
def fault_outcome(fid: str):
    """Fuzz with fault ``fid`` on (derandomised, ci profile); cached within a process."""
    f = all_faults()[fid]
    spec = get_variant(f.variant)
    params = spec.check_params({**spec.regimes[0], **f.params})
    return fuzz(spec, params, fault=fid)
