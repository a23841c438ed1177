"""The property list (``invariants/properties.py``) is the only place a property is named:
every check, fault and recorded trace names one that is on it, and the README's and
``docs/properties.md``'s tables are generated from it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from caches.faults import all_faults
from invariants.properties import ALL, BY_NAME, PROPERTIES, markdown_table

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("caches", "invariants", "state_machines")
TRACES = ("tests/regressions", "tests/upstream_findings")


def named_in_checks() -> dict[str, list[str]]:
    """property -> where a check names it: the literal first argument of ``fail(...)`` or
    ``Violation(...)``, or a module's ``PROP = "..."``, in every source file."""
    out: dict[str, list[str]] = {}
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                name = None
                if isinstance(node, ast.Call) and node.args:
                    f = node.func
                    called = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                    if called in ("fail", "Violation") and isinstance(node.args[0], ast.Constant):
                        name = node.args[0].value
                elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                        and any(isinstance(t, ast.Name) and t.id == "PROP" for t in node.targets):
                    name = node.value.value
                if isinstance(name, str):
                    out.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def unlisted_in_faults() -> list[str]:
    return [f"fault {f.id} names {p!r}" for f in all_faults().values() for p in f.properties
            if p not in BY_NAME]


def named_in_traces() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for folder in TRACES:
        for path in sorted((ROOT / folder).glob("*.json")):
            violation = json.loads(path.read_text()).get("violation") or {}
            if "property" in violation:
                out.setdefault(violation["property"], []).append(str(path.relative_to(ROOT)))
    return out


def test_every_check_names_a_listed_property():
    named = named_in_checks()
    assert len(named) >= 20, sorted(named)  # the scan sees the checks
    unlisted = {p: where for p, where in named.items() if p not in BY_NAME}
    assert not unlisted, f"add these to invariants/properties.py: {unlisted}"


def test_every_fault_names_a_listed_property_its_variant_checks():
    assert not unlisted_in_faults(), unlisted_in_faults()
    for f in all_faults().values():
        assert f.properties, f.id
        for p in f.properties:
            assert f.variant in BY_NAME[p].variants, (f.id, p, BY_NAME[p].variants)


def test_a_planted_fault_with_an_unlisted_property_is_reported(monkeypatch):
    """The check above can fail: a fault that names a property nobody listed."""
    from caches import faults

    all_faults()  # every module registered
    planted = faults.Fault("Z9", "planted", "radix", "s", "u", ("no-such-property",), object)
    monkeypatch.setitem(faults._REGISTRY, "Z9", planted)
    assert unlisted_in_faults() == ["fault Z9 names 'no-such-property'"]


def test_every_recorded_trace_names_a_listed_property():
    named = named_in_traces()
    assert named, "no recorded trace found"
    unlisted = {p: where for p, where in named.items() if p not in BY_NAME}
    assert not unlisted, f"add these to invariants/properties.py: {unlisted}"


def test_every_listed_property_is_checked_somewhere():
    """No dead entries: each listed property is named by a check (the run's own ``crash`` and
    ``hang`` included)."""
    named = named_in_checks()
    assert [p.name for p in PROPERTIES if p.name not in named] == []


def test_the_list_is_well_formed():
    for p in PROPERTIES:
        assert p.name == p.name.lower() and " " not in p.name, p.name
        assert p.meaning and "|" not in p.meaning, p.name
        assert p.variants and set(p.variants) <= set(ALL), p.name


@pytest.mark.parametrize("doc", ["docs/properties.md", "README.md"])
def test_the_tables_are_generated_from_the_list(doc):
    from state_machines.commands.list import properties_markdown

    text = (ROOT / doc).read_text()
    if doc == "README.md":
        begin = text.index("<!-- properties: generated")
        begin = text.index("\n", begin) + 1
        end = text.index("<!-- properties: end -->")
        assert text[begin:end] == markdown_table(), (
            "regenerate the README's block from: python3 -m state_machines list --properties")
    else:
        assert text == properties_markdown(), (
            "regenerate: python3 -m state_machines list --properties > docs/properties.md")
