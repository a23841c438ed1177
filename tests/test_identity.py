"""Identity says exactly what was gated: the engine checkout's own commit (never a repository
around it) with ``+dirty.<hash>`` of the uncommitted changes to the files loaded, the
adapter's source hash, the newer-version note; traces written before keep loading; and the
version rule an engine target follows (PEP 440 order, without ``packaging``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from caches.adapters.sglang import versions
from caches.target import (Identity, Target, _adapter_hash, adapter_source, git_commit,
                           source_identity)

ROOT = Path(__file__).resolve().parent.parent
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
                        "HOME": str(repo)})


@pytest.fixture
def checkout(tmp_path):
    repo = tmp_path / "engine"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "cache.py").write_text("LIMIT = 1\n")
    (repo / "pkg" / "other.py").write_text("X = 1\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "engine")
    return repo


def test_a_folder_inside_a_repository_is_not_its_checkout():
    assert git_commit(ROOT)  # this checkout's own HEAD
    assert git_commit(ROOT / "caches") is None  # a folder inside it has no commit of its own


@needs_git
def test_source_is_the_commit_plus_a_hash_of_the_loaded_files_changes(checkout):
    files = [checkout / "pkg" / "cache.py"]
    head = git_commit(checkout)
    assert source_identity(checkout, files) == f"git:{head}"
    (checkout / "pkg" / "other.py").write_text("X = 2\n")  # not a file the target loads
    assert source_identity(checkout, files) == f"git:{head}"
    (checkout / "pkg" / "cache.py").write_text("LIMIT = 2\n")
    dirty = source_identity(checkout, files)
    assert dirty.startswith(f"git:{head}+dirty.")
    (checkout / "pkg" / "cache.py").write_text("LIMIT = 3\n")
    assert source_identity(checkout, files) not in (dirty, f"git:{head}")
    (checkout / "pkg" / "cache.py").write_text("LIMIT = 1\n")
    assert source_identity(checkout, files) == f"git:{head}"


def test_a_folder_that_is_no_checkout_is_identified_by_content(tmp_path):
    f = tmp_path / "cache.py"
    f.write_text("LIMIT = 1\n")
    a = source_identity(tmp_path, [f])
    f.write_text("LIMIT = 2\n")
    assert a.startswith("sha256:") and source_identity(tmp_path, [f]) != a


def test_adapter_hash_follows_the_adapter_source(tmp_path, monkeypatch):
    pkg = tmp_path / "myadapter"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def build(params, **kw):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import myadapter

    target = Target(name="t", engine="e", summary="", builders={"radix": myadapter.build},
                    identify=lambda src: Identity("e", "1", "sha256:00"))
    before = target.identity().adapter
    assert before == adapter_source(target) and before.startswith("sha256:")
    (pkg / "__init__.py").write_text("def build(params, **kw):\n    return 1\n")
    _adapter_hash.cache_clear()
    assert target.identity().adapter != before


def test_traces_written_before_adapter_and_note_still_load():
    old = {"engine": "sglang", "version": "0.5.23", "source": "sha256:0123456789abcdef"}
    ident = Identity.from_json(old)
    assert ident == Identity("sglang", "0.5.23", "sha256:0123456789abcdef")
    assert ident.to_json() == old  # and are written back the same
    new = Identity("sglang", "0.5.24.dev0", "git:abc+dirty.def", adapter="sha256:1",
                   note="engine version 0.5.24.dev0 is newer ...")
    assert Identity.from_json(new.to_json()) == new
    assert Identity.from_json({**old, "adapter": 3}) is None
    from state_machines.trace import load_trace

    recorded = 0
    for path in sorted((ROOT / "tests" / "upstream_findings").glob("*.json")):
        raw = json.loads(path.read_text()).get("target_identity")
        trace = load_trace(path)  # raises TraceError if the identity no longer loads
        if raw is not None:
            recorded += 1
            assert trace.identity.to_json() == raw, path.name
    assert recorded, "no shipped finding records an identity: the check above checked nothing"


def test_replay_says_when_the_adapter_changed(monkeypatch, capsys):
    import state_machines.targets as targets
    from state_machines.commands.replay import _say_identity
    from state_machines.trace import Trace

    now = Identity("e", "1", "sha256:aa", adapter="sha256:new")
    monkeypatch.setattr(targets, "get_target", lambda name: Target(
        name="t", engine="e", summary="", builders={}, identify=lambda src: now))
    trace = Trace("radix", {}, [], None, "t", None, identity=Identity(
        "e", "1", "sha256:aa", adapter="sha256:old"))
    _say_identity(trace, None)
    out = capsys.readouterr().out
    assert "adapter for t changed" in out and "a different source" not in out
    trace.identity = Identity("e", "1", "sha256:aa")  # an old trace: no adapter recorded
    _say_identity(trace, None)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("older, newer", [
    ("0.5.23.dev0", "0.5.23rc1"), ("0.5.23rc1", "0.5.23"), ("0.5.23", "0.5.23+g1a2b"),
    ("0.5.23+g1a2b", "0.5.23.post1"), ("0.5.23.post1", "0.5.24.dev0"),
    ("0.5.24.dev0", "0.5.24.dev0+g1234abc"), ("0.5.24.dev0+g1234abc", "0.5.24.dev3"),
    ("0.5.9", "0.5.10.post1"), ("0.5.24", "0.6")])
def test_versions_order_as_pep_440(older, newer):
    assert versions.version_key(older) < versions.version_key(newer)


def test_newer_versions_run_on_the_newest_adapters_older_ones_are_refused():
    assert versions.adapter_release("0.5.24.dev0+g1234abc") == versions.NEWEST
    assert versions.newer_note("0.5.24.dev0") == (
        "engine version 0.5.24.dev0 is newer than the newest one kvcheck was tested on "
        f"({versions.NEWEST})")
    assert versions.adapter_release("0.5.12.post1") == "0.5.12.post1"  # pinned: itself
    assert versions.newer_note(versions.NEWEST) is None
    for old in ("0.5.23.dev0", "0.5.11", "0.0.0.dev0", "not a version"):
        assert versions.adapter_release(old) is None
    assert versions.variant_unsupported("0.5.24.dev0", "sglang-rust", "radix") is None
