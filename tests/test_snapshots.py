"""A trace's recorded engine checkout (``src``) is found the same way from any working
directory (state_machines/snapshots.py), and a missing one is one line naming what to pass."""

import json
import os
from pathlib import Path

import pytest

from state_machines import snapshots
from state_machines.cli import main
from state_machines.trace import load_trace

FINDING = Path(__file__).resolve().parent / "upstream_findings" / \
    "pymllm-radix-F1-partial-page-tail-freed.json"


def _with_src(tmp_path, src) -> Path:
    data = json.loads(FINDING.read_text())
    data["src"] = src
    out = tmp_path / "trace.json"
    out.write_text(json.dumps(data))
    return out


def test_relative_src_resolves_against_the_checkout_not_the_working_directory(tmp_path,
                                                                              monkeypatch):
    checkout = tmp_path / "work" / "shared" / "upstream" / "engine-abc"
    checkout.mkdir(parents=True)
    monkeypatch.setattr(snapshots, "REPO", tmp_path / "work" / "project")
    monkeypatch.chdir(tmp_path)  # "../shared/upstream/engine-abc" is not a dir from here
    monkeypatch.delenv(snapshots.ENV, raising=False)
    assert snapshots.resolve_src("../shared/upstream/engine-abc") == str(checkout.resolve())


def test_snapshots_search_path_finds_the_checkout_by_name(tmp_path, monkeypatch):
    held = tmp_path / "snaps" / "engine-abc"
    held.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(snapshots.ENV, os.pathsep.join([str(tmp_path / "none"),
                                                       str(tmp_path / "snaps")]))
    assert snapshots.resolve_src("elsewhere/engine-abc") == str(held.resolve())
    assert snapshots.resolve_src("elsewhere/engine-xyz") is None


def test_load_trace_resolves_src_from_any_directory(tmp_path, monkeypatch):
    held = tmp_path / "snaps" / "mllm-b9c307020b"
    held.mkdir(parents=True)
    monkeypatch.setenv(snapshots.ENV, str(tmp_path / "snaps"))
    monkeypatch.chdir(tmp_path)
    trace = load_trace(_with_src(tmp_path, "../nowhere/mllm-b9c307020b"))
    assert Path(trace.src) == held.resolve()


def test_missing_src_is_one_line_naming_what_to_pass(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(snapshots.ENV, str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    path = _with_src(tmp_path, "../nowhere/mllm-not-here")
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "pass --src PATH" in err and "mllm-not-here" in err and snapshots.ENV in err
    assert "not a directory" not in err and "Traceback" not in err


@pytest.mark.parametrize("where", ["/", "tests"])
def test_gate_skips_a_missing_src_with_that_line(tmp_path, monkeypatch, where):
    from state_machines.gate import run_gate

    monkeypatch.setenv(snapshots.ENV, str(tmp_path / "empty"))
    monkeypatch.chdir(Path(__file__).resolve().parents[1] / where if where != "/" else "/")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _with_src(tmp_path, "../nowhere/mllm-not-here").rename(corpus / FINDING.name)
    verdicts = run_gate(corpus_dirs=(corpus,), fuzz_too=False)
    v = next(v for v in verdicts if FINDING.name in v.what)
    assert v.skipped and "recorded with (../nowhere/mllm-not-here)" in v.detail
    assert snapshots.ENV in v.detail
