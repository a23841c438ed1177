"""Adapters: real upstream caches behind the subject interface our machines drive.

One package per engine (``caches/adapters/sglang/``: a loader with every import shim, one
adapter module per variant, and the upstream form of catalogued faults).  ``docs/adapters.md``
says how to wrap your own cache.
"""

from contextlib import contextmanager

from caches.subjects.base import Skip


class KnownUpstreamFinding(Skip):
    """An op an upstream subject declines because it would only re-find a recorded upstream
    defect (``tests/upstream_findings/``); the op is a no-op, so the rest of the run goes on
    looking for new ones.  The differential engine skips it on both sides."""


_reproducing = False


@contextmanager
def reproducing_known_findings():
    """Within it, upstream subjects built do not decline the ops that re-find recorded
    findings: replaying a finding's own trace (``kvcheck gate``, ``kvcheck replay``, the
    generated tests) must reproduce the defect, not skip past it."""
    global _reproducing
    old, _reproducing = _reproducing, True
    try:
        yield
    finally:
        _reproducing = old


def declines_known_findings(option: bool | None = None) -> bool:
    """An upstream subject's ``skip_known_findings`` option resolved: the explicit choice, else
    decline unless inside ``reproducing_known_findings()``."""
    return (not _reproducing) if option is None else option
