"""Serving operations as data.

An ``Op`` is a name plus JSON-able arguments; a variant's ``OpTable`` says which ops exist,
which arguments each takes (and their types), how to say it in plain words, how its arguments
are generated (``OpSpec.gen``, see ``state_machines/gen.py``), and applies it by calling the
subject's method of the same name.  The Hypothesis machines, ``replay`` and the exhaustive
explorer all go through ``OpTable.apply``, so one trace means the same thing to each; the
machines' rules and the explorer's alphabet are both derived from the generators.
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
    gen: object = ()  # a ``gen.Gen`` or a tuple of them: how the op's arguments are generated
    # False: the op may change the state before it finds its precondition false and skips
    # (a match that touches access times, first); the exhaustive search then compares states
    # after its skips too instead of taking a skip as a no-op (``explore.py``)
    pure_skips: bool = True

    @property
    def gens(self) -> tuple:
        gens = self.gen if isinstance(self.gen, tuple) else (self.gen,)
        return tuple(g.bind(self.name, self.params) for g in gens)


class OpError(ValueError):
    """An op that does not fit the variant's table (unknown name, missing or bad argument)."""


class OpTable:
    """``scenarios``: steering generators that drive several ops (``gen.Scenario``);
    ``alphabet_key``: an order for the exhaustive alphabet (a stable sort key over ops; the
    search expands paths in alphabet order, so it decides which of several shortest
    counterexamples is reported)."""

    def __init__(self, *specs: OpSpec, scenarios: tuple = (), alphabet_key=None):
        self.specs = {s.name: s for s in specs}
        self.specs.setdefault("quiesce", OpSpec("quiesce", {}, "drain everything and check "
                                                "nothing leaked (quiescence)"))
        self.scenarios = tuple(scenarios)
        self.alphabet_key = alphabet_key
        for s in self.specs.values():
            s.gens  # noqa: B018  bind (and check) every generator now

    def names(self) -> list[str]:
        return list(self.specs)

    def alphabet(self, params) -> list[Op]:
        """The exhaustive search's finite op set: each generator's small argument values
        (every combination), in table order, without repeats."""
        ops: list[Op] = []
        seen = set()
        for spec in self.specs.values():
            for g in spec.gens:
                for op in g.ops(params):
                    k = repr(op.to_json())
                    if k not in seen:
                        seen.add(k)
                        ops.append(op)
        return sorted(ops, key=self.alphabet_key) if self.alphabet_key else ops

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
