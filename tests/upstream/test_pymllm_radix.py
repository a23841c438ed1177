"""``--target pymllm``: pymllm's real ``RadixCache`` from the source snapshot
``../shared/upstream/mllm-b9c307020b`` (test data, never copied into the repo; the tests skip
when it is absent).  Runs under the system python: pymllm needs only torch.

* the target loads, identifies its source, and refuses a bad ``--src`` with one line;
* the known findings R1, R2 and F1 (``tests/upstream_findings/pymllm-*``) still fail on the
  snapshot, each on its own property, and R1's trace passes on a fixed copy (PR #656 applied
  in a temp dir) -- so the test fails once upstream fixes it;
* the default (declining) subject runs clean, and the CLI exits 1 on size-accounting with
  ``--known-findings find``;
* catalogued faults patched into the real class are caught on their own property; the ones
  with no upstream form are refused up front.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from caches.adapters.pymllm import loader
from tests.upstream.snapshots import snapshot

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = snapshot("mllm-b9c307020b")
REASON = loader.unavailable_reason(str(SNAPSHOT))
if REASON:
    pytest.skip(f"pymllm snapshot not usable here: {REASON}", allow_module_level=True)

from caches.adapters.pymllm.radix import PymllmRadixSubject  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines.cli import main  # noqa: E402
from state_machines.regressions import fails_as_recorded  # noqa: E402
from state_machines.replay import replay  # noqa: E402
from state_machines.trace import load_trace  # noqa: E402
from state_machines.variants import get_variant  # noqa: E402

FINDINGS = REPO / "tests" / "upstream_findings"
PYMLLM_FINDINGS = sorted(FINDINGS.glob("pymllm-*.json"))
R1_TRACE = FINDINGS / "pymllm-radix-R1-add-leaf-subtracts-parent.json"
SRC = str(SNAPSHOT)
R1_BLOCK = """        if (
            len(parent.children) == 0
            and parent != self.root_node
            and parent.lock_ref == 0
            and not parent.evicted
        ):
            self._evictable_size -= len(parent.key)
"""


@pytest.fixture(scope="module")
def fixed_copy(tmp_path_factory) -> str:
    """The snapshot with pymllm PR #656's fix applied: ``_add_leaf`` no longer subtracts a
    leaf-turned-parent's tokens from ``_evictable_size``."""
    dst = tmp_path_factory.mktemp("mllm-fixed") / "mllm"
    shutil.copytree(SNAPSHOT, dst)
    f = dst / "pymllm" / "mem_cache" / "radix_cache.py"
    text = f.read_text()
    assert text.count(R1_BLOCK) == 1, "the snapshot's _add_leaf changed"
    f.write_text(text.replace(R1_BLOCK, "        # PR #656: no subtraction here\n"))
    return str(dst)


def run(ops, src=SRC, **kw):
    """Apply ``ops`` (name, kwargs) with a check after each; the Violation or None."""
    s = PymllmRadixSubject(src, **kw)
    try:
        for name, args in ops:
            getattr(s, name)(**args)
            s.check()
        s.quiesce()
    except Violation as v:
        return v
    return None


# -- loading -----------------------------------------------------------------------------------
def test_loads_without_leaking_modules():
    ns = loader.load(SRC)
    assert Path(ns.radix_cache.__file__).resolve().is_relative_to(SNAPSHOT.resolve())
    assert not [m for m in sys.modules if m.split(".")[0] in ("pymllm", "mllm_kernel")]
    assert not [p for p in sys.path if Path(p).resolve() in (SNAPSHOT.resolve(),
                                                         (SNAPSHOT / "mllm-kernel").resolve())]


def test_bad_src_is_one_line(tmp_path):
    for src in (None, str(tmp_path / "missing"), str(tmp_path)):
        why = loader.unavailable_reason(src)
        assert why and "\n" not in why
    assert main(["fuzz", "radix", "--target", "pymllm", "--src", str(tmp_path)]) == 2


def test_identity_is_the_content_hash_of_the_snapshot(fixed_copy):
    from caches.adapters.pymllm.target import TARGET

    a, b = TARGET.identity(SRC), TARGET.identity(fixed_copy)
    assert a.engine == "pymllm" and a.source.startswith("sha256:") and a.source != b.source


# -- known findings ------------------------------------------------------------------------------
def test_there_are_pymllm_findings():
    assert {p.stem.split("-")[2] for p in PYMLLM_FINDINGS} == {"R1", "R2", "F1"}


@pytest.mark.parametrize("path", PYMLLM_FINDINGS, ids=[p.stem for p in PYMLLM_FINDINGS])
def test_finding_still_fails_on_the_snapshot(path):
    trace = load_trace(path)
    result = replay(trace, src=SRC)
    assert result.violation is not None, f"{path.name} no longer reproduces: upstream fixed it?"
    assert fails_as_recorded(trace, result), result.violation.message


def test_r1_passes_on_the_fixed_copy(fixed_copy):
    result = replay(load_trace(R1_TRACE), src=fixed_copy)
    assert result.violation is None, result.violation.message


def test_r1_lock_unlock_drives_evictable_negative_on_the_snapshot_only(fixed_copy):
    """FAULTS.md's R1 shape: after the subtraction, a lock/unlock cycle moves more tokens out
    of evictable than it holds."""
    ops = [("insert", {"tokens": [0]}), ("insert", {"tokens": [0, 0]}),
           ("lock", {"hid": 1, "tokens": [0, 0]})]
    for src, want in ((SRC, "size-accounting"), (fixed_copy, None)):
        s = PymllmRadixSubject(src, skip_known_findings=False)
        for name, args in ops:
            getattr(s, name)(**args)
        if want:
            assert s.cache.evictable_size_ < 0
            with pytest.raises(Violation) as exc:
                s.check()
            assert exc.value.prop == want
        else:
            s.check()
            assert s.cache.evictable_size_ == 0 and s.cache.protected_size_ == 2


def test_default_subject_declines_the_findings():
    from caches.adapters import KnownUpstreamFinding

    s = PymllmRadixSubject(SRC)
    s.insert([0])
    with pytest.raises(KnownUpstreamFinding):
        s.insert([0, 0])  # R1
    with pytest.raises(KnownUpstreamFinding):
        s.stray_unlock([0])  # R2
    s.check()
    p = PymllmRadixSubject(SRC, page_size=4, pool_pages=6)
    with pytest.raises(KnownUpstreamFinding):
        p.admit(1, [0] * 5)  # F1
    p.admit(1, [0] * 8)
    p.check()


def _decoded_then_drained(src, skip_known_findings=None):
    """[1 0] cached; r4 = [1] hits [1] (splitting it off) and decodes 2 tokens: its finish in
    the drain inserts [1 0 x]-shaped output below the unlocked leaf [0] -- R1's shape, met by
    the drain itself (a release it cannot decline)."""
    s = PymllmRadixSubject(src, skip_known_findings=skip_known_findings)
    s.insert([1, 0])
    s.admit(4, [1])
    s.prefill(4, 0)
    s.decode(4, 2)
    s.check()
    s.quiesce()
    s.check()
    return s


def test_a_drain_meeting_r1_is_compensated_only_where_r1_is_declined(fixed_copy):
    """Since decode, a drain's finish inserts output the tree never saw and may hit R1.  The
    declining subject runs that release and gives back exactly the tokens ``_add_leaf`` took
    (counted); driving R1 (``find``), the drain fails on size-accounting; a fixed checkout owes
    nothing."""
    s = _decoded_then_drained(SRC)
    assert s.r1_compensated == 1
    with pytest.raises(Violation) as exc:
        _decoded_then_drained(SRC, skip_known_findings=False)
    assert exc.value.prop == "size-accounting"
    assert _decoded_then_drained(fixed_copy).r1_compensated == 0


def test_fixed_copy_declines_nothing_for_r1(fixed_copy):
    s = PymllmRadixSubject(fixed_copy)
    s.insert([0])
    s.insert([0, 0])
    s.check()


def test_each_finding_is_driven_on_its_own():
    """``find=ID``: that finding's ops run, the other findings' stay declined."""
    from caches.adapters import KnownUpstreamFinding
    from caches.adapters.pymllm.target import TARGET

    s = TARGET.build("radix", {"page_size": 4, "pool_pages": 6}, src=SRC,
                     known_findings="find=F1")
    s.admit(1, [0] * 5)  # F1 driven
    with pytest.raises(KnownUpstreamFinding):
        s.stray_unlock([0] * 4)  # R2 still declined
    r = TARGET.build("radix", {"page_size": 4, "pool_pages": 6}, src=SRC,
                     known_findings="find=R2")
    with pytest.raises(KnownUpstreamFinding):
        r.admit(1, [0] * 5)  # F1 declined


@pytest.mark.parametrize("fid, prop", [("F1", "conservation"), ("R2", "ref-balance")])
def test_cli_find_one_finding_fails_on_its_property(capsys, tmp_path, fid, prop):
    code = main(["--profile", "ci", "fuzz", "radix", "--target", "pymllm", "--src", SRC,
                 "--param", "page_size=4", "--param", "pool_pages=6",
                 "--known-findings", f"find={fid}", "--stop-on-first", "--out", str(tmp_path)])
    out = capsys.readouterr().out  # (stop on first: the other findings are declined, so the
    assert code == 1 and f"property broken: {prop}" in out, out  # first failure is this one)


def test_cli_find_lists_every_distinct_finding_each_with_a_replayable_trace(capsys, tmp_path):
    """One run, both findings of page size 1: R1 no longer hides R2 (or the other way); the
    run exits 1, on size-accounting (R1) among others.  (Both show within the first two
    seconds of each engine; the budget bounds the rest, shrinking included.)"""
    code = main(["--profile", "ci", "fuzz", "radix", "--target", "pymllm", "--src", SRC,
                 "--known-findings", "find", "--page-size", "1", "--budget", "10",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and "known R1 (asked for)" in out and "known R2 (asked for)" in out, out
    assert "size-accounting" in out
    traces = sorted(tmp_path.glob("radix-*.json"))
    assert len(traces) >= 2
    props = set()
    for path in traces:  # each one replays to its own failure
        trace = load_trace(path)
        assert fails_as_recorded(trace, replay(trace)), path
        props.add(trace.violation["property"])
    assert {"size-accounting", "ref-balance"} <= props


def test_cli_unknown_finding_id_is_one_line_listing_the_ids(capsys):
    code = main(["fuzz", "radix", "--target", "pymllm", "--src", SRC,
                 "--known-findings", "find=F9"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "F9" in err and "R1, R2, F1" in err


def test_cli_default_runs_clean(capsys, tmp_path):
    code = main(["--profile", "ci", "fuzz", "radix", "--target", "pymllm", "--src", SRC,
                 "--max-examples", "60", "--out", str(tmp_path)])  # both regimes
    out = capsys.readouterr().out
    assert code == 0 and "page_size=4" in out, out


# -- the driver follows pymllm's model runner -------------------------------------------------------
def test_admission_keeps_two_tokens_to_extend():
    s = PymllmRadixSubject(SRC)
    s.insert([1, 2, 0])
    assert s.admit(1, [1, 2, 0]) == "hit 1 of 3 tokens, allocated 2"
    s.prefill(1, 64)
    s.check()
    s.finish(1)
    s.check()
    s.quiesce()


def test_concurrent_same_prompt_dedups_at_page_1():
    ops = [("admit", {"rid": 1, "tokens": [0, 1, 2]}), ("admit", {"rid": 2, "tokens": [0, 1, 2]}),
           ("prefill", {"rid": 1, "n": 64}), ("prefill", {"rid": 2, "n": 64}),
           ("finish", {"rid": 2}), ("abort", {"rid": 1})]
    assert run(ops) is None


# -- catalogued faults on the real class --------------------------------------------------------------
@pytest.mark.parametrize("fid,ops,prop", [
    ("R3", [("insert", {"tokens": [0]}), ("evict", {"n": 1})], "progress"),
    ("R4", [("insert", {"tokens": [0, 1]}), ("lock", {"hid": 1, "tokens": [0, 1]})],
     "ref-balance"),
])
def test_fault_caught_on_its_property(fid, ops, prop):
    v = run(ops, fault=fid)
    assert v is not None and v.prop == prop, v


def test_r1_injected_on_the_fixed_copy(fixed_copy):
    v = run([("insert", {"tokens": [0]}), ("insert", {"tokens": [0, 0]})], src=fixed_copy,
            fault="R1")
    assert v is not None and v.prop == "size-accounting"


@pytest.mark.parametrize("fid", ["R1", "R2", "R5", "R6"])
def test_fault_without_upstream_form_is_refused(fid):
    from caches.target import FaultNotInjectable

    with pytest.raises(FaultNotInjectable):
        get_variant("radix").make_subject({"page_size": 1, "pool_pages": 16}, fault=fid,
                                          target="pymllm", src=SRC)


# -- known findings matched by their fix models (state_machines/failures.py) -----------------------
def _trace(ops, violation):
    from state_machines.ops import Op
    from state_machines.trace import Trace

    return Trace("radix", {"page_size": 4, "pool_pages": 6}, [Op(n, a) for n, a in ops], None,
                 "pymllm", violation, known_findings="find", src=SRC)


@pytest.mark.parametrize("path", PYMLLM_FINDINGS, ids=lambda p: p.stem)
def test_each_finding_passes_with_its_own_fix_model_only(path):
    trace = load_trace(path)
    own = trace.meta["known_finding"].rsplit("-", 1)[-1]
    for fid in PymllmRadixSubject.fix_models:
        result = replay(trace, fix=fid)
        if fid == own:
            assert result.violation is None, (fid, result.violation)
        else:
            assert result.violation is not None and \
                result.violation.prop == trace.violation["property"], (fid, result.violation)


def test_r1s_fix_model_is_what_pr_656_does(fixed_copy):
    """The model and the real fix agree on R1's trace: both pass it."""
    trace = load_trace(R1_TRACE)
    assert replay(trace, src=fixed_copy).violation is None
    assert replay(trace, fix="R1").violation is None
    assert replay(trace).violation is not None


# a one-token prompt: its post-extend insert gives the partial page (0,) to the tree; the
# finish inserts prompt + output, whose first page (0, x) is another child key -- a second leaf
# takes the same slot.  F1's fix (the re-match covering the partial page) does not change that.
TAIL_HELD_TWICE = [("admit", {"rid": 9, "tokens": [0]}), ("prefill", {"rid": 9, "n": 1}),
                   ("decode", {"rid": 9, "n": 1}), ("finish", {"rid": 9})]
# a running request's partial page, taken by the tree at its post-extend insert but left out of
# its page-aligned re-match (so out of its lock), is evicted by another admission
TAIL_EVICTED_UNDER_ITS_REQUEST = [
    ("admit", {"rid": 1, "tokens": [0]}), ("admit", {"rid": 0, "tokens": [0, 0, 0, 2, 0, 2, 0, 2]}),
    ("admit", {"rid": 4, "tokens": [2, 0, 1, 1, 1, 2, 2, 1, 1]}), ("prefill", {"rid": 1, "n": 4}),
    ("admit", {"rid": 5, "tokens": [1, 0, 0, 2, 0, 2, 2, 2]})]


def _failing(ops, message):
    """The trace of ``ops`` at page size 4 in ``find`` mode, recorded with the conservation
    failure (saying ``message``) it replays to."""
    trace = _trace(ops, None)
    first = replay(trace)
    assert first.violation is not None and first.violation.prop == "conservation"
    assert message in first.violation.message
    trace.violation = {**first.violation.to_json(), "step": first.failed_step}
    return trace


def test_a_partial_page_held_by_two_nodes_is_new_not_f1():
    from state_machines.failures import known_by_replay, label, Failure, Signature

    trace = _failing(TAIL_HELD_TWICE, "held at two positions by the tree")
    assert known_by_replay(trace) == (None, True)  # every fix model tried, none removes it
    failure = label(Failure(Signature.of_trace(trace), 0.0, 1, trace))
    assert failure.known is None and failure.new


def test_a_tail_evicted_under_its_request_is_f1s_mechanism():
    """Its lock stops where F1's re-match stops: F1's fix model alone removes it."""
    from state_machines.failures import known_by_replay

    trace = _failing(TAIL_EVICTED_UNDER_ITS_REQUEST, "is free but request r1 still reads it")
    assert known_by_replay(trace) == ("F1", True)
