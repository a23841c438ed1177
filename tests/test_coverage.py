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


@pytest.mark.slow  # each machine's whole ci budget
@pytest.mark.parametrize("spec", DECLARING, ids=[s.name for s in DECLARING])
def test_every_transition_reached_and_every_op_generated_in_the_ci_budget(spec, capsys):
    """``kvcheck --profile ci coverage VARIANT``: every declared transition reached and every
    op of the table generated (quiesce included: every example's teardown runs it)."""
    code = main(["--profile", "ci", "coverage", spec.name, "--json"])
    row = json.loads(capsys.readouterr().out)
    assert not row["errors"], row["errors"]
    assert row["missing"] == [], row["counts"]
    assert set(row["counts"]) == set(spec.sometimes)
    assert row["ops_missing"] == [], row["op_counts"]
    assert set(row["op_counts"]) == set(spec.ops.names())
    assert all(n > 0 for n in row["op_counts"].values()), row["op_counts"]
    assert code == 0


def test_a_declared_transition_never_reached_fails_the_command(monkeypatch, capsys):
    bogus = dataclasses.replace(RADIX, sometimes=RADIX.sometimes + ("never-happens",))
    monkeypatch.setattr(variants, "get_variant", lambda name: bogus)
    # (a seed whose 5 examples reach every declared transition)
    code = main(["coverage", "radix", "--max-examples", "5", "--seed", "4"])
    out = capsys.readouterr().out
    assert code == 1
    assert "NEVER REACHED" in out and "never reached: never-happens" in out
    code = main(["coverage", "radix", "--max-examples", "5", "--seed", "4", "--json"])
    row = json.loads(capsys.readouterr().out)
    assert code == 1 and row["missing"] == ["never-happens"] and row["counts"]["node-split"]


def test_an_op_never_generated_fails_the_command(monkeypatch, capsys):
    from state_machines.ops import OpSpec, OpTable

    table = OpTable(*RADIX.ops.specs.values(), OpSpec("never_generated", {}, "nothing"))
    bogus = dataclasses.replace(RADIX, ops=table, sometimes=("out-of-memory",))
    monkeypatch.setattr(variants, "get_variant", lambda name: bogus)
    code = main(["coverage", "radix", "--max-examples", "5", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 1 and "NEVER GENERATED" in out
    failed = next(line for line in out.splitlines() if "ops of the table never" in line)
    assert "never_generated" in failed
    code = main(["coverage", "radix", "--max-examples", "5", "--seed", "1", "--json"])
    row = json.loads(capsys.readouterr().out)
    assert code == 1 and "never_generated" in row["ops_missing"]
    assert row["op_counts"]["admit"] > 0 and row["op_counts"]["quiesce"] > 0


def test_the_command_passes_when_everything_is_reached(monkeypatch, capsys):
    few = dataclasses.replace(RADIX, sometimes=("out-of-memory",))
    monkeypatch.setattr(variants, "get_variant", lambda name: few)
    # (a seed whose 10 examples generate every op, the rare unlock included)
    code = main(["coverage", "radix", "--max-examples", "10", "--seed", "2"])
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


def test_what_only_a_declined_op_reaches_is_left_out():
    from state_machines.lifecycle import declined_ops, unreachable

    assert declined_ops({"schedule": "no batches"}) == {"enqueue": "no batches",
                                                        "schedule": "no batches"}
    gone = unreachable({"retract": "r", "schedule": "s"})
    assert gone["retract-readmitted"] == ["retract", "schedule"]
    assert gone["batch-admitted"] == ["schedule"] and gone["retract-evicts"] == ["retract"]
    assert "decode-new-page" not in gone  # decode still reaches it
    assert "decode-new-page" in unreachable({op: "x" for op in
                                             ("decode", "spec_decode", "schedule")})
    assert unreachable({}) == {}


def test_a_target_that_declines_lifecycle_ops_passes_coverage_and_says_so(monkeypatch, capsys):
    """A target that declines retract and batch scheduling (an engine whose scheduler has no
    such path) is not failed for the ops it never draws, nor for what only they reach; the
    report names them and why.  The same target that declines nothing still must reach all."""
    from caches.subjects.radix import RadixSubject

    why = "this engine's scheduler has no such path"
    monkeypatch.setattr(RadixSubject, "lifecycle_declined",
                        {"retract": why, "schedule": why}, raising=False)
    res = run_coverage(RADIX, max_examples=60)
    assert res.declined == {"retract": why, "schedule": why}
    assert set(res.declined_ops) == {"retract", "enqueue", "schedule"}
    assert all(res.op_counts[op] == 0 for op in res.declined_ops)  # never drawn
    assert {"retract-evicts", "retract-readmitted", "batch-admitted",
            "admission-refused"} <= set(res.declined_transitions)
    assert not set(res.declined_transitions) & set(res.missing)
    assert not set(res.declined_ops) & set(res.ops_missing)
    code = main(["--profile", "ci", "coverage", "radix", "--max-examples", "60"])
    out = capsys.readouterr().out
    assert "NOTE: radix declines retract (this engine's scheduler has no such path)" in out
    assert "declined: retract, schedule" in out  # retract-readmitted's row
    for op in ("retract", "enqueue", "schedule"):  # their op rows say so, not "NEVER ..."
        (row,) = [ln for ln in out.splitlines() if ln.split()[:1] == [op]]
        assert row.rstrip().endswith("declined"), row
    assert code == (0 if res.ok else 1)
    row = json.loads(json.dumps(res.to_json()))
    assert row["declined_ops"]["enqueue"] == why
