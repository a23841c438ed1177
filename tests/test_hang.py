"""An op that never returns is a ``hang`` finding with the trace so far -- in fuzz, replay,
check and nightly -- caught by the per-op deadline (state_machines/deadline.py).  The catalogued
hang fault T1 loops in the radix cache's match path, outside ``evict``.

The suite runs with a 2 s deadline (tests/conftest.py); these tests use ``HANG_DEADLINE``
(tests/harness.py), half a second, so each hang costs about that.  Nothing here times
anything: a test only checks *that* the hang was reported, with which property and trace.
"""

import json
import subprocess
import sys
import threading
import time

import pytest

from caches.faults import get_fault
from state_machines.cli import main
from state_machines.deadline import ENV, Hang, Ticker, deadline, op_deadline, ticking
from state_machines.replay import replay
from state_machines.trace import load_trace
from tests.harness import HANG_DEADLINE


@pytest.fixture(autouse=True)
def _short_deadline(monkeypatch):
    monkeypatch.setenv(ENV, HANG_DEADLINE)


def spin():
    while True:
        pass


def test_deadline_interrupts_a_loop_in_the_main_thread():
    with pytest.raises(Hang):
        with deadline(0.2):
            spin()


def test_deadline_interrupts_a_blocking_sleep_in_the_main_thread():
    with pytest.raises(Hang):
        with deadline(0.2):
            threading.Event().wait(30)


def test_deadline_interrupts_a_loop_in_another_thread():
    caught = []

    def worker():
        try:
            with deadline(0.2):
                spin()
        except Hang as h:
            caught.append(h)

    t = threading.Thread(target=worker)
    t.start()
    t.join(30)
    assert not t.is_alive() and len(caught) == 1


def test_a_finished_op_leaves_no_alarm_behind():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    with deadline(0.2):
        pass
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_ticker_interrupts_only_a_guarded_op_that_overran():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    with Ticker(0.2) as t:
        assert ticking(0.2) is t and ticking(0.3) is None
        t.guard()
        t.clear()
        time.sleep(0.5)  # between ops: ticks come, nothing is raised
        t.guard()
        with pytest.raises(Hang):
            spin()
        t.guard()
        with pytest.raises(Hang):  # a blocking wait too
            threading.Event().wait(30)
        t.clear()
    assert ticking(0.2) is None
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_ticker_gives_someone_elses_timer_back():
    import signal

    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 5.0)
        with Ticker(0.2):
            pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 4.0 < left <= 5.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_native_walks_report_t1_as_a_hang_under_the_shared_ticker(tmp_path):
    from state_machines.native import native_fuzz
    from state_machines.variants import get_variant

    spec = get_variant("radix")
    out = native_fuzz(spec, spec.check_params(spec.regimes[0]), fault="T1", budget=20, seed=3,
                      shrink_budget=5, out_dir=tmp_path)
    assert out.failed and out.prop == "hang", out.trace and out.trace.violation


def test_the_deadline_is_configurable(monkeypatch, capsys):
    monkeypatch.setenv(ENV, "0")
    assert op_deadline() == 0
    monkeypatch.delenv(ENV)
    assert op_deadline() > 0  # the default
    assert main(["--op-deadline", "7.5", "list"]) == 0
    capsys.readouterr()
    import os

    assert os.environ[ENV] == "7.5"  # the CLI hands it to its workers this way


def test_t1_is_catalogued_and_loops_outside_evict():
    f = get_fault("T1")
    assert f.variant == "radix" and f.properties == ("hang",)
    assert "evict" not in vars(f.cls)  # its defect lives in the match path


@pytest.mark.slow  # a hang costs a deadline per run
def test_fuzz_reports_t1_as_a_hang_with_the_trace(capsys, tmp_path):
    code = main(["--profile", "ci", "fuzz", "radix", "--fault", "T1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "property broken: hang" in out and f"within {float(HANG_DEADLINE):g}s" in out
    (path,) = tmp_path.glob("radix-*.json")
    saved = json.loads(path.read_text())
    assert saved["violation"]["property"] == "hang"
    assert saved["violation"]["step"] == len(saved["ops"])
    # the trace so far replays to the same hang, and its ops pass on the clean cache
    trace = load_trace(path)
    again = replay(trace)
    assert again.violation is not None and again.violation.prop == "hang"
    trace.fault = None
    assert replay(trace).ok


def test_replay_reports_a_hang(capsys, tmp_path):
    trace = {"format": "kvcheck-trace", "version": 1, "variant": "radix", "fault": "T1",
             "params": {"page_size": 1, "pool_pages": 16},
             "ops": [{"op": "insert", "tokens": [1, 2, 3]}, {"op": "match", "tokens": [1, 2]}]}
    path = tmp_path / "t1.json"
    path.write_text(json.dumps(trace))
    code = main(["replay", str(path)])
    out = capsys.readouterr().out
    assert code == 1 and "property broken at step 2: hang" in out


def test_check_reports_a_hang(capsys, tmp_path):
    code = main(["check", "radix", "--fault", "T1", "--depth", "3", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and "VIOLATION: hang" in out and "property broken: hang" in out
    (path,) = tmp_path.glob("radix-*.json")
    assert load_trace(path).violation["property"] == "hang"


@pytest.mark.slow  # a hang costs a deadline per run
def test_nightly_in_xdist_workers_reports_a_hang(tmp_path):
    out = tmp_path / "n"
    # (both engines: two items, so the nightly runs them in two xdist workers -- it starts no
    # more workers than items)
    p = subprocess.run([sys.executable, "-m", "state_machines", "--op-deadline", HANG_DEADLINE,
                        "nightly", "--fault", "T1", "--budget", "40", "--workers", "2",
                        "--engine", "both", "--out", str(out),
                        "--database", str(tmp_path / "db"), "--seed", "1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    summary = (out / "summary.md").read_text()
    assert "with fault T1" in summary and "FAILED hang (new)" in summary
    # each worker's item reports the hang; a signature the other worker met first is "seen"
    # (the two engines' shrunk traces may stop in different ops -- T1 hangs the match, which an
    # admit runs too -- and then both are new, each a row of the distinct failures)
    native = next(line for line in summary.splitlines()
                  if line.startswith("| radix") and "with fault T1 (native)" in line)
    assert "FAILED hang (seen)" in native or "FAILED hang (new)" in native
    distinct = [line for line in summary.split("## Distinct failures")[1].splitlines()
                if line.startswith("| ") and "`hang @" in line]
    assert len(distinct) == summary.count("FAILED hang (new)")
    traces = sorted((out / "regressions").glob("radix-*.json"))  # one per new failure
    assert len(traces) == len(distinct)
    assert all(load_trace(t).violation["property"] == "hang" for t in traces)
    assert "<failure" in (out / "junit.xml").read_text()
