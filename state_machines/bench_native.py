"""``kvcheck bench --engine native``: the native engine against the Hypothesis machines.

Measured in one run, one core unless said otherwise:

* per variant and regime: the Hypothesis machine's checked steps/s (``ci`` settings,
  derandomised, no database) and the native engine's (swarm walks, one worker, every invariant
  after every op), and their ratio;
* per variant and regime, where a step's time goes (microseconds per step): the machine's
  and the native engine's whole step, and of the native walks' own ops replayed, the op and
  the checks after it -- the rest of a native step is the engine's (generation, ``Run``'s
  bookkeeping) -- and the ratio a native engine costing nothing would reach: the ratio can
  only grow by making the op and the checks cheaper, which the machine shares;
* the native engine on 1 and 2 worker processes (the same seed and time);
* per catalogued fault, over seeds 0..N-1: caught in how many, median seconds to first
  detection, median shrunk length -- for both engines.

A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import time

from hypothesis import settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from state_machines.deadline import Ticker, op_deadline
from state_machines.machine import Recorder, machine_class
from state_machines.native import native_fuzz, run_walk
from state_machines.run import Run
from state_machines.variants import all_variants


def _regime(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def machine_rate(spec, params, examples: int, device=None) -> float:
    """Checked steps/s of the Hypothesis machine over ``examples`` clean examples."""
    rec = Recorder()
    machine = machine_class(spec, params, device=device, recorder=rec)
    t = time.perf_counter()
    with with_reporter(lambda _m: None):
        run_state_machine_as_test(machine, settings=settings(
            settings.default, max_examples=examples, derandomize=True, database=None))
    return rec.steps / (time.perf_counter() - t)


def native_rate(spec, params, seconds: float, workers: int = 1, device=None) -> float:
    out = native_fuzz(spec, params, budget=seconds, seed=0, workers=workers, device=device)
    return out.steps / out.seconds if out.seconds else 0.0


def step_costs(spec, params, walks: int = 200, first: int = 200, device=None) -> dict:
    """Microseconds per step of the op and of the checks after it, over the ops of native
    walks ``first .. first + walks - 1`` (seed 0: full-length walks) replayed on fresh subjects
    -- the part of a step both engines pay."""
    clock = time.perf_counter
    op_s = check_s = 0.0
    steps = 0
    with Ticker(op_deadline()):
        for i in range(first, first + walks):
            ops = run_walk(spec, params, 0, i, device=device).run_ops
            run = Run(spec, params, device=device)
            apply, subject = spec.ops.apply, run.subject
            for op in ops:
                t0 = clock()
                apply(subject, op)
                t1 = clock()
                subject.check()
                op_s += t1 - t0
                check_s += clock() - t1
            steps += len(ops)
    return {"op": 1e6 * op_s / steps, "checks": 1e6 * check_s / steps} if steps else {}


def speed(names=None, *, examples: int = 60, seconds: float = 3.0, device=None,
          progress=None) -> list[dict]:
    variants = all_variants()
    rows = []
    for name in names or list(variants):
        spec = variants[name]
        for regime in spec.regimes:
            params = spec.check_params(regime)
            m = machine_rate(spec, params, examples, device)
            n = native_rate(spec, params, seconds, 1, device)
            row = {"variant": name, "regime": _regime(params), "machine_steps_per_s": m,
                   "native_steps_per_s": n, "ratio": n / m if m else None}
            if m and n:
                us = {"machine": 1e6 / m, "native": 1e6 / n, **step_costs(spec, params,
                                                                          device=device)}
                us["native_engine"] = us["native"] - us["op"] - us["checks"]
                row["us_per_step"] = us
                row["ratio_if_engine_free"] = us["machine"] / (us["op"] + us["checks"])
            rows.append(row)
            if progress:
                progress(row)
    return rows


def workers(name: str = "radix", *, seconds: float = 5.0, device=None) -> dict:
    spec = all_variants()[name]
    params = spec.check_params(spec.regimes[0])
    one = native_rate(spec, params, seconds, 1, device)
    two = native_rate(spec, params, seconds, 2, device)
    return {"variant": name, "regime": _regime(params), "workers_1_steps_per_s": one,
            "workers_2_steps_per_s": two, "speedup": two / one if one else None}


def faults(names=None, *, seeds: int = 5, budget: float = 20.0, device=None,
           progress=None) -> list[dict]:
    """Both engines on every catalogued fault of ``names``, seeds 0..seeds-1."""
    from caches.faults import faults_of
    from state_machines.bench import over_seeds
    from state_machines.fuzz import fuzz

    variants = all_variants()
    rows = []
    for name in names or list(variants):
        spec = variants[name]
        for f in faults_of(name):
            params = spec.check_params({**spec.regimes[0], **f.params})
            runs = {"hypothesis": lambda seed: fuzz(spec, params, fault=f.id, seed=seed,
                                                    device=device),
                    "native": lambda seed: native_fuzz(spec, params, fault=f.id, seed=seed,
                                                       budget=budget, device=device,
                                                       shrink_budget=30.0)}
            row = {"variant": name, "fault": f.id, "seeds": seeds}
            for engine, run in runs.items():
                row[engine] = over_seeds(f, run, seeds)
            rows.append(row)
            if progress:
                progress(row)
    return rows


def _f(v, spec="{:,.0f}"):
    return "-" if v is None else spec.format(v)


def markdown(result: dict) -> str:
    lines = ["## Native engine vs Hypothesis", "",
             ("*machine*: the Hypothesis machine's checked steps/s (ci settings); *native*: "
              "swarm random walks from the same op generators through the same `Run`, every "
              "invariant after every op, one worker; measured in one run."), "",
             "| variant | regime | machine steps/s | native steps/s | ratio |",
             "|---|---|---:|---:|---:|"]
    for r in result["speed"]:
        lines.append(f"| {r['variant']} | {r['regime']} | {_f(r['machine_steps_per_s'])} | "
                     f"{_f(r['native_steps_per_s'])} | {_f(r['ratio'], '{:.1f}x')} |")
    costs = [r for r in result["speed"] if r.get("us_per_step")]
    if costs:
        lines += ["", ("Where a step's time goes, in microseconds: the machine's whole step and "
                       "the native engine's; of the native walks' own ops replayed, the op and "
                       "the checks after it (both engines pay these); the rest of a native step "
                       "is the engine's own. *free engine*: the ratio if the native engine cost "
                       "nothing -- the ceiling left once only the op and the checks remain."), "",
                  "| variant | regime | machine | native | op | checks | native engine | "
                  "free engine |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in costs:
            u = r["us_per_step"]
            lines.append(f"| {r['variant']} | {r['regime']} | {u['machine']:.1f} | "
                         f"{u['native']:.1f} | {u['op']:.1f} | {u['checks']:.1f} | "
                         f"{u['native_engine']:.1f} | {r['ratio_if_engine_free']:.1f}x |")
    w = result.get("workers")
    if w:
        lines += ["", (f"Native workers ({w['variant']} {w['regime']}): 1 worker "
                       f"{_f(w['workers_1_steps_per_s'])} steps/s, 2 workers "
                       f"{_f(w['workers_2_steps_per_s'])} steps/s: "
                       f"{_f(w['speedup'], '{:.2f}x')}.")]
    if result.get("faults"):
        lines += ["", "| fault | Hypothesis caught | native caught | Hypothesis median s | "
                      "native median s | Hypothesis median steps | native median steps |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in result["faults"]:
            h, n = r["hypothesis"], r["native"]
            lines.append(
                f"| {r['fault']} | {h['caught']}/{r['seeds']} | {n['caught']}/{r['seeds']} | "
                f"{_f(h['median_first_detection_s'], '{:.2f}')} | "
                f"{_f(n['median_first_detection_s'], '{:.2f}')} | "
                f"{_f(h['median_shrunk_steps'], '{:g}')} | "
                f"{_f(n['median_shrunk_steps'], '{:g}')} |")
    return "\n".join(lines)
