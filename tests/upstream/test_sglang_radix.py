"""``--target sglang``: SGLang's real RadixCache under the radix machine.

Run with the upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream``.  Anywhere sglang is not importable
(the core install) the whole module skips, saying why.
"""

from pathlib import Path

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.12.post1")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

import torch  # noqa: E402

from caches.adapters.sglang.faults import NOT_INJECTABLE, UPSTREAM_FAULTS  # noqa: E402
from caches.adapters.sglang.radix import make_subject  # noqa: E402
from caches.faults import get_fault  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines.diff import format_diff, replay_diff, run_diff  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.radix import SPEC  # noqa: E402
from state_machines.replay import replay  # noqa: E402
from state_machines.trace import load_trace  # noqa: E402
from tests.harness import assert_caught_on_upstream  # noqa: E402

FINDINGS = Path(__file__).resolve().parents[1] / "upstream_findings"
REGIMES = [SPEC.check_params(r) for r in SPEC.regimes]
IDS = [f"ps{r['page_size']}" for r in REGIMES]


# -- the environment ---------------------------------------------------------------------------
def test_pinned_release_on_cpu_torch_without_torchvision():
    ns = loader.load()
    assert ns.version == "0.5.12.post1"  # this suite drives that release (radix.py)
    assert torch.version.cuda is None, "the upstream env must keep the CPU torch"
    import torchvision

    assert torchvision.__file__ == "<kvcheck stand-in>", "a real torchvision got installed"
    with pytest.raises(loader.StandInCalled):
        torchvision.io.decode_jpeg(b"")
    assert isinstance(ns.radix_cache.time, loader.LogicalTime)


# -- clean runs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_fuzz_clean_under_ci_profile(params):
    out = fuzz(SPEC, params, target="sglang")
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 1000


def test_request_paths_use_sglangs_tables():
    """Chunked prefill moves the lock down; finish frees the request-pool row; page 4 frees
    the partial-page tail; every node id is creation order, as in the reference."""
    s = make_subject({"page_size": 4, "pool_pages": 6})
    apply = lambda name, **args: SPEC.ops.apply(s, Op(name, args))  # noqa: E731
    assert apply("admit", rid=1, tokens=list(range(10))) == "hit 0 of 10 tokens, allocated 10"
    apply("prefill", rid=1, n=5)
    req = s.requests[1]
    assert req.cache_protected_len == 4 and req.last_node.lock_ref == 1
    assert s.cache.req_to_token_pool.available_size() == s.cache.req_to_token_pool.size - 1
    apply("prefill", rid=1, n=5)
    apply("finish", rid=1)
    s.check()
    assert s.cache.req_to_token_pool.available_size() == s.cache.req_to_token_pool.size
    assert s.cache.evictable_size_ == 8 and len(s.pool.free_pages) == 4  # tail page freed
    assert sorted(n.id for n in s.cache.root_node.children.values()) == [1]
    s.quiesce()


# -- faults on the real class --------------------------------------------------------------------
@pytest.mark.parametrize("fid", sorted(UPSTREAM_FAULTS))
def test_fault_on_real_class_caught_on_its_property(fid, tmp_path):
    params = SPEC.check_params({**SPEC.regimes[0], **get_fault(fid).params})
    assert_caught_on_upstream(SPEC, params, fid, tmp_path)


@pytest.mark.parametrize("fid", sorted(NOT_INJECTABLE))
def test_faults_without_an_upstream_form_say_why(fid):
    with pytest.raises(KeyError, match="no upstream form"):
        make_subject(SPEC.check_params({}), fault=fid)


def test_fault_patch_leaves_the_real_class_alone():
    from caches.adapters.sglang.faults import upstream_fault

    cls = upstream_fault("R1")
    assert cls.__mro__[1] is loader.load().RadixCache
    assert cls._insert_helper is not loader.load().RadixCache._insert_helper


# -- the known upstream finding ------------------------------------------------------------------
def test_known_finding_F1_still_present():
    """SGLang's dec_lock_ref accepts an unmatched unlock.  This test FAILS when a release adds
    the guard: then retire the finding (tests/upstream_findings/README.md)."""
    trace = load_trace(FINDINGS / "sglang-radix-F1-unmatched-unlock.json")
    for params in REGIMES:
        s = make_subject(params, skip_known_findings=False)
        ops = trace.ops if params == trace.params else [
            Op(o.name, {"tokens": [0] * params["page_size"]}) for o in trace.ops]
        with pytest.raises(Violation) as exc:
            for op in ops:
                SPEC.ops.apply(s, op)
                s.check()
        assert exc.value.prop == trace.violation["property"] == "ref-balance"
        assert "lock ref is -1" in exc.value.message


def test_known_finding_is_declined_by_default():
    trace = load_trace(FINDINGS / "sglang-radix-F1-unmatched-unlock.json")
    result = replay(trace, known_findings="decline")  # as a fuzz run would
    assert result.ok
    assert result.steps[-1].result.startswith("skipped: ") and "F1" in result.steps[-1].result


# -- differential mode ---------------------------------------------------------------------------
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_diff_reference_and_sglang_agree(params):
    res = run_diff("radix", "sglang", params, max_examples=60)
    assert res.error is None, res.error
    assert not res.diverged, format_diff(res)
    assert res.steps > 500


def test_diff_reports_first_differing_step():
    """SGLang's scheduler evicts the whole request size, the reference loop only the shortfall:
    with the scheduler's own policy the diff must find that, at the step it happens."""
    res = run_diff("radix", "sglang", REGIMES[1], max_examples=150, same_driver=False)
    assert res.diverged and res.prop == "divergence", format_diff(res)
    steps, v = replay_diff(res.trace, same_driver=False)
    assert v is not None and v.step == res.trace.violation["step"] == len(res.trace.ops)
    assert steps[-1].differs and not any(s.differs for s in steps[:-1])
    assert "DIFFERS at step" in format_diff(res)
