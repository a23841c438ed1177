"""``--target sglang`` for himamba at host=1: SGLang's real HiMambaRadixCache under the machine.

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

from caches.adapters.sglang.himamba import make_subject  # noqa: E402
from caches.adapters.sglang.himamba_faults import (  # noqa: E402
    NOT_INJECTABLE,
    UPSTREAM_FAULTS,
    upstream_fault,
)
from caches.faults import get_fault  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines.diff import pair_spec  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.himamba import SPEC  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.replay import replay  # noqa: E402
from state_machines.targets import get_target  # noqa: E402
from state_machines.trace import load_trace  # noqa: E402
from tests.harness import assert_caught_on_upstream, seen_eviction_passes  # noqa: E402

FINDINGS = Path(__file__).resolve().parents[1] / "upstream_findings"
REGIMES = [SPEC.check_params({"policy": p}) for p in (0, 1)]  # host=1, storage on
IDS = ["write_through", "write_through_selective"]
TRACES = {
    "F1": "sglang-himamba-F1-host-insert-skips-full-lru.json",
    "F2": "sglang-himamba-F2-write-ack-drops-mamba-lock.json",
    "F3": "sglang-himamba-F3-evict-mamba-asserts-on-write-locked-leaf.json",
    "F4": "sglang-himamba-F4-host-leaf-below-unbacked-node.json",
    "F6": "sglang-himamba-F6-cascade-hides-ancestor-from-evict.json",
}


def _run(params, ops, **options):
    """Apply ``ops`` (name, args) to a fresh subject, checking after each; returns it."""
    s = make_subject(params, **options)
    for name, args in ops:
        SPEC.ops.apply(s, Op(name, args))
        s.check()
    return s


# -- clean runs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_fuzz_clean_under_ci_profile(params):
    out = fuzz(SPEC, params, target="sglang")
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 1000


def test_request_paths_use_sglangs_tables_and_host_pools():
    """Write-through, storage backup, eviction to host, load back (KV + mamba state) at
    admission, finish: the numbers are SGLang's counters and pools, the fingerprints came back
    through the stand-in controller's copies (checked on the hit)."""
    s = make_subject(REGIMES[0])
    apply = lambda name, **args: (SPEC.ops.apply(s, Op(name, args)), s.check())[0]  # noqa
    assert apply("insert", tokens=[0, 1, 1]) == "tree already had 0 tokens"
    # write_through: the new node is written at once and stays locked (KV and state) in flight
    assert s.counters() == {"full_evictable": 0, "full_protected": 3, "mamba_evictable": 0,
                            "mamba_protected": 1, "free_kv": 9, "free_mamba": 7,
                            "free_host_kv": 13, "free_host_mamba": 9, "writes_in_flight": 1,
                            "live": 0}
    assert apply("write_ack") == "acknowledged 1 write(s)"
    raw = s.cache.tree.root_node.children[0]
    assert (raw.host_ref_counter, raw.host_mamba_ref_counter) == (1, 1)  # storage backup
    assert apply("storage_ack") == "storage acknowledged 1 backup(s)"
    assert raw.host_ref_counter == 0 and raw.full_lock_ref == 0
    assert apply("evict", n=3) == "evicted 3 device tokens"
    assert raw.value is None and raw.mamba_value is None and raw.mamba_host_value is not None
    assert s.cache.tree.evictable_full_host_leaves == {raw}
    assert apply("admit", rid=1, tokens=[0, 1, 1, 0]) == "hit 3 of 4 tokens at #1, allocated 1"
    assert {"load-back", "host-mamba-restored", "evict-to-host"} <= set(s.reached_counts)
    assert s.counters()["free_kv"] == 8 and s.counters()["free_mamba"] == 6
    assert s.cache.tree.ongoing_load_back == {}  # the load landed and was acknowledged
    apply("prefill", rid=1, n=1)
    apply("finish", rid=1)
    rows = s.cache.req_to_token_pool
    assert rows.available_size() == rows.size
    assert s.counters()["writes_in_flight"] == 1 and s.counters()["free_host_kv"] == 12
    assert sorted(n.id for n in s.cache.root_node.children.values()) == [1]
    s.quiesce()
    assert s.counters()["free_host_kv"] == 16 and s.counters()["free_host_mamba"] == 10


def test_host_pools_must_be_larger_and_host0_is_not_served_here():
    with pytest.raises(ValueError, match="larger than the device"):
        make_subject(SPEC.check_params({"host_kv_slots": 12}))
    with pytest.raises(ValueError, match="host=0"):
        make_subject(SPEC.check_params({"host": 0}))


# -- faults on the real class --------------------------------------------------------------------
@pytest.mark.parametrize("fid", sorted(UPSTREAM_FAULTS))
def test_fault_on_real_class_caught_on_its_property(fid, tmp_path):
    params = SPEC.check_params({**SPEC.regimes[0], **get_fault(fid).params})
    assert_caught_on_upstream(SPEC, params, fid, tmp_path)


@pytest.mark.parametrize("fid", sorted(NOT_INJECTABLE))
def test_faults_without_an_upstream_form_say_why(fid):
    with pytest.raises(KeyError, match="no upstream form"):
        make_subject(REGIMES[0], fault=fid)


def test_fault_patch_leaves_the_real_class_alone():
    from sglang.srt.mem_cache.hi_mamba_radix_cache import HiMambaRadixCache

    cls = upstream_fault("H1")
    assert cls.__mro__[1] is HiMambaRadixCache
    assert cls._iteratively_delete_tombstone_leaf is not \
        HiMambaRadixCache._iteratively_delete_tombstone_leaf
    assert upstream_fault("H3").cache_unfinished_req is not HiMambaRadixCache.cache_unfinished_req


# -- the known upstream findings: each FAILS once a release fixes it ---------------------------
def _trace_ops(fid):
    trace = load_trace(FINDINGS / TRACES[fid])
    return trace, [(op.name, op.args) for op in trace.ops]


def test_known_finding_F1_host_insert_leaves_lru_out_of_order():
    """H5 as pinned: _insert_helper_host stamps the walked node's time but leaves it behind a
    younger node in the full LRU list.  Retire F1 when this fails."""
    trace, ops = _trace_ops("F1")
    with pytest.raises(Violation) as exc:
        _run(trace.params, ops, skip_known_findings=False)
    assert exc.value.prop == trace.violation["property"] == "lru-order"
    assert "full_lru_list" in exc.value.message


def test_known_finding_F2_write_ack_drops_a_requests_mamba_lock():
    trace, ops = _trace_ops("F2")
    with pytest.raises(Violation) as exc:
        _run(trace.params, ops, skip_known_findings=False)
    assert exc.value.prop == trace.violation["property"] == "ref-balance"
    assert "mamba ref is 0, but 1 live holder" in exc.value.message
    # the same through inserts alone (the second hit on the split tombstone starts the write)
    with pytest.raises(Violation, match="mamba ref is 0"):
        _run(trace.params, [("insert", {"tokens": [0, 0]}), ("lock", {"hid": 1, "tokens": [0]}),
                            ("insert", {"tokens": [0, 0]}), ("insert", {"tokens": [0, 1]}),
                            ("admit", {"rid": 1, "tokens": [0, 0]}),
                            ("prefill", {"rid": 1, "n": 1}), ("write_ack", {})],
             skip_known_findings=False)


def test_known_finding_F3_evict_mamba_asserts_on_write_locked_leaf():
    trace, ops = _trace_ops("F3")
    assert trace.violation["property"] == "crash"
    with pytest.raises(AssertionError, match="full_lock_ref mismatch") as exc:
        _run(trace.params, ops, skip_known_findings=False)
    assert not isinstance(exc.value, Violation)  # upstream's own assert, in evict_mamba
    # through inserts alone: the insert that counts the tombstone's second hit writes it and
    # then gives it its mamba state back
    with pytest.raises(AssertionError, match="full_lock_ref mismatch") as exc:
        _run(trace.params, [("insert", {"tokens": [0, 0]}), ("lock", {"hid": 1, "tokens": [0]}),
                            ("insert", {"tokens": [0, 0]}), ("insert", {"tokens": [0]}),
                            ("evict_mamba", {"n": 2})], skip_known_findings=False)
    assert not isinstance(exc.value, Violation)


def test_known_finding_F4_host_leaf_below_unbacked_node_breaks_eviction():
    trace, ops = _trace_ops("F4")
    assert trace.violation["property"] == "crash"
    s = make_subject(trace.params, skip_known_findings=False)
    for name, args in ops[:-1]:
        SPEC.ops.apply(s, Op(name, args))
        s.check()
    # the completed prefetch hung a host-only node below a device node nobody backed up
    [raw] = [n for n in s.cache.tree.evictable_full_device_leaves if n.children]
    assert raw.host_value is None and all(c.value is None for c in raw.children.values())
    with pytest.raises(AssertionError, match="non-leaf") as exc:
        SPEC.ops.apply(s, Op(*ops[-1]))  # the drain's eviction reaches it: _evict_regular
    assert not isinstance(exc.value, Violation)


def test_known_finding_F6_cascade_hides_the_ancestor_it_exposes_from_evict():
    """``evict`` pushes only the evicted leaf's parent; the tombstone cascade deleted it, and
    the node it exposed as an evictable device leaf is never evicted in that call.  Retire
    F6 when this fails."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    trace, ops = _trace_ops("F6")
    with pytest.raises(Violation) as exc:
        _run(trace.params, ops, skip_known_findings=False)
    assert exc.value.prop == trace.violation["property"] == "spurious-oom"
    s = _run(trace.params, ops[:-1], skip_known_findings=False)
    tree = s.cache.tree
    # [0] with its mamba state -> [0] the match's split left (a tombstone) -> [0] (a leaf)
    [tomb] = [n for n in s._walk() if n.mamba_value is None and n.id != s.cache.root_node.id]
    top, leaf = tomb.raw.parent, next(iter(tomb.raw.children.values()))
    assert top.mamba_value is not None and not leaf.children
    assert tree.full_evictable_size() == 3 and s.kv.available_size() == 3
    got = tree.evict(EvictParams(num_tokens=3))
    assert got.num_tokens_evicted == 2  # the leaf and the tombstone its cascade deleted
    assert top in tree.evictable_full_device_leaves and not top.children  # never pushed
    assert tree.evict(EvictParams(num_tokens=1)).num_tokens_evicted == 1  # the next call does


def test_F6_decline_leaves_an_allocation_the_reachable_tokens_cover():
    """Declined only when the tokens the heap can reach fall short: 5 slots (3 free + the leaf
    and the tombstone) are allocated, 6 are declined."""
    trace, ops = _trace_ops("F6")
    s = _run(trace.params, ops[:-1])
    assert SPEC.ops.apply(s, Op("admit", {"rid": 1, "tokens": [1] * 5})).endswith(
        "allocated 5")
    s = _run(trace.params, ops[:-1])
    declined = SPEC.ops.apply(s, Op(*ops[-1]))
    assert declined.startswith("skipped: ") and "sglang-himamba-F6" in declined, declined
    assert s.kv.available_size() == 3 and len(s.requests) == 0  # a no-op


@pytest.mark.parametrize("fid", sorted(TRACES))
def test_known_finding_is_declined_by_default(fid):
    trace = load_trace(FINDINGS / TRACES[fid])
    result = replay(trace, known_findings="decline")  # as a fuzz run would
    assert result.ok
    declined = [st.result for st in result.steps if st.result.startswith("skipped: ")
                and f"sglang-himamba-{fid}" in st.result]
    assert declined, [st.result for st in result.steps]


# -- differential mode ---------------------------------------------------------------------------
def _run_diff(params, max_examples=60):
    return fuzz(pair_spec(SPEC, "sglang"), params, target="reference~sglang",
                max_examples=max_examples)


@pytest.mark.parametrize("params", REGIMES, ids=IDS)
def test_diff_reference_and_sglang_agree(params):
    """Same results and counters at every step (the reference allocates host and device slots
    in ``HybridCacheController``'s order, as the two traces below pin)."""
    out = _run_diff(params, max_examples=150)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 500


# the last insert's write-through finds a host KV slot but no host mamba slot (shrunk by the
# diff against a reference with only the load order fixed)
WRITE_SHORT_OF_HOST_MAMBA = [
    ("insert", {"tokens": [0]}), ("insert", {"tokens": [1]}), ("insert", {"tokens": [0, 0]}),
    ("write_ack", {}), ("storage_ack", {}), ("insert", {"tokens": [0, 0, 0]}),
    ("insert", {"tokens": [0, 1]}), ("insert", {"tokens": [0, 1, 0]}),
    ("insert", {"tokens": [1, 0]}), ("insert", {"tokens": [0, 1, 1]}),
    ("insert", {"tokens": [1, 1]}), ("write_ack", {}), ("storage_ack", {}),
    ("insert", {"tokens": [0, 0, 1]}), ("insert", {"tokens": [1, 0, 0]})]
# a host-only mamba state to restore at admission while the device mamba pool is full
LOAD_SHORT_OF_DEVICE_MAMBA = [
    ("insert", {"tokens": [1, 0]}), ("insert", {"tokens": [0, 0]}),
    ("insert", {"tokens": [1, 0, 0]}), ("write_ack", {}), ("storage_ack", {}),
    ("admit", {"rid": 1, "tokens": [0]}), ("insert", {"tokens": [0]}),
    ("admit", {"rid": 2, "tokens": [0]}), ("insert", {"tokens": [0, 1]}),
    ("insert", {"tokens": [0, 0, 0]}), ("insert", {"tokens": [1]}),
    ("lock", {"hid": 3, "tokens": [1, 0]})]


@pytest.mark.parametrize("ops", [WRITE_SHORT_OF_HOST_MAMBA, LOAD_SHORT_OF_DEVICE_MAMBA],
                         ids=["write", "load"])
def test_pool_short_of_mamba_slots_only_evicts_what_sglang_evicts(ops):
    """A write short of a host mamba slot only (and a load short of a device one) evicts through
    the pool's own callback after the KV allocation, as the controller does: the reference and
    SGLang agree on the result and every counter at every step.  (The diff found these when the
    reference still checked both pools up front.)"""
    params = REGIMES[0]
    ref = get_target("reference").build("himamba", params)
    up = make_subject(params)
    for i, (name, args) in enumerate(ops, 1):
        a, b = (SPEC.ops.apply(x, Op(name, args)) for x in (ref, up))
        assert a == b, f"step {i} {name}: reference {a!r}, sglang {b!r}"
        assert ref.counters() == up.counters(), f"step {i} {name}"


# -- policy: the checks see SGLang's own victims on every tier ------------------------------------
@pytest.mark.parametrize("params", [REGIMES[0], SPEC.check_params({"host": 0, "kv_slots": 6,
                                                                   "mamba_slots": 6})],
                         ids=["host1", "host0"])
def test_policy_checks_see_the_real_trees_victims(params, monkeypatch):
    """A run records the victims of SGLang's own eviction passes (device, mamba state, host
    tier where there is one), and a declared key that disagrees with upstream's LRU fails on
    ``victim``: the checks watch the real tree, they do not pass by seeing nothing."""
    from caches.subjects.himamba import HiMambaSubject

    seen = seen_eviction_passes(monkeypatch, HiMambaSubject)
    out = fuzz(SPEC, params, target="sglang", max_examples=150)
    assert out.error is None and not out.failed, out.trace and out.trace.violation
    assert seen == ({"evict", "evict_mamba", "evict_host"} if params["host"]
                    else {"evict", "evict_mamba"}), seen
    monkeypatch.setattr(HiMambaSubject, "victim_key",
                        staticmethod(lambda n: (-n.extra["time"],)))  # MRU: not upstream's
    out = fuzz(SPEC, params, target="sglang", max_examples=150)
    assert out.failed and out.prop == "victim", out.trace and out.trace.violation
