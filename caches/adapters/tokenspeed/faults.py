"""Faults on TokenSpeed's scheduler, injected at the event boundary.

The cache lives in compiled C++ (``tokenspeed_scheduler_ext``): nothing can be patched, so the
catalogued continuation-state faults C1-C5 (FAULTS.md) are refused here.  What can be
injected is a runtime that feeds the scheduler wrong events (``continuation_state.py``):

| id | fault | property it breaks |
|---|---|---|
| B1 | a ``Finish`` delivered twice (the length stop sent twice in one ``advance``) | see docs |
| B2 | a lost ``SnapshotDoneEvent`` (a retraction image never confirmed) | see docs |
| B3 | an ``ExtendResult`` with the wrong length (an intermediate prefill chunk reports a token) | see docs |
"""

from __future__ import annotations

from caches.target import FaultNotInjectable

BOUNDARY = {
    "B1": "finish-twice: the runtime's length stop sends Finish twice in one advance",
    "B2": "lost-snapshot-done: a SnapshotOp's SnapshotDoneEvent is never delivered",
    "B3": "extend-wrong-length: an intermediate prefill chunk's ExtendResult carries a token",
}

CATALOGUE_NO_FORM = ("C1-C5 live inside TokenSpeed's compiled hybrid prefix cache "
                     "(tokenspeed_scheduler_ext); a binary wheel cannot be patched -- the "
                     "tokenspeed target injects boundary faults B1-B3 instead (tests)")


def boundary_fault_of(fault):
    """The builder's ``fault`` argument: None, or refused (catalogue faults have no form)."""
    if fault is None:
        return None
    if fault in BOUNDARY:
        return fault
    raise FaultNotInjectable(f"fault {fault}: {CATALOGUE_NO_FORM}")
