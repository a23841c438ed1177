"""The variant registry: one ``VariantSpec`` per cache variant, found by name.

A spec bundles what a variant adds to the shared mechanism: its op table, how to build a
subject (reference, with a fault, or an upstream target), its parameters and their regimes,
and its Hypothesis machine.  Everything else -- runs, traces, replay, the CLI, profiles,
quiescence -- is shared.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Mapping

from caches.target import DECLINE, FaultNotInjectable, Identity, Target, content_hash
from state_machines.ops import OpTable

# one module per variant; each defines SPEC.  A variant whose module is not written yet is
# skipped (only that exact module missing; any other import error propagates).
_MODULES = ("state_machines.radix", "state_machines.paged_bigpage",
            "state_machines.streaming_session", "state_machines.himamba",
            "state_machines.continuation_state", "state_machines.block_hash")


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
    build: Callable  # (params, cache_cls_or_None, device) -> subject: the reference target
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


def all_variants() -> dict[str, VariantSpec]:
    out = {}
    for mod in _MODULES:
        try:
            # an imported module straight from sys.modules: this runs for every subject
            # built (each native walk), the import machinery costs microseconds per module
            spec = (sys.modules.get(mod) or importlib.import_module(mod)).SPEC
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


# -- the reference target: kvcheck's own models of each variant ------------------------------
class _ReferenceBuilders(MappingABC):
    """variant -> builder over the variant's reference cache (and a catalogued fault of it)."""

    def __getitem__(self, variant):
        spec = get_variant(variant)

        def build(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
            cache_cls = None
            if fault is not None:
                from caches.faults import get_fault

                f = get_fault(fault)
                if f.variant != spec.name:
                    raise FaultNotInjectable(f"fault {fault} belongs to variant {f.variant}, "
                                             f"not {spec.name}")
                cache_cls = f.cls
            return spec.build(params, cache_cls, device)

        return build

    def __iter__(self):
        return iter(all_variants())

    def __len__(self):
        return len(all_variants())


@lru_cache(maxsize=1)
def _reference_identity(src=None) -> Identity:
    from importlib import metadata

    root = Path(__file__).resolve().parent.parent / "caches"
    try:
        version = metadata.version("kvcheck")
    except metadata.PackageNotFoundError:
        version = "checkout"
    files = [p for p in root.rglob("*.py") if "adapters" not in p.parts]
    return Identity("kvcheck", version, content_hash(files))


REFERENCE = Target(
    name="reference", engine="kvcheck",
    summary="kvcheck's own reference model of each variant (and its catalogued faults)",
    builders=_ReferenceBuilders(), identify=_reference_identity)
