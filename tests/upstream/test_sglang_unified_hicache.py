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
from caches.target import FaultNotInjectable  # noqa: E402
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


def test_storage_1_runs_by_name_and_the_cli_substitutes_nothing(capsys):
    """storage=1 is driven on 0.5.23 (the L3 backend: ``unified_storage.py``): nothing is
    refused, nothing substituted; SGLang's regimes are the variant's three and three
    small-pool host=1 ones (storage off and on, and write_back with a host smaller than the
    device)."""
    from argparse import Namespace

    from state_machines.commands.common import regimes_from_args

    for target in CORES:
        assert get_target(target).params_unavailable("himamba", STORAGE) is None
        s = get_target(target).build("himamba", STORAGE)
        assert s.cache.storage is not None and s.cache.tree.enable_storage
    args = Namespace(target="sglang", src=None, param=["host=1"], page_size=None)
    regimes = regimes_from_args(args, SPEC)
    assert [(r["host"], r["policy"], r["storage"], r["kv_slots"]) for r in regimes] == \
        [(1, 0, 1, 12), (1, 1, 1, 12), (1, 0, 1, 6), (1, 0, 0, 3), (1, 0, 1, 3), (1, 2, 0, 6)]
    assert "with storage=0" not in capsys.readouterr().err
    args.param = ["host=1", "storage=1"]  # asked for by name: runs as asked
    assert {r["storage"] for r in regimes_from_args(args, SPEC)} == {1}


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


# -- storage=1: the L3 backend, the storage threads' bodies run by the ops -----------------------
def storage_subject(core="python", **params):
    return make_subject(SPEC.check_params({"storage": 1, **params}), core=core)


def _stored_then_gone(core, **params):
    """[1 2 3] backed up to host and to storage, then evicted from both tiers: only the
    storage holds it."""
    s = storage_subject(core, **params)
    apply(s, "insert", tokens=[1, 2, 3])
    assert apply(s, "write_ack") == "acknowledged 1 write(s)"
    assert len(s.cache.tree.ongoing_backup) == 1  # its host lock held until the ack
    assert apply(s, "storage_ack") == "storage acknowledged 1 backup(s)"
    assert not s.cache.tree.ongoing_backup
    assert apply(s, "evict", n=3) == "evicted 3 device tokens"
    assert apply(s, "evict_host", n=3) == "evicted 3 host tokens"
    assert apply(s, "match", tokens=[1, 2, 3]) == "hit 0 tokens on device at root, host hit 0"
    return s


@pytest.mark.parametrize("core", ["python", "rust"])
def test_storage_backup_prefetch_and_load_back_through_the_real_controller(core):
    """By hand: a write ack queues the node's storage backup (a host lock on it until the
    backup thread's body writes it and the drain acknowledges); the node leaves both tiers;
    a prefetch queries the backend (the prefetch thread's body), stages the hit on host at
    the drain, the IO thread's body reads it, the drain inserts it on host; an admission
    loads it back and reads the fingerprints the storage gave."""
    s = _stored_then_gone(core)
    c = s.cache
    assert not c.controller.prefetch_thread.is_alive()  # built, never started
    assert {w[0].value for w in c.storage.writes} == {"kv", "mamba"}
    assert apply(s, "prefetch", hid=1, tokens=[1, 2, 3]) == \
        "prefetching 3 of 3 tokens past a hit of 0"
    staged = c.live_prefetches()[1]
    assert len(staged["host"]) == 3 and staged["mamba"] is not None
    assert apply(s, "prefetch_done", hid=1) == "prefetched: 3 tokens new on host"
    assert not c.tree.ongoing_prefetch
    assert apply(s, "match", tokens=[1, 2, 3]) == "hit 0 tokens on device at root, host hit 3"
    assert apply(s, "admit", rid=1, tokens=[1, 2, 3, 4]) == \
        "hit 3 of 4 tokens at depth 3, allocated 1"
    apply(s, "prefill", rid=1, n=1)
    apply(s, "finish", rid=1)
    s.quiesce()


@pytest.mark.parametrize("core", ["python", "rust"])
def test_prefetch_miss_and_abort_give_back_what_they_took(core):
    """A storage miss is revoked at the drain; an aborted prefetch (``release_aborted_request``)
    gives its staging back and its anchor lock; both leave the host pools as they were."""
    s = _stored_then_gone(core)
    c = s.cache
    free = (s.host_kv.available_size(), s.host_mamba.available_size())
    assert apply(s, "prefetch", hid=1, tokens=[4, 5]) == \
        "prefetch of 2 tokens: storage miss (revoked)"
    assert apply(s, "prefetch", hid=1, tokens=[1, 2, 3]) == \
        "prefetching 3 of 3 tokens past a hit of 0"
    assert s.host_kv.available_size() == free[0] - 3
    assert apply(s, "prefetch_abort", hid=1) == "prefetch released"
    assert (s.host_kv.available_size(), s.host_mamba.available_size()) == free
    assert not c.tree.ongoing_prefetch and not c.handles


@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_prefetch_without_host_room_is_refused_and_checked(core):
    """Host pools one slot above the device ones: a node demoted to host under its storage
    backup's host lock and a queued backup take every host slot, so a prefetch's hit finds
    no host staging (nothing is host-evictable) and is revoked (``host_capacity``); the
    called-off check runs on it.  A second prefetch while one occupies half the host pool is
    declined before it is submitted (``prefetch_rate_limited``)."""
    s = _stored_then_gone(core, kv_slots=3, mamba_slots=6, host_kv_slots=4, host_mamba_slots=7)
    apply(s, "insert", tokens=[7, 8, 9])
    apply(s, "write_ack")  # its storage backup holds a host lock on it
    assert apply(s, "evict", n=3) == "evicted 3 device tokens"
    apply(s, "insert", tokens=[5])  # its backup takes the last host slot
    assert s.host_kv.available_size() == 0
    assert apply(s, "prefetch", hid=2, tokens=[1, 2, 3]) == \
        "prefetch refused: 3 tokens hit, no host staging for them (revoked)"
    assert s.reached_counts["prefetch-refused"] == 1
    assert 2 not in s.cache.handles and s.host_kv.available_size() == 0
    apply(s, "storage_ack")
    apply(s, "write_ack")
    assert apply(s, "prefetch", hid=1, tokens=[1, 2, 3]) == \
        "prefetching 3 of 3 tokens past a hit of 0"  # the host reclaim made room
    assert apply(s, "prefetch", hid=2, tokens=[1, 2, 3]) == \
        "prefetch declined: the prefetches in flight hold half the host pool"
    assert apply(s, "prefetch_done", hid=1) == "prefetched: 3 tokens new on host"


def test_a_prefetch_that_keeps_its_staging_is_caught():
    """Mutation: the controller's release queue loses what it is handed
    (``append_host_mem_release`` a no-op), so an aborted prefetch's staging is never freed:
    the called-off check reports the host slots it kept, on conservation.  (Dropping the
    prefetch from ``ongoing_prefetch`` alone is not a leak: the IO ack's drain releases the
    staging of an operation that is no longer current.)"""
    from invariants import Violation

    s = _stored_then_gone("python")
    apply(s, "prefetch", hid=1, tokens=[1, 2, 3])
    s.cache.controller.append_host_mem_release = lambda host_indices=None, extra_pools=None: None
    with pytest.raises(Violation) as exc:
        apply(s, "prefetch_abort", hid=1)
    assert exc.value.prop == "conservation" and "kept host_kv slot(s) [4, 5, 6]" in \
        str(exc.value)


def test_stored_keys_are_the_hash_chain_and_a_wrong_key_is_caught(monkeypatch):
    """The stored-key property over what the backend received: [1 2] then its child [1 2 3]
    each stored under the chain of its own prefix; a key scheme that restarts the chain at
    the node (no prior hash: the bug ``StorageAttachment.apply_runtime_config`` guards
    against) files page 2 for the wrong prefix, and ``storage-keys`` says so."""
    from invariants import Violation
    from invariants.storage_keys import check_storage_keys

    s = storage_subject("python")
    for tokens in ([1, 2], [1, 2, 3]):
        apply(s, "insert", tokens=tokens)
        apply(s, "write_ack")
        apply(s, "storage_ack")
    writes = s.cache.stored_writes()
    assert [(w[1], len(w[2]), len(w[3])) for w in writes] == [([1, 2], 2, 1), ([1, 2, 3], 1, 1)]
    from sglang.srt.mem_cache.utils import get_hash_str

    def restarted(tokens):  # keys of a chain that restarts at every node
        return get_hash_str(list(tokens)[-1:], None, page_size=1) * len(tokens)

    check_storage_keys(writes, lambda t: get_hash_str(list(t), None, page_size=1))
    with pytest.raises(Violation) as exc:
        check_storage_keys(writes, restarted)
    assert exc.value.prop == "storage-keys"
    # the same through the subject: the tree's key chain made to restart at the node
    s2 = storage_subject("python")
    core = s2.cache.tree.tree_core
    real = core.build_storage_backup_spec

    def spec(node_id, pass_prefix_keys):
        out = real(node_id, pass_prefix_keys)
        if out is not None:
            out.hash_value[:] = get_hash_str(list(out.token_ids), None, page_size=1)
        return out

    monkeypatch.setattr(core, "build_storage_backup_spec", spec)
    apply(s2, "insert", tokens=[1, 2])
    apply(s2, "write_ack")
    apply(s2, "storage_ack")
    apply(s2, "insert", tokens=[1, 2, 3])
    apply(s2, "write_ack")
    with pytest.raises(Violation) as exc:
        apply(s2, "storage_ack")
    assert exc.value.prop == "storage-keys" and "not its chain key" in str(exc.value)


@pytest.mark.parametrize("target", sorted(CORES))
def test_fuzz_clean_with_storage(target):
    params = SPEC.check_params({"policy": 0, "storage": 1, "kv_slots": 3, "mamba_slots": 6,
                                "host_kv_slots": 4, "host_mamba_slots": 7})
    out = fuzz(SPEC, params, target=target, max_examples=30, seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.reached.get("storage-backup") and out.reached.get("prefetch-staged")


# -- write_back (policy=2): backups at eviction, a failed one dropped (helper "wb") -------------
WRITE_BACK = SPEC.check_params({"policy": 2, "storage": 0, "kv_slots": 6, "mamba_slots": 4,
                                "host_kv_slots": 3, "host_mamba_slots": 2})


@pytest.mark.parametrize("core", sorted(CORES.values()))
def test_write_back_backs_a_leaf_up_when_eviction_picks_it(core):
    s = make_subject(WRITE_BACK, core=core)
    assert s.cache.tree.is_write_back and s.write_back
    apply(s, "insert", tokens=[1, 0])
    apply(s, "insert", tokens=[1, 0])  # a hit: no backup under write_back
    assert "write_back" in apply(s, "backup", tokens=[1, 0])  # the op is declined (Skip)
    assert s.host_kv.available_size() == 3 and not s.cache.tree.ongoing_write_through
    assert apply(s, "evict", n=2) == "evicted 2 device tokens"
    assert s.reached_counts["write-back"] == 1 and s.reached_counts["evict-to-host"] <= 1
    assert s.host_kv.available_size() == 1 and s.host_mamba.available_size() == 1
    assert not s.cache.tree.ongoing_write_through  # acknowledged inside the eviction
    apply(s, "quiesce")


@pytest.mark.parametrize("core", sorted(CORES.values()))
def test_write_back_without_host_room_drops_the_leaf(core):
    s = make_subject(WRITE_BACK, core=core)
    apply(s, "insert", tokens=[0])
    apply(s, "evict", n=1)  # written back: the host holds it
    apply(s, "insert", tokens=[1, 1, 1, 1])  # 4 tokens never fit the 3-slot host
    assert apply(s, "evict", n=4) == "evicted 4 device tokens"  # dropped, not kept
    assert s.reached_counts["write-back"] == 1 and s.reached_counts["write-back-failed"] == 1
    assert s._kept == 0 and s.host_kv.available_size() == 3  # the host leaf went to make room
    apply(s, "quiesce")


@pytest.mark.parametrize("target", sorted(CORES))
def test_fuzz_clean_write_back_under_host_pressure(target):
    out = fuzz(SPEC, WRITE_BACK, target=target, max_examples=40, seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.reached.get("write-back")  # (the failure path: the test above, and coverage)


def test_python_and_rust_cores_agree_under_write_back():
    res = run_diff("himamba", "sglang", WRITE_BACK, max_examples=40, seed=0,
                   against="sglang-rust")
    assert res.error is None, res.error
    assert not res.diverged, format_diff(res)
    assert res.steps > 500
