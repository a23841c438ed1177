"""The one failure type every invariant raises: which property broke, where, with the numbers."""

from __future__ import annotations


class Violation(AssertionError):
    """A broken property.

    ``prop`` is the property's stable id (``ref-balance``, ``conservation``, ...), one of
    the list in ``invariants/properties.py``; ``where`` names the node/page/request;
    ``details`` carries the numbers.
    """

    def __init__(self, prop: str, message: str, **details):
        self.prop = prop
        self.message = message
        self.details = details
        super().__init__(f"[{prop}] {message}")

    def to_json(self) -> dict:
        return {"property": self.prop, "message": self.message,
                "details": {k: _plain(v) for k, v in self.details.items()}}


def _plain(v):
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_plain(x) for x in (sorted(v) if isinstance(v, (set, frozenset)) else v)]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return repr(v)


def fail(prop: str, message: str, **details):
    raise Violation(prop, message, **details)
