"""The wheel carries the regression corpus, so an installed `kvcheck gate` replays it from any
directory (ci/wheel-gate.sh runs that gate; this checks what the wheel holds)."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from state_machines.regressions import REGRESSIONS, UPSTREAM_FINDINGS, corpus_files

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_carries_every_corpus_trace(tmp_path):
    # from a clean copy: setuptools reuses a checkout's build/lib, where an earlier build's
    # corpus would hide a wheel that no longer carries one
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", ".venv*", "__pycache__", ".hypothesis", "kvcheck-traces"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("kvcheck-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in (REGRESSIONS, UPSTREAM_FINDINGS):
        traces = corpus_files(folder)
        assert traces, f"{folder} holds no traces"
        missing = [p.name for p in traces
                   if f"state_machines/corpus/{folder.name}/{p.name}" not in names]
        assert not missing, f"the wheel lacks {folder.name} traces: {missing}"
    # only the traces: the generated test files stay in the checkout
    assert not [n for n in names if n.startswith("state_machines/corpus/")
                and not n.endswith(".json")]


def test_the_corpus_is_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert REGRESSIONS.is_absolute() and corpus_files(REGRESSIONS)
    assert UPSTREAM_FINDINGS.is_absolute() and corpus_files(UPSTREAM_FINDINGS)
