"""Invariants: pure functions of plain views that raise a ``Violation`` naming the property.

Property ids are stable; every one is on the list in ``invariants/properties.py`` (name,
one-line meaning, the variants that check it), which ``docs/properties.md`` shows.
"""

from .conservation import check_conservation, check_held_once
from .integrity import check_fingerprints
from .quiescence import check_quiescence
from .refs import check_ref_balance, expected_refs
from .sizes import check_size_accounting
from .structure import check_eviction_set, check_structure, child_key, evictable_leaves
from .violation import Violation, fail
from .views import NodeView, PoolView, TreeView

__all__ = [
    "NodeView", "PoolView", "TreeView", "Violation", "fail",
    "check_conservation", "check_eviction_set", "check_fingerprints", "check_held_once",
    "check_quiescence",
    "check_ref_balance", "check_size_accounting", "check_structure", "child_key",
    "evictable_leaves", "expected_refs",
]
