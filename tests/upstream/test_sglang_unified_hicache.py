"""``--target sglang`` / ``--target sglang-rust`` at himamba ``host=1, storage=0`` on SGLang 0.5.23:
``UnifiedRadixCache`` (Full + Mamba) with its real HiCache stack (``init_hicache``,
``HybridCacheController``, the host pools), a recording L2 transfer engine, on the Python and
the Rust tree core (``caches/adapters/sglang/unified_hicache.py``).

Run with the default upstream environment (``bash ci/upstream/setup.sh``):
``.venv-upstream/bin/python -m pytest -q tests/upstream/test_sglang_unified_hicache.py``.  Where
sglang is not importable, or another release is installed, the module skips, saying why.
"""

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.23")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from caches.adapters.sglang.unified_hicache import RecordingEngine, make_subject  # noqa: E402
from caches.faults import get_fault  # noqa: E402
from caches.target import FaultNotInjectable, TargetUnavailable  # noqa: E402
from state_machines.diff import format_diff, run_diff  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.himamba import SPEC  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.targets import get_target  # noqa: E402

PARAMS = [SPEC.check_params({"policy": p, "storage": 0}) for p in (0, 1)]
STORAGE = SPEC.check_params(SPEC.regimes[0])  # host=1 storage=1
CORES = {"sglang": "python", "sglang-rust": "rust"}


def subject(core="python", **params):
    return make_subject(SPEC.check_params({"storage": 0, **params}), core=core)


def apply(s, name, **args):
    out = SPEC.ops.apply(s, Op(name, args))
    s.check()
    return out


def test_both_cores_run_the_real_hicache_stack():
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    for target, core in CORES.items():
        s = get_target(target).build("himamba", PARAMS[0])
        c = s.cache
        assert type(c.tree).__name__ == "UnifiedRadixCache" and c.core == core
        assert isinstance(c.allocator.get_kvcache(), HybridLinearKVPool)
        cc = c.tree.cache_controller
        assert type(cc) is HybridCacheController and not cc.enable_storage
        assert isinstance(cc.l2_transfer_engine, RecordingEngine)  # the only stand-in
        assert type(c.host_kv.pool) is MHATokenToKVPoolHost and not c.host_kv.pool.pin_memory
        assert type(c.host_mamba.pool) is MambaPoolHost and not c.host_mamba.pool.pin_memory
        assert (c.host_kv.size, c.host_mamba.size) == (16, 10)
        assert c.tree.write_through_threshold == 1 and c.tree.load_back_threshold == 1
        assert get_target(target).build("himamba", PARAMS[1]).cache.tree \
            .write_through_threshold == 2


def test_storage_1_is_refused_by_name_and_the_cli_runs_storage_0_instead(capsys):
    from argparse import Namespace

    from state_machines.commands.common import UsageError, regimes_from_args

    for target in CORES:
        why = get_target(target).params_unavailable("himamba", STORAGE)
        assert "storage=1" in why and "setup.sh 0.5.12.post1" in why
        assert get_target(target).params_unavailable("himamba", PARAMS[0]) is None
        with pytest.raises(TargetUnavailable, match="storage=1"):
            get_target(target).build("himamba", STORAGE)
    args = Namespace(target="sglang", src=None, param=["host=1"], page_size=None)
    regimes = regimes_from_args(args, SPEC)
    assert [(r["host"], r["policy"], r["storage"], r["kv_slots"]) for r in regimes] == \
        [(1, 0, 0, 12), (1, 1, 0, 12), (1, 0, 0, 6), (1, 0, 0, 3)]  # (+ SGLang's small one)
    assert capsys.readouterr().err.count("with storage=0 [sglang]") == 3
    args.param = ["host=1", "storage=1"]  # asked for by name: refused, not substituted
    with pytest.raises(UsageError, match="storage=1"):
        regimes_from_args(args, SPEC)


@pytest.mark.parametrize("core", ["python", "rust"])
def test_write_in_flight_ack_demote_and_load_back(core):
    """By hand: an insert queues its node's backup (threshold 1), which holds a write lock
    until the write lands and is acknowledged; then eviction demotes the node to host, and an
    admission loads it back -- the KV into fresh device slots, the state into the request's
    own slot -- and runs on it (the checks read the fingerprints back after every step)."""
    s = subject(core, kv_slots=6, mamba_slots=4, host_kv_slots=10, host_mamba_slots=6)
    c = s.cache
    apply(s, "insert", tokens=[1, 2, 3])
    assert s.counters()["writes_in_flight"] == 1 and len(c.controller.write_queue) == 1
    assert not c.engine.writes  # queued, not submitted (flush=False)
    assert apply(s, "evict", n=3) == "evicted 0 device tokens"  # the write lock holds it
    assert apply(s, "write_ack") == "acknowledged 1 write(s)"
    assert s.counters()["writes_in_flight"] == 0
    assert s.counters()["free_host_kv"] == 7 and s.counters()["free_host_mamba"] == 5
    assert apply(s, "evict", n=3) == "evicted 3 device tokens"  # demoted: still on host
    assert apply(s, "match", tokens=[1, 2, 3]) == \
        "hit 0 tokens on device at root, host hit 3"
    free_states = s.mamba.available_size()
    assert apply(s, "admit", rid=1, tokens=[1, 2, 3, 4]) == \
        "hit 3 of 4 tokens at depth 3, allocated 1"
    # the node's state came back and the request runs on a loaded copy in its own slot
    assert s.mamba.available_size() == free_states - 2
    apply(s, "prefill", rid=1, n=1)
    apply(s, "finish", rid=1)
    assert apply(s, "evict_host", n=64).startswith("evicted ")
    s.quiesce()


@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_backup_chain_write_locks_a_tombstone(core):
    """0.5.23's contracts the checks follow: a second hit (selective) on the tombstone a split
    left queues *its* backup (the insert's chain); backing up the node below adds its own
    write lock; each holds a receipt until the ack, the tombstone's counting a mamba ref
    ("Tombstones are counted too") -- the white-box checks hold it to the write locks there."""
    s = subject(core, policy=1)
    c = s.cache
    apply(s, "insert", tokens=[0, 0])
    assert s.counters()["writes_in_flight"] == 0  # one hit: below the threshold of 2
    apply(s, "insert", tokens=[0, 1])  # splits [0 0]: the tombstone [0] gets its second hit
    assert s.counters()["writes_in_flight"] == 1
    assert apply(s, "backup", tokens=[0, 0]) == "backing up depth 2 (1 tokens)"
    assert s.counters()["writes_in_flight"] == 2
    if core == "python":
        (tomb,) = [n for n in c.ongoing_write_through.values() if n.mamba_value is None]
        assert tomb.mamba_lock_ref == 1 and not c.write_lock_took_mamba[tomb.id]
    assert apply(s, "write_ack") == "acknowledged 2 write(s)"
    assert apply(s, "evict", n=64) == "evicted 3 device tokens"  # [0 1] deleted, two demoted
    assert apply(s, "match", tokens=[0, 0]) == "hit 0 tokens on device at root, host hit 2"
    s.quiesce()


def _demoted(core):
    s = subject(core, kv_slots=6, mamba_slots=4, host_kv_slots=10, host_mamba_slots=6)
    apply(s, "insert", tokens=[1, 2, 3])
    apply(s, "write_ack")
    apply(s, "evict", n=3)
    return s


@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_load_that_copies_nothing_is_caught_on_both_cores(core):
    from invariants import Violation

    s = _demoted(core)
    engine = s.cache.engine
    engine._copy = lambda transfers, to_host: None  # the H2D copy never happens
    with pytest.raises(Violation) as exc:
        apply(s, "admit", rid=1, tokens=[1, 2, 3, 4])
    assert exc.value.prop == "data-integrity"


def test_a_host_slot_leak_is_caught_black_box():
    """Rust core: host values are invisible, but a host slot the pool never gets back breaks
    host-pool conservation once the drain has evicted everything."""
    from invariants import Violation

    s = _demoted("rust")
    s.host_kv.pool.free = lambda indices: len(indices)  # freed host slots are lost
    with pytest.raises(Violation) as exc:
        s.quiesce()
    assert exc.value.prop == "conservation"


@pytest.mark.parametrize("target", sorted(CORES))
@pytest.mark.parametrize("params", PARAMS, ids=["write_through", "write_through_selective"])
def test_fuzz_clean(target, params):
    out = fuzz(SPEC, params, target=target, max_examples=40, seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 500


def test_python_and_rust_cores_agree_step_by_step():
    res = run_diff("himamba", "sglang", PARAMS[0], max_examples=40, seed=0,
                   against="sglang-rust")
    assert res.error is None, res.error
    assert not res.diverged, format_diff(res)
    assert res.steps > 500


def test_the_rust_core_takes_no_fault():
    with pytest.raises(FaultNotInjectable, match="compiled"):
        make_subject(PARAMS[0], core="rust", fault="H4")


@pytest.mark.parametrize("fid", ["H4"])
def test_tree_core_fault_caught_on_its_property(fid, tmp_path):
    """The fault patched into 0.5.23's ``UnifiedTreeCore`` (registered as a tree-core
    backend), Python core: caught on the catalogue's property, shrunk, replayed."""
    from tests.harness import assert_caught_on_upstream

    params = SPEC.check_params({**PARAMS[0], **get_fault(fid).params, "storage": 0})
    assert_caught_on_upstream(SPEC, params, fid, tmp_path, target="sglang")


@pytest.mark.parametrize("fid", ["P6", "P7"])
def test_policy_fault_caught_on_victim(fid, tmp_path):
    """The policy faults patched into 0.5.23's components -- P6 turns the Mamba walk round,
    P7 negates the host heap's key (``FullComponent.drive_host_eviction``) -- Python core:
    caught on ``victim``, shrunk, replayed."""
    from tests.harness import assert_caught_on_upstream

    params = SPEC.check_params({**PARAMS[0], **get_fault(fid).params, "storage": 0})
    assert_caught_on_upstream(SPEC, params, fid, tmp_path, target="sglang")


@pytest.mark.parametrize("fid", ["R1", "R3", "H1", "H2", "H3", "H5"])
def test_faults_without_a_form_here_say_why(fid):
    with pytest.raises(FaultNotInjectable, match="no upstream form"):
        make_subject(PARAMS[0], core="python", fault=fid)


# -- eviction policy on the host tier too (invariants/policy.py) -------------------------------
def test_policy_checks_see_every_tiers_victims_and_a_wrong_key_fails(monkeypatch):
    """Python core, host=1: the victims of the Full walk, the Mamba walk and the host heap are
    all recorded, a clean run passes every policy check, and a declared key that disagrees with
    upstream's (MRU) fails on ``victim``."""
    from caches.adapters.sglang.unified_mamba import UnifiedMambaSubject
    from caches.subjects.himamba import HiMambaSubject
    from tests.harness import seen_eviction_passes

    seen = seen_eviction_passes(monkeypatch, HiMambaSubject)
    out = fuzz(SPEC, PARAMS[0], target="sglang", max_examples=60, seed=0)
    assert out.error is None and not out.failed, out.trace and out.trace.violation
    assert seen == {"evict", "evict_mamba", "evict_host"}, seen
    monkeypatch.setattr(UnifiedMambaSubject, "victim_key",
                        staticmethod(lambda n: (-n.extra["time"],)))  # MRU: not upstream's
    out = fuzz(SPEC, PARAMS[0], target="sglang", max_examples=60, seed=0)
    assert out.failed and out.prop == "victim", out.trace and out.trace.violation


def test_a_host_heap_patched_to_take_the_mru_leaf_is_caught_on_victim():
    """[1] and [2] backed up and demoted (the device walk by LRU), then ``evict_host(1)``:
    upstream's host heap (``FullComponent.drive_host_eviction``, keyed by
    ``last_access_time``) drops [1], the older, and every check passes; with the host heap's
    key patched to SGLang's own ``MRUStrategy`` (fault P7's shape) it drops [2], reported on
    ``victim`` for that pass."""
    from sglang.srt.mem_cache.evict_policy import MRUStrategy

    from invariants import Violation

    for patched in (False, True):
        s = subject(kv_slots=6, mamba_slots=4, host_kv_slots=10, host_mamba_slots=6)
        for tokens in ([1], [2]):
            apply(s, "insert", tokens=tokens)
        apply(s, "write_ack")
        assert apply(s, "evict", n=2) == "evicted 2 device tokens"
        if patched:
            full = s.cache.tree.tree_core.components_by_type[s.cache.FULL]
            full.session_ref_eviction_strategy = MRUStrategy().get_priority
        if not patched:
            assert apply(s, "evict_host", n=1) == "evicted 1 host tokens"
            assert [n.key for n in s._walk() if n.key] == [(2,)]
            continue
        SPEC.ops.apply(s, Op("evict_host", {"n": 1}))
        with pytest.raises(Violation) as exc:
            s.check()
        assert exc.value.prop == "victim" and "evict_host(1)" in str(exc.value), exc.value
