"""The target registry: every ``kvcheck.targets`` entry point, found by name.

kvcheck's own targets (``reference``, ``sglang``) register in its ``pyproject.toml`` exactly as
a separately installed package registers its own.  When kvcheck runs from a checkout that was
never installed (no distribution metadata on the path), its own targets come from ``BUILTIN``
-- the same table ``pyproject.toml`` declares (a test keeps the two equal).

A plug-in that fails to load (its module raises on import, the object is not a ``Target``, two
packages claim one name) does not stop kvcheck: it is listed with the reason by
``kvcheck list`` and refused by name with that reason everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import import_module, metadata

from caches.target import Target

GROUP = "kvcheck.targets"
BUILTIN = {
    "reference": "caches.adapters.reference.target:TARGET",
    "sglang": "caches.adapters.sglang.target:TARGET",
    "sglang-rust": "caches.adapters.sglang.target:TARGET_RUST",
    "sglang-radixcache": "caches.adapters.sglang.target:TARGET_RADIXCACHE",
    "lightllm": "caches.adapters.lightllm.target:TARGET",
    "pymllm": "caches.adapters.pymllm.target:TARGET",
    "tokenspeed": "caches.adapters.tokenspeed.target:TARGET",
    "vllm": "caches.adapters.vllm.target:TARGET",
}


@dataclass(frozen=True)
class Registered:
    name: str
    value: str  # "module:attr"
    origin: str  # "kvcheck 0.1.0", "mycache-kvcheck 1.2 (entry point)", ...
    target: Target | None
    error: str | None = None  # why it could not be loaded


class UnknownTarget(KeyError):
    pass


def _load(value: str) -> Target:
    mod, _, attr = value.partition(":")
    obj = import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, Target):
        raise TypeError(f"{value} is a {type(obj).__name__}, not a caches.target.Target")
    return obj


def _entry(name, value, origin) -> Registered:
    try:
        return Registered(name, value, origin, _load(value))
    except Exception as exc:  # noqa: BLE001  a broken plug-in is reported, never fatal
        return Registered(name, value, origin, None,
                          " ".join(f"{type(exc).__name__}: {exc}".split())[:300])


def _found() -> list[tuple[str, str, str]]:
    """``(name, value, origin)`` of every registered target, builtin order first; loads none."""
    found = []
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        origin = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "entry point"
        found.append((ep.name, ep.value, origin))
    if not any(name in BUILTIN and value == BUILTIN[name] for name, value, _ in found):
        found = [(n, v, "kvcheck (this checkout)") for n, v in BUILTIN.items()] + found
    builtin_order = list(BUILTIN)
    found.sort(key=lambda f: builtin_order.index(f[0]) if f[0] in BUILTIN else len(BUILTIN))
    return found


def target_names() -> list[str]:
    """The registered target names, in ``registry()``'s order, without importing any target
    (no engine, no torch): what a command checks ``--target`` against before any work."""
    return list(dict.fromkeys(name for name, _, _ in _found()))


@lru_cache(maxsize=1)
def registry() -> dict[str, Registered]:
    out: dict[str, Registered] = {}
    for name, value, origin in _found():
        if name in out:
            if out[name].value == value:
                continue  # the same target seen twice (an editable install plus the path)
            out[name] = Registered(name, value, f"{out[name].origin} and {origin}", None,
                                   f"two packages register the target name {name!r} "
                                   f"({out[name].value} and {value})")
            continue
        out[name] = _entry(name, value, origin)
    return out


def get_target(name: str) -> Target:
    reg = registry()
    if name not in reg:
        raise UnknownTarget(f"unknown target {name!r}; known: {', '.join(reg)} "
                            "(`kvcheck list` shows them)")
    entry = reg[name]
    if entry.target is None:
        raise UnknownTarget(f"target {name!r} ({entry.value}, from {entry.origin}) could not "
                            f"be loaded: {entry.error}")
    return entry.target


def targets_of(variant: str) -> tuple[str, ...]:
    """Names of the loadable targets that have ``variant`` (``reference`` first)."""
    return tuple(name for name, e in registry().items()
                 if e.target is not None and variant in e.target.builders)


def unavailable_reason(name: str, src: str | None = None) -> str | None:
    """Why target ``name`` cannot be used here (None when it can): a missing environment or
    an unknown/broken plug-in.  Never builds a subject: an adapter bug is not a reason."""
    try:
        target = get_target(name)
    except UnknownTarget as exc:
        return exc.args[0]
    why = target.unavailable(src)
    if why and target.setup_hint and target.setup_hint.split(",")[0] not in why:
        why = f"{why}; set it up with: {target.setup_hint}"
    return why


def variant_unavailable_reason(name: str, variant: str, src: str | None = None) -> str | None:
    """Why target ``name``'s ``variant`` cannot be used here although the target can (the
    installed engine release lacks it; ``Target.variant_unavailable``), or None."""
    try:
        target = get_target(name)
    except UnknownTarget:
        return None
    if target.variant_unavailable is None or target.unavailable(src):
        return None
    return target.variant_unavailable(variant, src)


def params_unavailable_reason(name: str, variant: str, params: dict,
                              src: str | None = None) -> str | None:
    """Why target ``name`` cannot run ``variant`` with ``params`` here although it has the
    variant (the installed release lacks that part; ``Target.params_unavailable``), or None."""
    try:
        target = get_target(name)
    except UnknownTarget:
        return None
    if target.params_unavailable is None or target.unavailable(src):
        return None
    return target.params_unavailable(variant, params)



def params_substitute(name: str, variant: str, params: dict,
                      src: str | None = None) -> dict | None:
    """The regime target ``name`` runs in place of ``params`` it cannot run here
    (``Target.params_substitute``), or None."""
    try:
        target = get_target(name)
    except UnknownTarget:
        return None
    if target.params_substitute is None or target.unavailable(src):
        return None
    return target.params_substitute(variant, params)
