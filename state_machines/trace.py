"""Traces: a run's ops as a JSON file -- the durable regression corpus.

Hypothesis's example database is keyed by a hash of the machine's source, so it forgets saved
failures whenever a machine is edited.  A trace is plain data -- variant, target, fault,
parameters, ops, and the violation it ended in -- and ``replay`` applies it to a fresh subject,
so it stays meaningful across code changes.  Traces are only ever read as JSON (never pickle:
they come from CI artifacts and pull requests).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from caches.target import DECLINE, Identity, parse_known_findings
from state_machines.ops import Op, OpError
from state_machines.trace_record import FORMAT, VERSION, Trace, TraceError  # noqa: F401  (re-exported)
from state_machines.variants import get_variant


def load_trace(path: str | os.PathLike) -> Trace:
    """Read and validate a trace file; raises ``TraceError`` with a message a person can act on."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise TraceError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{p}: is a directory, expected a trace .json file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{p}: cannot read it ({exc})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno}, column "
                         f"{exc.colno})") from None
    except RecursionError:
        raise TraceError(f"{p}: not a usable trace (JSON nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise TraceError(f"{p}: not a usable trace ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise TraceError(f"{p}: not a kvcheck trace (expected an object with "
                         f'"format": "{FORMAT}")')
    if raw.get("version") != VERSION or isinstance(raw.get("version"), bool):
        raise TraceError(f"{p}: trace format version {_short(raw.get('version'))} is not "
                         f"supported (this kvcheck reads version {VERSION})")
    for key, kind in (("variant", str), ("params", dict), ("ops", list)):
        if not isinstance(raw.get(key), kind):
            raise TraceError(f"{p}: field {key!r} must be a {_KIND[kind]}, got "
                             f"{_short(raw.get(key))}")
    for key, kinds in (("fault", (str, type(None))), ("target", (str,)),
                       ("violation", (dict, type(None))), ("meta", (dict, type(None)))):
        if key in raw and not isinstance(raw[key], kinds):
            raise TraceError(f"{p}: field {key!r} must be "
                             + " or ".join(_KIND[k] for k in kinds) + f", got {_short(raw[key])}")
    try:
        spec = get_variant(raw["variant"])
    except KeyError as exc:
        raise TraceError(f"{p}: {exc.args[0]}") from None
    fault = raw.get("fault")
    target = raw.get("target", "reference")
    if fault is not None:
        from caches.faults import all_faults

        known = all_faults()
        # an upstream target may inject another variant's catalogued defect (VariantSpec.
        # make_subject); whether its adapter can is checked when the subject is built
        if fault not in known or (known[fault].variant != spec.name
                                  and target == "reference"):
            raise TraceError(f"{p}: unknown fault {_short(fault)} for variant {spec.name!r}")
    if target not in spec.targets:
        from state_machines.targets import registry

        hint = ("" if target in registry() else
                "; if it is a plug-in, install the package that registers it")
        raise TraceError(f"{p}: unknown target {_short(target)} for variant {spec.name!r} "
                         f"(known: {', '.join(spec.targets)}){hint}")
    known_findings = raw.get("known_findings", DECLINE)
    try:
        known_findings = parse_known_findings(known_findings)
    except ValueError:
        raise TraceError(f"{p}: field 'known_findings' must be decline, find or "
                         f"find=ID[,ID...], got {_short(known_findings)}") from None
    identity = None
    if raw.get("target_identity") is not None:
        identity = Identity.from_json(raw["target_identity"])
        if identity is None:
            raise TraceError(f"{p}: field 'target_identity' must be an object with string "
                             "'engine', 'version' and 'source'")
    src = raw.get("src")
    if src is not None and not isinstance(src, str):
        raise TraceError(f"{p}: field 'src' must be a path string or absent")
    if src:  # the same checkout from any working directory (state_machines/snapshots.py)
        from state_machines.snapshots import resolve_src

        src = resolve_src(src) or src
    try:
        params = spec.check_params(raw["params"], target)
    except ValueError as exc:
        raise TraceError(f"{p}: bad params: {exc}") from None
    ops = []
    for i, op in enumerate(raw["ops"]):
        try:
            ops.append(spec.ops.parse(op, where=f"step {i + 1}: "))
        except OpError as exc:
            raise TraceError(f"{p}: {exc}") from None
    violation = raw.get("violation")
    if violation is not None:
        violation = _violation(p, violation)
    return Trace(spec.name, params, ops, fault, target, violation, raw.get("meta") or {},
                 identity=identity, known_findings=known_findings, src=src)


_KIND = {str: "string", dict: "object", list: "list", type(None): "null"}


def _short(v) -> str:
    """``repr(v)`` cut to a length a one-line message can carry."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _violation(p: Path, v: dict) -> dict:
    """The recorded violation: a string ``property``, a string ``message``, an int ``step``."""
    out = dict(v)
    if not isinstance(v.get("property"), str):
        raise TraceError(f"{p}: field 'violation' must have a string 'property', got "
                         f"{_short(v.get('property'))}")
    if not isinstance(v.get("message", ""), str):
        raise TraceError(f"{p}: violation 'message' must be a string, got "
                         f"{_short(v.get('message'))}")
    step = v.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise TraceError(f"{p}: violation 'step' must be an integer, got {_short(step)}")
    out.setdefault("message", "")
    return out
