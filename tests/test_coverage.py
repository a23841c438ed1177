"""Reachability ("sometimes") coverage (state_machines/coverage.py, ``kvcheck coverage``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from state_machines import variants
from state_machines.cli import main
from state_machines.coverage import (
    NotDeclared,
    coverage_report,
    merge,
    missing,
    run_coverage,
)
from state_machines.machine import Recorder
from state_machines.variants import get_variant

RADIX = get_variant("radix")
DECLARING = [s for s in variants.all_variants().values() if s.sometimes is not None]


@pytest.mark.parametrize("spec", DECLARING, ids=[s.name for s in DECLARING])
def test_every_declared_transition_is_reached_in_the_ci_budget(spec):
    res = run_coverage(spec)  # the loaded profile: ci (tests/conftest.py)
    assert not res.errors, res.errors
    assert res.missing == [], res.report
    assert set(res.report) == set(spec.sometimes)


def test_a_declared_transition_never_reached_fails_the_command(monkeypatch, capsys):
    bogus = dataclasses.replace(RADIX, sometimes=RADIX.sometimes + ("never-happens",))
    monkeypatch.setattr(variants, "get_variant", lambda name: bogus)
    code = main(["coverage", "radix", "--max-examples", "5", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "NEVER REACHED" in out and "never reached: never-happens" in out
    code = main(["coverage", "radix", "--max-examples", "5", "--seed", "1", "--json"])
    row = json.loads(capsys.readouterr().out)
    assert code == 1 and row["missing"] == ["never-happens"] and row["counts"]["node-split"]


def test_the_command_passes_when_everything_is_reached(monkeypatch, capsys):
    few = dataclasses.replace(RADIX, sometimes=("out-of-memory",))
    monkeypatch.setattr(variants, "get_variant", lambda name: few)
    code = main(["coverage", "radix", "--max-examples", "5", "--seed", "1"])
    assert code == 0, capsys.readouterr().out


def test_variant_without_declarations_is_refused():
    with pytest.raises(NotDeclared):
        run_coverage(dataclasses.replace(RADIX, sometimes=None))


def test_report_helpers_for_the_nightly_job():
    rec = Recorder()
    rec.reached.update({"node-split": 3, "undeclared": 1})
    report = coverage_report(RADIX, {}, rec)
    assert report["node-split"] == 3 and "undeclared" not in report
    assert "cascade-eviction" in missing(report) and "node-split" not in missing(report)
    assert merge({"a": 1, "b": 0}, {"b": 2}) == {"a": 1, "b": 2}


def test_transitions_are_counted_by_the_subject_but_not_while_draining():
    s = RADIX.make_subject({"page_size": 1, "pool_pages": 8})
    s.insert([0, 1, 2])
    s.insert([0, 1])  # splits [0 1 2]
    assert s.reached_counts["node-split"] == 1
    s.quiesce()  # evicts [2] then its parent [0 1]: a cascade, but while draining
    assert s.reached_counts["cascade-eviction"] == 0
    s.insert([0, 1, 2])
    s.insert([0, 1])
    s.evict(99)
    assert s.reached_counts["cascade-eviction"] == 1
