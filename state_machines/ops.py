"""Serving operations as data.

An ``Op`` is a name plus JSON-able arguments; a variant's ``OpTable`` says which ops exist,
which arguments each takes (and their types), how to say it in plain words, and applies it by
calling the subject's method of the same name.  The Hypothesis machines, ``replay`` and the
exhaustive explorer all go through ``OpTable.apply``, so one trace means the same thing to each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from caches.subjects.base import Skip

# argument types an op may take; checked when a trace is loaded
INT, TOKENS = "int", "tokens"


@dataclass(frozen=True)
class Op:
    name: str
    args: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"op": self.name, **{k: (list(v) if isinstance(v, (list, tuple)) else v)
                                    for k, v in self.args.items()}}


@dataclass(frozen=True)
class OpSpec:
    name: str
    params: Mapping[str, str]  # argument -> INT | TOKENS
    words: str  # format string over the arguments, e.g. "admit r{rid} with {tokens}"


class OpError(ValueError):
    """An op that does not fit the variant's table (unknown name, missing or bad argument)."""


class OpTable:
    def __init__(self, *specs: OpSpec):
        self.specs = {s.name: s for s in specs}
        self.specs.setdefault("quiesce", OpSpec("quiesce", {}, "drain everything and check "
                                                "nothing leaked (quiescence)"))

    def names(self) -> list[str]:
        return list(self.specs)

    def parse(self, raw: object, where: str = "") -> Op:
        """Validate one JSON op (``{"op": name, **args}``) against the table."""
        if not isinstance(raw, dict) or not isinstance(raw.get("op"), str):
            raise OpError(f"{where}expected an object with a string 'op', got {_short(raw)}")
        name = raw["op"]
        spec = self.specs.get(name)
        if spec is None:
            raise OpError(f"{where}unknown op {_short(name)}; this variant knows "
                          f"{', '.join(self.specs)}")
        args = {k: v for k, v in raw.items() if k != "op"}
        missing = set(spec.params) - set(args)
        extra = set(args) - set(spec.params)
        if missing or extra:
            raise OpError(f"{where}op {name!r} takes {sorted(spec.params) or 'no arguments'}; "
                          f"missing {sorted(missing)}, unexpected {_short(sorted(extra))}")
        for k, kind in spec.params.items():
            v = args[k]
            if kind == INT and not (_is_int(v) and -INT_LIMIT <= v < INT_LIMIT):
                raise OpError(f"{where}op {name!r}: {k} must be an integer in "
                              f"[-2**31, 2**31), got {_short(v)}")
            if kind == TOKENS:
                if not isinstance(v, list) or not all(_is_int(t) and 0 <= t < INT_LIMIT
                                                      for t in v):
                    raise OpError(f"{where}op {name!r}: {k} must be a list of token ids "
                                  f"(integers in [0, 2**31)), got {_short(v)}")
                args[k] = list(v)
        return Op(name, args)

    def describe(self, op: Op) -> str:
        spec = self.specs.get(op.name)
        if spec is None:
            return f"{op.name} {dict(op.args)}"
        shown = {k: (_tokens(v) if spec.params.get(k) == TOKENS else v)
                 for k, v in op.args.items()}
        return spec.words.format(**shown)

    def apply(self, subject, op: Op) -> str:
        """Run ``op`` on ``subject``; returns its result in words ('skipped: ...' if moot)."""
        if op.name not in self.specs:
            raise OpError(f"unknown op {op.name!r}")
        try:
            return getattr(subject, op.name)(**op.args)
        except Skip as why:
            return f"skipped: {why}"


INT_LIMIT = 2**31  # op arguments are ids and counts: anything larger is a corrupt trace


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _tokens(v) -> str:
    return "[" + " ".join(map(str, v)) + "]"
