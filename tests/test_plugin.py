"""An out-of-tree target, installed as a user installs theirs, works in every command.

``tests/plugin_example/`` is a separate package (``kvcheck-r1-demo``) that registers target
``r1demo`` under the entry-point group ``kvcheck.targets``: the reference radix cache with
fault R1.  It is pip-installed into a temp folder (the suite's environment is not touched) and
kvcheck runs in subprocesses with that folder on the path: ``list`` shows where it comes
from, ``fuzz`` catches R1 on size-accounting, ``replay`` reproduces the saved trace and says
which source it ran against, ``gate`` reports it both as a failing fuzz run and, once the trace
is filed as a known upstream finding, as one that still fails on its own property.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # pip-installs the example plug-in, runs kvcheck processes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "plugin_example"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    src = tmp_path_factory.mktemp("src") / "plugin_example"
    shutil.copytree(EXAMPLE, src)  # build outside the repo: no build/ or egg-info left there
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-build-isolation", "--target", str(site), str(src)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert list(site.glob("kvcheck_r1_demo-*.dist-info/entry_points.txt"))
    return site


def kvcheck(plugin_path, cwd, *argv):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "state_machines", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_list_shows_the_plugin_and_where_it_comes_from(plugin_path, tmp_path):
    done = kvcheck(plugin_path, tmp_path, "list")
    assert done.returncode == 0, done.stderr
    assert "r1demo" in done.stdout
    assert "kvcheck-r1-demo 0.1.0" in done.stdout and "kvcheck_r1_demo:TARGET" in done.stdout
    assert "targets: reference, sglang, sglang-rust, sglang-radixcache, pymllm, r1demo" in done.stdout


def test_fuzz_replay_and_gate_catch_r1_through_the_plugin(plugin_path, tmp_path):
    out = tmp_path / "traces"
    done = kvcheck(plugin_path, tmp_path, "--profile", "ci", "fuzz", "radix", "--target",
                   "r1demo", "--page-size", "1", "--out", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "property broken: size-accounting" in done.stdout
    (trace,) = out.glob("radix-r1demo-r1demo-0.1.0-*.json")
    raw = json.loads(trace.read_text())
    assert raw["target"] == "r1demo"
    assert raw["target_identity"]["engine"] == "r1demo"
    assert raw["violation"]["property"] == "size-accounting"

    done = kvcheck(plugin_path, tmp_path, "replay", str(trace))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "property broken" in done.stdout and "size-accounting" in done.stdout
    assert "NOTE" not in done.stdout  # same source as recorded

    # the trace filed as a known upstream finding: the gate checks it still fails on its own
    # property (size-accounting), and the fuzz part of the gate catches R1 afresh
    findings = tmp_path / "upstream_findings"
    findings.mkdir()
    shutil.copy(trace, findings / trace.name)
    done = kvcheck(plugin_path, tmp_path, "gate", "--replay-only", "--corpus", str(findings))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "still fails on size-accounting" in done.stdout + done.stderr

    done = kvcheck(plugin_path, tmp_path, "gate", "--corpus", str(findings), "--variant",
                   "radix", "--target", "r1demo")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fuzz radix page_size=1 pool_pages=16 [r1demo]" in done.stdout
    assert "property broken: size-accounting" in done.stdout


def test_a_trace_of_another_source_says_so_on_replay(plugin_path, tmp_path):
    out = tmp_path / "traces"
    done = kvcheck(plugin_path, tmp_path, "--profile", "ci", "fuzz", "radix", "--target",
                   "r1demo", "--page-size", "1", "--out", str(out))
    (trace,) = out.glob("*.json")
    raw = json.loads(trace.read_text())
    raw["target_identity"]["source"] = "sha256:00000000deadbeef"
    trace.write_text(json.dumps(raw))
    done = kvcheck(plugin_path, tmp_path, "replay", str(trace))
    assert done.returncode == 1
    assert "NOTE: recorded against r1demo 0.1.0 sha256:00000000deadbeef" in done.stdout


def test_coverage_check_nightly_and_bench_take_the_plugin(plugin_path, tmp_path):
    done = kvcheck(plugin_path, tmp_path, "check", "radix", "--target", "r1demo",
                   "--depth", "3", "--out", str(tmp_path / "cx"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "VIOLATION: size-accounting" in done.stdout
    done = kvcheck(plugin_path, tmp_path, "coverage", "radix", "--target", "r1demo",
                   "--max-examples", "5")
    # coverage runs the plug-in's machine: clean (it counts transitions) or, once R1 shows
    # within the few examples, an error naming R1's property -- never an unknown target
    assert "coverage of radix [r1demo] over 2 regime(s)" in done.stderr
    assert done.returncode == 0 or "ERROR" in done.stdout and "size-accounting" in done.stdout
    done = kvcheck(plugin_path, tmp_path, "bench", "radix", "--target", "r1demo",
                   "--examples", "5")
    # the bench times the plug-in's machine: a row per regime, or -- once R1 shows within the
    # examples -- a clear error naming R1's property instead of a speed
    if done.returncode == 0:
        assert "radix [r1demo] page_size=1" in done.stdout
    else:
        assert done.returncode == 1, done.stdout + done.stderr
        assert "on target r1demo: the machine failed (size-accounting)" in done.stderr
    done = kvcheck(plugin_path, tmp_path, "nightly", "--budget", "20", "--workers", "1",
                   "--variant", "radix", "--target", "r1demo", "--out", str(tmp_path / "n"),
                   "--database", str(tmp_path / "db"))
    assert done.returncode == 1, done.stdout + done.stderr
    summary = (tmp_path / "n" / "summary.md").read_text()
    assert "r1demo" in summary and "size-accounting" in summary
