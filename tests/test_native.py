"""The native engine: reproducible swarm walks, trace-level shrinking, workers, the CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from state_machines.cli import main
from state_machines.commands.common import EXIT_INTERRUPTED
from state_machines.native import Swarm, native_fuzz, run_walk
from state_machines.shrinker import _ddmin, shrink
from state_machines.ops import Op
from state_machines.replay import replay
from state_machines.trace import load_trace
from state_machines.variants import all_variants, get_variant
from tests.harness import default_sigint

RADIX = get_variant("radix")
P1 = RADIX.check_params({"page_size": 1, "pool_pages": 16})


def test_a_walk_is_reproducible_from_seed_and_index():
    a = run_walk(RADIX, P1, 7, 3)
    b = run_walk(RADIX, P1, 7, 3)
    c = run_walk(RADIX, P1, 7, 4)
    assert a.ops == b.ops and a.steps == b.steps > 0
    assert a.ops != c.ops
    assert a.ops[-1] == {"op": "quiesce"}  # every walk ends in the leak detector


def test_swarm_switches_generators_off_and_weights_the_rest():
    import random

    names = [f"g{i}" for i in range(8)]
    confs = [Swarm.draw(names, random.Random(i)) for i in range(50)]
    assert all(c.weights and set(c.weights) <= set(names) for c in confs)
    assert any(len(c.weights) < len(names) for c in confs)  # subsets, not always all
    assert len({frozenset(c.weights) for c in confs}) > 10
    assert all(1 <= w <= 8 for c in confs for w in c.weights.values())
    plain = Swarm.draw(names, random.Random(0), swarm=False)
    assert set(plain.weights) == set(names)


@pytest.mark.parametrize("variant", sorted(all_variants()))
def test_clean_walks_stay_clean_and_use_every_op(variant):
    spec = get_variant(variant)
    out = native_fuzz(spec, spec.regimes[0], max_walks=60, seed=1)
    assert not out.failed, out.trace and out.trace.violation
    assert out.steps > 100 and out.examples == 60
    generated = {n for n, c in out.op_counts.items() if c}
    # every op with a generator in this regime (radix's dllm_step runs at page_size > 1 only)
    params = spec.check_params(spec.regimes[0])
    declared = {s.name for s in spec.ops.specs.values() if any(g.regime(params) for g in s.gens)}
    assert declared and declared <= generated, (declared - generated, out.op_counts)


def test_ddmin_finds_the_minimal_failing_subsequence():
    ops = [Op("x", {"i": i}) for i in range(20)]

    def test(cand):
        got = {o.args["i"] for o in cand}
        return cand if {3, 11} <= got else None

    assert [o.args["i"] for o in _ddmin(ops, test)] == [3, 11]


def test_shrinking_keeps_the_property_and_simplifies_arguments():
    out = native_fuzz(RADIX, P1, fault="R1", max_walks=400, seed=3, shrink_budget=0)
    assert out.failed and out.prop == "size-accounting"
    raw = out.trace.ops
    small = shrink(RADIX, P1, raw, "size-accounting", fault="R1")
    assert len(small) <= len(raw)
    assert len(small) <= 4
    again = replay(out.trace.__class__(RADIX.name, P1, small, "R1"))
    assert again.violation is not None and again.violation.prop == "size-accounting"


def test_shrinking_replaces_a_request_lifecycle_by_the_insert_it_stands_for():
    """A walk whose R1 failure shows only at quiescence, through two admissions: no op can be
    deleted from it, and only both admissions turned into inserts at once reach the 2-step
    trace (an R1 run with a random seed stopped here at 5 steps before that pass)."""
    ops = [RADIX.ops.parse(o) for o in (
        {"op": "admit", "rid": 1, "tokens": [0]}, {"op": "admit", "rid": 4, "tokens": [0, 0]},
        {"op": "prefill", "rid": 4, "n": 2}, {"op": "prefill", "rid": 1, "n": 1},
        {"op": "quiesce"})]
    small = shrink(RADIX, P1, ops, "size-accounting", fault="R1")
    assert [(o.name, o.args) for o in small] == [("insert", {"tokens": [0]}),
                                                   ("insert", {"tokens": [0, 0]})]


def test_shrinking_grows_a_count_when_that_drops_ops():
    """K7 (block-hash spurious-oom) as a native walk left it: a chunked admission and the
    ``step`` that finishes its prompt.  A chunk covering the whole prompt needs no ``step``, and
    one longer prompt can stand for two: the shrinker may grow an argument when the trace gets
    shorter for it (Hypothesis's order: shorter first), where shrinking values alone stops at
    three ops."""
    spec = get_variant("block-hash")
    params = spec.check_params({**spec.regimes[0], "block_size": 2})
    ops = [Op("admit", {"rid": 1, "tokens": [0] * 7, "chunk": 4}),
           Op("admit", {"rid": 0, "tokens": [0, 1, 0, 0, 1], "chunk": 5}),
           Op("step", {"rid": 1})]
    small = shrink(spec, params, ops, "spurious-oom", fault="K7")
    assert len(small) <= 2, small
    assert all(o.name == "admit" for o in small)


def test_workers_find_the_same_kind_of_failure():
    one = native_fuzz(RADIX, P1, fault="R4", max_walks=300, seed=5, workers=1)
    two = native_fuzz(RADIX, P1, fault="R4", max_walks=300, seed=5, workers=2)
    assert one.failed and two.failed and one.prop == two.prop == "ref-balance"


@pytest.mark.slow  # worker processes
def test_a_failure_in_one_worker_stops_the_other():
    """A worker that fails sets the shared stop event, and a worker whose event is set walks
    no further (``_worker`` in this process, as a pool worker runs it)."""
    import multiprocessing as mp
    import time

    from state_machines import native

    kw = {"fault": "R1", "target": "reference", "device": None, "src": None,
          "known_findings": "decline", "swarm": True}
    job = ("radix", RADIX.check_params(P1), 3, 0, 2, time.time() + 60, None, kw, True)
    event = mp.get_context("fork").Event()
    try:
        native._stop = event
        got = native._worker(job)
        assert len(got["failures"]) == 1 and event.is_set()
        again = native._worker(job)  # the event is set: not one walk
        assert again["walks"] == 0 and not again["failures"]
    finally:
        native._stop = None
    out = native_fuzz(RADIX, P1, fault="R1", budget=60, seed=3, workers=2, shrink_budget=5)
    assert out.failed and out.prop == "size-accounting" and out.examples < 2000


@pytest.mark.parametrize("workers", [1, 2])
def test_a_native_run_reports_its_progress_while_it_walks(monkeypatch, workers):
    """A long run is not silent: the walks and steps so far, reported while walks still run,
    growing, and never more than the run's totals.  No clock decides it: the later walks
    wait (in the forked workers too) until the parent has reported three times with steps
    counted, so a loaded machine only makes the test slower."""
    import multiprocessing as mp

    from state_machines import native

    release = mp.get_context("fork").Event()
    walk = native.run_walk

    def gated_walk(spec, params, seed, index, **kw):
        if index >= 4:
            assert release.wait(300), "the parent never reported progress"
        return walk(spec, params, seed, index, **kw)

    monkeypatch.setattr(native, "run_walk", gated_walk)
    monkeypatch.setattr(native, "PROGRESS_EVERY", 0 if workers == 1 else 0.01)
    seen, released_at = [], []

    def progress(p):
        seen.append((p.examples, p.steps, p.first_failure_at))
        if len(seen) >= 3 and p.steps > 0 and not release.is_set():
            released_at.append(len(seen))
            release.set()

    # on the cpu: the gate lives in this process's patched module, which forked workers share
    # and spawned ones (a GPU run's, see native._start_method) would not
    out = native_fuzz(RADIX, P1, max_walks=8, seed=1, workers=workers, progress=progress,
                      device="cpu")
    assert released_at and out.examples == 8, (released_at, out.examples)
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(seen, seen[1:])), seen
    assert 0 < seen[-1][1] <= out.steps and seen[-1][0] <= out.examples
    assert all(f is None for _, _, f in seen)


def test_a_found_failure_is_reported_before_it_is_shrunk():
    seen = []
    out = native_fuzz(RADIX, P1, fault="R1", budget=30, seed=3, workers=1, shrink_budget=5,
                      progress=lambda p: seen.append((p.steps, p.first_failure_at)))
    assert out.failed and seen and seen[-1][1] is not None and seen[-1][0] == out.steps


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_counts_failures_as_the_walks_find_them(monkeypatch, workers):
    """A run that searches on after a failure says so while it walks (the progress line's
    "N failures"), not only once the walks are over and the shrinking starts."""
    from state_machines import native

    monkeypatch.setattr(native, "PROGRESS_EVERY", 0 if workers == 1 else 0.01)
    seen = []
    out = native_fuzz(RADIX, P1, fault="R1", max_walks=200, seed=3, workers=workers,
                      shrink_budget=5, stop_on_first=False, device="cpu",
                      progress=lambda p: seen.append((p.distinct, p.first_failure_at)))
    assert out.failed
    walking = [d for d, at in seen if at is None]  # reported before the shrinking began
    assert walking and max(walking) >= 1, seen
    assert seen[-1][0] == len(out.failures)


def test_cli_native_fuzz_prints_progress(monkeypatch, capsys):
    """Every walk reports (``PROGRESS_EVERY`` 0, and the CLI's throttle is off on a
    terminal): a walk cap, not a time budget, decides how many."""
    from state_machines import native
    from state_machines.commands import fuzz as fuzz_cmd

    monkeypatch.setattr(native, "PROGRESS_EVERY", 0)
    monkeypatch.setattr(fuzz_cmd, "PROGRESS_EVERY", 0)
    assert main(["fuzz", "radix", "--engine", "native", "--max-examples", "5", "--workers",
                 "1", "--page-size", "4"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"  radix page_size=4 pool_pages=\d+: [1-5] examples, [1-9]\d* steps, "
                     r"0 failures, \d+s left", err), err


@pytest.mark.slow  # a fuzz budget and a shrink
def test_cli_native_r1_is_caught_shrunk_and_replays(capsys, tmp_path):
    code = main(["fuzz", "radix", "--engine", "native", "--fault", "R1", "--budget", "30",
                 "--seed", "1", "--page-size", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "property broken: size-accounting" in out
    (path,) = tmp_path.glob("radix-*.json")
    raw = json.loads(path.read_text())
    assert raw["meta"]["engine"] == "native" and len(raw["ops"]) <= 4
    assert main(["replay", str(path)]) == 1
    assert "size-accounting" in capsys.readouterr().out
    trace = load_trace(path)
    assert trace.violation["property"] == "size-accounting"


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_native_workers_and_reports(sig):
    """SIGTERM (a CI timeout, ``kill``) and Ctrl-C stop ``fuzz --engine native --workers 2``
    the same way: the run is reported as interrupted, exit 3, no worker left behind and no
    worker traceback.  (A signal that lands in a garbage-collector callback is dropped by
    Python: the test signals again until the run ends.)"""
    p = subprocess.Popen([sys.executable, "-m", "state_machines", "fuzz", "radix", "--engine",
                          "native", "--workers", "2", "--budget", "120", "--page-size", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=default_sigint)
    try:
        line = p.stderr.readline()  # "fuzzing radix ...": the run started
        assert line.startswith("fuzzing radix"), line
        line = p.stderr.readline()  # the first progress line: the workers have walked
        assert " examples, " in line, line
        out = err = None
        for _ in range(10):
            if sig == signal.SIGINT:  # Ctrl-C in a terminal: the whole process group
                os.killpg(p.pid, sig)
            else:  # kill / a CI timeout: the process itself
                p.send_signal(sig)
            try:
                out, err = p.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        assert p.returncode == EXIT_INTERRUPTED, (out, err)
        assert "interrupted" in out and "Traceback" not in err, (out, err)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    # the pool's workers went with it.  A zombie is not left running: a spawned pool's
    # resource tracker (workers on a GPU, native._start_method) exits after the parent, and
    # where PID 1 does not reap orphans (a container's) it stays listed as one
    ps = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-s", str(p.pid)],
                        capture_output=True, text=True).stdout
    left = [line for line in ps.splitlines() if not line.split()[1].startswith("Z")]
    assert not left, ps
