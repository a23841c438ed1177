"""``--target sglang`` at himamba ``host=0``: SGLang's real MambaRadixCache under the machine.

Run with the upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream``.  Anywhere sglang is not importable
(the core install) the whole module skips, saying why.
"""

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.12.post1")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from caches.adapters.sglang.mamba import make_subject  # noqa: E402
from caches.adapters.sglang.mamba_faults import NOT_INJECTABLE, UPSTREAM_FAULTS  # noqa: E402
from state_machines.diff import format_diff, run_diff  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.himamba import SPEC  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from tests.harness import assert_caught_on_upstream  # noqa: E402

PARAMS = SPEC.check_params(next(r for r in SPEC.regimes if r.get("host") == 0))


def subject(**params):
    return make_subject(SPEC.check_params({"host": 0, **params}))


def apply(s, name, **args):
    return SPEC.ops.apply(s, Op(name, args))


# -- the real class, driven ----------------------------------------------------------------------
def test_subject_drives_the_real_mamba_radix_cache():
    from sglang.srt.mem_cache.mamba_radix_cache import MambaRadixCache
    from sglang.srt.mem_cache.memory_pool import MambaPool

    s = subject()
    assert type(s.cache.tree) is MambaRadixCache
    assert isinstance(s.cache.req_to_token_pool.mamba_pool, MambaPool)
    assert apply(s, "backup", tokens=[0]).startswith("skipped: no host tier")


def test_request_paths_fork_states_in_the_real_pool():
    """A chunked prefill forks the request's state into the tree with the pool's own
    ``fork_from`` (the fingerprint travels inside the real state tensor), moves the lock down,
    and finishing hands the request's own slot to the tree."""
    s = subject(kv_slots=8, mamba_slots=6)
    assert apply(s, "admit", rid=1, tokens=[0, 1, 0]) == "hit 0 of 3 tokens at #0, allocated 3"
    free_states = s.mamba.available_size()
    apply(s, "prefill", rid=1, n=2)  # cache_unfinished_req: insert [0 1] with a forked state
    req, tree = s.requests[1], s.cache.tree
    node = req.last_node
    assert node.key == (0, 1) and node.full_lock_ref == 1 and node.mamba_lock_ref == 1
    assert s.mamba.available_size() == free_states - 1  # the fork
    assert s.mamba.read([node.mamba_value]) == s.mamba.read([req.mamba_slot])  # copied
    assert tree.full_protected_size_ == 2 and tree.mamba_protected_size_ == 1
    apply(s, "prefill", rid=1, n=1)
    apply(s, "finish", rid=1)
    s.check()
    assert tree.full_evictable_size_ == 3 and tree.full_protected_size_ == 0
    assert tree.mamba_evictable_size_ == 2  # [0 1] (the fork) and [0] (the request's slot)
    assert s.cache.req_to_token_pool.available_size() == s.cache.req_to_token_pool.size
    assert apply(s, "evict", n=64) == "evicted 3 device tokens"
    s.check_quiescent()


def test_a_wrong_fork_is_a_data_integrity_violation():
    """The fingerprints are the real pool's state: a fork that copies the wrong slot is seen."""
    s = subject()
    apply(s, "admit", rid=1, tokens=[0, 1, 0])
    pool = s.cache.req_to_token_pool.mamba_pool
    real_copy = pool.copy_from
    pool.copy_from = lambda src, dst: None  # the fork forgets to copy
    try:
        apply(s, "prefill", rid=1, n=2)
        with pytest.raises(Exception) as exc:
            s.check()
        assert getattr(exc.value, "prop", None) == "data-integrity"
    finally:
        pool.copy_from = real_copy


def test_fuzz_clean_under_ci_profile():
    out = fuzz(SPEC, PARAMS, target="sglang")
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 1000


# -- faults on the real class --------------------------------------------------------------------
@pytest.mark.parametrize("fid", sorted(UPSTREAM_FAULTS))
def test_fault_on_real_class_caught_on_its_property(fid, tmp_path):
    assert_caught_on_upstream(SPEC, PARAMS, fid, tmp_path)


@pytest.mark.parametrize("fid", sorted(NOT_INJECTABLE))
def test_faults_without_an_upstream_form_say_why(fid):
    with pytest.raises(KeyError, match="no upstream form"):
        make_subject(PARAMS, fault=fid)


# -- differential mode ---------------------------------------------------------------------------
def test_diff_reference_and_sglang_agree():
    res = run_diff("himamba", "sglang", PARAMS, max_examples=80)
    assert res.error is None, res.error
    assert not res.diverged, format_diff(res)
    assert res.steps > 1000
