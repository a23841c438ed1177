"""Every known upstream finding still reproduces through the paths a user takes: the generated
regression helper, ``kvcheck gate``'s corpus replay and ``kvcheck replay``.  (The subjects
decline a finding's op while fuzzing; replaying the finding's own trace must not.)"""

from pathlib import Path

import pytest

from state_machines.cli import main
from state_machines.regressions import assert_trace_holds, replay_corpus
from state_machines.targets import unavailable_reason
from state_machines.trace import load_trace

FINDINGS = Path(__file__).resolve().parents[1] / "upstream_findings"
TRACES = sorted(FINDINGS.glob("*.json"))


def test_there_are_findings():
    assert TRACES


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_finding_still_fails_when_replayed(path, capsys):
    trace = load_trace(path)  # each finding skips where its own target cannot run
    why = unavailable_reason(trace.target, trace.src)
    if why:
        pytest.skip(why)
    assert_trace_holds(path)  # raises if it no longer reproduces
    entry, = [e for e in replay_corpus(FINDINGS, skip_target=unavailable_reason)
              if e.path == path]
    assert entry.expect_failure and entry.ok and entry.result.violation is not None
    assert main(["replay", str(path)]) == 1
    assert "BROKE" in capsys.readouterr().out
