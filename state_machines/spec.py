"""What a cache variant declares: ``VariantSpec`` (and its parameters, ``Param``).

A spec bundles what a variant adds to the shared mechanism: its op table, its parameters and
their regimes, and its Hypothesis machine.  How a subject is built is each target's
(``caches/adapters/<engine>/target.py``; kvcheck's own reference models:
``caches/adapters/reference/target.py``).  Everything else -- runs, traces, replay, the CLI,
profiles, quiescence -- is shared.  ``state_machines/variants.py`` registers the specs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from caches.target import DECLINE, Param, Target  # noqa: F401  (Param: re-exported)
from state_machines.ops import OpTable


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

    def _declared(self, target: str | None) -> "Target | None":
        """The registered target whose declarations apply (the upstream side of a diff pair
        ``against~target``), or None."""
        if target in (None, "reference"):
            return None
        name = target.rsplit("~", 1)[-1]
        from state_machines.targets import UnknownTarget, get_target

        try:
            return get_target(name)
        except UnknownTarget:
            return None

    def params_for(self, target: str | None = None) -> Mapping[str, Param]:
        """The parameters ``target`` runs this variant with: the variant's, narrowed and
        extended by the target's declaration (``Target.params``)."""
        t = self._declared(target)
        extra = t.params.get(self.name) if t is not None else None
        return {**self.params, **extra} if extra else self.params

    def regimes_for(self, target: str | None = None) -> tuple:
        """The regimes ``target`` runs: its own (``Target.regimes``), else the variant's."""
        t = self._declared(target)
        own = t.regimes.get(self.name) if t is not None else None
        return tuple(own) if own else self.regimes

    def plan(self, targets) -> list:
        """``(params, target)`` for every regime each of ``targets`` runs: the variant's
        regimes in order (each for every target without its own), then each target's own."""
        own = [t for t in targets if self.regimes_for(t) is not self.regimes]
        out = [(self.check_params(r, t), t) for r in self.regimes for t in targets
               if t not in own]
        return out + [(self.check_params(r, t), t) for t in own for r in self.regimes_for(t)]

    def check_params(self, given: Mapping, target: str | None = None) -> dict:
        """Defaults filled in, unknown names and out-of-range values rejected (against the
        parameters ``target`` declares, ``params_for``)."""
        params = self.params_for(target)
        unknown = set(given) - set(params)
        if unknown:
            on = f" on target {target}" if params is not self.params else ""
            raise ValueError(f"unknown parameter(s) {sorted(unknown)} for {self.name}{on}; "
                             f"known: {', '.join(params)}")
        out = {}
        for name, p in params.items():
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
        if target in self.extra_targets:
            params = self.check_params(params, target)
            return self.extra_targets[target](params, fault, device)
        from state_machines.targets import get_target

        t = get_target(target)
        if self.name not in t.builders:
            raise KeyError(f"unknown target {target!r} for {self.name}; known: "
                           f"{', '.join(self.targets)}")
        params = self.check_params(params, target)
        return t.build(self.name, params, fault=fault, device=device, src=src,
                       known_findings=known_findings)
