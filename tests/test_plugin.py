"""Out-of-tree targets, installed as a user installs theirs, work in every command.

``tests/plugin_example/`` is a separate package (``kvcheck-plugin-example``) that registers two
targets under the entry-point group ``kvcheck.targets``: ``r1demo``, the reference radix cache
with fault R1, and ``tinyserve``, a toy engine that is not shaped like SGLang (its own node
field names, 0-based slots with no padding slot, an ``evict`` returning the slots it freed, a
scheduler that evicts on its own) plugged in through the public seam only (the tests of it are
at the end: the victim check runs on it, ``diff`` passes with its one declared difference,
``kvcheck report`` writes a script that reproduces its planted defect).  It is pip-installed into a temp folder (the suite's environment is not touched) and
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

from tests.harness import NO_KVCHECK

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
    assert list(site.glob("kvcheck_plugin_example-*.dist-info/entry_points.txt"))
    return site


def kvcheck(plugin_path, cwd, *argv):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "state_machines", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_list_shows_the_plugin_and_where_it_comes_from(plugin_path, tmp_path):
    done = kvcheck(plugin_path, tmp_path, "list")
    assert done.returncode == 0, done.stderr
    assert "r1demo" in done.stdout
    assert "kvcheck-plugin-example 0.1.0" in done.stdout
    assert "kvcheck_r1_demo:TARGET" in done.stdout and "tinyserve_kvcheck:TARGET" in done.stdout
    assert ("targets: reference, sglang, sglang-rust, sglang-radixcache, pymllm, r1demo, "
            "tinyserve") in done.stdout


def test_fuzz_replay_and_gate_catch_r1_through_the_plugin(plugin_path, tmp_path):
    out = tmp_path / "traces"
    done = kvcheck(plugin_path, tmp_path, "--profile", "ci", "fuzz", "radix", "--target",
                   "r1demo", "--page-size", "1", "--stop-on-first", "--out", str(out))
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
                   "radix", "--target", "r1demo", "--stop-on-first")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fuzz radix page_size=1 pool_pages=16 [r1demo]" in done.stdout
    assert "property broken: size-accounting" in done.stdout


def test_a_trace_of_another_source_says_so_on_replay(plugin_path, tmp_path):
    out = tmp_path / "traces"
    done = kvcheck(plugin_path, tmp_path, "--profile", "ci", "fuzz", "radix", "--target",
                   "r1demo", "--page-size", "1", "--stop-on-first", "--out", str(out))
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
                   "--max-examples", "12")
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
    done = kvcheck(plugin_path, tmp_path, "nightly", "--budget", "12", "--workers", "1",
                   "--variant", "radix", "--target", "r1demo", "--out", str(tmp_path / "n"),
                   "--database", str(tmp_path / "db"), "--stop-on-first")
    assert done.returncode == 1, done.stdout + done.stderr
    summary = (tmp_path / "n" / "summary.md").read_text()
    assert "r1demo" in summary and "size-accounting" in summary


# -- tinyserve: an engine that is not SGLang-shaped, through the public seam only ---------------
@pytest.fixture
def tinyserve(monkeypatch):
    """The example engine and its adapter, imported from the example's source."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import tinyserve as engine
    import tinyserve_kvcheck as adapter

    return engine, adapter


def _evict_through_the_scheduler(subject):
    """Two cached entries, the first read again, then an admission that needs both slots: the
    engine's scheduler evicts by itself (``Scheduler._allocate`` -> ``PrefixTree.evict``)."""
    from invariants import Violation

    for op, args in [("insert", {"tokens": [1]}), ("insert", {"tokens": [2]}),
                     ("match", {"tokens": [1]}), ("admit", {"rid": 0, "tokens": [3, 4]})]:
        getattr(subject, op)(**args)
        try:
            subject.check()
        except Violation as v:
            return v
    return None


def test_the_victim_check_runs_on_tinyserve_and_a_wrong_eviction_key_fails(tinyserve):
    engine, adapter = tinyserve

    class MRUTree(engine.PrefixTree):  # the newest leaf goes first: not the declared LRU
        def leaves(self):
            return sorted(super().leaves(), key=lambda e: -e.stamp)

        def evict(self, n):
            freed = []
            for e in self.leaves():
                if len(freed) >= n:
                    break
                freed += e.slots
                self._drop(e)
            return freed

    clean = adapter.TinyServeSubject(pool_pages=2)
    assert _evict_through_the_scheduler(clean) is None
    assert clean.reached_counts["policy:victims"] == 2  # both, seen inside the scheduler's call
    assert clean.quiesce().startswith("drained")
    wrong = adapter.TinyServeSubject(pool_pages=2, tree_cls=MRUTree)
    v = _evict_through_the_scheduler(wrong)
    assert v is not None and v.prop == "victim", v


def test_tinyserve_declares_its_pool_layout_results_and_fields(tinyserve):
    """0-based slots, no padding: conservation and quiescence hold on the engine's own ids
    (slot 0 is a real slot), an empty list is out of memory, evict's indices are freed."""
    _, adapter = tinyserve
    s = adapter.TinyServeSubject(pool_pages=2)
    assert s.insert(tokens=[5, 6]) == "tree already had 0 tokens"
    s.check()
    assert 0 in [i for n in s.tree_view().nodes.values() for i in n.value]
    assert s.evict(n=2) == "evicted 2 tokens" and sorted(s.pool.view().free) == [0, 1]
    s.check()
    assert s.admit(rid=1, tokens=[7, 8, 9]).startswith("out of memory")
    assert s.reached_counts["out-of-memory"] == 1
    s.check()
    s.quiesce()


def test_tinyserve_differs_from_the_reference_only_as_declared(tinyserve):
    """A lookup that splits an entry leaves the lower part's stamp old (the reference refreshes
    it): the next eviction takes another leaf on each side -- accepted as the declared
    difference, a divergence once the declaration is taken away."""
    import dataclasses

    from invariants import Violation
    from state_machines.diff import PROP, PairSubject
    from state_machines.variants import get_variant

    _, adapter = tinyserve
    ops = [("insert", {"tokens": [1, 2]}), ("insert", {"tokens": [3]}),
           ("match", {"tokens": [1]}), ("evict", {"n": 1})]

    def run(policy):
        up = adapter.TinyServeSubject(pool_pages=4)
        up.policy = policy
        ref = get_variant("radix").make_subject({"pool_pages": 4})
        pair = PairSubject(ref, up, "tinyserve")
        for op, args in ops:
            getattr(pair, op)(**args)
            pair.check()
        return pair

    pair = run(adapter.TinyServeSubject.policy)
    assert pair.by_state and pair.accepted == "split-keeps-lower-stamp"
    assert pair.log[-1].declared and not pair.log[-1].differs
    with pytest.raises(Violation) as err:
        run(dataclasses.replace(adapter.TinyServeSubject.policy, differences=()))
    assert err.value.prop == PROP and "state differ" in err.value.message


def test_fuzz_diff_and_coverage_run_tinyserve(plugin_path, tmp_path):
    done = kvcheck(plugin_path, tmp_path, "--profile", "ci", "fuzz", "radix", "--target",
                   "tinyserve", "--budget", "6", "--out", str(tmp_path / "t"))
    assert done.returncode == 0, done.stdout + done.stderr
    # its own regimes and its narrowed page size: only page_size=1, its pool sizes
    assert "page_size=1 pool_pages=8 fast_finish=0" in done.stdout
    assert "page_size=1 pool_pages=16 fast_finish=0" in done.stdout
    done = kvcheck(plugin_path, tmp_path, "fuzz", "radix", "--target", "tinyserve",
                   "--page-size", "4")
    assert done.returncode == 2 and "page_size must be an integer in [1, 1]" in done.stderr
    # (40 derandomised examples show the declared difference 4 times)
    done = kvcheck(plugin_path, tmp_path, "--profile", "ci", "diff", "radix", "--target",
                   "tinyserve", "--param", "pool_pages=16", "--max-examples", "40",
                   "--out", str(tmp_path / "d"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no difference beyond the declared" in done.stdout
    assert "differs as declared: split-keeps-lower-stamp" in done.stdout
    done = kvcheck(plugin_path, tmp_path, "coverage", "radix", "--target", "tinyserve",
                   "--max-examples", "30", "--json")
    res = json.loads(done.stdout.splitlines()[-1])
    assert res["victims_unreported"] is False  # the observer saw the victims
    # the ops its scheduler declines, and what only they reach, are left out, and named
    assert set(res["declined_ops"]) == {"decode", "spec_decode", "retract", "enqueue",
                                        "schedule"}
    assert not set(res["declined_ops"]) & set(res["ops_missing"])
    assert "batch-admitted" in res["declined_transitions"]
    assert not set(res["declined_transitions"]) & set(res["missing"])
    assert res["counts"]["alloc-evicted"] > 0 and res["counts"]["out-of-memory"] > 0


PLANTED = {"format": "kvcheck-trace", "version": 1, "variant": "radix", "target": "tinyserve",
           "fault": None, "params": {"page_size": 1, "pool_pages": 8, "fast_finish": 1},
           "ops": [{"op": "admit", "rid": 1, "tokens": [0]},
                   {"op": "admit", "rid": 2, "tokens": [0]},
                   {"op": "insert", "tokens": [0]}, {"op": "prefill", "rid": 1, "n": 1},
                   {"op": "quiesce"}],
           "violation": {"property": "quiescence", "step": 5,
                         "message": "after draining, pool kv has 7 of 8 slots free (1 leaked)"}}


@pytest.mark.parametrize("fast_finish", [1, 0])
def test_report_reproduces_tinyserves_planted_defect_without_kvcheck(plugin_path, tmp_path,
                                                                     fast_finish):
    """``Scheduler(fast_finish=True)`` leaks a finishing sequence's duplicate slot (the shrunk
    trace a ``--param fast_finish=1`` fuzz finds): the script written from the trace imports
    only the engine and fails on it; with the switch off the same steps pass."""
    trace = tmp_path / "planted.json"
    trace.write_text(json.dumps({**PLANTED, "params": {**PLANTED["params"],
                                                        "fast_finish": fast_finish}}))
    done = kvcheck(plugin_path, tmp_path, "report", str(trace), "--out", str(tmp_path / "r"))
    assert done.returncode == 0, done.stdout + done.stderr
    script, md = tmp_path / "r" / "planted.py", (tmp_path / "r" / "planted.md").read_text()
    assert "from tinyserve import" in script.read_text()
    assert f"sched = Scheduler(pool, tree, fast_finish={bool(fast_finish)})" in md
    assert f"`fast_finish={fast_finish}`" in md and "`pool_pages=8`" in md
    run = subprocess.run([sys.executable, "-c", NO_KVCHECK, str(script)], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(plugin_path)},
                         capture_output=True, text=True, timeout=120)
    if fast_finish:
        assert run.returncode == 1, run.stdout + run.stderr
        assert "BROKEN at step 5. drain everything" in run.stdout
        assert "quiescence: " in run.stdout and "(1 leaked)" in run.stdout
    else:
        assert run.returncode == 0 and "not reproduced" in run.stdout, run.stdout + run.stderr
