"""``--target lightllm``: LightLLM's real ``LinearAttPagedRadixCache`` under the paged-bigpage
machine, loaded from the snapshot ``../shared/upstream/lightllm-87881ae7ca`` (test data, never
copied into the repo).  Runs under the core install's Python; skips, saying why, when the
snapshot or LightLLM's import dependencies (``kvcheck[engines]``) are absent.

The known findings L2/L3/L4 (LightLLM PR #1348's root-ref fixes, reverted before the merge)
must fail on the snapshot and pass on a fixed copy each session makes in a temp dir: the
snapshot with the three ``self.dec_node_ref_counter(self.root_node)`` lines of the PR's head
187cbda93 put back.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from caches.adapters.lightllm import loader
from tests.upstream.snapshots import snapshot

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = snapshot("lightllm-87881ae7ca")
REASON = loader.unavailable_reason(SNAPSHOT) if SNAPSHOT.is_dir() else \
    f"the LightLLM snapshot {SNAPSHOT} is not here"
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from caches.adapters.lightllm.faults import NOT_INJECTABLE, UPSTREAM_FAULTS  # noqa: E402
from caches.adapters.lightllm.paged_bigpage import KNOWN, make_subject  # noqa: E402
from caches.faults import get_fault  # noqa: E402
from caches.target import FaultNotInjectable  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines.diff import format_diff, run_diff  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.paged_bigpage import SPEC  # noqa: E402
from state_machines.replay import replay  # noqa: E402
from state_machines.targets import get_target, unavailable_reason  # noqa: E402
from state_machines.trace import load_trace  # noqa: E402

FINDINGS = REPO / "tests" / "upstream_findings"
FINDING = {fid: FINDINGS / f"lightllm-paged-bigpage-{fid}-{slug}.json" for fid, slug in (
    ("L2", "root-ref-leak-on-miss"), ("L3", "root-ref-leak-on-trim"),
    ("L4", "root-ref-leak-on-deref"))}
REGIMES = [SPEC.check_params(r) for r in SPEC.regimes]
IDS = ["small-pages", "big-pages"]
MODULE = "lightllm/server/router/dynamic_prompt/linear_att_radix_cache.py"
RELEASE = "            self.dec_node_ref_counter(self.root_node)\n"


@pytest.fixture(scope="session")
def fixed(tmp_path_factory) -> str:
    """The snapshot with PR #1348's root-ref fixes (187cbda93: a root release at the miss and
    trim-to-empty returns of ``match_prefix`` and at ``deref_to_first_big_page_node``'s
    bottom-out at the root), as a copy in a temp dir."""
    dest = tmp_path_factory.mktemp("lightllm") / "lightllm-fixed"
    shutil.copytree(SNAPSHOT, dest)
    f = dest / MODULE
    text = f.read_text()
    empty = "        if len(ans_node_list) == 0:\n            return None, 0, None\n"
    at_root = "        if iter_node is self.root_node:\n            return None\n"
    assert text.count(empty) == 2 and text.count(at_root) == 1, "the snapshot changed"
    text = text.replace(empty, empty.replace("            return", RELEASE + "            return"))
    text = text.replace(at_root, at_root.replace("            return",
                                                  RELEASE + "            return"))
    f.write_text(text)
    return str(dest)


def apply(s, name, **args):
    out = SPEC.ops.apply(s, Op(name, args))
    s.check()
    return out


def mine() -> list[str]:
    """This process's LightLLM shared-memory segments and lock files."""
    return loader.os_resources(f"kvcheck_lightllm_{os.getpid()}")


# -- the environment ---------------------------------------------------------------------------
def test_unavailable_says_why_in_one_line(tmp_path):
    assert unavailable_reason("lightllm") == \
        "the lightllm target needs --src PATH to a LightLLM checkout; set it up with: " \
        + get_target("lightllm").setup_hint
    for src in (tmp_path / "missing", tmp_path):
        why = loader.unavailable_reason(src)
        assert why and "\n" not in why and str(src) in why
    broken = tmp_path / "broken"
    (broken / MODULE).parent.mkdir(parents=True)
    (broken / MODULE).write_text("import no_such_module_kvcheck\n")
    why = loader.unavailable_reason(broken)
    assert why.startswith("the LightLLM checkout at") and "no_such_module_kvcheck" in why
    assert loader.unavailable_reason(SNAPSHOT) is None


def test_import_leaves_nothing_behind():
    """The checkout is importable only through the loader: no ``lightllm`` module, no
    ``triton`` stand-in, no ``sys.path`` entry after a load; the classes come from the
    snapshot, and the identity is the hash of exactly the files loaded."""
    ns = loader.load(SNAPSHOT)
    assert not [m for m in sys.modules if m == "lightllm" or m.startswith("lightllm.")]
    assert getattr(sys.modules.get("triton"), "__file__", None) != loader.STAND_IN_FILE
    assert str(SNAPSHOT) not in sys.path
    assert Path(ns.module.__file__) == SNAPSHOT / MODULE
    assert len(ns.files) == 20 and all(f.startswith(str(SNAPSHOT)) for f in ns.files)
    ident = get_target("lightllm").identity(str(SNAPSHOT))
    assert ident.engine == "lightllm" and ident.source.startswith("sha256:")


def test_shared_memory_and_lock_files_are_removed():
    before = mine()
    s = make_subject(REGIMES[1], src=str(SNAPSHOT))
    name = s.cache.unique_name
    assert name.startswith(f"kvcheck_lightllm_{os.getpid()}_")
    assert not loader.os_resources(name), "segments/lock files of a built cache remain"
    apply(s, "admit", rid=1, tokens=[0] * 9)
    for _ in range(4):
        apply(s, "prefill", rid=1, n=8)
    apply(s, "finish", rid=1)
    assert s.cache.tree_total_tokens_num == 8  # the counters live in the unlinked segments
    s.quiesce()
    fuzz(SPEC, REGIMES[0], target="lightllm", src=str(SNAPSHOT), max_examples=10)
    assert mine() == before == []
    assert not list(Path("/dev/shm").glob(f"{name}*"))
    assert not list(Path("/tmp").glob(f"{name}*.lock"))


# -- runs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_fuzz_clean_by_default(params):
    """The default (--known-findings decline) compensates L2-L4 and finds nothing else."""
    out = fuzz(SPEC, params, target="lightllm", src=str(SNAPSHOT), max_examples=60)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 1500


def test_fuzz_with_known_findings_finds_L2(tmp_path):
    out = fuzz(SPEC, REGIMES[0], target="lightllm", src=str(SNAPSHOT), known_findings="find",
               out_dir=tmp_path)
    assert out.failed and out.prop == "ref-balance", out.trace and out.trace.violation
    # one op that misses the tree leaks the root's ref (a plain match does, as admit's match)
    assert len(out.trace.ops) == 1 and out.trace.ops[0].name in ("admit", "match")
    assert "root ref" in out.trace.violation["message"]
    assert out.failures[0].known == "L2"


def test_request_paths_over_the_real_tree():
    """Big pages on: a chunked prefill fills a big-page buffer at the boundary and the tail
    small buffer at the cache length; finish inserts a big node and a small node whose ids are
    creation order; a small hit copies its tail and holds the big ancestor."""
    s = make_subject(REGIMES[1], src=str(SNAPSHOT))
    apply(s, "admit", rid=1, tokens=[0, 0, 0, 0, 0, 0, 1])
    assert apply(s, "prefill", rid=1, n=8) == "computed [0, 4) of 7, state -> big_state 1"
    assert apply(s, "prefill", rid=1, n=8) == "computed [4, 6) of 7, state -> small_state 1"
    apply(s, "prefill", rid=1, n=8)
    apply(s, "finish", rid=1)
    root = s.cache.root_node
    big, = root.children.values()
    small, = big.children.values()
    assert (big.id, big.is_big_page_node(), big.value) == (1, True, [1, 2, 3, 4])
    assert (small.id, small.small_page_buffer_idx) == (2, 1)
    got = apply(s, "admit", rid=2, tokens=[0, 0, 0, 0, 0, 0, 0])
    assert got == "small-page hit of 6 tokens (tail 2 copied, big prefix 4 held)"
    assert s.requests[2].shared_kv_node is big and big.ref_counter == 1
    assert dict(s.cache.compensated) == {"L2": 1}  # r1's miss on the empty tree; hits keep none
    s.quiesce()


def test_decode_and_schedule_over_the_real_tree():
    """The lifecycle ops on LightLLM's tree: a scheduled batch is matched, prefilled and
    decoded; finish after decode inserts the prompt's hashed pages only (a big node and a
    small one) and frees the output's KV."""
    s = make_subject(REGIMES[1], src=str(SNAPSHOT))
    apply(s, "enqueue", rid=1, tokens=[0, 0, 0, 0, 0, 0, 1], max_new=3)
    apply(s, "enqueue", rid=2, tokens=[1, 1, 1], max_new=3)
    assert apply(s, "schedule", n=3) == \
        "admitted r1, r2 of 2 waiting; prefilled, decoded one step"
    assert apply(s, "decode", rid=1, n=2) == "decoded 2: 10 tokens computed, 3 output"
    apply(s, "finish", rid=1)
    root = s.cache.root_node
    big = next(n for n in root.children.values() if n.is_big_page_node())
    small, = big.children.values()
    assert big.value and len(small.value) == 2 and s.cache.tree_total_tokens_num == 6
    assert s.kv.available_size() == s.kv.num_pages - 6 - 4  # the tree's 6 + r2's 4
    apply(s, "enqueue", rid=3, tokens=[0, 0, 0, 0, 0, 0, 1, 1], max_new=1)
    apply(s, "schedule", n=1)
    assert s.requests[3].shared_len() == 4  # matched after admission: the big page
    s.quiesce()


# -- the known findings --------------------------------------------------------------------------
@pytest.mark.parametrize("fid", sorted(FINDING))
def test_known_finding_fails_on_snapshot_and_passes_when_fixed(fid, fixed):
    """This test FAILS once the snapshot's LightLLM keeps its root refs balanced: then retire
    the finding (tests/upstream_findings/README.md)."""
    trace = load_trace(FINDING[fid])
    assert trace.known_findings == "find" and trace.target == "lightllm"
    found = replay(trace, src=str(SNAPSHOT))
    assert found.violation is not None and found.violation.prop == "ref-balance"
    assert found.failed_step == trace.violation["step"] == len(trace.ops)
    assert "root ref ref is 2, expected 1" in found.violation.message
    assert replay(trace, src=fixed).ok  # PR #1348's lines put back: it passes


@pytest.mark.parametrize("fid", sorted(FINDING))
def test_default_compensates_exactly_that_exit(fid):
    trace = load_trace(FINDING[fid])
    exit_ = {v: k for k, v in KNOWN.items()}[fid]
    result = replay(trace, src=str(SNAPSHOT), known_findings="decline")
    assert result.ok and dict(result.run.subject.cache.compensated) == {fid: 1}
    s = make_subject(trace.params, src=str(SNAPSHOT),
                     compensate=tuple(k for k in KNOWN if k != exit_))
    with pytest.raises(Violation, match="root ref"):  # every other exit compensated: still
        for op in trace.ops:  # fails, so the trace shows the exit it is named after
            SPEC.ops.apply(s, op)
            s.check()


# -- faults on the real class --------------------------------------------------------------------
def _caught(trace_ops, params, fid, src):
    s = make_subject(SPEC.check_params({**SPEC.regimes[0], **params}), src=src, fault=fid,
                     compensate=())
    with pytest.raises(Violation) as exc:
        for name, args in trace_ops:
            SPEC.ops.apply(s, Op(name, args))
            s.check()
        s.quiesce()
        s.check()  # the eviction-policy events of the drain
    return exc.value.prop


@pytest.mark.parametrize("fid", ["L1", "L2"])
def test_fault_fuzzed_on_fixed_copy_caught_on_its_property(fid, fixed, tmp_path):
    f = get_fault(fid)
    params = SPEC.check_params({**SPEC.regimes[0], **f.params})
    out = fuzz(SPEC, params, target="lightllm", src=fixed, fault=fid, known_findings="find",
               out_dir=tmp_path)
    assert out.failed and out.prop in f.properties, out.trace and out.trace.violation
    trace = load_trace(out.trace_path)
    assert replay(trace).violation.prop == out.prop
    trace.fault = None
    assert replay(trace).ok  # the same ops pass on the unpatched class


SERVE5 = [("admit", {"rid": 1, "tokens": [0, 0, 0, 0, 0]}), ("prefill", {"rid": 1, "n": 8}),
          ("prefill", {"rid": 1, "n": 8}), ("finish", {"rid": 1})]
SHRUNK = {  # the fuzzer's shrunk traces of each fault on the fixed copy (kvcheck --profile ci)
    "L3": (SERVE5 + [("admit", {"rid": 2, "tokens": [0, 0, 0]})], {}),
    "L4": ([("admit", {"rid": 1, "tokens": [0, 1, 0]}), ("prefill", {"rid": 1, "n": 8}),
            ("prefill", {"rid": 1, "n": 8}), ("finish", {"rid": 1}),
            ("admit", {"rid": 2, "tokens": [0, 1, 0]})], {"big_page_num": 2}),
    "P5": (SERVE5 + [("admit", {"rid": 2, "tokens": [0, 1, 0]}),
                     ("prefill", {"rid": 2, "n": 8}), ("prefill", {"rid": 2, "n": 8}),
                     ("finish", {"rid": 2})], {}),
}


@pytest.mark.parametrize("fid", sorted(SHRUNK))
def test_fault_trace_caught_on_its_property_only_with_the_fault(fid, fixed):
    ops, params = SHRUNK[fid]
    assert _caught(ops, params, fid, fixed) in get_fault(fid).properties
    s = make_subject(SPEC.check_params({**SPEC.regimes[0], **params}), src=fixed,
                     compensate=())
    for name, args in ops:
        apply(s, name, **args)
    s.quiesce()
    s.check()


@pytest.mark.parametrize("fid", ["L2", "L3", "L4"])
def test_root_ref_faults_are_refused_where_the_defect_is_already_there(fid):
    with pytest.raises(FaultNotInjectable, match=f"lightllm-paged-bigpage-L2.*{fid}|"
                       f"{fid}.*lightllm-paged-bigpage-L2"):
        make_subject(REGIMES[1], src=str(SNAPSHOT), fault=fid)


@pytest.mark.parametrize("fid", sorted(NOT_INJECTABLE))
def test_faults_without_an_upstream_form_say_why(fid):
    with pytest.raises(FaultNotInjectable, match="no upstream form"):
        make_subject(REGIMES[1], src=str(SNAPSHOT), fault=fid)


def test_fault_patch_leaves_the_real_class_alone(fixed):
    from caches.adapters.lightllm.faults import upstream_fault

    ns = loader.load(fixed)
    cls = upstream_fault(ns, "L1")
    assert cls.__mro__[1] is ns.LinearAttPagedRadixCache
    assert cls._add_node is not ns.LinearAttPagedRadixCache._add_node
    assert set(UPSTREAM_FAULTS) == {"L1", "L2", "L3", "L4", "P5"}


# -- differential mode ---------------------------------------------------------------------------
def test_diff_against_reference_on_fixed_copy(fixed):
    res = run_diff("paged-bigpage", "lightllm", REGIMES[1], max_examples=40, src=fixed)
    assert res.error is None, res.error
    assert not res.diverged, format_diff(res)
    assert res.steps > 1000


# -- the seam --------------------------------------------------------------------------------------
def test_subject_satisfies_the_protocol():
    from caches.protocol import PROTOCOLS

    s = make_subject(REGIMES[0], src=str(SNAPSHOT))
    assert isinstance(s, PROTOCOLS["paged-bigpage"]) and s.target == "lightllm"


def test_cli_bad_src_exits_2_in_one_line(capsys, tmp_path):
    from state_machines.cli import main

    for extra in ([], ["--src", str(tmp_path / "missing")], ["--src", str(tmp_path)]):
        assert main(["fuzz", "paged-bigpage", "--target", "lightllm", "--max-examples", "1",
                     *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
