"""Speed figures, measured in one run (a benchmark, never a timed test).

For each variant/regime it
1. runs the Hypothesis machine (every invariant on) for ``examples`` examples, recording every
   op it executed -> *machine steps/s* (includes Hypothesis's own per-step cost);
2. replays those exact op sequences on fresh subjects with every check on, without
   Hypothesis -> *checked steps/s*;
3. replays them again with every check off (no invariants, no fingerprint read-back, no
   match-contract or progress checks) -> *bare ops/s*;
and measures Hypothesis's ceiling on a trivial machine.  check cost = checked / bare time.
"""

from __future__ import annotations

import time

from hypothesis import settings, strategies as st
from hypothesis.reporting import with_reporter
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from state_machines.machine import Recorder, machine_class
from state_machines.run import Run
from state_machines.variants import all_variants


class _Trivial(RuleBasedStateMachine):
    @rule(x=st.integers(0, 7))
    def step(self, x):
        self.last = x


def _hypothesis_ceiling(examples: int, steps: int) -> float:
    counter = {"n": 0}

    class Counted(_Trivial):
        @rule(x=st.integers(0, 7))
        def step(self, x):
            counter["n"] += 1

    t = time.perf_counter()
    run_state_machine_as_test(Counted, settings=settings(
        settings.default, max_examples=examples, stateful_step_count=steps, derandomize=True,
        database=None))
    return counter["n"] / (time.perf_counter() - t)


def _replay_all(spec, params, sequences, device, checking: bool) -> tuple[int, float]:
    n, elapsed = 0, 0.0
    for ops in sequences:
        run = Run(spec, params, device=device)
        run.subject.checking = checking
        t = time.perf_counter()
        for op in ops:
            spec.ops.apply(run.subject, op)
            if checking:
                run.subject.check()
            n += 1
        elapsed += time.perf_counter() - t
    return n, elapsed


def bench(names=None, *, examples: int = 60, device: str | None = None) -> dict:
    variants = all_variants()
    rows = []
    for name in names or list(variants):
        spec = variants[name]
        for params in spec.regimes:
            params = spec.check_params(params)
            rec = Recorder()
            rec.keep_ops = True
            machine = machine_class(spec, params, device=device, recorder=rec)
            t = time.perf_counter()
            with with_reporter(lambda _m: None):
                run_state_machine_as_test(machine, settings=settings(
                    settings.default, max_examples=examples, derandomize=True, database=None))
            machine_s = time.perf_counter() - t
            seqs = rec.sequences
            n_checked, checked_s = _replay_all(spec, params, seqs, device, True)
            n_bare, bare_s = _replay_all(spec, params, seqs, device, False)
            rows.append({"variant": name, "params": params, "steps": rec.steps,
                         "machine_steps_per_s": rec.steps / machine_s,
                         "checked_steps_per_s": n_checked / checked_s,
                         "bare_ops_per_s": n_bare / bare_s,
                         "check_cost": checked_s / bare_s})
    steps = settings.default.stateful_step_count
    return {"rows": rows, "hypothesis_ceiling": _hypothesis_ceiling(examples, steps)}


def format_bench(result: dict) -> str:
    lines = [f"{'variant':<12} {'regime':<28} {'steps':>6} {'machine/s':>10} {'checked/s':>10} "
             f"{'bare/s':>10} {'checked:bare':>12}"]
    for r in result["rows"]:
        regime = " ".join(f"{k}={v}" for k, v in r["params"].items())
        lines.append(f"{r['variant']:<12} {regime:<28} {r['steps']:>6} "
                     f"{r['machine_steps_per_s']:>10,.0f} {r['checked_steps_per_s']:>10,.0f} "
                     f"{r['bare_ops_per_s']:>10,.0f} {r['check_cost']:>11.2f}x")
    lines.append(f"Hypothesis ceiling (trivial machine, same settings): "
                 f"{result['hypothesis_ceiling']:,.0f} steps/s")
    return "\n".join(lines)
