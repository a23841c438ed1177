"""Build TokenSpeed's scheduler extension from a checkout (``--src CHECKOUT``), with its own
CMake build (CPU), cached by source hash.

A checkout is a lightseekorg/tokenspeed clone (``tokenspeed-scheduler/`` under it), the
``tokenspeed-scheduler`` directory itself, or an unpacked ``tokenspeed-scheduler`` sdist: a
directory with ``CMakeLists.txt`` and ``bindings/python_module.cpp``.  The build is the one
its ``pyproject.toml`` asks scikit-build-core for (``TOKENSPEED_SCHEDULER_BUILD_PYTHON=ON``,
tests off), run by cmake directly so nothing is installed: the module and the checkout's
``python/tokenspeed_scheduler/*.py`` go to ``<cache>/tokenspeed-scheduler/<key>/`` (``<cache>``
is ``$KVCHECK_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvcheck``, else ``~/.cache/kvcheck``).  The
key hashes every source file (relative path and bytes), the compiler, cmake, nanobind and
spdlog versions and the Python ABI, so an edit rebuilds and an unchanged tree never does.
Concurrent builds of one key (pytest-xdist workers) wait on a lock file.

Toolchain (``bash ci/tokenspeed-src-setup.sh`` installs it): cmake >= 3.22, a C++20
compiler, ninja (optional), OpenSSL headers (Debian ``libssl-dev``), and the PyPI packages
``nanobind`` and ``tokenspeed-spdlog`` importable by this Python.  Older checkouts fetch spdlog
from GitHub with ``FetchContent``; ``FETCHCONTENT_TRY_FIND_PACKAGE_MODE=ALWAYS`` with
``tokenspeed-spdlog``'s CMake prefix lets ``find_package`` satisfy it offline.

After a build the module is imported once in a separate Python (never in kvcheck's process:
the subject imports it in its forked child) and checked for the bindings of each API the target
drives (``APIS``): the ``CacheGroupConfig``/``AttnKind`` API of tokenspeed-scheduler 0.1.38 and
later (``continuation_state.py``), or the pre-#864 ``PagedCacheGroupConfig`` API of the
checkouts around TokenSpeed #460 (``continuation_state_pre864.py``).  ``api(src)`` says which;
a checkout with neither is unavailable, naming what the newer one misses.
Every way this can fail is a ``BuildUnavailable`` with a one-line reason (and the log's path).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

SCHEDULER_SUBDIR = "tokenspeed-scheduler"
PACKAGE = "tokenspeed_scheduler"
MIN_CMAKE = (3, 22)
NB_DOMAIN = "kvcheck_src"  # the nanobind domain a checkout's build registers its types in
# the bindings each subject drives, by API generation (probed in this order)
API_CURRENT, API_PRE864 = "0.1.38+", "pre-#864"
APIS = {
    # continuation_state.py: tokenspeed-scheduler 0.1.38 and later
    API_CURRENT: {
        "": ("AttnKind", "CacheGroupConfig", "CacheTransferPolicy", "SchedulerConfig",
             "Scheduler", "RequestSpec", "ExecutionEvent"),
        "AttnKind": ("Full", "State"),
        "SchedulerConfig": ("prefix_granularity", "num_snapshot_pages", "max_retracted_requests",
                            "debug_force_retraction_interval", "enable_kv_cache_events"),
        "Scheduler": ("snapshot_pool_free_blocks", "retracted_size", "host_pool_pinned_blocks",
                      "can_clear_cache", "cache_group_available_pages", "request_token_size"),
        "Cache": ("SnapshotDoneEvent", "RestoreDoneEvent"),
    },
    # continuation_state_pre864.py: one allocator per PagedCacheGroupConfig (lightseekorg/
    # tokenspeed before #864, e.g. 473124f2 and 4b3b06de, TokenSpeed #460's pre-fix and fix)
    API_PRE864: {
        "": ("PagedCacheGroupConfig", "PagedCacheRetention", "PagedCacheGroupFamily",
             "PrefixCacheAdjunctSpec", "SchedulerConfig", "Scheduler", "RequestSpec",
             "ExecutionEvent"),
        "SchedulerConfig": ("paged_cache_groups", "prefix_cache_adjunct", "page_size",
                            "max_scheduled_tokens", "disable_l2_cache"),
        "Scheduler": ("paged_cache_group_available_pages", "paged_cache_group_total_pages",
                      "get_request_paged_cache_page_ids", "get_request_token_size",
                      "waiting_size", "prefilling_size", "decoding_size"),
        "Forward": ("FlatForwardOp",),
    },
}
# per-file bytes hashed into the key (and the source identity): what the build reads
_SOURCE_GLOBS = ("CMakeLists.txt", "pyproject.toml", "bindings/**/*", "csrc/**/*",
                 "python/**/*.py", "cmake/**/*")


class BuildUnavailable(RuntimeError):
    """The scheduler cannot be built or loaded from this checkout (one-line reason)."""


def scheduler_dir(src: str | os.PathLike) -> Path:
    """The directory holding the scheduler's ``CMakeLists.txt`` in checkout ``src``."""
    root = Path(src).expanduser().resolve()
    for cand in (root / SCHEDULER_SUBDIR, root):
        if (cand / "CMakeLists.txt").is_file() and (cand / "bindings" / "python_module.cpp").is_file():
            return cand
    raise BuildUnavailable(
        f"--src {src}: not a TokenSpeed checkout (no {SCHEDULER_SUBDIR}/CMakeLists.txt with "
        "bindings/python_module.cpp under it; pass a lightseekorg/tokenspeed clone, its "
        f"{SCHEDULER_SUBDIR} directory, or an unpacked tokenspeed-scheduler sdist)")


def source_files(sdir: Path) -> list[Path]:
    out = set()
    for pattern in _SOURCE_GLOBS:
        out.update(p for p in sdir.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    return sorted(out)


def source_hash(sdir: Path) -> str:
    """sha256 over the source files' paths (relative to ``sdir``) and bytes."""
    h = hashlib.sha256()
    for f in source_files(sdir):
        h.update(f.relative_to(sdir).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def declared_version(sdir: Path) -> str:
    """``version`` from the checkout's ``pyproject.toml`` ("" when none)."""
    try:
        text = (sdir / "pyproject.toml").read_text()
    except OSError:
        return ""
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    return m.group(1) if m else ""


def cache_root() -> Path:
    base = os.environ.get("KVCHECK_CACHE_DIR")
    if base:
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "kvcheck"


# -- the toolchain -----------------------------------------------------------------------------
def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else ""


def _compiler() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx.split()[0])
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


@lru_cache(maxsize=1)
def toolchain() -> dict:
    """What the build needs, found here; raises ``BuildUnavailable`` naming what is missing."""
    missing = []
    cmake = shutil.which("cmake")
    cmake_version = _first_line([cmake, "--version"]) if cmake else ""
    m = re.search(r"(\d+)\.(\d+)", cmake_version)
    if not cmake or not m or tuple(map(int, m.groups())) < MIN_CMAKE:
        missing.append(f"cmake >= {'.'.join(map(str, MIN_CMAKE))}"
                       + (f" (found {cmake_version})" if cmake_version else ""))
    cxx = _compiler()
    if not cxx:
        missing.append("a C++20 compiler (g++ or clang++)")
    versions = {}
    for mod, dist in (("nanobind", "nanobind"), ("tokenspeed_spdlog", "tokenspeed-spdlog")):
        if importlib.util.find_spec(mod) is None:
            missing.append(f"the Python package {dist}")
        else:
            from importlib import metadata

            try:
                versions[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                versions[dist] = "?"
    if missing:
        raise BuildUnavailable(f"cannot build the TokenSpeed scheduler from a checkout: missing "
                               f"{', '.join(missing)}")
    ninja = shutil.which("ninja")
    return {"cmake": cmake, "cmake_version": cmake_version, "cxx": cxx,
            "cxx_version": _first_line([cxx, "--version"]), "ninja": ninja,
            "python": sys.executable, "abi": sysconfig.get_config_var("EXT_SUFFIX") or "",
            **versions}


def build_key(sdir: Path) -> str:
    tc = toolchain()
    fingerprint = {k: tc[k] for k in ("cmake_version", "cxx_version", "abi", "nanobind",
                                      "tokenspeed-spdlog")}
    fingerprint["nb_domain"] = NB_DOMAIN
    h = hashlib.sha256(source_hash(sdir).encode())
    h.update(json.dumps(fingerprint, sort_keys=True).encode())
    return h.hexdigest()[:20]


# -- the build -----------------------------------------------------------------------------------
def _spdlog_prefix() -> str:
    out = subprocess.run([sys.executable, "-c", "import tokenspeed_spdlog as t; "
                          "print(t.cmake_prefix_path())"], capture_output=True, text=True)
    return out.stdout.strip()


def _log_reason(log: Path) -> str:
    """The first line of the build log that says what went wrong."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "no build log"
    if any("Could NOT find OpenSSL" in ln for ln in lines):
        return "OpenSSL development headers are missing (Debian libssl-dev)"
    for ln in lines:
        if re.search(r"error:|CMake Error|FAILED:|fatal error", ln):
            return ln.strip()[:300]
    return (lines or ["(empty log)"])[-1].strip()[:300]


def _run(cmd: list[str], log, cwd: Path, env: dict) -> int:
    log.write(("$ " + " ".join(cmd) + "\n").encode())
    log.flush()
    return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env).returncode


def _compile(sdir: Path, work: Path, out: Path, log_path: Path) -> None:
    tc = toolchain()
    build = work / "build"
    env = dict(os.environ, CXX=tc["cxx"])
    cfg = [tc["cmake"], "-S", str(sdir), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
           "-DTOKENSPEED_SCHEDULER_BUILD_PYTHON=ON", "-DTOKENSPEED_SCHEDULER_BUILD_TESTS=OFF",
           f"-DPython_EXECUTABLE={sys.executable}",
           # older checkouts FetchContent spdlog from GitHub: take tokenspeed-spdlog's instead
           "-DFETCHCONTENT_TRY_FIND_PACKAGE_MODE=ALWAYS",
           f"-DCMAKE_PREFIX_PATH={_spdlog_prefix()}",
           # a nanobind domain of its own: a process that imported the wheel's module (a test
           # worker, the parent of the forked subject) would otherwise abort on the second
           # registration of the same C++ types ("refusing to add duplicate key")
           f"-DCMAKE_CXX_FLAGS=-DNB_DOMAIN={NB_DOMAIN}"]
    if tc["ninja"]:
        cfg += ["-G", "Ninja"]
    jobs = os.environ.get("KVCHECK_BUILD_JOBS") or str(os.cpu_count() or 1)
    with open(log_path, "wb") as log:
        rc = _run(cfg, log, work, env)
        if rc == 0:
            rc = _run([tc["cmake"], "--build", str(build), "--target", "tokenspeed_scheduler_ext",
                       "-j", jobs], log, work, env)
    if rc != 0:
        raise BuildUnavailable(f"building the TokenSpeed scheduler from {sdir} failed: "
                               f"{_log_reason(log_path)} (log: {log_path})")
    built = sorted(build.glob("tokenspeed_scheduler_ext*" + (tc["abi"] or ".so")))
    if not built:
        raise BuildUnavailable(f"building the TokenSpeed scheduler from {sdir} made no "
                               f"tokenspeed_scheduler_ext module (log: {log_path})")
    pkg = out / PACKAGE
    pkg.mkdir(parents=True)
    py = sdir / "python" / PACKAGE
    for f in sorted(py.glob("*.py")) if py.is_dir() else []:
        shutil.copy2(f, pkg / f.name)
    if not (pkg / "__init__.py").exists():
        (pkg / "__init__.py").write_text("")
    shutil.copy2(built[0], pkg / built[0].name)


_PROBE = r"""
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
ts = importlib.import_module("tokenspeed_scheduler")
apis = json.loads(sys.argv[2])
missing = {}
for api, need in apis.items():
    missing[api] = []
    for owner, names in need.items():
        obj = ts if not owner else getattr(ts, owner, None)
        for n in names:
            if obj is None or not hasattr(obj, n):
                missing[api].append(f"{owner}.{n}" if owner else n)
print(json.dumps({"missing": missing, "file": ts.tokenspeed_scheduler_ext.__file__}))
"""


def probe(pkgroot: Path) -> dict:
    """Import the built package in a separate Python; ``{"missing": {api: [...]}, "file": ...}``
    (the bindings each API generation of ``APIS`` needs and this build lacks)."""
    out = subprocess.run([sys.executable, "-c", _PROBE, str(pkgroot), json.dumps(APIS)],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise BuildUnavailable(f"the TokenSpeed scheduler built from the checkout does not "
                               f"import: {last[:300]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _built(sdir: Path) -> Path:
    key = build_key(sdir)
    root = cache_root() / "tokenspeed-scheduler"
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker building the same key: wait for it
        if not (final / PACKAGE).is_dir():
            work = root / f"{key}.tmp-{os.getpid()}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            print(f"kvcheck: building the TokenSpeed scheduler from {sdir} (CMake, once per "
                  f"source hash; cached in {final})", file=sys.stderr, flush=True)
            try:
                _compile(sdir, work, work / "out", root / f"{key}.log")
                (work / "out" / "SOURCE").write_text(f"{sdir}\n")
                os.replace(work / "out", final)
                shutil.copy2(root / f"{key}.log", final / "build.log")
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return final


_OUTCOMES: dict = {}  # src -> (package root, API), or the BuildUnavailable it raised (per process)


def _outcome(src: str) -> tuple:
    key = str(Path(src).expanduser().resolve())
    if key not in _OUTCOMES:
        try:
            _OUTCOMES[key] = _package_root(src)
        except BuildUnavailable as exc:
            _OUTCOMES[key] = exc
    out = _OUTCOMES[key]
    if isinstance(out, BuildUnavailable):
        raise out
    return out


def package_root(src: str) -> Path:
    """The directory to put first on ``sys.path`` to import the scheduler built from ``src``
    (built now unless cached); raises ``BuildUnavailable`` with the reason (a failure is
    remembered for this process, so one command reports it without building twice)."""
    return _outcome(src)[0]


def api(src: str) -> str:
    """Which bindings the build of ``src`` has: ``API_CURRENT`` or ``API_PRE864``."""
    return _outcome(src)[1]


def _package_root(src: str) -> tuple:
    sdir = scheduler_dir(src)
    final = _built(sdir)
    missing = probe(final)["missing"]
    for name in APIS:
        if not missing.get(name):
            return final, name
    lack = missing.get(API_CURRENT, [])
    raise BuildUnavailable(
        f"the TokenSpeed scheduler of {src} (tokenspeed-scheduler "
        f"{declared_version(sdir) or '?'}) lacks bindings the tokenspeed target drives: "
        f"{', '.join(lack[:8])}{' ...' if len(lack) > 8 else ''} (its continuation-state "
        "adapter needs the API of tokenspeed-scheduler 0.1.38 or later, or the pre-#864 "
        "PagedCacheGroupConfig API)")


def extension_file(src: str) -> str:
    root = package_root(src)
    return str(sorted((root / PACKAGE).glob("tokenspeed_scheduler_ext*"))[0])
