"""The variant registry: one ``VariantSpec`` per cache variant, found by name.

A spec bundles what a variant adds to the shared mechanism: its op table, how to build a
subject (reference, with a fault, or an upstream target), its parameters and their regimes,
and its Hypothesis machine.  Everything else -- runs, traces, replay, the CLI, profiles,
quiescence -- is shared.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

from state_machines.ops import OpTable

# one module per variant; each defines SPEC.  A variant whose module is not written yet is
# skipped (only that exact module missing; any other import error propagates).
_MODULES = ("state_machines.radix", "state_machines.paged_bigpage",
            "state_machines.streaming_session", "state_machines.himamba",
            "state_machines.continuation_state")


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
    build: Callable  # (params, cache_cls_or_None, device) -> subject
    machine: type = None  # the Hypothesis machine (set by the variant module)
    regimes: tuple = ({},)  # param overrides each test/fuzz pass runs under
    targets: Mapping[str, Callable] = field(default_factory=lambda: {"reference": None})
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

    def make_subject(self, params: Mapping, *, fault: str | None = None,
                     target: str = "reference", device: str | None = None):
        params = self.check_params(params)
        cache_cls = None
        if fault is not None:
            from caches.faults import get_fault

            f = get_fault(fault)
            # an upstream target may carry another variant's catalogued defect where upstream
            # shares the code (R1 also lives in SGLang's MambaRadixCache); its factory decides
            if f.variant != self.name and target == "reference":
                raise KeyError(f"fault {fault} belongs to variant {f.variant}, not {self.name}")
            cache_cls = f.cls
        if target not in self.targets:
            raise KeyError(f"unknown target {target!r} for {self.name}; known: "
                           f"{', '.join(self.targets)}")
        if target != "reference":
            return self.targets[target](params, fault, device)
        return self.build(params, cache_cls, device)


def all_variants() -> dict[str, VariantSpec]:
    out = {}
    for mod in _MODULES:
        try:
            spec = importlib.import_module(mod).SPEC
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                continue
            raise
        out[spec.name] = spec
    return out


def get_variant(name: str) -> VariantSpec:
    variants = all_variants()
    if name not in variants:
        raise KeyError(f"unknown variant {name!r}; known: {', '.join(variants)}")
    return variants[name]
