"""``kvcheck bench --findings``: how soon each search engine finds the bugs that are really there.

For every trace in ``tests/upstream_findings/`` whose target is usable here, from a cold start
(no example database, no replay of the trace), in find mode for that finding only
(``--known-findings find=ID``: the other findings stay declined), in the trace's regime: each
engine runs once per seed 0..N-1 with a time budget and stops at its first failure.  A seed
*found* the finding when that first failure is labelled with the finding's id
(``state_machines/failures.py``: the corpus signature, or the trace no longer failing once the
finding is declined again).  Per finding and engine: found in k of N seeds, the median seconds
to the first failure and the median shrunk steps over the seeds that found it.

The same for the catalogued faults with the longest minimal traces (``LONG_FAULTS``: the
deepest rows of ``docs/model-checking.md``'s fault -> depth table), where a seed found the fault
when it failed on one of the fault's own properties.  The machine and its load are stated with
the table (``machine()``): timings on a shared box are only comparable within one run.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from state_machines.bench import median
from state_machines.failures import finding_id
from state_machines.regressions import UPSTREAM_FINDINGS

ENGINES = ("hypothesis", "native")
# catalogued faults whose shortest counterexample is longest (docs/model-checking.md, the
# fault -> depth table and tests/test_explore.py's FAULT_DEPTH / TOO_DEEP): P8 8 ops, P5 ~7,
# C4 6, S1 5, C3 5
LONG_FAULTS = ("P8", "P5", "C4", "S1", "C3")


def machine() -> dict:
    """The machine and its load, to print with the table."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"cpu": model, "cores": os.cpu_count() or 1, "load": [round(x, 2) for x in load],
            "python": platform.python_version()}


def usable_findings(corpus: Path = UPSTREAM_FINDINGS, src: str | None = None):
    """``(path, trace, id, None)`` for every corpus trace usable here, ``(path, trace, id,
    why)`` for the others."""
    from state_machines.commands.common import UsageError, target_named
    from state_machines.trace import TraceError, load_trace
    from state_machines.variants import get_variant

    out = []
    for path in sorted(Path(corpus).glob("*.json")):
        try:
            trace = load_trace(path)
        except TraceError as exc:
            out.append((path, None, None, f"unreadable: {exc}"))
            continue
        fid = finding_id(trace, path)
        tsrc = src or trace.src
        why = None
        try:
            target_named(get_variant(trace.variant), trace.target, tsrc)
            from state_machines.gate import _other_release

            why = _other_release(trace, tsrc)
        except UsageError as exc:
            why = str(exc)
        if why is None and trace.target != "reference":
            from state_machines.targets import get_target

            if fid not in get_target(trace.target).findings.get(trace.variant, ()):
                why = f"target {trace.target} declares no finding {fid} for {trace.variant}"
        out.append((path, trace, fid, why))
    return out


def run_once(spec, params, engine: str, seed: int, budget: float, **kw):
    """One cold run of ``engine`` that stops at its first failure."""
    if engine == "native":
        from state_machines.native import native_fuzz

        return native_fuzz(spec, params, seed=seed, budget=budget, workers=1,
                           shrink_budget=30.0, stop_on_first=True, **kw)
    from state_machines.fuzz import fuzz

    return fuzz(spec, params, seed=seed, budget=budget, stop_on_first=True, database=None,
                **kw)


def over_seeds(found_it, run, seeds: int) -> dict:
    times, steps, other = [], [], 0
    for seed in range(seeds):
        o = run(seed)
        first = o.failures[0] if o.failures else None
        if first is not None and found_it(first):
            times.append(first.first_seen)
            steps.append(len(first.trace.ops))
        elif first is not None:
            other += 1
    return {"found": len(times), "seeds": seeds, "other_failure": other,
            "median_s": median(times), "median_steps": median(steps)}


def bench_findings(*, seeds: int = 5, budget: float = 20.0, src: str | None = None,
                   engines=ENGINES, progress=None, variant: str | None = None) -> dict:
    """``variant``: only the findings of that variant (else every one usable here)."""
    from state_machines.variants import get_variant

    rows, skipped = [], []
    for path, trace, fid, why in usable_findings(src=src):
        if variant is not None and (trace is None or trace.variant != variant):
            continue
        if why:
            skipped.append({"finding": path.stem, "why": why})
            continue
        spec = get_variant(trace.variant)
        kw = {"target": trace.target, "src": src or trace.src,
              "known_findings": f"find={fid}"}
        row = {"finding": f"{trace.target}-{trace.variant}-{fid}", "file": path.name,
               "params": trace.params, "minimal_steps": len(trace.ops)}
        for engine in engines:
            row[engine] = over_seeds(
                lambda f: f.known == fid,
                lambda seed: run_once(spec, trace.params, engine, seed, budget, **kw), seeds)
        rows.append(row)
        if progress:
            progress(row)
    return {"machine": machine(), "seeds": seeds, "budget": budget, "rows": rows,
            "skipped": skipped}


def bench_long_faults(*, seeds: int = 5, budget: float = 20.0, engines=ENGINES,
                      faults=LONG_FAULTS, progress=None, variant: str | None = None) -> list[dict]:
    """``variant``: only the faults of that variant."""
    from caches.faults import get_fault
    from state_machines.variants import get_variant

    rows = []
    for fid in faults:
        f = get_fault(fid)
        if variant is not None and f.variant != variant:
            continue
        spec = get_variant(f.variant)
        params = spec.check_params({**spec.regimes[0], **f.params})
        row = {"finding": f"fault {fid}", "params": params, "minimal_steps": None}
        for engine in engines:
            row[engine] = over_seeds(
                lambda failure: failure.signature.prop in f.properties,
                lambda seed: run_once(spec, params, engine, seed, budget, fault=fid), seeds)
        rows.append(row)
        if progress:
            progress(row)
    return rows


def _cell(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def table(result: dict, markdown: bool = False) -> str:
    from state_machines.commands.common import describe_regime, format_table

    m = result["machine"]
    head = (f"{m['cores']} cores ({m['cpu']}), load average {m['load'][0]:.2f} / "
            f"{m['load'][1]:.2f} / {m['load'][2]:.2f} at the start, Python {m['python']}; "
            f"{result['seeds']} seeds per engine, cold start, {result['budget']:g}s budget "
            "per run, stop at the first failure")
    header = ["finding", "regime", "min steps"]
    for e in ENGINES:
        header += [f"{e} found", f"{e} median s", f"{e} median steps"]
    rows = []
    for r in result["rows"] + result.get("faults", []):
        cells = [r["finding"], describe_regime(r["params"]), _cell(r["minimal_steps"], "{}")]
        for e in ENGINES:
            x = r.get(e)
            if x is None:
                cells += ["-", "-", "-"]
                continue
            cells += [f"{x['found']}/{x['seeds']}"
                      + (f" (+{x['other_failure']} other)" if x["other_failure"] else ""),
                      _cell(x["median_s"], "{:.2f}"), _cell(x["median_steps"], "{:g}")]
        rows.append(cells)
    skipped = [f"not usable here: {s['finding']}: {s['why']}" for s in result["skipped"]]
    if not markdown:
        return "\n".join([head, format_table(rows, header)] + skipped)
    md = [head, "", "| " + " | ".join(header) + " |",
          "|" + "---|" * 3 + "---:|" * (3 * len(ENGINES))]
    md += ["| " + " | ".join(str(c) for c in cells) + " |" for cells in rows]
    return "\n".join(md + ([""] + [f"- {s}" for s in skipped] if skipped else []))
