"""A fuzz run replays its first failure's trace twice when it prints it; replays that differ
(an adapter iterating a set, a clock in the engine) are warned about -- they used to give other
labels silently."""

from __future__ import annotations

import io
from types import SimpleNamespace

from invariants import Violation
from state_machines import replay as replay_mod
from state_machines.commands.common import print_failure, replays_differ
from state_machines.fuzz import fuzz
from state_machines.run import StepRecord
from state_machines.variants import all_variants


def result(*results, prop="size-accounting", message="m"):
    steps = [StepRecord(i + 1, None, f"op {i + 1}", r) for i, r in enumerate(results)]
    return SimpleNamespace(steps=steps, violation=Violation(prop, message) if prop else None)


def test_replays_differ_names_the_first_difference():
    assert replays_differ(result("a", "b"), result("a", "b")) is None
    assert "'b' and then 'c' at step 2" in replays_differ(result("a", "b"), result("a", "c"))
    assert "2 and then 1 steps" in replays_differ(result("a", "b"), result("a"))
    assert "no failure" in replays_differ(result("a"), result("a", prop=None))


def test_a_failure_whose_replays_differ_is_warned_about(monkeypatch):
    spec = all_variants()["radix"]
    out = fuzz(spec, {"page_size": 1, "pool_pages": 16}, fault="R1", seed=0)
    assert out.failed
    steady = io.StringIO()
    print_failure(out, steady)
    assert "not deterministic" not in steady.getvalue()

    real, calls = replay_mod.replay, []

    def flaky(trace, **kw):  # every other replay sees another engine result at step 1
        got = real(trace, **kw)
        calls.append(1)
        if len(calls) % 2 == 0 and got.steps:
            got.steps[0].result += " (and one more)"
        return got

    monkeypatch.setattr(replay_mod, "replay", flaky)
    warned = io.StringIO()
    print_failure(out, warned)
    assert "WARNING: this target's replays are not deterministic" in warned.getvalue()
    assert "at step 1" in warned.getvalue()
