"""Invariants: pure functions of plain views that raise a ``Violation`` naming the property.

Property ids (stable; FAULTS.md and reports use them): ``ref-balance``, ``conservation``,
``size-accounting``, ``structure``, ``eviction-set``, ``data-integrity``, ``quiescence``,
``progress``, ``match-contract``, ``admission-sound`` (a batch the scheduler's budget admitted
must run its next step: ``caches/subjects/radix.py``), ``hash-map`` (block caches, ``invariants/blocks.py``), and
``crash`` for an exception raised by the cache itself; the policy properties ``victim``,
``spurious-oom``, ``over-eviction``, ``recency``, ``lru-order`` (``invariants/policy.py``).
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
