"""The nightly fuzz job: a time budget spent across every variant, regime and available target,
in parallel on all cores (pytest-xdist), with a live progress display.

The parent (``run_nightly``) writes a plan, starts ``pytest -n W --pyargs
state_machines.nightly_items`` in its own process group, and redraws a per-item table from the
progress files the items write.  Each item (``run_item``) fuzzes one variant/regime/target for
its share of the budget with the ``nightly`` profile and the shared example database, and writes
its result -- also when interrupted.  Then every new failure is exported three ways: the trace
JSON, a generated stand-alone pytest file (ready to drop into ``tests/regressions/``), and an
entry in ``summary.md``; pytest's JUnit XML lands beside it.  Ctrl-C or a CI timeout (SIGTERM)
interrupts the workers, and the summary still gets written from what was found so far: every
finding made before the signal is kept and exported, the items that completed are listed, the
JUnit XML gets an error test case (an interrupted night is never green), and the exit code is
3 (``EXIT_INTERRUPTED``), whatever was found.  An interrupt is never recorded as a violation.

Budget: each item, when it starts, takes a fair share of the time left --
``fair_share(time left, items not finished, workers)`` -- so an item that starts late (behind
a slow one) still gets its share rather than the last second.
"""

from __future__ import annotations

import io
import json
import math
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
EXIT_INTERRUPTED = 3
EXIT_HARNESS = 4  # (state_machines/commands/common.py) a harness error, never the engine's


# -- plan ---------------------------------------------------------------------------------------
@dataclass
class Item:
    id: str
    variant: str
    params: dict
    target: str
    budget: float
    seed: int
    fault: str | None = None  # a catalogued fault switched on (checking the job end to end)
    known_findings: str = "decline"
    src: str | None = None
    engine: str = "hypothesis"  # or "native" (state_machines/native.py)
    stop_on_first: bool = False  # else the item spends its budget, every distinct failure kept

    def label(self) -> str:
        regime = " ".join(f"{k}={v}" for k, v in self.params.items())
        return (f"{self.variant} {regime}" + (f" [{self.target}]" if self.target != "reference"
                                              else "")
                + (f" with fault {self.fault}" if self.fault else "")
                + (" (native)" if self.engine == "native" else ""))


def workers_for(workers: int, items: list) -> int:
    """The workers a night starts: never more than its items (a worker beyond them would only
    start up -- a torch import -- and wait)."""
    return min(workers, max(1, len(items)))


def fair_share(left: float, unfinished: int, workers: int) -> float:
    """Seconds for an item starting now: the time ``left`` split over the waves of the
    ``unfinished`` items (this one included) still to run on ``workers`` workers."""
    waves = max(1, math.ceil(unfinished / max(1, workers)))
    return max(1.0, left / waves)


def target_available(spec, params, target, src=None) -> str | None:
    """None if ``target`` can be used here, else why not: a missing environment or an unknown
    or broken plug-in (``state_machines.targets.unavailable_reason``).  Nothing is built, so
    an adapter bug is never mistaken for "unavailable": it fails the item that builds it."""
    from state_machines.targets import (params_unavailable_reason, unavailable_reason,
                                        variant_unavailable_reason)

    if target not in spec.targets:
        return f"target {target!r} has no {spec.name} variant"
    if target in spec.extra_targets:
        return None
    # a missing env first; then a variant, or a regime, the installed engine release lacks
    return (unavailable_reason(target, src) or variant_unavailable_reason(target, spec.name, src)
            or params_unavailable_reason(target, spec.name, params, src))


ENGINES = {"hypothesis": ("hypothesis",), "native": ("native",),
           "both": ("hypothesis", "native")}


def plan(budget: float, workers: int, variants=None, seed: int = 0, fault=None, *,
         targets=None, src: str | None = None, known_findings: str = "decline",
         engine: str = "hypothesis", stop_on_first: bool = False, shard=None):
    """Items (one per variant x regime x available target x engine; ``targets`` narrows them)
    and the skipped targets; with ``fault`` (a catalogued fault's id), its variant's regimes
    on the reference only.  ``engine`` ``both``: every combination once per engine, so each
    engine gets an equal share of the budget.  ``shard`` ``(i, n)``: only this shard's items
    (``shard_of``), the budget shared among them; ``stop_on_first``: each item stops at its
    first failure (``fault`` implies it)."""
    from state_machines.variants import all_variants

    specs = all_variants()
    names = variants or list(specs)
    if fault is not None:
        from caches.faults import get_fault

        f = get_fault(fault)
        names = [f.variant]
    combos, skipped = [], []
    for name in names:
        spec = specs[name]
        runs = (spec.plan(spec.targets) if fault is None else
                [(spec.check_params({**spec.regimes[0], **f.params}), "reference")])
        for params, target in runs:
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
    engines = ENGINES[engine]
    items = []
    for i, (name, params, target) in enumerate(combos):
        tag = "-".join(f"{k}{v}" for k, v in params.items())
        for eng in engines:
            items.append(Item(f"{name}-{tag}-{target}" + (f"-{fault}" if fault else "")
                              + ("-native" if eng == "native" else ""), name, params, target,
                              0.0, seed + i, fault, known_findings,
                              src if target != "reference" else None, eng,
                              stop_on_first or fault is not None))
    if shard is not None:
        items = shard_of(items, *shard)
    # each worker runs items back to back; leave ~10% for start-up and shrinking
    share = max(5.0, 0.9 * budget * workers_for(workers, items) / max(1, len(items)))
    for it in items:
        it.budget = share
    return items, skipped


def shard_of(items: list, index: int, count: int) -> list:
    """Shard ``index`` of ``count`` (1-based): every ``count``-th item of the plan sorted by
    id, starting at the ``index``-th -- the same split on every machine, each item in exactly
    one shard, the shards' sizes within one of each other."""
    ordered = sorted(items, key=lambda it: it.id)
    return ordered[index - 1::count]


# -- one item (inside a pytest-xdist worker) -------------------------------------------------
def run_item(item: Item, out: Path, database: str | None, github_artifact: str | None,
             deadline: float | None = None, total: int | None = None,
             workers: int | None = None) -> dict:
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
                               "steps": rec.steps,
                               "failures": getattr(rec, "distinct", 0) or int(
                                   rec.first_failure_at is not None),
                               "started": started, "budget": item.budget, "done": done})

    db = open_database(database, github_artifact)
    if deadline is None:
        budget = item.budget
    elif total is None or workers is None:
        budget = max(1.0, min(item.budget, deadline - time.time()))
    else:  # this item's fair share of what is left, however long the earlier ones took
        done = len(list((out / "results").glob("*.json")))
        budget = fair_share(deadline - time.time(), total - done, workers)
    if item.engine == "native":
        from state_machines.native import native_fuzz

        outcome = native_fuzz(spec, item.params, fault=item.fault, target=item.target,
                              budget=budget, seed=item.seed, workers=1,
                              out_dir=out / "traces", src=item.src,
                              known_findings=item.known_findings,
                              shrink_budget=min(60.0, max(5.0, budget / 4)), progress=progress,
                              stop_on_first=item.stop_on_first)
    else:
        outcome = fuzz(spec, item.params, fault=item.fault, target=item.target, budget=budget,
                       seed=item.seed, out_dir=out / "traces", progress=progress, database=db,
                       src=item.src, known_findings=item.known_findings,
                       stop_on_first=item.stop_on_first)
    result = {"id": item.id, "label": item.label(), "variant": item.variant,
              "engine": item.engine,
              "params": item.params, "target": item.target, "examples": outcome.examples,
              "steps": outcome.steps, "seconds": round(outcome.seconds, 2),
              "failed": outcome.failed, "property": outcome.prop,
              "message": outcome.trace.violation["message"] if outcome.failed else None,
              "trace": str(outcome.trace_path) if outcome.trace_path else None,
              "interrupted": outcome.interrupted, "error": outcome.error,
              "reached": outcome.reached or {},
              "failures": [f.to_json() for f in outcome.failures]}
    _write(out / "results" / f"{item.id}.json", result)
    _write(progress_file, {"id": item.id, "label": item.label(), "examples": outcome.examples,
                           "steps": outcome.steps, "failures": len(outcome.failures),
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


def _raise_interrupted(signum, frame):
    raise _Interrupted(signal.Signals(signum).name)


def run_nightly(budget: float, out: Path, *, workers: int | None = None, variants=None,
                database: str | None = None, github_artifact: str | None = None,
                seed: int | None = None, stream=None, fault: str | None = None,
                targets=None, src: str | None = None, known_findings: str = "decline",
                engine: str = "hypothesis", stop_on_first: bool = False, shard=None) -> int:
    stream = stream or sys.stderr
    workers = workers or os.cpu_count() or 1
    seed = seed if seed is not None else int(time.time()) % 100_000
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("progress", "results"):
        for p in (out / sub).glob("*.json"):
            p.unlink()
    items, skipped = plan(budget, workers, variants, seed, fault, targets=targets, src=src,
                          known_findings=known_findings, engine=engine,
                          stop_on_first=stop_on_first, shard=shard)
    workers = workers_for(workers, items)
    plan_file = out / "plan.json"
    # items stop by this wall-clock time, whatever worker start-up took
    deadline = time.time() + budget - 3
    _write(plan_file, {"items": [it.__dict__ for it in items], "out": str(out.resolve()),
                       "database": database, "github_artifact": github_artifact,
                       "deadline": deadline, "workers": workers, "budget": budget,
                       "seed": seed, "shard": list(shard) if shard else None,
                       "skipped": [[n, p, t, w] for n, p, t, w in skipped]})
    print(f"nightly: {len(items)} items" + (f" (shard {shard[0]}/{shard[1]})" if shard else "")
          + f" on {workers} workers, budget {budget:.0f}s, seed {seed}"
          + "".join(f"\n  skipped {n} {' '.join(f'{k}={v}' for k, v in p.items())} [{t}]: {w}"
                    for n, p, t, w in skipped), file=stream, flush=True)
    env = {**os.environ, PLAN_ENV: str(plan_file.resolve())}
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "state_machines.nightly_items",
           "-p", "no:cacheprovider", "-q", "--no-header", f"--junitxml={out / 'junit.xml'}",
           "-o", "junit_family=xunit2"]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "load"]
    started = time.time()
    interrupted = None  # the signal's name, once one came
    old = signal.signal(signal.SIGTERM, _raise_interrupted)
    old_int = signal.getsignal(signal.SIGINT)
    log = open(out / "pytest.log", "w")
    proc = None
    tty = stream.isatty()
    drawn, last_print = 0, 0.0
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        while True:
            try:  # the display is redrawn every second; a finished run is not waited on
                proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            lines = progress_table(items, out)
            if tty:
                stream.write(("\x1b[F" * drawn) + "\n".join(f"{ln}\x1b[K" for ln in lines)
                             + "\n")
                stream.flush()
                drawn = len(lines)
            elif time.time() - last_print > 30:
                print("\n".join(lines), file=stream, flush=True)
                last_print = time.time()
    except (KeyboardInterrupt, _Interrupted) as exc:
        interrupted = str(exc) if isinstance(exc, _Interrupted) else "SIGINT"
        from state_machines.stopping import reset

        reset()  # the workers are stopped below and the summary written: no forced exit
        # a second signal must not cut the summary short (SIGKILL still does)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(f"\nnightly: interrupted by {interrupted} after {time.time() - started:.0f}s -- "
              "stopping workers and writing what was found so far", file=stream, flush=True)
        if proc is not None:
            _stop(proc)
    try:
        log.close()
        print("\n".join(progress_table(items, out)), file=stream, flush=True)
        code = summarise(items, skipped, out, budget, workers, seed, interrupted, stream)
        if interrupted:
            mark_junit_interrupted(out / "junit.xml", interrupted, items, out)
        return code
    finally:
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, old_int)


def mark_junit_interrupted(path: Path, why: str, items, out: Path) -> None:
    """Add an error test case to pytest's JUnit XML (or write one): an interrupted night must
    not read as a green one to a CI system."""
    import xml.etree.ElementTree as ET

    done = {r["id"] for r in _read_all(out / "results") if not r.get("interrupted")}
    unfinished = [it.label() for it in items if it.id not in done]
    try:
        tree = ET.parse(path)  # our own pytest's output, not user input
        root = tree.getroot()
    except (OSError, ET.ParseError):
        root = ET.Element("testsuites")
        tree = ET.ElementTree(root)
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        suite = ET.SubElement(root, "testsuite", name="kvcheck-nightly", tests="0", errors="0",
                              failures="0", skipped="0")
    case = ET.SubElement(suite, "testcase", classname="kvcheck.nightly", name="interrupted",
                         time="0")
    err = ET.SubElement(case, "error", message=f"the nightly job was interrupted by {why}: "
                        f"{len(unfinished)} of {len(items)} items did not finish")
    err.text = "not finished:\n" + "\n".join(unfinished)
    for key in ("tests", "errors"):
        suite.set(key, str(int(suite.get(key, "0") or 0) + 1))
    tree.write(path, encoding="utf-8", xml_declaration=True)


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
    distinct: dict = {}  # (property, op, masked message) -> the failure's JSON, its item
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
            marks = []
            for f in item_failures(r):
                sig = (f["signature"]["property"], f["signature"]["op"],
                       f["signature"]["message"])
                if sig in distinct:  # the same bug met by another item: counted once
                    distinct[sig]["count"] += f["count"]
                    marks.append("seen")
                    continue
                distinct[sig] = {**f, "item": it.label()}
                try:
                    trace = load_trace(f["trace"])
                except (TraceError, TypeError):
                    trace = None
                counts = f.get("known") is None or f.get("driven")
                if trace is not None and counts and trace.digest() not in known:
                    marks.append("new")
                    json_out, test_out = export(Path(f["trace"]), out / "regressions",
                                                f"the nightly job, seed {seed}")
                    buf = io.StringIO()
                    with redirect_stdout(buf):
                        print_failure(FuzzOutcome(trace.variant, trace.params, trace.fault,
                                                  trace.target, trace=trace,
                                                  trace_path=Path(f["trace"])))
                    new.append((it, f["signature"], json_out, test_out, buf.getvalue()))
                else:
                    marks.append("known" + (f" {f['known']}" if f.get("known") else ""))
            status = (f"FAILED {r['property']}" if len(marks) == 1 else
                      f"FAILED {len(marks)} distinct") + f" ({', '.join(marks)})"
        elif r["interrupted"]:
            status = "interrupted"
        rows.append((it.label(), r["examples"], r["steps"], f"{r['seconds']:.0f}s", status))
    completed = [it.label() for it in items
                 if it.id in results and not results[it.id].get("interrupted")]
    md = [f"# kvcheck nightly\n",
          f"- budget {budget:.0f}s on {workers} workers, seed {seed}"
          + (f" -- **interrupted** ({interrupted if isinstance(interrupted, str) else 'signal'})"
             f": partial results; {len(completed)} of {len(items)} items completed"
             + (f" ({', '.join(completed)})" if completed else "") if interrupted else ""),
          f"- new failures: **{len(new)}**; JUnit XML: `{out / 'junit.xml'}`",
          "- checked steps per engine: " + ", ".join(
              f"{eng} {n:,}" for eng, n in steps_per_engine(items, results).items()) + "\n",
          "| item | examples | steps | time | result |", "|---|---:|---:|---:|---|"]
    md += [f"| {a} | {b} | {c:,} | {d} | {e} |" for a, b, c, d, e in rows]
    for n, p, t, w in skipped:
        md.append(f"| {n} {' '.join(f'{k}={v}' for k, v in p.items())} [{t}] | - | - | - | "
                  f"skipped: {w} |")
    if distinct:
        md += ["\n## Distinct failures\n",
               "| # | signature | item | engine | first seen | count | steps | finding | "
               "trace |", "|---:|---|---|---|---:|---:|---:|---|---|"]
        md += [f"| {i} | `{f['signature']['property']} @ {f['signature']['op']}: "
               f"{f['signature']['message']}` | {f['item']} | {f.get('engine', '-')} | "
               f"{f.get('first_seen', 0):.1f}s | {f['count']} | {f.get('steps', '-')} | "
               f"{f.get('known') or 'new'} | `{f['trace']}` |"
               for i, f in enumerate(distinct.values(), 1)]
    for it, sig, json_out, test_out, text in new:
        md += [f"\n## New failure: {it.label()} -- `{sig['property']}`\n",
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
        md += ["\n## Harness errors (kvcheck failed, not the engine)\n"] + [
            f"- {e}" for e in errors]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    print(f"\nsummary: {out / 'summary.md'}  ({len(new)} new failure(s)"
          + (f", {sum(map(len, unreached.values()))} transition(s) never reached"
             if unreached else "")
          + (f", interrupted: {len(completed)} of {len(items)} items completed"
             + (f" ({', '.join(completed)})" if completed else "") if interrupted else "")
          + ")", file=stream, flush=True)
    if interrupted:
        return EXIT_INTERRUPTED
    if new or unreached:
        return 1
    return EXIT_HARNESS if errors else 0  # kvcheck failed, not the engine


def item_failures(result: dict) -> list[dict]:
    """An item's distinct failures (``Failure.to_json``); a result written before the search
    kept going has its one failure in the flat fields."""
    if result.get("failures"):
        return result["failures"]
    if not result.get("failed"):
        return []
    from state_machines.failures import mask

    return [{"signature": {"property": result["property"], "op": "?",
                           "message": mask(result.get("message") or "")},
             "count": 1, "trace": result["trace"], "known": None, "driven": False}]


def steps_per_engine(items, results) -> dict[str, int]:
    """Checked steps of the finished items, per search engine of the plan."""
    out = {eng: 0 for eng in sorted({it.engine for it in items})}
    for it in items:
        r = results.get(it.id)
        if r is not None:
            out[it.engine] += r["steps"]
    return out


def never_reached(items, results, interrupted) -> dict[str, list[str]]:
    """Per variant, declared "sometimes" transitions no regime reached (a completed run only:
    an interrupted night proves nothing about reachability)."""
    from state_machines.variants import get_variant

    if interrupted:
        return {}
    seen: dict[str, dict] = {}
    for it in items:
        r = results.get(it.id)
        if r is None or r.get("error") or (r.get("failed") and it.stop_on_first):
            continue  # a run that stopped at a failure stopped early: its coverage says nothing
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
