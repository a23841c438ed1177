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
