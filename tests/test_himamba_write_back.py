"""write_back (himamba ``policy=2``) on the reference HiMamba cache: nothing is backed up on a
hit; a device leaf is written back when eviction picks it, then demoted; a backup the host has
no room for drops the leaf with its host-only subtree, or keeps it on device while something
there is held; fault WB1 (0.5.12.post1's unchecked backup) crashes where the model does not."""

import pytest

from caches.faults.himamba import WriteBackDemotesUnbacked, WriteBackHostEvictionDeletesItsLeaf
from caches.himamba import POLICIES, WRITE_BACK, CacheAssertion, HiMambaRadixCache
from caches.subjects.himamba import HiMambaSubject
from invariants import Violation
from state_machines.himamba import SPEC, WRITE_BACK_REGIME
from tests.test_himamba_cache import node_at


def subject(cls=HiMambaRadixCache, storage=False, **kw):
    return HiMambaSubject(cls, write_policy=WRITE_BACK, storage=storage, device="cpu", **kw)


def test_policy_2_is_write_back_and_a_default_regime_drives_it():
    assert POLICIES[2] == WRITE_BACK
    assert SPEC.params["policy"].high == 2
    assert WRITE_BACK_REGIME in SPEC.regimes
    assert {"write-back", "write-back-failed"} <= set(SPEC.sometimes)


def test_no_hit_counts_no_backup_until_eviction_then_demoted_with_its_data():
    s = subject()
    s.insert([1, 0])
    s.insert([1, 0])  # a hit: write-through would back up here
    n = node_at(s, [1, 0])
    assert n.hit_count == 0 and not n.backuped and not s.cache.ongoing_write_through
    s.check()
    assert s.cache.evict(2) == 2
    assert n.evicted and n.backuped and n.mamba_backuped and n.mamba_value is None
    assert n.full_lock_ref == 0 and not s.cache.ongoing_write_through  # no lock, acked
    assert s.reached_counts["write-back"] == 1
    s.check()  # host fingerprints are the prefix's (data-integrity), policy checks included
    assert s.cache.match_prefix([1, 0]).host_hit_length == 2
    s.quiesce()


def test_backup_op_is_skipped_under_write_back():
    from caches.subjects.base import Skip

    s = subject()
    s.insert([0])
    with pytest.raises(Skip, match="write_back"):
        s.backup([0])


def test_failed_backup_drops_the_leaf():
    s = subject(kv_slots=6, host_kv_slots=2, mamba_slots=4, host_mamba_slots=2)
    s.insert([1, 1, 1])
    big = node_at(s, [1, 1, 1])
    assert s.evict(3) == "evicted 3 device tokens"  # 3 tokens never fit a 2-slot host
    assert big.id not in {n.id for n in s._walk()} and s.host_kv.available_size() == 2
    assert s.reached_counts["write-back-failed"] == 1 and s._kept == 0
    s.check()
    s.quiesce()


def test_drop_takes_the_host_only_subtree_unless_part_of_it_is_held():
    s = subject(storage=True, kv_slots=6, host_kv_slots=4, mamba_slots=4, host_mamba_slots=3)
    s.insert([0, 0, 0])
    s.insert([0, 0])  # P = [0 0] above C = [0]
    p, c = node_at(s, [0, 0]), node_at(s, [0, 0, 0])
    s.evict(1)  # C written back and demoted: P is a device leaf over a host-only child
    assert c.evicted and c.host_ref_counter == 1  # its storage backup holds it
    assert not s.cache._drop_subtree_no_host(p)  # held: declined, nothing changed
    assert c.parent is p and p.children
    s.storage_ack()
    free = s.host_kv.available_size()
    assert s.cache._drop_subtree_no_host(p)
    assert not p.children and c.host_value is None and s.host_kv.available_size() == free + 1
    s.cache._evict_device_leaf(p)  # what _write_back_failed does next: P deleted
    assert p.id not in {n.id for n in s._walk()}
    s.check_state()
    s.quiesce()


def test_failed_backup_keeps_the_leaf_while_its_host_subtree_is_protected():
    s = subject(storage=True, kv_slots=6, host_kv_slots=2, mamba_slots=4, host_mamba_slots=2)
    s.insert([0, 0, 0])
    s.insert([0, 0])  # splits: P = [0 0] (its own state) above C = [0]
    p, c = node_at(s, [0, 0]), node_at(s, [0, 0, 0])
    assert s.evict(1) == "evicted 1 device tokens"  # C written back; its storage backup
    assert c.evicted and c.host_ref_counter == 1    # host-protects it
    s.check()
    # P (2 tokens) does not fit the one host slot left, host eviction cannot take the
    # protected C, and the drop declines (C is held): P stays on device, nothing freed --
    # not a stall (the progress check is excused), not a victim (the policy check)
    assert s.evict(1) == "evicted 0 device tokens"
    assert not p.evicted and not p.backuped and p.parent is s.cache.root_node
    assert s.reached_counts["write-back-failed"] == 1 and s._kept == 1
    s.check()
    s.storage_ack()  # C unprotected: now P's backup can evict it and succeed
    assert s.evict(2) == "evicted 2 device tokens"
    assert p.evicted and p.backuped
    s.check()
    s.quiesce()


def test_the_progress_check_still_fails_a_write_back_eviction_that_stalls():
    s = subject()
    # an eviction that frees nothing while something is evictable, and kept no leaf
    stalled = s._write_back_progress(lambda n: 0, lambda: 1)
    with pytest.raises(Violation, match="progress"):
        stalled(1)
    s._kept += 1  # ... unless a write-back kept its leaf during it
    kept = s._write_back_progress(lambda n: setattr(s, "_kept", s._kept + 1) or 0, lambda: 1)
    assert kept(1) == 0


def test_internal_state_eviction_backs_the_node_up_first():
    s = subject()
    s.insert([1])
    s.insert([1, 0])  # [1 0] below [1]: the inner state is the least recently used
    inner = node_at(s, [1])
    assert inner.mamba_value is not None and inner.children
    assert s.cache.evict_mamba(1) == 1
    assert inner.mamba_value is None and inner.backuped and inner.mamba_backuped
    s.check()
    s.quiesce()


def test_load_back_keeps_its_host_copies_through_its_own_write_backs():
    """0.5.10.post1 crashes here (load_back reads a freed host_value: the eviction it runs
    writes a leaf back and that backup's host eviction takes the node being loaded); the
    model host-protects the load's node, as 0.5.23 host-locks it."""
    s = subject(kv_slots=3, host_kv_slots=4, mamba_slots=6, host_mamba_slots=7)
    s.insert([1, 1])
    s.insert([0, 0, 0])  # evicts [1 1] to host (written back)
    assert node_at(s, [1, 1]).evicted
    out = s.lock(0, [1, 1])  # loads [1 1] back: evicting [0 0 0] needs its 3 host slots
    s.check()
    assert "locked" in out or "nothing" in out
    s.quiesce()


def test_wb1_demotes_an_unbacked_leaf_and_crashes():
    def run(cls):
        s = subject(cls, kv_slots=6, host_kv_slots=2, mamba_slots=4, host_mamba_slots=2)
        s.insert([1, 1, 1])
        return s.cache.evict(3)

    assert run(HiMambaRadixCache) == 3  # dropped: no host copy, nothing held
    with pytest.raises(CacheAssertion, match="not backuped"):
        run(WriteBackDemotesUnbacked)


def test_wb2_a_write_back_whose_host_eviction_cascades_into_its_own_leaf():
    """WB2's shrunk trace: the write-back of the tombstone [0] (its child [0] already on host)
    must make room on the 3-slot host; without the model's host protection the host eviction
    takes the child and the cascade deletes [0] itself, under the copy."""
    def run(cls):
        s = subject(cls, kv_slots=6, host_kv_slots=3, mamba_slots=4, host_mamba_slots=2)
        s.insert([0, 0])
        s.match([0])  # splits: a tombstone [0] above [0]
        s.insert([1, 1])
        s.evict_mamba(2)
        s.check()
        s.quiesce()

    run(HiMambaRadixCache)
    with pytest.raises(Violation) as exc:
        run(WriteBackHostEvictionDeletesItsLeaf)
    assert exc.value.prop == "size-accounting"


def test_fuzz_write_back_regime_is_clean():
    from state_machines.fuzz import fuzz

    params = {**{k: p.default for k, p in SPEC.params.items()}, **WRITE_BACK_REGIME}
    try:
        fuzz(SPEC, params, max_examples=25, device="cpu")
    except Violation as v:  # pragma: no cover - the failure message is the point
        pytest.fail(str(v))
