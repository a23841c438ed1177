"""The gate gates the code under review and never passes vacuously: a ``--target`` asked for
that runs nowhere fails the gate naming it; the summary says which engine code was gated;
``--budget`` bounds the fuzz part."""

import importlib.util
import json

import pytest

from state_machines.cli import main

SPLIT = [{"op": "insert", "tokens": [1, 2]}, {"op": "insert", "tokens": [1, 2, 3]}]


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "good.json").write_text(json.dumps(
        {"format": "kvcheck-trace", "version": 1, "variant": "radix", "fault": None,
         "params": {"page_size": 1}, "ops": SPLIT, "meta": {}}))
    return str(tmp_path)


def test_a_target_that_runs_nowhere_fails_the_gate_naming_it(corpus, capsys):
    code = main(["gate", "--target", "pymllm", "--variant", "radix", "--corpus", corpus,
                 "--max-examples", "3"])
    out = capsys.readouterr().out
    assert code == 1
    assert "target pymllm was not gated: target pymllm needs --src PATH" in out
    assert "gate: FAILED" in out


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None,
                    reason="sglang is installed in this Python (the upstream suite covers it)")
def test_gate_target_sglang_without_sglang_exits_1_naming_it(corpus, capsys):
    code = main(["gate", "--target", "sglang", "--variant", "radix", "--corpus", corpus])
    out = capsys.readouterr().out
    assert code == 1
    assert "target sglang was not gated: sglang is not installed" in out


def test_repeated_targets_each_must_be_gated(corpus, capsys):
    code = main(["gate", "--target", "reference", "--target", "lightllm", "--variant",
                 "paged-bigpage", "--corpus", corpus, "--max-examples", "3"])
    out = capsys.readouterr().out
    assert code == 1
    assert "fuzz paged-bigpage" in out and "[lightllm]" in out
    assert "target lightllm was not gated" in out


def test_a_gate_of_kvcheck_models_only_says_no_engine_code_was_gated(corpus, capsys):
    code = main(["gate", "--variant", "radix", "--corpus", corpus, "--max-examples", "3"])
    out = capsys.readouterr().out
    summary = out[out.index("\n\n"):]
    assert code == 0
    assert "no engine code was gated" in summary
    assert "engine targets not gated: " in summary and "pymllm (" in summary


def test_budget_bounds_each_fuzz_item(corpus, capsys):
    code = main(["gate", "--target", "reference", "--variant", "radix", "--corpus", corpus,
                 "--budget", "0.001"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("share of --budget ran out") == 2  # both radix regimes, 1 example each


@pytest.mark.parametrize("argv, words", [
    (["--target", "nope"], "unknown target 'nope'"),
    (["--src", "."], "--src needs --target"),
    (["--target", "reference", "--src", "."], "takes no --src"),
    (["--target", "pymllm", "--src", "/nonexistent"], "not a directory"),
    (["--target", "vllm", "--variant", "radix"], "has none of the variants"),
    (["--budget", "0"], "--budget must be a positive"),
])
def test_bad_gate_arguments_exit_2(argv, words, capsys):
    assert main(["gate", *argv]) == 2
    assert words in capsys.readouterr().err
