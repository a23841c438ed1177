"""The nightly job end to end: parallel items, summary + JUnit, exports, interruption."""

import json
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from state_machines.nightly import EXIT_INTERRUPTED, Item, fair_share, plan, summarise
from state_machines.ops import Op
from state_machines.trace import Trace
from tests.harness import default_sigint, wait_until


@pytest.mark.slow  # a nightly process end to end
def test_short_nightly_writes_summary_and_junit(tmp_path):
    out = tmp_path / "n"
    # (the budget is kept, and pytest takes seconds to start: 12 s left one second of fuzzing
    # per item, too little for every transition; one worker runs the two items one after the
    # other -- a nightly in xdist workers runs to its end in tests/test_hang.py)
    p = subprocess.run([sys.executable, "-m", "state_machines", "nightly", "--budget", "30",
                        "--variant", "radix", "--workers", "1", "--out", str(out),
                        "--database", str(tmp_path / "db"), "--seed", "3"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = (out / "summary.md").read_text()
    assert "| radix page_size=1 pool_pages=16 |" in summary and "clean" in summary
    assert "new failures: **0**" in summary
    junit = (out / "junit.xml").read_text()
    assert junit.count("<testcase") == 2 and "<failure" not in junit
    assert "examples" in p.stderr  # the progress display


@pytest.mark.slow  # generated tests run in pytest processes
def test_new_failure_is_exported_three_ways(tmp_path):
    ops = [Op("insert", {"tokens": [1, 2]}), Op("insert", {"tokens": [1, 2, 3]})]
    trace = Trace("radix", {"page_size": 1, "pool_pages": 16}, ops, "R1",
                  violation={"property": "size-accounting", "message": "m", "step": 2})
    out = tmp_path / "n"
    path = trace.save(out / "traces")
    item = Item("radix-x", "radix", {"page_size": 1, "pool_pages": 16}, "reference", 1, 0)
    (out / "results").mkdir()
    (out / "results" / "radix-x.json").write_text(json.dumps({
        "id": item.id, "label": item.label(), "variant": "radix", "params": item.params,
        "target": "reference", "examples": 3, "steps": 9, "seconds": 1.0, "failed": True,
        "property": "size-accounting", "message": "m", "trace": str(path),
        "interrupted": False, "error": None}))
    code = summarise([item], [], out, 1, 1, 0, False, sys.stderr)
    assert code == 1
    summary = (out / "summary.md").read_text()
    assert "New failure: radix" in summary and "size-accounting" in summary
    assert "insert [1 2 3] into the tree (no lock)  -> BROKE" in summary
    exported = out / "regressions" / path.name
    test_file = out / "regressions" / f"test_{path.stem.replace('-', '_')}.py"
    assert exported.exists() and test_file.exists()
    # the generated test is stand-alone, and it fails while the fault is in the trace ...
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(test_file)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "size-accounting broke again at step 2" in r.stdout
    # ... and passes once the bug is gone (here: the fault switched off)
    data = json.loads(exported.read_text())
    data["fault"] = None
    exported.write_text(json.dumps(data))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(test_file)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout


@pytest.mark.slow  # a nightly process end to end
# SIGTERM stops xdist workers; SIGINT a nightly that runs its items in one pytest process
@pytest.mark.parametrize("sig, workers", [(signal.SIGTERM, 2), (signal.SIGINT, 1)],
                         ids=["SIGTERM", "SIGINT"])
def test_interrupted_nightly_exits_three_and_is_never_green(tmp_path, sig, workers):
    out = tmp_path / "n"
    p = subprocess.Popen([sys.executable, "-m", "state_machines", "nightly", "--budget", "300",
                          "--variant", "radix", "--workers", str(workers), "--out", str(out),
                          "--database", str(tmp_path / "db")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_sigint)

    def walking():  # an item's fuzz is under way: it has counted examples
        return any(json.loads(f.read_text() or "{}").get("examples", 0) > 0
                   for f in (out / "progress").glob("*.json"))

    wait_until(walking, "an item reported examples", proc=p)
    p.send_signal(sig)  # SIGTERM: what a CI timeout does; SIGINT: Ctrl-C
    _, err = p.communicate(timeout=120)
    assert p.returncode == EXIT_INTERRUPTED, err  # its own code: not 0, not 1
    assert f"interrupted by {sig.name}" in err and "items completed" in err
    summary = (out / "summary.md").read_text()
    assert "**interrupted**" in summary and "| radix page_size=1" in summary
    assert "items completed" in summary
    # the interrupt never became a finding: no trace, no regression, no failed result
    assert not list((out / "traces").glob("*.json")) if (out / "traces").exists() else True
    assert not (out / "regressions").exists()
    results = [json.loads(r.read_text()) for r in (out / "results").glob("*.json")]
    assert results and not any(r["failed"] for r in results)
    assert all(r["interrupted"] for r in results), results
    junit = ET.parse(out / "junit.xml").getroot()
    cases = junit.iter("testcase")
    (mark,) = [c for c in cases if c.get("name") == "interrupted"]
    assert mark.find("error") is not None and sig.name in mark.find("error").get("message")
    suite = junit if junit.tag == "testsuite" else junit.find("testsuite")
    assert int(suite.get("errors")) >= 1 and int(suite.get("tests")) >= 1


def test_findings_made_before_an_interrupt_are_kept(tmp_path):
    ops = [Op("insert", {"tokens": [1, 2]}), Op("insert", {"tokens": [1, 2, 3]})]
    trace = Trace("radix", {"page_size": 1, "pool_pages": 16}, ops, "R1",
                  violation={"property": "size-accounting", "message": "m", "step": 2})
    out = tmp_path / "n"
    path = trace.save(out / "traces")
    done = Item("radix-x", "radix", {"page_size": 1, "pool_pages": 16}, "reference", 1, 0)
    cut = Item("radix-y", "radix", {"page_size": 4, "pool_pages": 16}, "reference", 1, 0)
    (out / "results").mkdir()
    (out / "results" / "radix-x.json").write_text(json.dumps({
        "id": done.id, "label": done.label(), "variant": "radix", "params": done.params,
        "target": "reference", "examples": 3, "steps": 9, "seconds": 1.0, "failed": True,
        "property": "size-accounting", "message": "m", "trace": str(path),
        "interrupted": False, "error": None}))
    code = summarise([done, cut], [], out, 1, 1, 0, "SIGTERM", sys.stderr)
    assert code == EXIT_INTERRUPTED
    summary = (out / "summary.md").read_text()
    assert "New failure: radix" in summary and "**interrupted** (SIGTERM)" in summary
    assert "1 of 2 items completed (radix page_size=1 pool_pages=16)" in summary
    assert (out / "regressions" / path.name).exists()


def test_both_engines_get_every_item_and_an_equal_share():
    one, _ = plan(100, 2, ["radix"], seed=5)
    both, _ = plan(100, 2, ["radix"], seed=5, engine="both")
    assert [it.engine for it in one] == ["hypothesis"] * len(one)
    assert sorted(it.engine for it in both) == ["hypothesis"] * len(one) + ["native"] * len(one)
    assert {(it.variant, tuple(it.params.items())) for it in both if it.engine == "native"} \
        == {(it.variant, tuple(it.params.items())) for it in one}
    assert both[0].budget == pytest.approx(one[0].budget / 2)
    assert len({it.id for it in both}) == len(both)


@pytest.mark.slow  # a nightly process end to end
def test_a_native_nightly_finds_a_fault_and_counts_its_steps(tmp_path):
    out = tmp_path / "n"
    p = subprocess.run([sys.executable, "-m", "state_machines", "nightly", "--budget", "20",
                        "--fault", "R1", "--engine", "native", "--workers", "2", "--out",
                        str(out), "--database", str(tmp_path / "db"), "--seed", "3"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "nightly: 1 items on 1 workers" in p.stderr  # no worker is started to wait
    summary = (out / "summary.md").read_text()
    assert "(native)" in summary and "FAILED size-accounting" in summary
    steps = int(summary.split("checked steps per engine: native ")[1].split()[0].replace(",", ""))
    assert steps > 0


def test_a_fair_share_for_every_item():
    # 13 items on 2 workers, 60 s: the first wave gets a seventh, the last item all that is left
    assert fair_share(60, 13, 2) == pytest.approx(60 / 7)
    assert fair_share(10, 1, 2) == 10
    assert fair_share(10, 2, 2) == 10
    assert fair_share(10, 3, 2) == 5
    assert fair_share(0.2, 5, 2) == 1.0  # never less than a second


def test_a_transition_never_reached_fails_the_night(tmp_path):
    out = tmp_path / "n"
    item = Item("radix-x", "radix", {"page_size": 1, "pool_pages": 16}, "reference", 1, 0)
    result = {"id": item.id, "label": item.label(), "variant": "radix", "params": item.params,
              "target": "reference", "examples": 3, "steps": 9, "seconds": 1.0,
              "failed": False, "property": None, "message": None, "trace": None,
              "interrupted": False, "error": None,
              "reached": {"node-split": 4, "prefix-hit": 2}}
    (out / "results").mkdir(parents=True)
    (out / "results" / "radix-x.json").write_text(json.dumps(result))
    assert summarise([item], [], out, 1, 1, 0, False, sys.stderr) == 1
    summary = (out / "summary.md").read_text()
    assert "Transitions never reached" in summary and "cascade-eviction" in summary
    assert "node-split," not in summary  # reached ones are not listed
    # every declared transition reached: the night is clean
    from state_machines.variants import get_variant

    result["reached"] = {name: 1 for name in get_variant("radix").sometimes}
    (out / "results" / "radix-x.json").write_text(json.dumps(result))
    assert summarise([item], [], out, 1, 1, 0, False, sys.stderr) == 0


def test_a_native_item_writes_its_progress_while_it_runs(tmp_path, monkeypatch):
    """The live table reads each item's progress file: a native item updates it while it
    walks (done False, steps so far), not only when it ends."""
    from state_machines import native, nightly
    from state_machines.variants import get_variant

    monkeypatch.setattr(native, "PROGRESS_EVERY", 0.05)
    # (run_item loads the nightly profile: not in this process's later tests)
    monkeypatch.setattr("state_machines.profiles.load_profile", lambda name: None)
    writes = []
    real = nightly._write
    monkeypatch.setattr(nightly, "_write",
                        lambda path, data: (writes.append((path.parent.name, dict(data))),
                                            real(path, data)))
    spec = get_variant("radix")
    item = Item("radix-native", "radix", spec.check_params(spec.regimes[0]), "reference", 1.0,
                3, engine="native")
    nightly.run_item(item, tmp_path, None, None)
    live = [d for where, d in writes if where == "progress" and not d["done"]]
    assert live and live[-1]["steps"] > 0 and live[-1]["examples"] > 0, writes


# -- shards and merge ---------------------------------------------------------------------------
def test_shards_split_the_items_deterministically_and_completely():
    from state_machines.nightly import shard_of

    items, _ = plan(60, 2, ["radix", "streaming-session"], seed=1, engine="both")
    shards = [shard_of(items, i, 3) for i in (1, 2, 3)]
    ids = [it.id for s in shards for it in s]
    assert sorted(ids) == sorted(it.id for it in items) and len(set(ids)) == len(ids)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    again, _ = plan(60, 2, ["radix", "streaming-session"], seed=1, engine="both", shard=(2, 3))
    assert [it.id for it in again] == [it.id for it in shards[1]]


def _failed_result(item, trace_path, message):
    from state_machines.failures import Signature

    sig = Signature.of("size-accounting", "insert", message)
    return {"id": item.id, "label": item.label(), "variant": "radix", "params": item.params,
            "target": "reference", "examples": 3, "steps": 9, "seconds": 1.0, "failed": True,
            "property": "size-accounting", "message": message, "trace": str(trace_path),
            "interrupted": False, "error": None,
            "failures": [{"signature": sig.to_json(), "first_seen": 0.5, "count": 2,
                          "known": None, "driven": False, "engine": item.engine, "steps": 2,
                          "trace": str(trace_path)}]}


def test_the_same_failure_in_two_items_is_one_distinct_failure(tmp_path):
    ops = [Op("insert", {"tokens": [1]}), Op("insert", {"tokens": [1, 2]})]
    out = tmp_path / "n"
    items = [Item(f"radix-{e}", "radix", {"page_size": 1, "pool_pages": 16}, "reference", 1, 0,
                  "R1", engine=e) for e in ("hypothesis", "native")]
    (out / "results").mkdir(parents=True)
    for n, it in enumerate(items):  # two traces, one signature (the numbers differ)
        trace = Trace("radix", it.params, ops[:1] * n + ops, "R1",
                      violation={"property": "size-accounting", "step": n + 2,
                                 "message": f"evictable {n} + protected 0 != {n + 2}"})
        path = trace.save(out / "traces")
        (out / "results" / f"{it.id}.json").write_text(json.dumps(
            _failed_result(it, path, f"evictable {n} + protected 0 != {n + 2}")))
    assert summarise(items, [], out, 1, 1, 0, False, sys.stderr) == 1
    summary = (out / "summary.md").read_text()
    assert summary.count("## New failure") == 1 and "FAILED size-accounting (seen)" in summary
    assert len(list((out / "regressions").glob("*.json"))) == 1


@pytest.mark.skipif(__import__("shutil").which("redis-server") is None,
                    reason="Debian redis-server not installed")
def test_three_shards_over_one_redis_then_merged(tmp_path):
    from tests.test_redis_database import redis_server

    with redis_server(tmp_path) as (url, client):
        shards = [subprocess.Popen(
            # (a kept budget: three shards start their pytest workers at once, which takes
            # most of 15 s on a 2-core box, and the Hypothesis item must find R2 in what is left)
            [sys.executable, "-m", "state_machines", "nightly", "--budget", "40", "--fault",
             "R2", "--engine", "both", "--shard", f"{i}/3", "--workers", "1", "--seed", "3",
             "--out", str(tmp_path / f"s{i}"), "--database", f"{url}/0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (1, 2, 3)]
        logs = [p.communicate(timeout=400)[0] for p in shards]
        assert [p.returncode for p in shards] == [1, 1, 0], logs  # shard 3 has no item
        # the Hypothesis shard saved its failing example there
        assert client.dbsize() > 0, logs
    merged = subprocess.run([sys.executable, "-m", "state_machines", "nightly", "merge"]
                            + [str(tmp_path / f"s{i}") for i in (1, 2, 3)]
                            + ["--out", str(tmp_path / "all")],
                            capture_output=True, text=True, timeout=300)
    assert merged.returncode == 1, merged.stdout + merged.stderr
    summary = (tmp_path / "all" / "summary.md").read_text()
    assert "| radix page_size=1 pool_pages=16 with fault R2 |" in summary
    assert "| radix page_size=1 pool_pages=16 with fault R2 (native) |" in summary
    assert "## Distinct failures" in summary
    junit = ET.parse(tmp_path / "all" / "junit.xml").getroot()
    ran = [c for c in junit.iter("testcase") if c.find("skipped") is None]
    assert len(ran) == 2  # one item in each of shards 1 and 2
    for f in (tmp_path / "all" / "results").glob("*.json"):
        for failure in json.loads(f.read_text())["failures"]:
            assert failure["trace"].startswith(str(tmp_path / "all" / "traces"))
