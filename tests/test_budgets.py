"""A time budget is kept, and running out of it is never a failure of kvcheck or the engine.

A time cap used to stop a derandomised Hypothesis run by raising out of an example: Hypothesis
recorded the example as ending there, met the same prefix drawing on later, and failed with
"FlakyStrategyDefinition: Inconsistent data generation" -- a harness error reported by the gate
for nothing but a budget (``machine.StopFuzzing``).  The sweep below stops every variant's
items at several points of their runs; a stop cut short mid-shrink keeps the shortest failing
run so far, marked partly shrunk, and ``kvcheck shrink`` goes on from it.
"""

from __future__ import annotations

import copy
import json
import time

import pytest

from state_machines import machine
from state_machines.cli import main
from state_machines.fuzz import fuzz
from state_machines.gate import fuzz_both
from state_machines.variants import all_variants

SPECS = all_variants()


@pytest.mark.slow  # every variant x regime, three caps each
@pytest.mark.parametrize("variant", sorted(SPECS))
def test_a_budget_that_runs_out_is_never_a_harness_error(variant):
    spec = SPECS[variant]
    for params, target in spec.plan(spec.targets):
        if target != "reference":
            continue
        for share in (0.3, 1.0, 1.6):  # Hypothesis alone; then both engines, twice
            o = fuzz_both(spec, params, target=target, max_examples=None, src=None,
                          known_findings="decline", seed=None, share=share,
                          stop_on_first=False)
            assert o.error is None, (variant, params, share, o.error)
            assert not o.failures, (variant, params, share, [str(f.signature)
                                                             for f in o.failures])


def test_a_time_cap_mid_run_is_not_inconsistent_data_generation():
    """The gate's first failing case before the fix: block-hash, a cap a few examples in."""
    spec = SPECS["block-hash"]
    params = spec.plan(spec.targets)[0][0]
    for cap in (0.2, 0.5, 1.0):
        o = fuzz(spec, params, time_cap=cap, stop_on_first=False)
        assert o.error is None, o.error
        assert o.capped and o.examples > 1


class JumpingClock:
    """``time.monotonic`` that leaps an hour ahead once a failure has been recorded: the
    time cap then falls in the middle of Hypothesis's shrinking, on every machine."""

    def __init__(self, recorder_box):
        self.box, self.jump = recorder_box, 0.0

    def monotonic(self):
        rec = self.box[0]
        if rec is not None and rec.first_failure_at is not None and not self.jump \
                and rec.first_trace is not None:
            self.jump = 3600.0
        return time.monotonic() + self.jump

    def __getattr__(self, name):
        return getattr(time, name)


def test_a_cap_mid_shrink_keeps_the_shortest_run_so_far(monkeypatch, tmp_path):
    """Hypothesis's own shrinker (``shrinker="hypothesis"``) cut by the cap."""
    box = [None]
    real_init = machine.Recorder.__init__

    def init(self):
        real_init(self)
        box[0] = self

    monkeypatch.setattr(machine.Recorder, "__init__", init)
    monkeypatch.setattr(machine, "time", JumpingClock(box))
    spec = SPECS["radix"]
    o = fuzz(spec, {"page_size": 1, "pool_pages": 16}, fault="R1", seed=3, time_cap=600,
             max_examples=400, out_dir=tmp_path, shrinker="hypothesis")
    assert o.failed and o.error is None and not o.interrupted
    assert o.trace.meta["shrunk"] is False
    assert o.trace.meta["note"].startswith("partly shrunk")
    assert o.trace.violation["property"] == "size-accounting"
    # ... and kvcheck shrink goes on from the saved trace, on the same property
    saved = json.loads(o.trace_path.read_text())
    code = main(["shrink", str(o.trace_path), "--budget", "20", "--out", str(tmp_path / "s")])
    assert code == 1
    (shrunk,) = (tmp_path / "s").glob("radix-*.json")
    again = json.loads(shrunk.read_text())
    assert again["violation"]["property"] == "size-accounting"
    assert len(again["ops"]) <= len(saved["ops"])
    assert again["meta"]["shrunk_from"] == len(saved["ops"])


def test_kvcheck_shrinker_keeps_the_failure_and_marks_a_cut_partly_shrunk():
    """The default shrinker (kvcheck's) on what Hypothesis found: with time, a short trace of
    the same signature, marked shrunk; with none left, the failure as found, marked partly
    shrunk (never lost, never passed off as shrunk)."""
    from state_machines.fuzz import _shrunk
    from state_machines.signature import Signature

    spec, params = SPECS["radix"], {"page_size": 1, "pool_pages": 16}
    found = fuzz(spec, params, fault="R4", seed=0, shrinker=None).trace
    assert found.meta["shrunk"] is False and found.meta["note"] == "not shrunk (asked for)"
    cut = _shrunk(spec, params, copy.deepcopy(found), "kvcheck", 0.0, fault="R4")
    assert cut.meta["shrunk"] is False and cut.meta["note"].startswith("partly shrunk")
    assert [o.to_json() for o in cut.ops] == [o.to_json() for o in found.ops]
    small = _shrunk(spec, params, copy.deepcopy(found), "kvcheck", 60.0, fault="R4")
    assert small.meta["shrunk"] is True and "note" not in small.meta
    assert len(small.ops) < len(found.ops)
    assert Signature.of_trace(small) == Signature.of_trace(found)
    assert small.meta["examples"] == found.meta["examples"]


def test_shrink_of_a_trace_that_passes_says_so(tmp_path, capsys):
    trace = {"format": "kvcheck-trace", "version": 1, "variant": "radix", "fault": None,
             "params": {"page_size": 1},
             "ops": [{"op": "insert", "tokens": [1, 2]}, {"op": "quiesce"}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    assert main(["shrink", str(path)]) == 0
    assert "nothing to shrink" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_shrink_bad_file_is_a_usage_error(tmp_path, capsys):
    assert main(["shrink", str(tmp_path / "nope.json")]) == 2
    assert "Traceback" not in capsys.readouterr().err
