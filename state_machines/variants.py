"""The variant registry: one ``VariantSpec`` per cache variant, found by name.

Each variant module (``state_machines/<variant>.py``) declares its ``SPEC``
(``state_machines/spec.py``: op table, parameters, regimes, machine); this module imports
them and nothing imports it back.  A new variant is one import and one entry in ``SPECS``.
Subjects are built by the targets (``caches/adapters/<engine>/target.py``; kvcheck's own
models: ``caches/adapters/reference/target.py``).
"""

from __future__ import annotations

from caches.adapters.reference.target import TARGET as REFERENCE  # noqa: F401  (the old path)
from state_machines import (block_hash, continuation_state, himamba, hybrid_swa,
                            paged_bigpage, radix, streaming_session)
from state_machines.spec import Param, VariantSpec  # noqa: F401  (re-exported)

SPECS = {m.SPEC.name: m.SPEC for m in (radix, paged_bigpage, streaming_session, himamba,
                                       continuation_state, block_hash, hybrid_swa)}


def all_variants() -> dict[str, VariantSpec]:
    return dict(SPECS)


def get_variant(name: str) -> VariantSpec:
    if name not in SPECS:
        raise KeyError(f"unknown variant {name!r}; known: {', '.join(SPECS)}")
    return SPECS[name]
