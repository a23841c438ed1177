"""``--target tokenspeed --src CHECKOUT``: the scheduler built from a TokenSpeed checkout.

Fast, everywhere (no compile):

* a path that is no TokenSpeed checkout, a missing toolchain and a failed CMake run are each
  one line and exit 2 from ``fuzz`` (never a traceback), the failed build naming CMake's error;
* the identity is the checkout's own commit (``git:<sha>``), ``+dirty.<hash>`` for uncommitted
  changes to the scheduler's files (a different edit, a different hash), and ``sha256:`` of the
  sources for a directory that is no git checkout -- never the commit of an enclosing
  repository; the build-cache key follows the sources.

Opt-in (a CPU build takes minutes): ``KVCHECK_TOKENSPEED_SRC=<checkout>`` (a lightseekorg/
tokenspeed clone, its ``tokenspeed-scheduler`` directory or an unpacked
``tokenspeed-scheduler`` sdist whose bindings are those of 0.1.38 or later) builds it (cached
by source hash) and runs a ci-profile fuzz of continuation-state on it, which must be clean
and record the checkout's identity; skipped, with the reason, when unset or the toolchain is
missing.  ``KVCHECK_TOKENSPEED_PRE460_SRC`` / ``KVCHECK_TOKENSPEED_POST460_SRC`` (checkouts of
lightseekorg/tokenspeed 473124f2 and 4b3b06de, the pre-#864 API): TokenSpeed #460 found by the
machines before the fix and not after it, and the probe's page counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from caches.adapters.tokenspeed import build
from caches.adapters.tokenspeed.target import TARGET


def source_of(src) -> str:
    return TARGET.identity(str(src)).source

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = '[project]\nname = "tokenspeed-scheduler"\nversion = "9.9.9"\n'


def fake_checkout(root: Path, cmake_body: str = "message(FATAL_ERROR \"planted: no such SDK\")\n"):
    """A tokenspeed-shaped tree (``tokenspeed-scheduler/`` with CMakeLists, bindings, csrc)."""
    sdir = root / "tokenspeed-scheduler"
    (sdir / "bindings").mkdir(parents=True)
    (sdir / "csrc").mkdir()
    (sdir / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.22)\n"
                                         "project(t LANGUAGES NONE)\n" + cmake_body)
    (sdir / "bindings" / "python_module.cpp").write_text("// bindings\n")
    (sdir / "csrc" / "a.cpp").write_text("int a() { return 1; }\n")
    (sdir / "pyproject.toml").write_text(PYPROJECT)
    return sdir


def kvcheck(*args, env=None, timeout=300):
    """The CLI in a child Python, from the repository (``env`` on top of this one's)."""
    code = "import sys\nfrom state_machines.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def fuzz_cli(src, tmp_path, *extra, env=None):
    return kvcheck("--profile", "ci", "fuzz", "continuation-state", "--target", "tokenspeed",
                   "--src", str(src), "--out", str(tmp_path / "traces"),
                   *(extra or ("--budget", "1")),
                   env={"KVCHECK_CACHE_DIR": str(tmp_path / "cache"), **(env or {})})


def one_line_exit_2(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("kvcheck: error")]
    assert len(errs) == 1, r.stderr
    return errs[0]


# -- refusals: one line, exit 2 ---------------------------------------------------------------
def test_not_a_checkout_is_one_line_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    line = one_line_exit_2(fuzz_cli(tmp_path / "empty", tmp_path))
    assert "not a TokenSpeed checkout" in line


def test_missing_toolchain_is_one_line_exit_2(tmp_path):
    src = fake_checkout(tmp_path / "ts").parent
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    # no cmake, no compiler on PATH: unavailable before anything runs
    line = one_line_exit_2(fuzz_cli(src, tmp_path, env={"PATH": str(empty_bin), "CXX": ""}))
    assert "missing cmake >= 3.22" in line and "C++20 compiler" in line
    assert "ci/tokenspeed-src-setup.sh" in line
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.log"))


@pytest.mark.skipif(not build.shutil.which("cmake"), reason="cmake is not installed here")
def test_failed_build_is_one_line_exit_2_naming_the_error(tmp_path):
    try:
        build.toolchain()
    except build.BuildUnavailable as exc:
        pytest.skip(f"build toolchain incomplete here: {exc}")
    src = fake_checkout(tmp_path / "ts").parent
    line = one_line_exit_2(fuzz_cli(src, tmp_path))
    assert "building the TokenSpeed scheduler from" in line and "failed" in line
    assert "planted: no such SDK" in line or "CMake Error" in line
    logs = list((tmp_path / "cache").rglob("*.log"))
    assert logs and "planted: no such SDK" in logs[0].read_text()
    # nothing half-built is cached: a later run builds (and fails) again
    assert not [p for p in (tmp_path / "cache" / "tokenspeed-scheduler").iterdir() if p.is_dir()]


def test_checkout_without_the_driven_bindings_is_refused(tmp_path, monkeypatch):
    """A build that imports but has neither API the target drives (0.1.38+ nor pre-#864) is
    unavailable, naming what the newer one misses."""
    sdir = fake_checkout(tmp_path / "ts")
    monkeypatch.setattr(build, "_built", lambda d: tmp_path / "built")
    monkeypatch.setattr(build, "probe", lambda root: {
        "missing": {build.API_CURRENT: ["AttnKind", "Scheduler.retracted_size"],
                    build.API_PRE864: ["PagedCacheGroupConfig"]}, "file": "x.so"})
    build._OUTCOMES.clear()
    with pytest.raises(build.BuildUnavailable, match="lacks bindings the tokenspeed target "
                                                     "drives: AttnKind, Scheduler.retracted_size"):
        build.package_root(str(sdir.parent))
    build._OUTCOMES.clear()


def test_checkout_with_the_pre864_bindings_is_taken_as_such(tmp_path, monkeypatch):
    """A build with the pre-#864 PagedCacheGroupConfig API (TokenSpeed #460's commits) is
    usable, and ``api`` says which subject drives it; one with both takes the newer."""
    sdir = fake_checkout(tmp_path / "ts")
    monkeypatch.setattr(build, "_built", lambda d: tmp_path / "built")
    for missing, want in (({build.API_CURRENT: ["AttnKind"], build.API_PRE864: []},
                           build.API_PRE864),
                          ({build.API_CURRENT: [], build.API_PRE864: []}, build.API_CURRENT)):
        monkeypatch.setattr(build, "probe", lambda root, m=missing: {"missing": m,
                                                                     "file": "x.so"})
        build._OUTCOMES.clear()
        assert build.package_root(str(sdir.parent)) == tmp_path / "built"
        assert build.api(str(sdir.parent)) == want
    build._OUTCOMES.clear()


# -- identity ---------------------------------------------------------------------------------
def git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
                            GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"))


@pytest.mark.skipif(not build.shutil.which("git"), reason="git is not installed here")
def test_identity_is_the_checkouts_commit_and_dirty_hash(tmp_path):
    root = tmp_path / "ts"
    sdir = fake_checkout(root)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert source_of(str(root)) == f"git:{head}"
    assert TARGET.identity(str(root)).version == "9.9.9"
    key_clean = build.source_hash(sdir)

    (sdir / "csrc" / "a.cpp").write_text("int a() { return 2; }\n")
    one = source_of(str(root))
    assert one.startswith(f"git:{head}+dirty.")
    (sdir / "csrc" / "a.cpp").write_text("int a() { return 3; }\n")
    two = source_of(str(root))
    assert two.startswith(f"git:{head}+dirty.") and two != one
    assert build.source_hash(sdir) != key_clean  # the build cache follows the edit
    (sdir / "csrc" / "new.h").write_text("#pragma once\n")  # untracked counts too
    assert source_of(str(root)) not in (one, two)

    # a copy of the scheduler sitting inside that repository is no checkout of its own: its
    # identity is its sources' hash, not the enclosing repository's commit
    inner = root / "vendor" / "copy"
    fake_checkout(inner)
    assert source_of(str(inner)).startswith("sha256:")

    ident = TARGET.identity(str(root))
    assert (ident.engine, ident.version) == ("tokenspeed", "9.9.9")


def test_sdist_layout_is_a_checkout(tmp_path):
    """An unpacked sdist: CMakeLists.txt at the top (no tokenspeed-scheduler/ level)."""
    sdir = fake_checkout(tmp_path / "x")
    assert build.scheduler_dir(sdir) == sdir.resolve()
    assert build.scheduler_dir(sdir.parent) == sdir.resolve()
    assert source_of(str(sdir)).startswith("sha256:")


# -- opt-in: a real build and run -------------------------------------------------------------
SRC = os.environ.get("KVCHECK_TOKENSPEED_SRC")


def _why_not_real() -> str | None:
    if not SRC:
        return ("set KVCHECK_TOKENSPEED_SRC to a TokenSpeed checkout to build it and run on it "
                "(a CPU build takes minutes)")
    try:
        build.toolchain()
    except build.BuildUnavailable as exc:
        return str(exc)
    return None


@pytest.mark.skipif(bool(_why_not_real()), reason=str(_why_not_real()))
def test_built_checkout_is_what_runs_and_fuzzes_clean(tmp_path):
    from caches.adapters.tokenspeed.continuation_state import make_subject
    root = build.package_root(SRC)  # builds unless cached (minutes)
    try:  # the wheel's module loaded in this process first: the build must load beside it
        import tokenspeed_scheduler  # noqa: F401
    except ImportError:
        pass
    s = make_subject({}, src=SRC)
    try:  # the forked child imported the checkout's build, not the wheel
        assert Path(s.bindings_file()).parent == root / build.PACKAGE
        s.admit(1, [0, 1] * 5, 4)
        for _ in range(8):
            if s.requests:
                s.step(min(s.requests))
            s.check()
        s.quiesce()
        assert s.reached_counts["length-finish"]
    finally:
        s.close()
    ident = TARGET.identity(SRC)
    assert ident.version == build.declared_version(build.scheduler_dir(SRC))

    env = {"KVCHECK_CACHE_DIR": str(build.cache_root())}
    r = fuzz_cli(SRC, tmp_path, "--max-examples", "30", env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert "FAILED" not in r.stdout and "building" not in r.stderr  # cached: no rebuild


# -- opt-in: TokenSpeed #460 on the pre-#864 API, built from its two commits -----------------
PRE, POST = (os.environ.get("KVCHECK_TOKENSPEED_PRE460_SRC"),
             os.environ.get("KVCHECK_TOKENSPEED_POST460_SRC"))
PROBE = Path(__file__).with_name("tokenspeed_460_probe.py")


def _why_not_460() -> str | None:
    if not (PRE and POST):
        return ("set KVCHECK_TOKENSPEED_PRE460_SRC / KVCHECK_TOKENSPEED_POST460_SRC to "
                "lightseekorg/tokenspeed checkouts of 473124f2 and 4b3b06de (two CPU builds, "
                "minutes each)")
    try:
        build.toolchain()
    except build.BuildUnavailable as exc:
        return str(exc)
    return None


@pytest.mark.skipif(bool(_why_not_460()), reason=str(_why_not_460()))
def test_460_superseded_state_pinned_before_the_fix_bounded_after():
    """The probe (no machine): the State pages one live request holds grow with the prompt
    before #460 and stay within a window (plus the chunk being written) after it."""
    held = {}
    for name, src in (("pre", PRE), ("post", POST)):
        root = build._built(build.scheduler_dir(src))  # the pre-#864 API: no adapter probe
        r = subprocess.run([sys.executable, str(PROBE), str(root)], capture_output=True,
                           text=True, timeout=120, check=True)
        rows = json.loads(r.stdout.strip().splitlines()[-1])["rows"]
        held[name] = max(s for tag, h, s in rows if tag.startswith("turn1."))
    assert held["pre"] >= 10, held  # every superseded chunk snapshot stays pinned
    assert held["post"] <= 3, held


FINDING_460 = (REPO / "tests" / "upstream_findings"
               / "tokenspeed-473124f2-continuation-state-460-superseded-state-pinned.json")


@pytest.mark.skipif(bool(_why_not_460()), reason=str(_why_not_460()))
def test_460_found_by_the_machines_on_the_pre_fix_commit_and_not_after(tmp_path):
    """Both builds have the pre-#864 API, so the target drives them with Pre864Subject; the
    saved finding replays failing on owned-bounded before the fix and passing after it, and a
    fuzz of the production-shaped regime (State continuation-only) finds it again before the
    fix and is clean after it."""
    for src in (PRE, POST):
        assert build.api(src) == build.API_PRE864
    r = kvcheck("replay", str(FINDING_460), "--src", PRE)
    assert r.returncode == 1 and "owned-bounded" in r.stdout, r.stdout[-2000:]
    r = kvcheck("replay", str(FINDING_460), "--src", POST)
    assert r.returncode == 0 and "no longer fails" in r.stdout, r.stdout[-2000:]
    env = {"KVCHECK_CACHE_DIR": str(build.cache_root())}
    # the ci profile's own budget and seed (its native walks find it within 2 s)
    r = fuzz_cli(PRE, tmp_path / "pre", "--param", "state_required=0", env=env)
    assert r.returncode == 1 and "property broken: owned-bounded" in r.stdout, r.stdout[-2000:]
    r = fuzz_cli(POST, tmp_path / "post", "--param", "state_required=0", env=env)
    assert r.returncode == 0, r.stdout[-2000:]
