"""The reference HiMamba cache behaves like upstream (hand-driven cases), the tier invariants
pass on healthy views and name each kind of damage, and each fault shows its defect."""

import pytest

from caches.faults.himamba import (CascadeIgnoresHostRef, CascadeIgnoresLock,
                                   HostInsertSkipsFullLru, HostLeafIgnoresChildren,
                                   UnfinishedDropsChunked)
from caches.himamba import WRITE_THROUGH, WRITE_THROUGH_SELECTIVE, HiMambaRadixCache
from caches.subjects.himamba import HiMambaSubject
from invariants import NodeView, TreeView, Violation
from invariants.tiers import (check_hit_counts, check_host_protection, check_lock_order,
                              check_lru_order, check_node_refs, check_tombstones,
                              device_leaves, host_leaves, lru_members)


def subject(cls=HiMambaRadixCache, policy=WRITE_THROUGH, storage=False, **kw):
    return HiMambaSubject(cls, write_policy=policy, storage=storage, device="cpu", **kw)


def node_at(s, tokens):
    node, key = s.cache.root_node, list(tokens)
    while key:
        node = node.children[key[0]]
        key = key[len(node.key):]
    return node


def test_split_makes_a_tombstone_and_hits_end_at_mamba_nodes():
    s = subject(policy=WRITE_THROUGH_SELECTIVE)
    s.insert([1, 2, 0])
    s.insert([1, 2, 1])
    p = node_at(s, [1, 2])
    assert p.mamba_value is None and len(p.children) == 2  # the split node is a tombstone
    m = s.cache.match_prefix([1, 2])
    assert m.device_indices == [] and m.best_node is s.cache.root_node
    m = s.cache.match_prefix([1, 2, 1])
    assert len(m.device_indices) == 3 and m.best_node is node_at(s, [1, 2, 1])
    s.check()


def test_lock_is_path_full_and_node_mamba():
    s = subject(policy=WRITE_THROUGH_SELECTIVE)
    s.insert([1, 2, 0])
    s.insert([1, 2, 1])
    leaf, p = node_at(s, [1, 2, 1]), node_at(s, [1, 2])
    c = s.cache
    c.inc_lock_ref(leaf)
    assert (leaf.full_lock_ref, leaf.mamba_lock_ref, p.full_lock_ref, p.mamba_lock_ref) == \
        (1, 1, 1, 0)
    assert (c.full_protected_size_, c.full_evictable_size_) == (3, 1)
    assert (c.mamba_protected_size_, c.mamba_evictable_size_) == (1, 1)
    c.dec_lock_ref(leaf)
    assert c.full_protected_size_ == 0 and c.mamba_protected_size_ == 0


def test_write_through_backs_up_locks_until_ack_and_copies_fingerprints():
    s = subject()
    s.insert([1, 2])
    n = node_at(s, [1, 2])
    assert n.backuped and n.mamba_host_value is not None and n.full_lock_ref == 1
    assert s.host_kv.read(n.host_value) == s.kv.read(n.value)
    assert s.host_mamba.read([n.mamba_host_value]) == s.mamba.read([n.mamba_value])
    s.check()
    assert s.write_ack() == "acknowledged 1 write(s)" and n.full_lock_ref == 0
    s.check()


def test_evict_to_host_keeps_the_node_and_load_back_restores_it():
    s = subject()
    s.insert([1, 2])
    s.write_ack()
    n = node_at(s, [1, 2])
    s.evict(2)
    assert n.evicted and n.mamba_value is None and n.backuped and n.parent is s.cache.root_node
    assert n in s.cache.evictable_full_host_leaves
    s.check()
    out = s.admit(1, [1, 2, 0])  # match -> host hit -> load back -> lock
    assert out.startswith("hit 2 of 3") and not n.evicted and n.mamba_value is not None
    assert n.full_lock_ref == 1 and n.mamba_lock_ref == 1
    s.check()
    s.quiesce()


def test_cascade_deletes_tombstone_parents_but_not_protected_ones():
    for protect in (None, "host", "lock"):
        s = subject(policy=WRITE_THROUGH_SELECTIVE)
        s.insert([1, 0])
        s.insert([1, 1])
        p = node_at(s, [1])
        if protect == "host":
            s.backup([1])
            s.write_ack()
            s.prefetch(7, [1, 1, 2])  # best [1 1] is not backed up: protects P
            assert s.prefetches[7]["node"] is p and p.host_ref_counter == 1
        elif protect == "lock":
            s.backup([1])  # write-through in flight locks P
        s.evict(2)
        s.check()
        reachable = p.parent is not None and p.parent.children.get(1) is p
        assert reachable == (protect is not None), protect
        s.quiesce()


def test_host_leaf_needs_no_children_and_host_eviction_cascades():
    s = subject()
    s.insert([1, 0])
    s.insert([1, 1])
    s.write_ack()
    s.evict(6)
    p = node_at(s, [1])
    assert p.evicted and p.children and p not in s.cache.evictable_full_host_leaves
    s.check()
    s.evict_host(8)
    assert not s.cache.root_node.children
    s.check()


def test_prefetch_completion_refreshes_the_full_lru_in_access_order():
    s = subject()
    s.insert([1])
    s.write_ack()
    s.prefetch(5, [1, 2])
    s.insert([0])
    s.prefetch_done(5)
    x = node_at(s, [1])
    assert s.cache.full_lru.mru_first()[0] is x
    s.check()


def test_chunked_unfinished_insert_counts_no_hit():
    s = subject()
    s.admit(1, [1, 2, 0, 1])
    s.prefill(1, 2)
    n = node_at(s, [1, 2])
    assert n.hit_count == 0 and not n.backuped and s.requests[1].last_node is n
    s.check()
    s.quiesce()


# -- the faults show their defect -----------------------------------------------------------
def fails(prop, fn, *args, **kw):
    with pytest.raises(Violation) as err:
        fn(*args, **kw)
    assert err.value.prop == prop, err.value
    return err.value


def test_h1_deletes_a_host_protected_node():
    s = subject(CascadeIgnoresHostRef, policy=WRITE_THROUGH_SELECTIVE)
    s.insert([1, 0])
    s.insert([1, 1])
    s.backup([1])
    s.write_ack()
    s.prefetch(7, [1, 1, 2])
    s.evict(2)
    fails("host-protection", s.check)


def test_storage_backup_protects_until_its_ack_and_h1_ignores_it():
    for cls in (HiMambaRadixCache, CascadeIgnoresHostRef):
        s = subject(cls, policy=WRITE_THROUGH_SELECTIVE, storage=True)
        s.insert([1, 0])
        s.backup([1])  # splits [1 0]: P = [1] is a tombstone, backed up
        s.write_ack()  # ... and host-protected while storage copies it
        p = node_at(s, [1])
        assert p.host_ref_counter == 1 and p.host_mamba_ref_counter == 0
        s.evict(1)  # the child goes; the cascade reaches P
        if cls is HiMambaRadixCache:
            s.check()
            assert s.storage_ack() == "storage acknowledged 1 backup(s)"
            s.check()
            s.quiesce()
        else:
            fails("host-protection", s.check)


def test_h2_deletes_a_write_locked_node():
    s = subject(CascadeIgnoresLock, policy=WRITE_THROUGH_SELECTIVE)
    s.insert([1, 0])
    s.insert([1, 1])
    s.backup([1])
    s.evict(2)
    assert "deleted while locked" in fails("ref-balance", s.check).message


def test_h3_counts_chunks_as_hits():
    s = subject(UnfinishedDropsChunked)
    s.admit(1, [1, 2, 0, 1])
    fails("hit-count", s.prefill, 1, 2)


def test_h4_counts_an_inner_host_node_as_a_leaf():
    s = subject(HostLeafIgnoresChildren)
    s.insert([1, 0])
    s.insert([1, 1])
    s.write_ack()
    s.evict(6)
    fails("eviction-set", s.check)


def test_h5_leaves_the_full_lru_out_of_order():
    s = subject(HostInsertSkipsFullLru)
    s.insert([1])
    s.write_ack()
    s.prefetch(5, [1, 2])
    s.insert([0])
    s.prefetch_done(5)
    fails("lru-order", s.check)


# -- the tier invariants on hand-built views ------------------------------------------------
def view(*nodes):
    """nodes: (id, parent, key, refs, extra); root 0 has full/mamba 1 and is on device."""
    kids: dict = {}
    for nid, parent, key, _, _ in nodes:
        kids.setdefault(parent, {})[key[0]] = nid
    out = {0: NodeView(0, None, (), (), {"full": 1, "mamba": 1}, kids.get(0, {}),
                       {"device": True})}
    for nid, parent, key, refs, extra in nodes:
        out[nid] = NodeView(nid, parent, tuple(key), tuple(key), refs, kids.get(nid, {}),
                            {"device": True, "mamba": True, **extra})
    return TreeView(out, 0)


DEV = {"full": 0, "mamba": 0, "host": 0, "host_mamba": 0}


def test_leaf_sets_and_lru_members():
    t = view((1, 0, [1], DEV, {"mamba": False, "backuped": True}),
             (2, 1, [2], DEV, {"device": False, "backuped": True, "mamba": False,
                               "mamba_host": True}))
    assert device_leaves(t) == {1} and host_leaves(t) == {2}
    assert lru_members(t, "full") == {1} and lru_members(t, "mamba") == set()
    assert lru_members(t, "host_mamba") == {2}
    inner = view((1, 0, [1], DEV, {"device": False, "backuped": True}),
                 (2, 1, [2], DEV, {"device": False, "backuped": True}))
    assert host_leaves(inner) == {2}  # the evicted parent has a child: not a host leaf


def test_host_protection():
    t = view((1, 0, [1], {**DEV, "host": 1}, {}))
    check_host_protection(t, {1: 1}, [])
    v = fails("host-protection", check_host_protection, t, {1: 1, 5: 1}, [])
    assert v.details["node"] == 5
    fails("host-protection", check_host_protection, t, {1: 1}, [1])


def test_node_refs_and_lock_order():
    t = view((1, 0, [1], {**DEV, "full": 1, "mamba": 1}, {}))
    check_node_refs(t, "mamba", {1: 1}, root_baseline=1)
    check_lock_order(t)
    fails("ref-balance", check_node_refs, t, "mamba", {}, root_baseline=1)
    bad = view((1, 0, [1], {**DEV, "full": 0, "mamba": 1}, {}))
    fails("ref-balance", check_lock_order, bad)


def test_lru_order():
    check_lru_order("full", [2, 1], {1: 5, 2: 9})
    v = fails("lru-order", check_lru_order, "full", [1, 2], {1: 5, 2: 9})
    assert (v.details["ahead"], v.details["behind"]) == (1, 2)


def test_tombstones():
    locked_tomb = view((1, 0, [1], {**DEV, "full": 1}, {"mamba": False}))
    check_tombstones(locked_tomb, [])
    free_tomb = view((1, 0, [1], DEV, {"mamba": False}))
    check_tombstones(free_tomb, [1])  # waiting in an eviction set
    fails("tombstone", check_tombstones, free_tomb, [])
    fails("tombstone", check_tombstones,
          view((1, 0, [1], {**DEV, "full": 1, "mamba": 1}, {"mamba": False})), [])


def test_hit_counts():
    check_hit_counts({1: 2}, {1: 2, 3: 0}, [1], [1, 3])  # split of a backed-up node
    fails("hit-count", check_hit_counts, {1: 2}, {1: 2, 3: 1}, [], [])
    fails("hit-count", check_hit_counts, {1: 2}, {1: 2}, [], [1])


def test_host0_eviction_takes_an_ancestor_its_cascade_exposed_in_the_same_call():
    # MambaRadixCache.evict_full restarts at the LRU end when a cascade leaves a childless
    # ancestor (the Hi heap would wait for the next call).  [0] (state) -> [0] (a tombstone,
    # from the split) -> [0] (state, leaf): evict 3 deletes the leaf, the cascade the
    # tombstone, then the exposed [0] -- the differential run against SGLang found this
    s = subject(host=False, kv_slots=6, mamba_slots=6)
    s.insert([0])
    s.insert([0, 0, 0])
    s.match([0, 0])
    s.check()
    assert s.evict(3) == "evicted 3 device tokens"
    s.check()
    assert not s.cache.root_node.children



@pytest.mark.parametrize("policy", [0, 1])  # the machine's write_through, write_through_selective
@pytest.mark.parametrize("settle,abort,event", [(True, False, "prefetch-inserted"),
                                                (True, True, "prefetch-aborted"),
                                                (False, False, None)])
def test_prefetch_stored_steers_a_prefetch_past_both_tiers_and_settles_it(policy, settle, abort,
                                                                         event):
    # the machine's prefetch_stored scenario: a prefix backed up, acknowledged by host and
    # storage, evicted from device and host, then prefetched -- every token of it fetched anew
    # (a step left out leaves it on a tier, or host-protected, and the prefetch is skipped)
    from state_machines.gen import Walk
    from state_machines.himamba import SPEC, prefetch_stored
    from state_machines.ops import Op

    w = Walk(SPEC, {"policy": policy})
    w.do("insert", tokens=[1])  # an unrelated prefix: the evictions take it too
    prefetch_stored(w, [0, 1], settle=settle, abort=abort)
    names = [op.name for op in w.run.ops]
    assert "storage_ack" in names
    assert names.index("storage_ack") < names.index("evict") < names.index("evict_host")
    reached = w.subject.reached_counts
    assert reached["storage-backup"] >= 1 and reached["evict-to-host"] >= 1
    assert reached["host-eviction"] >= 1
    if settle:
        assert names[-2:] == ["prefetch", "prefetch_abort" if abort else "prefetch_done"]
        assert reached[event] == 1 and not w.subject.prefetches
        if not abort:  # both tokens came back from storage onto the host tier
            assert w.subject.cache.match_prefix([0, 1]).host_hit_length == 2
    else:  # left live for the prefetch_done scenario
        assert names[-1] == "prefetch" and list(w.subject.prefetches) == [w.run.ops[-1].args["hid"]]
        assert not reached["prefetch-inserted"] and not reached["prefetch-aborted"]
    assert w.run.violation is None
    w.run.step(Op("quiesce"))


def test_prefetch_stored_is_a_rule_only_where_storage_holds_something():
    from state_machines.himamba import OPS, has_storage

    rule = next(s for s in OPS.scenarios if s.name == "prefetch_stored")
    assert rule.regime is has_storage
    assert has_storage({"host": 1, "storage": 1})
    assert not has_storage({"host": 1, "storage": 0})
    assert not has_storage({"host": 0, "storage": 1})
