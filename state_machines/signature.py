"""A failure's signature: the broken property, the op it broke at, and the violation's message
with every number and token list masked -- two failures with one signature are one bug.

It sits below the machine (``machine.py`` signs the failures it tolerates) and imports nothing
of kvcheck's, so the ledger in ``failures.py`` (which replays traces, and so reaches every
variant) is not needed to sign one.  ``failures.py`` re-exports both names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LISTS = re.compile(r"\[[^\[\]]*\]|\([^()]*\)|\{[^{}]*\}")
_NUMBERS = re.compile(r"-?\d+(\.\d+)?")


def mask(message: str) -> str:
    """The message with token lists, tuples, sets and numbers (ids, counts, slots) masked."""
    return _NUMBERS.sub("#", _LISTS.sub("[..]", message)).strip()


@dataclass(frozen=True)
class Signature:
    prop: str
    op: str
    message: str  # masked

    def __str__(self) -> str:
        return f"{self.prop} @ {self.op}: {self.message}"

    @classmethod
    def of(cls, prop: str, op: str, message: str) -> "Signature":
        return cls(prop, op, mask(message))

    @classmethod
    def of_trace(cls, trace) -> "Signature | None":
        v = trace.violation
        if v is None:
            return None
        step = v.get("step") or len(trace.ops)
        op = trace.ops[step - 1].name if 0 < step <= len(trace.ops) else "?"
        return cls.of(v["property"], op, v.get("message", ""))

    def to_json(self) -> dict:
        return {"property": self.prop, "op": self.op, "message": self.message}

    @classmethod
    def from_json(cls, raw: dict) -> "Signature":
        return cls(raw["property"], raw["op"], raw["message"])
