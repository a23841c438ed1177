"""The kvcheck command as a user runs it: exit codes, messages, files."""

import json
import subprocess
import sys

import pytest

from state_machines.cli import main
from tests.harness import HANG_DEADLINE


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_variants_and_faults(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0 and "radix:" in out
    for fid in ("R1", "R2", "R3", "R4", "R5", "R6"):
        assert f"fault {fid}" in out


def test_fuzz_clean_exits_zero(capsys, tmp_path):
    code, out, _ = run(capsys, "fuzz", "radix", "--max-examples", "10", "--seed", "1",
                       "--out", str(tmp_path))
    assert code == 0, out
    assert "clean" in out and "page_size=4" in out  # both regimes, summary table
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # fuzz runs to a catch, or kvcheck processes
def test_fuzz_fault_prints_steps_saves_and_replays(capsys, tmp_path):
    code, out, _ = run(capsys, "--profile", "ci", "fuzz", "radix", "--fault", "R4",
                       "--out", str(tmp_path))
    assert code == 1
    assert "property broken: ref-balance" in out and "BROKE" in out
    (path,) = tmp_path.glob("radix-*.json")
    assert str(path) in out
    saved = json.loads(path.read_text())
    assert saved["fault"] == "R4" and saved["violation"]["property"] == "ref-balance"
    code, out, _ = run(capsys, "replay", str(path), "--verbose")
    assert code == 1
    assert f"property broken at step {saved['violation']['step']}: ref-balance" in out
    assert "root  ref=" in out  # the tree outline


def test_replay_of_a_now_passing_trace_exits_zero(capsys, tmp_path):
    trace = {"format": "kvcheck-trace", "version": 1, "variant": "radix", "fault": None,
             "params": {"page_size": 1},
             "ops": [{"op": "insert", "tokens": [1, 2]}, {"op": "quiesce"}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    code, out, _ = run(capsys, "replay", str(path))
    assert code == 0 and "all properties hold" in out


@pytest.mark.parametrize("content, message", [
    ("not json", "not valid JSON"),
    ('{"ops": []}', "not a kvcheck trace"),
    ('{"format": "kvcheck-trace", "version": 9}', "version 9"),
    ('{"format": "kvcheck-trace", "version": 1, "variant": "nope", "params": {}, "ops": []}',
     "unknown variant"),
    ('{"format": "kvcheck-trace", "version": 1, "variant": "radix", "params": {}, '
     '"ops": [{"op": "explode"}]}', "unknown op 'explode'"),
    ('{"format": "kvcheck-trace", "version": 1, "variant": "radix", "params": {}, '
     '"ops": [{"op": "admit", "rid": 1, "tokens": [1, -2]}]}', "list of token ids"),
    ('{"format": "kvcheck-trace", "version": 1, "variant": "radix", "params": '
     '{"page_size": 0}, "ops": []}', "page_size"),
    ('{"format": "kvcheck-trace", "version": 1, "variant": "radix", "fault": "Z9", '
     '"params": {}, "ops": []}', "unknown fault"),
])
def test_malformed_trace_is_a_clear_error(capsys, tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, out, err = run(capsys, "replay", str(path))
    assert code == 2 and message in err and "Traceback" not in err


def test_unknown_names_exit_two(capsys):
    code, _, err = run(capsys, "fuzz", "radix", "--fault", "Q7")
    assert code == 2 and "unknown fault id 'Q7'" in err
    code, _, err = run(capsys, "fuzz", "nope")
    assert code == 2 and "unknown variant" in err
    code, _, err = run(capsys, "replay", "/no/such/trace.json")
    assert code == 2 and "no such file" in err


@pytest.mark.slow  # fuzz runs to a catch, or kvcheck processes
def test_real_entry_point_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    for argv in (["replay", str(bad)], ["fuzz", "radix", "--fault", "NOPE"],
                 ["fuzz", "radix", "--max-examples", "0"]):
        p = subprocess.run([sys.executable, "-m", "state_machines", *argv],
                           capture_output=True, text=True)
        assert p.returncode == 2, (argv, p.stderr)
        assert "Traceback" not in p.stderr and "error" in p.stderr


@pytest.mark.slow  # every fault fuzzed to its catch
@pytest.mark.parametrize("engine", [("--max-examples", "200"),
                                    ("--engine", "native", "--budget", "1")],
                         ids=["hypothesis", "native"])
def test_faults_json_reports_every_fault(capsys, engine, monkeypatch):
    # T1 (a hang) costs a per-op deadline per hanging attempt: the hang tests' (harness.py)
    monkeypatch.setenv("KVCHECK_OP_DEADLINE", HANG_DEADLINE)
    code, out, _ = run(capsys, "faults", "--variant", "radix", "--json", *engine)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert all(set(r) == {"variant", "fault", "caught", "property", "seconds", "steps"}
               for r in rows)
    clean = [r for r in rows if r["fault"] is None]
    assert clean == [{"variant": "radix", "fault": None, "caught": False, "property": None,
                      "seconds": clean[0]["seconds"], "steps": None}]
    from caches.faults import faults_of

    assert {r["fault"] for r in rows if r["caught"]} == {f.id for f in faults_of("radix")}
    assert {"R1", "R2", "R3", "R4", "R5", "R6", "P1", "P2", "P3", "P4", "T1"} <= \
        {f.id for f in faults_of("radix")}


def test_fuzz_progress_is_throttled_when_not_a_terminal():
    from state_machines.commands.fuzz import PROGRESS_EVERY, Throttle

    now = [0.0]
    throttle = Throttle(PROGRESS_EVERY, clock=lambda: now[0])
    shown = []
    for step in range(200):  # a batch every 0.4 s for 80 s
        now[0] = step * 0.4
        if throttle():
            shown.append(now[0])
    assert shown[0] == 0 and len(shown) == 1 + int(79.6 // PROGRESS_EVERY)
    assert all(b - a >= PROGRESS_EVERY for a, b in zip(shown, shown[1:]))
    always = Throttle(0, clock=lambda: now[0])
    assert all(always() for _ in range(5))  # on a terminal: every batch


@pytest.mark.slow  # a kvcheck process with a time budget
def test_fuzz_with_a_budget_into_a_log_prints_few_progress_lines(tmp_path):
    """Into a log, at most one progress line per ``PROGRESS_EVERY`` seconds of the run (the
    first batch's always shows): the bound follows the run's own wall time, so a loaded
    machine cannot break it."""
    import time

    from state_machines.commands.fuzz import PROGRESS_EVERY

    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "state_machines", "fuzz", "radix", "--budget", "4",
                        "--page-size", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - started
    assert p.returncode == 0, p.stderr
    progress = [ln for ln in p.stderr.splitlines() if "examples," in ln]
    assert 1 <= len(progress) <= 1 + int(wall // PROGRESS_EVERY), (wall, progress)
    assert sum("fuzzing radix" in ln for ln in p.stderr.splitlines()) >= 1


@pytest.mark.slow  # runs pytest-xdist over machine tests
def test_bench_xdist_phase_reports_progress():
    from state_machines.bench import bench_xdist

    said = []
    rows = bench_xdist(["radix"], workers=(1,), profile="dev", progress=said.append, every=0.5)
    assert rows[0]["ok"]
    assert said[0].startswith("-n 1: 2 machine tests")
    assert any("machine tests done" in s for s in said[1:])


def test_docs_faults_md_is_generated_from_the_registry(capsys):
    from pathlib import Path

    assert main(["list", "--markdown"]) == 0
    out = capsys.readouterr().out
    from caches.faults import all_faults

    for fid in all_faults():
        assert f"| {fid} | " in out
    assert Path("docs/faults.md").read_text() == out, (
        "docs/faults.md is stale: run  kvcheck list --markdown > docs/faults.md")


def _readme_block(after: str) -> str:
    from pathlib import Path

    text = Path("README.md").read_text()
    start = text.index("```\n", text.index(after)) + 4
    return text[start:text.index("```", start)]


@pytest.mark.slow  # fuzz runs to a catch, or kvcheck processes
def test_the_readme_r1_example_is_what_a_run_prints(capsys, tmp_path, monkeypatch):
    block = _readme_block("A failure prints the shrunk steps")
    monkeypatch.chdir(tmp_path)  # the default --out, kvcheck-traces/, as in the README
    import shutil
    from pathlib import Path

    code = main(["--profile", "ci", "fuzz", "radix", "--fault", "R1"])
    out = capsys.readouterr().out
    assert code == 1
    # everything after the table (steps, property, message, trace name) is exactly as shown
    shown, printed = block[block.index("FAILED:"):], out[out.index("FAILED:"):]
    assert printed.strip() == shown.strip()
    assert Path("kvcheck-traces").is_dir()
    shutil.rmtree("kvcheck-traces")


@pytest.mark.slow  # fuzz runs to a catch, or kvcheck processes
def test_the_readme_replay_glob_example_works_with_several_traces(capsys, tmp_path):
    for fid in ("R1", "R4"):
        assert main(["--profile", "ci", "fuzz", "radix", "--fault", fid, "--out",
                     str(tmp_path / "traces")]) == 1
    capsys.readouterr()
    traces = sorted((tmp_path / "traces").glob("radix-*.json"))  # what the shell glob gives
    assert len(traces) == 2
    page = tmp_path / "r.html"
    assert main(["replay", *map(str, traces), "--html", str(page)]) == 1
    out = capsys.readouterr().out
    assert out.count("property broken at step") == 2 and "replayed 2 traces" in out
    for t in traces:
        assert (tmp_path / f"r-{t.stem}.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["replay", *map(str, traces), "--verbose"]) == 1
