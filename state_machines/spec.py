"""What a cache variant declares: ``VariantSpec`` (and its ``Param``\ s).

A spec bundles what a variant adds to the shared mechanism: its op table, its parameters and
their regimes, and its Hypothesis machine.  How a subject is built is each target's
(``caches/adapters/<engine>/target.py``; kvcheck's own reference models:
``caches/adapters/reference/target.py``).  Everything else -- runs, traces, replay, the CLI,
profiles, quiescence -- is shared.  ``state_machines/variants.py`` registers the specs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from caches.target import DECLINE
from state_machines.ops import OpTable


@dataclass(frozen=True)
class Param:
    default: int
    low: int
    high: int
    doc: str


@dataclass
class VariantSpec:
    name: str
    summary: str
    ops: OpTable
    params: Mapping[str, Param]
    machine: type = None  # the Hypothesis machine (set by the variant module)
    regimes: tuple = ({},)  # param overrides each test/fuzz pass runs under
    # subjects made on the fly rather than registered (``kvcheck diff``'s pair of two targets):
    # name -> (params, fault, device) -> subject
    extra_targets: Mapping[str, Callable] = field(default_factory=dict)
    # exhaustive search (``kvcheck check``, state_machines/explore.py); None = not opted in.
    # small_params: a dict or a tuple of dicts (tiny pools); alphabet(params) -> list[Op]:
    # the finite op set, by default derived from the op table's generators
    # (``OpTable.alphabet``) once small_params are given; the subject declares its
    # ``state()`` (caches/subjects/canon.py).
    alphabet: Callable | None = None
    small_params: object = None
    # reachability coverage (``kvcheck coverage``): transitions the subject reports with
    # ``self.reached(name)`` that the machine must reach; None = not declared.
    sometimes: tuple | None = None

    def __post_init__(self):
        if self.alphabet is None and self.small_params is not None:
            self.alphabet = self.ops.alphabet

    def check_params(self, given: Mapping) -> dict:
        """Defaults filled in, unknown names and out-of-range values rejected."""
        unknown = set(given) - set(self.params)
        if unknown:
            raise ValueError(f"unknown parameter(s) {sorted(unknown)} for {self.name}; known: "
                             f"{', '.join(self.params)}")
        out = {}
        for name, p in self.params.items():
            v = given.get(name, p.default)
            if not isinstance(v, int) or isinstance(v, bool) or not p.low <= v <= p.high:
                raise ValueError(f"{name} must be an integer in [{p.low}, {p.high}], got {v!r}")
            out[name] = v
        return out

    @property
    def targets(self) -> tuple:
        """The registered targets that have this variant (``reference`` first); see
        ``state_machines/targets.py``."""
        from state_machines.targets import targets_of

        return targets_of(self.name) + tuple(self.extra_targets)

    def make_subject(self, params: Mapping, *, fault: str | None = None,
                     target: str = "reference", device: str | None = None,
                     src: str | None = None, known_findings: str = DECLINE):
        """A fresh subject of this variant on ``target`` (a registered target's builder)."""
        params = self.check_params(params)
        if target in self.extra_targets:
            return self.extra_targets[target](params, fault, device)
        from state_machines.targets import get_target

        t = get_target(target)
        if self.name not in t.builders:
            raise KeyError(f"unknown target {target!r} for {self.name}; known: "
                           f"{', '.join(self.targets)}")
        return t.build(self.name, params, fault=fault, device=device, src=src,
                       known_findings=known_findings)
