"""The pre-merge gate: the corpus must replay clean, known upstream findings must still fail."""

import json

import pytest

from state_machines.cli import main
from state_machines.regressions import REGRESSIONS, corpus_files


def trace(ops, fault=None, meta=None):
    return {"format": "kvcheck-trace", "version": 1, "variant": "radix", "fault": fault,
            "params": {"page_size": 1}, "ops": ops, "meta": meta or {}}


SPLIT = [{"op": "insert", "tokens": [1, 2]}, {"op": "insert", "tokens": [1, 2, 3]}]


def test_every_shipped_trace_is_replayed_once_by_its_own_test():
    # each tests/regressions/X.json is replayed by its generated test_X.py (and nowhere else in
    # the suite: the gate's own tests replay small corpora of their own)
    traces = corpus_files(REGRESSIONS)
    assert traces, "tests/regressions/ should hold the fault traces"
    for path in traces:
        test = path.with_name(f"test_{path.stem.replace('-', '_')}.py")
        assert test.exists(), f"{path.name} has no generated test"
        assert f'with_name("{path.name}")' in test.read_text()
    tests = list(REGRESSIONS.glob("test_*.py"))
    assert len(tests) == len(traces)


def test_a_trace_that_breaks_again_fails_the_gate(tmp_path, capsys):
    (tmp_path / "good.json").write_text(json.dumps(trace(SPLIT)))
    (tmp_path / "bad.json").write_text(json.dumps(trace(SPLIT, fault="R1")))
    code = main(["gate", "--replay-only", "--corpus", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL     replay" in out and "size-accounting at step 2" in out


def test_a_known_upstream_finding_must_keep_failing(tmp_path, capsys):
    finding = tmp_path / "finding.json"
    finding.write_text(json.dumps(trace(SPLIT, fault="R1", meta={"known_upstream_finding": 1})))
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 0
    assert "still fails on size-accounting (known upstream finding)" in capsys.readouterr().out
    # recorded on another property: failing differently is not "still fails"
    other = trace(SPLIT, fault="R1", meta={"known_upstream_finding": 1})
    other["violation"] = {"property": "ref-balance", "message": "as recorded", "step": 2}
    finding.write_text(json.dumps(other))
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 1
    assert ("now fails on size-accounting, not on its own property ref-balance"
            in capsys.readouterr().out)
    finding.write_text(json.dumps(trace(SPLIT, meta={"known_upstream_finding": 1})))
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 1
    assert "no longer reproduces" in capsys.readouterr().out


def test_a_broken_trace_file_fails_the_gate(tmp_path, capsys):
    (tmp_path / "junk.json").write_text("{")
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 1
    assert "not valid JSON" in capsys.readouterr().out


def test_gate_fuzzes_each_regime(capsys, tmp_path):
    (tmp_path / "good.json").write_text(json.dumps(trace(SPLIT)))
    code = main(["gate", "--variant", "radix", "--corpus", str(tmp_path),
                 "--max-examples", "10"])
    out = capsys.readouterr().out
    assert code == 0
    assert "fuzz radix page_size=1" in out and "fuzz radix page_size=4" in out


def test_a_gate_that_replays_nothing_fails(tmp_path, capsys):
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 1  # an empty folder
    out = capsys.readouterr().out
    assert "nothing replayed: no saved traces" in out and "gate: FAILED" in out
    # every trace skipped (an upstream target not installed here) is nothing replayed too
    (tmp_path / "up.json").write_text(json.dumps({**trace(SPLIT), "target": "sglang"}))
    from state_machines.nightly import target_available
    from state_machines.variants import get_variant

    spec = get_variant("radix")
    if target_available(spec, spec.check_params({}), "sglang") is None:
        return  # the upstream env is here: the trace is replayed, not skipped
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "nothing replayed: all 1 saved traces were skipped" in out
    assert "0 ok, 1 skipped, 1 failed" in out


def test_a_missing_corpus_folder_is_a_usage_error(capsys):
    assert main(["gate", "--replay-only", "--corpus", "nonexistent-dir"]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_skips_are_counted_and_shown(tmp_path, capsys):
    (tmp_path / "good.json").write_text(json.dumps(trace(SPLIT)))
    (tmp_path / "up.json").write_text(json.dumps({**trace(SPLIT), "target": "sglang"}))
    from state_machines.nightly import target_available
    from state_machines.variants import get_variant

    spec = get_variant("radix")
    if target_available(spec, spec.check_params({}), "sglang") is None:
        pytest.skip("the upstream env is here: nothing is skipped")
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 checks: 1 ok, 1 skipped, 0 failed" in out
    assert "skipped (1, not run here, so not verified):" in out and "up.json" in out


def test_an_interrupted_fuzz_never_counts_as_clean(tmp_path, capsys, monkeypatch):
    import state_machines.fuzz as fuzz_module
    from state_machines.fuzz import FuzzOutcome

    def interrupted(spec, params, **kw):
        return FuzzOutcome(spec.name, params, None, "reference", examples=3, interrupted=True)

    monkeypatch.setattr(fuzz_module, "fuzz", interrupted)
    (tmp_path / "good.json").write_text(json.dumps(trace(SPLIT)))
    code = main(["gate", "--variant", "radix", "--corpus", str(tmp_path)])
    assert code == 3  # interrupted, not passed
    assert "gate: passed" not in capsys.readouterr().out


def test_a_finding_recorded_on_another_release_is_judged_there(monkeypatch):
    """A known finding recorded on release X that does not reproduce on the installed Y is a
    skip naming X's env (another release, maybe another class), not 'fixed upstream?'; on X
    itself, or with no release recorded, it is judged as before."""
    from caches.target import Identity
    from state_machines import gate, run
    from state_machines.trace import load_trace

    installed = {"version": "0.5.23"}
    monkeypatch.setattr(run, "target_identity",
                        lambda spec, target, src: Identity("sglang", installed["version"], "x"))
    t = load_trace("tests/upstream_findings/sglang-radix-F1-unmatched-unlock.json")
    assert gate._recorded_release(t) == ("sglang", "0.5.12.post1")  # from meta.upstream
    why = gate._other_release(t)
    assert "recorded on sglang 0.5.12.post1" in why and "installed 0.5.23" in why
    installed["version"] = "0.5.12.post1"
    assert gate._other_release(t) is None
    t.meta.pop("upstream")
    assert gate._other_release(t) is None


def test_a_variant_the_installed_release_lacks_is_skipped_not_failed(monkeypatch):
    from state_machines import nightly, targets
    from state_machines.variants import all_variants

    spec = all_variants()["himamba"]
    params = spec.check_params(spec.regimes[0])
    monkeypatch.setattr(targets, "unavailable_reason", lambda name, src=None: None)
    monkeypatch.setattr(targets, "variant_unavailable_reason",
                        lambda name, variant, src=None:
                        f"no {variant} on this release" if name == "sglang" else None)
    assert nightly.target_available(spec, params, "sglang") == "no himamba on this release"
    assert nightly.target_available(spec, params, "reference") is None


def test_a_fuzz_check_lists_every_distinct_failure_and_passes_a_declined_known_one(
        tmp_path, capsys, monkeypatch):
    """The gate's fuzz part keeps what ``fuzz`` found past the first failure: a new failure
    fails its check, a known finding the run declined (met another way) is listed, not failed."""
    import state_machines.fuzz as fuzz_module
    from state_machines.failures import Failure, Signature
    from state_machines.fuzz import FuzzOutcome
    from state_machines.ops import Op
    from state_machines.trace import Trace

    def found(spec, params, **kw):
        def failure(prop, known):
            t = Trace("radix", params, [Op("insert", {"tokens": [1]})], None, "reference",
                      {"property": prop, "message": "m 1", "step": 1})
            return Failure(Signature.of_trace(t), 0.1, 2, t, None, known)

        fs = [failure("conservation", "F1")]
        if params["page_size"] == 1:
            fs.append(failure("ref-balance", None))
        return FuzzOutcome(spec.name, params, None, "reference", examples=5,
                           trace=fs[0].trace, failures=fs)

    monkeypatch.setattr(fuzz_module, "fuzz", found)
    (tmp_path / "good.json").write_text(json.dumps(trace(SPLIT)))
    code = main(["gate", "--variant", "radix", "--corpus", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "distinct failures: 3" in out and "known F1 (declined)" in out
    assert "clean but for known findings F1" in out  # page_size=4: only the declined one
    # the steps of the failures that count (made-up traces: replayed, they say "recorded")
    assert "broken (recorded): ref-balance" in out and "(recorded): conservation" not in out


def test_a_finding_that_fails_differently_on_another_release_fails_the_gate(
        tmp_path, capsys, monkeypatch):
    """A known finding recorded on release X that, on the installed Y, breaks on another
    property or at an earlier step is its own failed verdict naming both, not a skip; one that
    no longer fails at all on Y stays a skip."""
    from caches.target import Identity
    from state_machines import run

    monkeypatch.setattr(run, "target_identity",
                        lambda spec, target, src: Identity("kvcheck", "0.2", "x"))
    longer = SPLIT + [{"op": "insert", "tokens": [1, 2, 3, 4]},
                      {"op": "insert", "tokens": [5]}, {"op": "insert", "tokens": [5, 6]}]
    finding = tmp_path / "finding.json"
    meta = {"known_upstream_finding": 1, "upstream": "kvcheck==0.1"}

    def write(prop, step, fault="R1"):
        t = trace(longer, fault=fault, meta=meta)
        t["violation"] = {"property": prop, "message": "as recorded", "step": step}
        finding.write_text(json.dumps(t))

    write("ref-balance", 2)  # another property
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert ("fails differently: recorded ref-balance at step 2, now size-accounting at step 2"
            in out)
    assert "0 ok, 0 skipped, 1 failed" in out
    write("size-accounting", 5)  # its own property, earlier
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert ("fails differently: recorded size-accounting at step 5, now size-accounting at "
            "step 2" in out)
    write("size-accounting", 2, fault=None)  # no longer fails on 0.2: judged on 0.1's env
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipped: recorded on kvcheck 0.1" in out and "fails differently" not in out
    assert "0 ok, 1 skipped, 0 failed" in out


def test_skip_reasons_are_printed_whole(tmp_path, capsys, monkeypatch):
    """A long skip reason keeps its advice (the end of the line) in the verdict table, the
    skipped list and the not-gated line: wrapped, never cut."""
    from state_machines import gate, targets
    from state_machines.commands.gate import engine_summary

    advice = ("sglang is not installed in this Python (/a/rather/long/path/to/bin/python3); "
              "set it up with: bash ci/upstream/setup.sh  (then run with THE-END-OF-IT)")
    monkeypatch.setattr(targets, "unavailable_reason", lambda target, src=None: advice)
    (tmp_path / "good.json").write_text(json.dumps(trace(SPLIT)))
    (tmp_path / "up.json").write_text(json.dumps({**trace(SPLIT), "target": "sglang"}))
    assert main(["gate", "--replay-only", "--corpus", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table, skipped = out.split("skipped (1, not run here")
    for part in (table, skipped):
        assert "THE-END-OF-IT)" in part and "setup.sh" in part
    # the table's continuation lines sit under the detail column
    lines = table.splitlines()
    start = lines[0].index("detail")
    row = next(i for i, line in enumerate(lines) if "up.json" in line)
    assert lines[row + 1][:start].strip() == "" and lines[row + 1][start] != " "
    verdicts = gate.GateVerdicts()
    verdicts.not_gated = {"sglang": advice}
    assert "THE-END-OF-IT)" in "\n".join(engine_summary(verdicts, None))
