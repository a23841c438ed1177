"""The pure arithmetic of caches/arith.py: property tests of its contracts, CrossHair proving
them (and finding a planted bug in a wrong copy), and the CrossHair backend for Hypothesis."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caches import arith
from caches.arith import (
    ceil_align,
    crosses_bigpage_boundary,
    floor_align,
    lock_transfer,
    tail_free_range,
    window_releases_state,
)

ARITH = Path(arith.__file__)
CROSSHAIR = shutil.which("crosshair") or (
    importlib.util.find_spec("crosshair") and f"{sys.executable} -m crosshair")
needs_crosshair = pytest.mark.skipif(not CROSSHAIR, reason="crosshair-tool is not installed")
sizes = st.integers(0, 10_000)
pages = st.integers(1, 64)


# -- the contracts as property tests ----------------------------------------------------------
@given(sizes, pages)
def test_ceil_and_floor_align(n, page):
    c, f = ceil_align(n, page), floor_align(n, page)
    assert c % page == 0 and n <= c < n + page
    assert f % page == 0 and f <= n < f + page
    assert c == f or c == f + page


@given(sizes, sizes, pages)
def test_tail_free_range_never_frees_a_kept_page(a, b, page):
    prefix, allocated = min(a, b), max(a, b)
    start, end = tail_free_range(prefix, allocated, page)
    assert start % page == 0 and prefix <= start < prefix + page
    assert end == max(start, allocated)
    # no slot of a page holding a kept position is in [start, end)
    kept_pages = {s // page for s in range(prefix)}
    assert not kept_pages & {s // page for s in range(start, end)}


@given(sizes, sizes, pages)
def test_bigpage_boundary_is_a_multiple_in_between(a, b, big):
    old, new = min(a, b), max(a, b)
    if new - old > 500:
        new = old + 500
    assert crosses_bigpage_boundary(old, new, big) == any(
        k % big == 0 for k in range(old + 1, new + 1))


@given(sizes, st.integers(1, 64), sizes)
def test_window_release(d, window, extra):
    commit = d + extra
    released = window_releases_state(d, window, commit)
    # released iff no position of the trailing window [commit - W, commit) is before d
    assert released == all(p >= d for p in range(commit - window, commit))


@given(st.integers(0, 5), st.sampled_from((1, -1)), st.integers(0, 100))
def test_lock_transfer_moves_only_on_0_1(ref, delta, size):
    if ref + delta < 0:
        return
    d_e, d_p = lock_transfer(ref, delta, size)
    assert d_e + d_p == 0
    assert d_p == (size if (ref, delta) == (0, 1) else -size if (ref, delta) == (1, -1) else 0)


# -- CrossHair: proves the contracts, and finds a planted bug ---------------------------------
def crosshair_check(path: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = (CROSSHAIR.split() + ["check", "--analysis_kind=PEP316",
                                "--per_condition_timeout=4", str(path)])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=path.parent)


@needs_crosshair
def test_crosshair_finds_no_counterexample_in_caches_arith():
    done = crosshair_check(ARITH)
    assert done.returncode == 0, done.stdout + done.stderr


def _wrong_copy(tmp_path: Path, old: str, new: str) -> Path:
    src = ARITH.read_text()
    assert src.count(old) == 1
    path = tmp_path / "arith_wrong.py"
    path.write_text(src.replace(old, new))
    return path


@needs_crosshair
def test_crosshair_finds_a_single_value_bug(tmp_path):
    # wrong for one input only: random testing practically never draws it
    path = _wrong_copy(tmp_path, "    return -(-n // page) * page",
                       "    if n == 4097:\n        return n - 1\n    return -(-n // page) * page")
    done = crosshair_check(path)
    assert done.returncode != 0
    assert "ceil_align(4097" in done.stdout, done.stdout + done.stderr


@needs_crosshair
def test_crosshair_finds_the_unaligned_tail_free(tmp_path):
    # FAULTS.md S3: the tail free starts at the un-aligned prefix
    path = _wrong_copy(tmp_path, "    start = ceil_align(prefix_len, page)",
                       "    start = floor_align(prefix_len, page)")
    done = crosshair_check(path)
    assert done.returncode != 0 and "tail_free_range(" in done.stdout, done.stdout


# -- the CrossHair backend for Hypothesis (hypothesis-crosshair) ------------------------------
needs_backend = pytest.mark.skipif(importlib.util.find_spec("hypothesis_crosshair_provider")
                                   is None, reason="hypothesis-crosshair is not installed")
SYMBOLIC = settings(backend="crosshair", max_examples=100, deadline=None, database=None,
                    derandomize=False, suppress_health_check=list(HealthCheck))


def _ceil_property(fn):
    @SYMBOLIC
    @given(st.integers(0, 10**6), st.integers(1, 64))
    def prop(n, page):
        r = fn(n, page)
        assert r % page == 0 and n <= r < n + page

    return prop


@needs_backend
def test_crosshair_backend_passes_the_real_ceil_align():
    _ceil_property(ceil_align)()


@needs_backend
def test_crosshair_backend_finds_the_single_value_bug():
    def wrong(n, page):
        return n - 1 if n == 4097 else -(-n // page) * page

    with pytest.raises(AssertionError):
        _ceil_property(wrong)()
