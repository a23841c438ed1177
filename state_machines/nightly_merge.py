"""``kvcheck nightly merge DIR...``: one night out of the output folders of its shards.

Each shard (``kvcheck nightly --shard I/N``, on its own machine) writes the usual folder:
``plan.json`` (its items), ``results/``, ``progress/``, ``traces/``, ``junit.xml``.  The merge
copies the results and traces into one folder (a trace's name is its content hash, so the same
trace from two shards is one file), points the results at the copies, joins the JUnit test
suites, and writes the summary with the nightly's own ``summarise`` -- which dedupes the
failures of all shards by signature (``state_machines/failures.py``) and exports each new one
once.  The exit code is the nightly's: 1 on a new failure, a harness error, an item without a
result, or a transition no shard reached; 3 if a shard was interrupted.
"""

from __future__ import annotations

import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from state_machines.nightly import EXIT_INTERRUPTED, Item, _read_all, _write, summarise


class MergeError(ValueError):
    """The folders cannot be merged (a bad plan, an item in two shards)."""


def merge(dirs: list[Path], out: Path, stream=None) -> int:
    stream = stream or sys.stderr
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("progress", "results"):
        for p in (out / sub).glob("*.json"):
            p.unlink()
    items, skipped, owner = [], [], {}
    budget, workers, seeds, shards, interrupted = 0.0, 0, [], [], None
    for d in dirs:
        try:
            plan = json.loads((d / "plan.json").read_text())
            shard_items = [Item(**raw) for raw in plan["items"]]
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise MergeError(f"{d}/plan.json: not a nightly plan ({exc})") from None
        for it in shard_items:
            if it.id in owner:
                raise MergeError(f"item {it.id} is in both {owner[it.id]} and {d}: merge the "
                                 "shards of one night (--shard I/N, the same --seed)")
            owner[it.id] = d
        items += shard_items
        skipped += [tuple(s) for s in plan.get("skipped") or []]
        budget = max(budget, float(plan.get("budget") or 0))
        workers += int(plan.get("workers") or 0)
        seeds.append(plan.get("seed"))
        shards.append(plan.get("shard"))
        for trace in sorted((d / "traces").glob("*.json")):
            (out / "traces").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(trace, out / "traces" / trace.name)
        for r in _read_all(d / "results"):
            r = _relocate(r, out / "traces")
            interrupted = interrupted or ("a shard was interrupted" if r.get("interrupted")
                                          else None)
            _write(out / "results" / f"{r['id']}.json", r)
        for p in _read_all(d / "progress"):
            _write(out / "progress" / f"{p['id']}.json", p)
        if _junit_interrupted(d / "junit.xml"):
            interrupted = "a shard was interrupted"
    _merge_junit([d / "junit.xml" for d in dirs], out / "junit.xml")
    seed = seeds[0] if len(set(map(str, seeds))) == 1 else ",".join(map(str, seeds))
    print(f"nightly merge: {len(dirs)} shard(s) "
          + ", ".join(f"{s[0]}/{s[1]}" if s else "unsharded" for s in shards)
          + f", {len(items)} items -> {out}", file=stream, flush=True)
    code = summarise(items, sorted(set(skipped), key=str), out, budget, workers, seed,
                     interrupted, stream)
    return EXIT_INTERRUPTED if interrupted else code


def _relocate(result: dict, traces: Path) -> dict:
    """A shard's result with its trace paths pointing at the merged traces folder."""
    def moved(path):
        return str(traces / Path(path).name) if path else path

    result = dict(result)
    result["trace"] = moved(result.get("trace"))
    result["failures"] = [{**f, "trace": moved(f.get("trace"))}
                          for f in result.get("failures") or []]
    return result


def _junit_interrupted(path: Path) -> bool:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return False
    return any(c.get("name") == "interrupted" and c.get("classname") == "kvcheck.nightly"
               for c in root.iter("testcase"))


def _merge_junit(paths: list[Path], out: Path) -> None:
    """One ``<testsuites>`` holding every shard's test suites (a missing or unreadable file
    becomes a suite with one error case: a shard that left no JUnit is never green)."""
    root = ET.Element("testsuites")
    for p in paths:
        try:
            got = ET.parse(p).getroot()
        except (OSError, ET.ParseError) as exc:
            suite = ET.SubElement(root, "testsuite", name=f"kvcheck-nightly {p.parent}",
                                  tests="1", errors="1", failures="0", skipped="0")
            case = ET.SubElement(suite, "testcase", classname="kvcheck.nightly",
                                 name="missing-junit", time="0")
            ET.SubElement(case, "error", message=f"{p}: {exc}")
            continue
        for suite in ([got] if got.tag == "testsuite" else got.findall("testsuite")):
            suite.set("name", f"{suite.get('name', 'pytest')} ({p.parent.name})")
            root.append(suite)
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
