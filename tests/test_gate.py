"""The pre-merge gate: the corpus must replay clean, known upstream findings must still fail."""

import json

from state_machines.cli import main
from state_machines.regressions import REGRESSIONS, corpus_files


def trace(ops, fault=None, meta=None):
    return {"format": "kvcheck-trace", "version": 1, "variant": "radix", "fault": fault,
            "params": {"page_size": 1}, "ops": ops, "meta": meta or {}}


SPLIT = [{"op": "insert", "tokens": [1, 2]}, {"op": "insert", "tokens": [1, 2, 3]}]


def test_the_shipped_corpus_replays_clean(capsys):
    assert corpus_files(REGRESSIONS), "tests/regressions/ should hold the fault traces"
    code = main(["gate", "--replay-only"])
    out = capsys.readouterr().out
    assert code == 0 and "FAIL" not in out and "passes" in out


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


def test_gate_fuzzes_each_regime(capsys):
    code = main(["gate", "--variant", "radix", "--corpus", "/nonexistent",
                 "--max-examples", "10"])
    out = capsys.readouterr().out
    assert code == 0
    assert "fuzz radix page_size=1" in out and "fuzz radix page_size=4" in out
    assert "no saved traces" in out
