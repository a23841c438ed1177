"""Faults on TokenSpeed's scheduler, injected at the event boundary.

The cache lives in compiled C++ (``tokenspeed_scheduler_ext``): nothing can be patched, and the
catalogued continuation-state faults C1-C5 (``docs/faults.md``) belong to the hybrid prefix
cache that 0.1.42's consolidated cache replaced (``docs/engines/tokenspeed.md`` says what is
left of each), so they are refused.  What can be injected is a runtime that feeds the scheduler wrong events
(``continuation_state.py``):

| id | fault | caught on |
|---|---|---|
| B1 | a ``Finish`` delivered twice (the length stop sent twice in one ``advance``) | nothing: the scheduler ignores the second one (tolerated) |
| B2 | a lost ``SnapshotDoneEvent`` (a retraction image never confirmed) | ``snapshot-balance`` |
| B3 | an ``ExtendResult`` with the wrong length (the last prefill chunk reports two tokens) | ``request-tokens`` |

They are not in kvcheck's fault catalogue (the CLI's ``--fault`` refuses them); the target's
builder takes them (``fault="B2"``), as the tests do.
"""

from __future__ import annotations

from caches.target import FaultNotInjectable

BOUNDARY = {
    "B1": "finish-twice: the runtime's length stop sends Finish twice in one advance",
    "B2": "lost-snapshot-done: a SnapshotOp's SnapshotDoneEvent is never delivered",
    "B3": "extend-wrong-length: an intermediate prefill chunk's ExtendResult carries a token",
}

CATALOGUE_NO_FORM = ("C1-C5 are faults of TokenSpeed's hybrid prefix cache, which the "
                     "compiled scheduler (tokenspeed_scheduler_ext) replaced and which cannot "
                     "be patched -- the tokenspeed target injects boundary faults B1-B3 "
                     "instead (docs/engines/tokenspeed.md)")


def boundary_fault_of(fault):
    """The builder's ``fault`` argument: None, or refused (catalogue faults have no form)."""
    if fault is None:
        return None
    if fault in BOUNDARY:
        return fault
    raise FaultNotInjectable(f"fault {fault}: {CATALOGUE_NO_FORM}")
