"""Speed figures, measured in one run (a benchmark, never a timed test).

For each variant/regime it
1. runs the Hypothesis machine (every invariant on) for ``examples`` examples, recording every
   op it executed -> *machine steps/s* (includes Hypothesis's own per-step cost);
2. replays those exact op sequences on fresh subjects with every check on, without
   Hypothesis -> *checked steps/s*;
3. replays them again with every check off (no invariants, no fingerprint read-back, no
   match-contract or progress checks) -> *bare ops/s*;
and measures Hypothesis's ceiling on a trivial machine.  check cost = checked / bare time.

It also measures, per catalogued fault, the time to first detection and the shrunk trace's
length (median over ``seeds`` seeds of ``fuzz(..., seed=s)``), and the throughput of the
generic clean-machine tests (``tests/test_machines.py``) under pytest-xdist with 1 and 2
workers; ``markdown`` renders all of it as ``docs/benchmarks.md``.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.reporting import with_reporter
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from state_machines.machine import Recorder, machine_class
from state_machines.profiles import without_shrink
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


def _replay_all(spec, params, sequences, device, checking: bool, target: str = "reference",
                src: str | None = None) -> tuple[int, float]:
    n, elapsed = 0, 0.0
    for ops in sequences:
        run = Run(spec, params, None, target, device, src=src)
        run.subject.checking = checking
        t = time.perf_counter()
        for op in ops:  # the bare op (and check) cost: beside Run's step on purpose
            spec.ops.apply(run.subject, op)
            if checking:
                run.subject.check()
            n += 1
        elapsed += time.perf_counter() - t
    return n, elapsed


class BenchError(RuntimeError):
    """The machine failed while being timed (a broken cache has no speed to report)."""


def bench(names=None, *, examples: int = 60, device: str | None = None,
          target: str = "reference", src: str | None = None) -> dict:
    variants = all_variants()
    rows = []
    for name in names or list(variants):
        spec = variants[name]
        for params in spec.regimes_for(target):
            params = spec.check_params(params, target)
            rec = Recorder()
            rec.keep_ops = True
            machine = machine_class(spec, params, device=device, recorder=rec, target=target,
                                    src=src)
            t = time.perf_counter()
            try:
                with with_reporter(lambda _m: None):
                    # no shrink phase: a failure is reported, not shown ("fuzz it"), and
                    # Hypothesis's shrinking of it cost 16 s of a 20 s bench
                    run_state_machine_as_test(machine, settings=without_shrink(settings(
                        settings.default, max_examples=examples, derandomize=True,
                        database=None)))
            except Exception as exc:  # a property broke: no speed to measure on this cache
                prop = getattr(exc, "prop", None) or type(exc).__name__
                raise BenchError(f"{name} {params} on target {target}: the machine failed "
                                 f"({prop}); fuzz it to see the trace") from None
            machine_s = time.perf_counter() - t
            seqs = rec.sequences
            n_checked, checked_s = _replay_all(spec, params, seqs, device, True, target, src)
            n_bare, bare_s = _replay_all(spec, params, seqs, device, False, target, src)
            rows.append({"variant": name, "target": target, "params": params,
                         "steps": rec.steps,
                         "machine_steps_per_s": rec.steps / machine_s,
                         "checked_steps_per_s": n_checked / checked_s,
                         "bare_ops_per_s": n_bare / bare_s,
                         "check_cost": checked_s / bare_s})
    steps = settings.default.stateful_step_count
    return {"rows": rows, "hypothesis_ceiling": _hypothesis_ceiling(examples, steps)}


def format_bench(result: dict) -> str:
    lines = [(f"{'variant':<12} {'regime':<28} {'steps':>6} {'machine/s':>10} {'checked/s':>10} "
             f"{'bare/s':>10} {'checked:bare':>12}")]
    for r in result["rows"]:
        regime = " ".join(f"{k}={v}" for k, v in r["params"].items())
        target = r.get("target", "reference")
        name = r["variant"] + (f" [{target}]" if target != "reference" else "")
        lines.append(f"{name:<12} {regime:<28} {r['steps']:>6} "
                     f"{r['machine_steps_per_s']:>10,.0f} {r['checked_steps_per_s']:>10,.0f} "
                     f"{r['bare_ops_per_s']:>10,.0f} {r['check_cost']:>11.2f}x")
    lines.append(f"Hypothesis ceiling (trivial machine, same settings): "
                 f"{result['hypothesis_ceiling']:,.0f} steps/s")
    return "\n".join(lines)


# -- faults: time to first detection and shrunk length, median over seeds -----------------------
def median(xs):
    """The median of ``xs``, or None when there is none (a fault or finding never found)."""
    return statistics.median(xs) if xs else None


def over_seeds(fault, run, seeds: int) -> dict:
    """``run(seed)`` (a fuzz outcome with ``fault`` on) for seeds 0..seeds-1: in how many it
    was caught, how many on the fault's own property, and the medians over those."""
    times, lengths, props = [], [], []
    for seed in range(seeds):
        o = run(seed)
        if o.failed:
            times.append(o.first_failure_seconds or 0.0)
            lengths.append(len(o.trace.ops))
            props.append(o.prop)
    return {"caught": len(times), "on_property": sum(p in fault.properties for p in props),
            "median_first_detection_s": median(times),
            "median_shrunk_steps": median(lengths),
            "max_shrunk_steps": max(lengths) if lengths else None}


def bench_faults(names=None, *, seeds: int = 5, device: str | None = None,
                 progress=None) -> list[dict]:
    from caches.faults import faults_of
    from state_machines.fuzz import fuzz

    variants = all_variants()
    rows = []
    for name in names or list(variants):
        spec = variants[name]
        for f in faults_of(name):
            params = spec.check_params({**spec.regimes[0], **f.params})
            row = {"variant": name, "fault": f.id, "name": f.name, "seeds": seeds,
                   **over_seeds(f, lambda seed: fuzz(spec, params, fault=f.id, seed=seed,
                                                     device=device), seeds)}
            rows.append(row)
            if progress:
                progress(row)
    return rows


# -- pytest-xdist: 1 vs 2 workers on the generic clean-machine tests ----------------------------
def bench_xdist(names=None, *, workers=(1, 2), profile: str = "ci", progress=None,
                every: float = 15.0) -> list[dict]:
    """``progress(text)`` is called when each run starts and every ``every`` seconds while it
    runs (a run takes minutes: no silent phase)."""
    from hypothesis import settings as hs

    from state_machines.profiles import register_profiles

    register_profiles()
    examples = hs.get_profile(profile).max_examples
    variants = all_variants()
    chosen = [variants[n] for n in (names or list(variants))]
    items = sum(len(s.regimes) for s in chosen)
    select = " or ".join(s.machine.__name__ for s in chosen)
    root = Path(__file__).resolve().parent.parent
    rows = []
    for n in workers:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(n),
               "tests/test_machines.py", "-k", select]
        t = time.perf_counter()
        if progress:
            progress(f"-n {n}: {items} machine tests x {examples} examples ...")
        with subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "HYPOTHESIS_PROFILE": profile}) as p:
            passed = [0]

            def read(p=p, passed=passed):
                for line in p.stdout:  # pytest -q prints a dot per test
                    passed[0] += line.count(".") if set(line.strip()) <= set(".FEsx") else 0

            import threading

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            while p.poll() is None:
                try:
                    p.wait(timeout=every)
                except subprocess.TimeoutExpired:
                    if progress:
                        progress(f"-n {n}: {time.perf_counter() - t:.0f}s, {passed[0]} of "
                                 f"{items} machine tests done")
            reader.join(5)
            done = p
        wall = time.perf_counter() - t
        rows.append({"workers": n, "items": items, "examples": items * examples,
                     "seconds": wall, "examples_per_s": items * examples / wall,
                     "ok": done.returncode == 0,
                     "command": f"HYPOTHESIS_PROFILE={profile} " + " ".join(
                         ["python", "-m"] + cmd[2:-1] + [repr(select)])})
    return rows


# -- the markdown report ------------------------------------------------------------------------
def _fmt(v, spec="{:,.0f}"):
    return "-" if v is None else spec.format(v)


def markdown(result: dict, command: str) -> str:
    import hypothesis
    import torch

    lines = ["# Benchmarks", "",
             "Measured in one run by:", "", "```", command, "```", "",
             (f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
             f"{platform.python_version()}, torch {torch.__version__}, hypothesis "
             f"{hypothesis.__version__}, profile `{result.get('profile', '?')}`, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."),
             "", ("These are benchmarks, not tests: nothing asserts a time. Numbers from a "
             "shared machine are noisy; compare rows of one run only."), "",
             "## Checked steps vs bare cache ops", "",
             ("*machine/s*: the Hypothesis machine with every invariant (includes Hypothesis's "
             "own per-step cost); *checked/s*: the same op sequences replayed with every "
             "invariant after every op, no Hypothesis; *bare/s*: replayed again with every "
             "check off; *checked:bare*: time ratio (the cost of checking)."), "",
             ("| variant | regime | steps | machine steps/s | checked steps/s | bare ops/s "
             "| checked:bare |"), "|---|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        regime = " ".join(f"{k}={v}" for k, v in r["params"].items())
        lines.append(f"| {r['variant']} | {regime} | {r['steps']} | "
                     f"{r['machine_steps_per_s']:,.0f} | {r['checked_steps_per_s']:,.0f} | "
                     f"{r['bare_ops_per_s']:,.0f} | {r['check_cost']:.2f}x |")
    lines += ["", (f"**Reference line -- Hypothesis's ceiling on this machine** (a trivial "
              f"one-rule machine, same settings): **{result['hypothesis_ceiling']:,.0f} "
              "steps/s**."), ""]
    if result.get("faults"):
        seeds = result["faults"][0]["seeds"]
        lines += ["## Faults: time to first detection and shrunk length", "",
                  (f"`fuzz(..., fault=F, seed=s)` for s in 0..{seeds - 1}, the fault's regime; "
                  "medians over the seeds that caught it."), "",
                  ("| variant | fault | caught | on its property | median s to first detection "
                  "| median shrunk steps | max shrunk steps |"),
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r in result["faults"]:
            lines.append(f"| {r['variant']} | {r['fault']} {r['name']} | {r['caught']}/"
                         f"{r['seeds']} | {r['on_property']}/{r['seeds']} | "
                         f"{_fmt(r['median_first_detection_s'], '{:.3f}')} | "
                         f"{_fmt(r['median_shrunk_steps'], '{:g}')} | "
                         f"{_fmt(r['max_shrunk_steps'], '{:g}')} |")
        lines.append("")
    if result.get("xdist"):
        lines += ["## pytest-xdist: 1 vs 2 workers", "",
                  ("The generic clean-machine tests (one item per variant and regime), "
                  "examples = items x the profile's max_examples; wall time includes "
                  "starting the workers."), "",
                  "| workers | items | examples | seconds | examples/s | passed |",
                  "|---:|---:|---:|---:|---:|---|"]
        for r in result["xdist"]:
            lines.append(f"| {r['workers']} | {r['items']} | {r['examples']} | "
                         f"{r['seconds']:.1f} | {r['examples_per_s']:,.1f} | "
                         f"{'yes' if r['ok'] else 'NO'} |")
        lines += ["", f"Command: `{result['xdist'][0]['command']}` (and `-n 2`).", ""]
    return "\n".join(lines)


def format_extra(result: dict) -> str:
    lines = []
    for r in result.get("faults", []):
        lines.append(f"{r['variant']:<12} {r['fault']:<4} caught {r['caught']}/{r['seeds']} "
                     f"(on property {r['on_property']}), median first detection "
                     f"{_fmt(r['median_first_detection_s'], '{:.3f}')}s, median shrunk "
                     f"{_fmt(r['median_shrunk_steps'], '{:g}')} steps")
    for r in result.get("xdist", []):
        lines.append(f"xdist -n {r['workers']}: {r['examples']} examples in "
                     f"{r['seconds']:.1f}s = {r['examples_per_s']:,.1f} examples/s"
                     f"{'' if r['ok'] else ' (TESTS FAILED)'}")
    return "\n".join(lines)
