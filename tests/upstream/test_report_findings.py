"""``kvcheck report`` on the SGLang and pymllm findings: the emitted script, run with this interpreter
and kvcheck's packages made unimportable, FAILS on the finding's property on the release the
finding names; the same script written from the trace without its last op (the op that
triggers the defect) passes -- the script's check can fail and can pass.

Runs in each env: 0.5.12.post1 (``.venv-upstream-0.5.12.post1``) and 0.5.23
(``.venv-upstream``); a finding is reported where the table below says it reproduces.
"""

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import NO_KVCHECK

from state_machines.cli import main
from state_machines.call_recorder import ReportError
from state_machines.report import build_report
from state_machines.trace import load_trace

FINDINGS = Path(__file__).resolve().parents[1] / "upstream_findings"
# finding -> {release: the target whose class it reproduces on there}
REPORTED = {
    "sglang-radix-F1-unmatched-unlock": {"0.5.12.post1": "sglang",
                                         "0.5.23": "sglang-radixcache"},
    "sglang-streaming-session-F1-retract-twice-detaches": {"0.5.12.post1": "sglang"},
}
# finding -> the release it replays on, where no reporter exists yet
NOT_YET = {"sglang-himamba-F1-host-insert-skips-full-lru": "0.5.12.post1",
           "sglang-himamba-F2-write-ack-drops-mamba-lock": "0.5.12.post1",
           "sglang-himamba-F3-evict-mamba-asserts-on-write-locked-leaf": "0.5.12.post1",
           "sglang-himamba-F4-host-leaf-below-unbacked-node": "0.5.12.post1",
           "sglang-0.5.23-streaming-session-F1-retract-twice-detaches": "0.5.23"}
# what the script may import: the engine, torch, the standard library
ALLOWED = {"sglang", "torch", "sys", "traceback", "importlib", "time", "types", "warnings",
           "dataclasses", "array"}


def _release():
    from caches.adapters.sglang import loader

    why = loader.unavailable_reason()
    if why:
        pytest.skip(why)
    return loader.load().version


def _run_script(text: str, where: Path) -> subprocess.CompletedProcess:
    path = where / "repro.py"
    path.write_text(text)
    return subprocess.run([sys.executable, "-c", NO_KVCHECK, str(path)], cwd=where,
                          capture_output=True, text=True, timeout=300)


def _imports(text: str) -> set:
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("finding", sorted(REPORTED))
def test_script_fails_on_the_findings_property(finding, tmp_path):
    release = _release()
    target = REPORTED[finding].get(release)
    if target is None:
        pytest.skip(f"{finding} is not reported on sglang {release}")
    trace = load_trace(FINDINGS / f"{finding}.json")
    report = build_report(trace, target=target, trace_path=f"{finding}.json")
    prop, step = trace.violation["property"], trace.violation["step"]
    assert report.broke == prop
    assert _imports(report.script) <= ALLOWED, _imports(report.script)
    assert f"sglang {release}" in report.script and f"sglang {release}" in report.markdown
    got = _run_script(report.script, tmp_path)
    assert got.returncode == 1, got.stdout + got.stderr
    assert f"BROKEN at step {step}. " in got.stdout and f": {prop}: " in got.stdout, got.stdout

    # the same script without the op that triggers the defect: every check passes
    control = dataclasses.replace(trace, ops=trace.ops[:-1], violation=trace.violation)
    clean = build_report(control, target=target, trace_path=f"{finding}.json")
    assert clean.broke is None and "check_" in clean.script  # the check is still there
    got = _run_script(clean.script, tmp_path)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "not reproduced" in got.stdout


def test_cli_writes_the_script_and_the_markdown(tmp_path, capsys):
    release = _release()
    finding = "sglang-radix-F1-unmatched-unlock"
    argv = ["report", str(FINDINGS / f"{finding}.json"), "--out", str(tmp_path)]
    if release == "0.5.23":
        argv += ["--target", "sglang-radixcache"]
    assert main(argv) == 0, capsys.readouterr()
    assert "the replay broke: ref-balance" in capsys.readouterr().out
    script, md = tmp_path / f"{finding}.py", tmp_path / f"{finding}.md"
    assert "kvcheck report " in script.read_text()  # how to regenerate it
    text = md.read_text()
    assert f"sglang {release}" in text and "`ref-balance`" in text and "lock_ref" in text


def test_0_5_23_unified_cache_has_no_reporter_yet(capsys):
    if _release() != "0.5.23":
        pytest.skip("0.5.23's targets")
    code = main(["report", str(FINDINGS / "sglang-radix-F1-unmatched-unlock.json")])
    err = capsys.readouterr().err
    assert code == 2 and "has no reporter for variant 'radix'" in err, err


@pytest.mark.parametrize("finding", sorted(NOT_YET))
def test_findings_without_a_reporter_are_refused_clearly(finding):
    """Not written yet (docs/adapters.md, section 5): a clear refusal, not a wrong script.
    FAILS once a reporter exists -- then move the finding to REPORTED."""
    if _release() != NOT_YET[finding]:
        pytest.skip(f"{finding} replays on sglang {NOT_YET[finding]}")
    with pytest.raises(ReportError, match="no reporter"):
        build_report(load_trace(FINDINGS / f"{finding}.json"))


# -- pymllm, loaded from the snapshot checkout ------------------------------------------------------
PYMLLM = ["pymllm-radix-R1-add-leaf-subtracts-parent", "pymllm-radix-R2-unmatched-unlock"]


@pytest.mark.parametrize("finding", PYMLLM)
def test_pymllm_script_fails_on_the_findings_property(finding, tmp_path):
    from state_machines.targets import unavailable_reason
    from tests.upstream.snapshots import located_src

    trace = load_trace(FINDINGS / f"{finding}.json")
    src = located_src(trace.src)
    why = unavailable_reason("pymllm", src)
    if why:
        pytest.skip(why)
    report = build_report(trace, trace_path=f"{finding}.json", src=src)
    prop, step = trace.violation["property"], trace.violation["step"]
    assert report.broke == prop
    assert _imports(report.script) <= ALLOWED | {"pymllm", "os"}, _imports(report.script)
    got = _run_script(report.script, tmp_path)
    assert got.returncode == 1, got.stdout + got.stderr
    assert f"BROKEN at step {step}. " in got.stdout and f": {prop}: " in got.stdout, got.stdout
    control = dataclasses.replace(trace, ops=trace.ops[:-1])
    clean = build_report(control, trace_path=f"{finding}.json", src=src)
    got = _run_script(clean.script, tmp_path)
    assert got.returncode == 0 and "not reproduced" in got.stdout, got.stdout + got.stderr
