"""The nightly fuzz job: a time budget spent across every variant, regime and available target,
in parallel on all cores (pytest-xdist), with a live progress display.

The parent (``run_nightly``) writes a plan, starts ``pytest -n W --pyargs
state_machines.nightly_items`` in its own process group, and redraws a per-item table from the
progress files the items write.  Each item (``run_item``) fuzzes one variant/regime/target for
its share of the budget with the ``nightly`` profile and the shared example database, and writes
its result -- also when interrupted.  Then every new failure is exported three ways: the trace
JSON, a generated stand-alone pytest file (ready to drop into ``tests/regressions/``), and an
entry in ``summary.md``; pytest's JUnit XML lands beside it.  Ctrl-C or a CI timeout (SIGTERM)
interrupts the workers, and the summary still gets written from what was found so far.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from state_machines.regressions import REGRESSIONS, UPSTREAM_FINDINGS, export, known_digests

PLAN_ENV = "KVCHECK_NIGHTLY_PLAN"


# -- plan ---------------------------------------------------------------------------------------
@dataclass
class Item:
    id: str
    variant: str
    params: dict
    target: str
    budget: float
    seed: int
    known_findings: str = "decline"
    src: str | None = None

    def label(self) -> str:
        regime = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.variant} {regime}" + (f" [{self.target}]" if self.target != "reference"
                                              else "")


def target_available(spec, params, target, src=None) -> str | None:
    """None if ``target`` can be used here, else why not: a missing environment or an unknown
    or broken plug-in (``state_machines.targets.unavailable_reason``).  Nothing is built, so
    an adapter bug is never mistaken for "unavailable": it fails the item that builds it."""
    from state_machines.targets import unavailable_reason

    if target not in spec.targets:
        return f"target {target!r} has no {spec.name} variant"
    if target in spec.extra_targets:
        return None
    return unavailable_reason(target, src)


def plan(budget: float, workers: int, variants=None, seed: int = 0, *, targets=None,
         src: str | None = None, known_findings: str = "decline"):
    """Items (one per variant x regime x available target; ``targets`` narrows them) and the
    skipped targets."""
    from state_machines.variants import all_variants

    specs = all_variants()
    names = variants or list(specs)
    combos, skipped = [], []
    for name in names:
        spec = specs[name]
        for regime in spec.regimes:
            params = spec.check_params(regime)
            for target in spec.targets:
                if targets and target not in targets:
                    continue
                if src is not None and target != "reference" and not _takes_src(target):
                    continue  # --src is for the target that loads a checkout
                why = target_available(spec, params, target,
                                       src if target != "reference" else None)
                if why:
                    skipped.append((name, params, target, why))
                else:
                    combos.append((name, params, target))
    # each worker runs items back to back; leave ~10% for start-up and shrinking
    share = max(5.0, 0.9 * budget * workers / max(1, len(combos)))
    items = []
    for i, (name, params, target) in enumerate(combos):
        tag = "-".join(f"{k}{v}" for k, v in params.items())
        items.append(Item(f"{name}-{tag}-{target}", name, params, target, share, seed + i,
                          known_findings, src if target != "reference" else None))
    return items, skipped


# -- one item (inside a pytest-xdist worker) -------------------------------------------------
def run_item(item: Item, out: Path, database: str | None, github_artifact: str | None,
             deadline: float | None = None) -> dict:
    from state_machines.databases import open_database
    from state_machines.fuzz import fuzz
    from state_machines.profiles import load_profile
    from state_machines.variants import get_variant

    load_profile("nightly")
    spec = get_variant(item.variant)
    progress_file = out / "progress" / f"{item.id}.json"
    progress_file.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()

    def progress(rec, done=False):
        _write(progress_file, {"id": item.id, "label": item.label(), "examples": rec.examples,
                               "steps": rec.steps, "failures": int(rec.first_failure_at is not None),
                               "started": started, "budget": item.budget, "done": done})

    db = open_database(database, github_artifact)
    budget = item.budget if deadline is None else max(1.0, min(item.budget,
                                                               deadline - time.time()))
    outcome = fuzz(spec, item.params, target=item.target, budget=budget, seed=item.seed,
                   out_dir=out / "traces", progress=progress, database=db, src=item.src,
                   known_findings=item.known_findings)
    result = {"id": item.id, "label": item.label(), "variant": item.variant,
              "params": item.params, "target": item.target, "examples": outcome.examples,
              "steps": outcome.steps, "seconds": round(outcome.seconds, 2),
              "failed": outcome.failed, "property": outcome.prop,
              "message": outcome.trace.violation["message"] if outcome.failed else None,
              "trace": str(outcome.trace_path) if outcome.trace_path else None,
              "interrupted": outcome.interrupted, "error": outcome.error,
              "reached": outcome.reached or {}}
    _write(out / "results" / f"{item.id}.json", result)
    _write(progress_file, {"id": item.id, "label": item.label(), "examples": outcome.examples,
                           "steps": outcome.steps, "failures": int(outcome.failed),
                           "started": started, "budget": item.budget, "done": True})
    return result


def _takes_src(target: str) -> bool:
    from state_machines.targets import get_target

    return get_target(target).takes_src


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _read_all(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return out


# -- the parent ---------------------------------------------------------------------------------
def progress_table(items: list[Item], out: Path) -> list[str]:
    seen = {p["id"]: p for p in _read_all(out / "progress")}
    now = time.time()
    lines = [f"{'item':<44} {'examples':>8} {'steps':>9} {'fail':>4} {'left':>6}"]
    for it in items:
        p = seen.get(it.id)
        if p is None:
            lines.append(f"{it.label():<44} {'-':>8} {'-':>9} {'-':>4} {'queued':>6}")
            continue
        left = "done" if p["done"] else f"{max(0, p['started'] + p['budget'] - now):.0f}s"
        lines.append(f"{it.label():<44} {p['examples']:>8} {p['steps']:>9,} "
                     f"{p['failures']:>4} {left:>6}")
    return lines


class _Interrupted(Exception):
    pass


def run_nightly(budget: float, out: Path, *, workers: int | None = None, variants=None,
                database: str | None = None, github_artifact: str | None = None,
                seed: int | None = None, stream=None, targets=None, src: str | None = None,
                known_findings: str = "decline") -> int:
    stream = stream or sys.stderr
    workers = workers or os.cpu_count() or 1
    seed = seed if seed is not None else int(time.time()) % 100_000
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("progress", "results"):
        for p in (out / sub).glob("*.json"):
            p.unlink()
    items, skipped = plan(budget, workers, variants, seed, targets=targets, src=src,
                          known_findings=known_findings)
    plan_file = out / "plan.json"
    # items stop by this wall-clock time, whatever worker start-up took
    deadline = time.time() + budget - 3
    _write(plan_file, {"items": [it.__dict__ for it in items], "out": str(out.resolve()),
                       "database": database, "github_artifact": github_artifact,
                       "deadline": deadline})
    print(f"nightly: {len(items)} items on {workers} workers, budget {budget:.0f}s, seed {seed}"
          + "".join(f"\n  skipped {n} {' '.join(f'{k}={v}' for k, v in p.items())} [{t}]: {w}"
                    for n, p, t, w in skipped), file=stream, flush=True)
    env = {**os.environ, PLAN_ENV: str(plan_file.resolve())}
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "state_machines.nightly_items",
           "-p", "no:cacheprovider", "-q", "--no-header", f"--junitxml={out / 'junit.xml'}",
           "-o", "junit_family=xunit2"]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "load"]
    log = open(out / "pytest.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    interrupted = False
    old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(_Interrupted()))
    tty = stream.isatty()
    drawn, last_print = 0, 0.0
    try:
        while proc.poll() is None:
            time.sleep(1.0)
            lines = progress_table(items, out)
            if tty:
                stream.write(("\x1b[F" * drawn) + "\n".join(f"{ln}\x1b[K" for ln in lines)
                             + "\n")
                stream.flush()
                drawn = len(lines)
            elif time.time() - last_print > 30:
                print("\n".join(lines), file=stream, flush=True)
                last_print = time.time()
    except (KeyboardInterrupt, _Interrupted):
        interrupted = True
        print("\nnightly: interrupted -- stopping workers and writing what was found so far",
              file=stream, flush=True)
        _stop(proc)
    finally:
        signal.signal(signal.SIGTERM, old)
        log.close()
    print("\n".join(progress_table(items, out)), file=stream, flush=True)
    return summarise(items, skipped, out, budget, workers, seed, interrupted, stream)


def _stop(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def summarise(items, skipped, out: Path, budget, workers, seed, interrupted, stream) -> int:
    from state_machines.commands.common import print_failure
    from state_machines.fuzz import FuzzOutcome
    from state_machines.trace import TraceError, load_trace

    results = {r["id"]: r for r in _read_all(out / "results")}
    progress = {p["id"]: p for p in _read_all(out / "progress")}
    known = known_digests(REGRESSIONS, UPSTREAM_FINDINGS)
    rows, new, errors = [], [], []
    for it in items:
        r = results.get(it.id)
        p = progress.get(it.id, {})
        if r is None:
            status = "interrupted" if interrupted else "no result (worker died?)"
            if not interrupted:
                errors.append(f"{it.label()}: {status}")
            rows.append((it.label(), p.get("examples", 0), p.get("steps", 0), "-", status))
            continue
        status = "clean"
        if r["error"]:
            status = f"harness error: {r['error'][:80]}"
            errors.append(f"{it.label()}: {r['error']}")
        elif r["failed"]:
            status = f"FAILED {r['property']}"
            try:
                trace = load_trace(r["trace"])
            except (TraceError, TypeError):
                trace = None
            if trace is not None and trace.digest() not in known:
                status += " (new)"
                json_out, test_out = export(Path(r["trace"]), out / "regressions",
                                            f"the nightly job, seed {seed}")
                buf = io.StringIO()
                with redirect_stdout(buf):
                    print_failure(FuzzOutcome(trace.variant, trace.params, trace.fault,
                                              trace.target, trace=trace,
                                              trace_path=Path(r["trace"])))
                new.append((it, r, json_out, test_out, buf.getvalue()))
            else:
                status += " (known)"
        elif r["interrupted"]:
            status = "interrupted"
        rows.append((it.label(), r["examples"], r["steps"], f"{r['seconds']:.0f}s", status))
    md = [f"# kvcheck nightly\n",
          f"- budget {budget:.0f}s on {workers} workers, seed {seed}"
          + (" -- **interrupted**: partial results" if interrupted else ""),
          f"- new failures: **{len(new)}**; JUnit XML: `{out / 'junit.xml'}`\n",
          "| item | examples | steps | time | result |", "|---|---:|---:|---:|---|"]
    md += [f"| {a} | {b} | {c:,} | {d} | {e} |" for a, b, c, d, e in rows]
    for n, p, t, w in skipped:
        md.append(f"| {n} {' '.join(f'{k}={v}' for k, v in p.items())} [{t}] | - | - | - | "
                  f"skipped: {w} |")
    for it, r, json_out, test_out, text in new:
        md += [f"\n## New failure: {it.label()} -- `{r['property']}`\n",
               f"- trace: `{json_out}`", f"- regression test: `{test_out}` (promote: copy both "
               "into `tests/regressions/` once fixed)",
               f"- replay: `kvcheck replay {json_out} --html {json_out.with_suffix('.html')}`\n",
               "```", text.strip(), "```"]
    unreached = never_reached(items, results, interrupted)
    if unreached:
        md += ["\n## Transitions never reached\n",
               "Each variant declares interesting transitions it must reach (`kvcheck coverage`);"
               " these never fired in any regime tonight:\n"]
        md += [f"- {variant}: {', '.join(names)}" for variant, names in unreached.items()]
    if errors:
        md += ["\n## Harness errors\n"] + [f"- {e}" for e in errors]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    print(f"\nsummary: {out / 'summary.md'}  ({len(new)} new failure(s)"
          + (f", {sum(map(len, unreached.values()))} transition(s) never reached"
             if unreached else "")
          + (", interrupted" if interrupted else "") + ")", file=stream, flush=True)
    return 1 if new or errors or unreached else 0


def never_reached(items, results, interrupted) -> dict[str, list[str]]:
    """Per variant, declared "sometimes" transitions no regime reached (a completed run only:
    an interrupted night proves nothing about reachability)."""
    from state_machines.variants import get_variant

    if interrupted:
        return {}
    seen: dict[str, dict] = {}
    for it in items:
        r = results.get(it.id)
        if r is None or r.get("failed") or r.get("error"):
            continue  # a failing run stops early; its coverage says nothing
        counts = seen.setdefault(it.variant, {})
        for name, n in (r.get("reached") or {}).items():
            counts[name] = counts.get(name, 0) + n
    out = {}
    for variant, counts in seen.items():
        declared = get_variant(variant).sometimes or ()
        names = [n for n in declared if not counts.get(n)]
        if names:
            out[variant] = names
    return out
