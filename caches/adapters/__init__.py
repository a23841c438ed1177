"""Adapters: real upstream caches behind the subject interface our machines drive.

One package per engine (``caches/adapters/sglang/``: a loader with every import shim, one
adapter module per variant, and the upstream form of catalogued faults).  ``docs/adapters.md``
says how to wrap your own cache.
"""

from caches.subjects.base import Skip


class KnownUpstreamFinding(Skip):
    """An op an upstream subject declines because it would only re-find a recorded upstream
    defect (``tests/upstream_findings/``); the op is a no-op, so the rest of the run goes on
    looking for new ones.  The differential engine skips it on both sides."""


def declined_findings(option, ids) -> frozenset:
    """The ids (of ``ids``, a subject's known findings) an upstream subject declines, from its
    ``skip_known_findings`` option: None or True -> all, False -> none, a collection -> those
    (the target passes the ones ``--known-findings`` does not drive)."""
    if option is None or option is True:
        return frozenset(ids)
    if option is False:
        return frozenset()
    return frozenset(option) & frozenset(ids)


def declines_known_findings(option: bool | None = None) -> bool:
    """An upstream subject's ``skip_known_findings`` option resolved: decline unless told not
    to (the target passes ``--known-findings``: decline -> True, find -> False)."""
    return True if option is None else bool(option)
