"""Every known upstream finding still reproduces through the paths a user takes: the generated
regression helper, ``kvcheck gate``'s corpus replay and ``kvcheck replay``.  (The subjects
decline a finding's op while fuzzing; replaying the finding's own trace must not.)"""

import json
from pathlib import Path

import pytest

from state_machines.cli import main
from state_machines.regressions import assert_trace_holds, replay_corpus
from state_machines.targets import unavailable_reason
from state_machines.trace import load_trace
from tests.upstream.snapshots import located_src

FINDINGS = Path(__file__).resolve().parents[1] / "upstream_findings"
TRACES = sorted(FINDINGS.glob("*.json"))


def test_there_are_findings():
    assert TRACES


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_finding_still_fails_when_replayed(path, capsys, tmp_path):
    trace = load_trace(path)  # each finding skips where its own target cannot run
    src = located_src(trace.src)
    why = unavailable_reason(trace.target, src)
    if not why and trace.target == "sglang":  # replayed on the release it was recorded on
        from caches.adapters.sglang.loader import release_reason
        from state_machines.gate import _recorded_release

        why = release_reason(_recorded_release(trace)[1])
    if why:
        pytest.skip(why)
    corpus = FINDINGS
    if src != trace.src:  # recorded next to the project; this clone finds the snapshot elsewhere
        corpus = tmp_path / FINDINGS.name
        corpus.mkdir()
        data = json.loads(path.read_text())
        data["src"] = src
        path = corpus / path.name
        path.write_text(json.dumps(data))
    assert_trace_holds(path)  # raises if it no longer reproduces
    entry, = [e for e in replay_corpus(corpus, skip_target=unavailable_reason)
              if e.path == path]
    assert entry.expect_failure and entry.ok and entry.result.violation is not None
    assert main(["replay", str(path)]) == 1
    assert "BROKE" in capsys.readouterr().out
