"""Each invariant on hand-built views: a healthy view passes, each kind of damage is named."""

import pytest

from invariants import (NodeView, PoolView, TreeView, Violation, check_conservation,
                        check_eviction_set, check_fingerprints, check_held_once,
                        check_quiescence, check_ref_balance, check_size_accounting,
                        check_structure, evictable_leaves)


def tree(*nodes, page_size=1):
    """nodes: (id, parent, key, value, lock) ; root is id 0 with lock 1."""
    views = {0: NodeView(0, None, (), (), {"lock": 1}, {})}
    kids = {}
    for nid, parent, key, value, lock in nodes:
        kids.setdefault(parent, {})[key[0] if page_size == 1 else tuple(key[:page_size])] = nid
    for nid, parent, key, value, lock in nodes:
        views[nid] = NodeView(nid, parent, tuple(key), tuple(value), {"lock": lock},
                              kids.get(nid, {}))
    views[0] = NodeView(0, None, (), (), {"lock": 1}, kids.get(0, {}))
    return TreeView(views, 0, page_size)


def broken(prop, fn, *args, **kw):
    with pytest.raises(Violation) as err:
        fn(*args, **kw)
    assert err.value.prop == prop, err.value
    return err.value


# a root -> 1 [1 2] -> 2 [3], root -> 3 [4]; node 2 locked by one holder
T = tree((1, 0, [1, 2], [11, 12], 1), (2, 1, [3], [13], 1), (3, 0, [4], [14], 0))


def test_ref_balance_passes_and_names_the_node():
    check_ref_balance(T, {2: 1})
    v = broken("ref-balance", check_ref_balance, T, {})
    assert v.details["node"] in (1, 2) and v.details["expected"] == 0
    v = broken("ref-balance", check_ref_balance, T, {2: 1, 3: 1})
    assert v.details == {"node": 3, "counter": "lock", "ref": 0, "expected": 1}


def test_ref_balance_negative_and_root_baseline():
    neg = tree((1, 0, [1], [11], -1))
    assert "< 0" in broken("ref-balance", check_ref_balance, neg, {}).message
    root2 = TreeView({**T.nodes, 0: NodeView(0, None, (), (), {"lock": 2}, T.nodes[0].children)},
                     0)
    broken("ref-balance", check_ref_balance, root2, {2: 1})
    # a root that also counts holders (LightLLM): 1 + live holders
    check_ref_balance(root2, {2: 1}, root_counts_holders=True)
    broken("ref-balance", check_ref_balance, T, {5: 1})  # holder on a deleted node


def test_size_accounting():
    check_size_accounting(T, evictable=1, protected=3)
    assert broken("size-accounting", check_size_accounting, T, -1, 5).details["evictable"] == -1
    v = broken("size-accounting", check_size_accounting, T, 2, 3)
    assert v.details["tree_tokens"] == 4
    v = broken("size-accounting", check_size_accounting, T, 2, 2)  # right sum, wrong split
    assert v.details["locked_tokens"] == 3


def test_structure():
    check_structure(T)
    bad_link = TreeView({**T.nodes, 2: NodeView(2, 3, (3,), (13,), {"lock": 1})}, 0)
    broken("structure", check_structure, bad_link)
    bad_key = TreeView({**T.nodes, 1: NodeView(1, 0, (9, 2), (11, 12), {"lock": 1},
                                               {3: 2})}, 0)
    broken("structure", check_structure, bad_key)
    bad_len = TreeView({**T.nodes, 3: NodeView(3, 0, (4,), (14, 15), {"lock": 0})}, 0)
    broken("structure", check_structure, bad_len)
    paged = tree((1, 0, [1, 2, 3], [5, 6, 7], 0), page_size=2)
    broken("structure", check_structure, paged)


def test_eviction_set():
    assert evictable_leaves(T) == {3}
    check_eviction_set("evictable_leaves", [3], {3})
    v = broken("eviction-set", check_eviction_set, "evictable_leaves", [3, 2], {3})
    assert v.details["extra"] == [2]
    v = broken("eviction-set", check_eviction_set, "evictable_leaves", [], {3})
    assert v.details["missing"] == [3]
    broken("eviction-set", check_eviction_set, "lru", [3, 3], {3})


def test_conservation():
    pool = PoolView("kv", "slot", 5, free=(3, 4))
    check_conservation(pool, {"tree": [1], "request r1": [2, 5]}, {"request r1": [1]})
    v = broken("conservation", check_conservation, pool, {"tree": [1], "r": [2]})
    assert v.details["lost"] == [5]
    broken("conservation", check_conservation, PoolView("kv", "slot", 5, (3, 3, 4)),
           {"tree": [1, 5], "r": [2]})  # freed twice
    v = broken("conservation", check_conservation, pool, {"tree": [1, 3], "r": [2, 5]})
    assert v.details["places"] == ["free", "tree"]  # use after free
    broken("conservation", check_conservation, pool, {"tree": [1, 2], "r": [2, 5]})
    broken("conservation", check_conservation, pool, {"tree": [0, 1], "r": [2, 5]})
    v = broken("conservation", check_conservation, pool, {"tree": [1], "r": [2, 5]},
               {"r": [3]})
    assert v.details["reader"] == "r"


@pytest.mark.parametrize("unit", ["slot", "page", "block"])
def test_held_once_names_the_ids_at_two_positions_in_the_pools_unit(unit):
    """What conservation allows (one owner listing an id twice) ``check_held_once`` reports,
    on conservation, with the repeated ids (sorted) in the pool's own unit."""
    pool = PoolView("pages", unit, 5, free=(3, 4))
    check_held_once("pages", "the tree", [1, 2, 5], unit)
    check_held_once("pages", "the tree", [], unit)
    check_conservation(pool, {"tree": [1, 5, 1], "r": [2]})  # (passes: one owner)
    v = broken("conservation", check_held_once, "pages", "the tree", [5, 1, 5, 2, 1], unit)
    assert v.details == {"pool": "pages", "ids": [1, 5], "owner": "the tree"}
    assert v.message == (f"pool pages: {unit}(s) [1, 5] are held at two positions by the "
                         "tree (they would read each other's KV)")


def test_fingerprints():
    check_fingerprints("kv", [1, 2], [7, 8], [7, 8])
    v = broken("data-integrity", check_fingerprints, "kv", [1, 2], [7, 9], [7, 8])
    assert (v.details["position"], v.details["id"]) == (1, 2)


def test_quiescence():
    empty = tree()
    full = PoolView("kv", "slot", 2, (1, 2))
    check_quiescence(empty, [full], {"lock": 1})
    broken("quiescence", check_quiescence, T, [full], {"lock": 1})
    broken("quiescence", check_quiescence, empty, [PoolView("kv", "slot", 2, (1,))],
           {"lock": 1})
    # a slot freed twice (and so one missing): the free list itself is wrong, conservation
    # names the slot freed twice
    broken("conservation", check_quiescence, empty, [PoolView("kv", "slot", 2, (1, 1))],
           {"lock": 1})
    broken("quiescence", check_quiescence, empty, [full], {"lock": 2})


def _consistent_by_definition(pool, owners, borrowed):
    """What ``conservation._consistent`` decides, owner by owner (the old formulation)."""
    free = set(pool.free)
    if len(free) != len(pool.free) or free & set(pool.reserved):
        return False
    seen = set(free)
    for ids in owners.values():
        ids = set(ids)
        if seen & ids or ids & set(pool.reserved):
            return False
        seen |= ids
    if len(seen) != pool.capacity or (seen and (min(seen) < 1 or max(seen) > pool.capacity)):
        return False
    return all(not (free & set(ids)) for ids in (borrowed or {}).values())


def test_conservation_fast_path_is_the_per_owner_definition():
    """The one-union fast path gives the per-owner definition's verdict on random pools:
    partitions (clean or with one id moved, duplicated or out of range) and arbitrary lists;
    with ``held_once`` that verdict and no id twice in the first owners' lists."""
    import random

    from invariants.conservation import _consistent, consistent_lists, ids_1_to

    rnd = random.Random(0)
    clean = twice = 0
    for _ in range(20000):
        cap = rnd.randint(0, 8)
        ids = list(range(cap + 3))
        if rnd.random() < 0.5:
            perm = list(range(1, cap + 1))
            rnd.shuffle(perm)
            k = rnd.randint(0, cap)
            free, rest, owners = perm[:k], perm[k:], {}
            for o in range(rnd.randint(1, 3)):
                j = rnd.randint(0, len(rest))
                owners[o], rest = rest[:j], rest[j:]
            owners["last"] = rest + (rest[:1] if rnd.random() < 0.3 else [])
            if rnd.random() < 0.5:
                o = rnd.choice(list(owners))
                owners[o] = owners[o] + [rnd.choice(ids)]
        else:
            free = [rnd.choice(ids) for _ in range(rnd.randint(0, cap + 1))]
            owners = {o: [rnd.choice(ids) for _ in range(rnd.randint(0, 4))]
                      for o in range(rnd.randint(0, 3))}
        borrowed = rnd.choice([None, {}, {"b": [rnd.choice(ids)
                                                for _ in range(rnd.randint(0, 3))]}])
        pool = PoolView("p", "slot", cap, tuple(free), rnd.choice([(0,), (), (1,), (0, 2)]))
        want = _consistent_by_definition(pool, owners, borrowed)
        assert _consistent(pool, owners, borrowed) == want, (pool, owners, borrowed)
        if cap > 0 and not set(pool.reserved) & ids_1_to(cap):  # the pools' set comparison
            got = consistent_lists(free, cap, pool.reserved, list(owners.values()),
                                   list(borrowed.values()) if borrowed else None,
                                   ids_1_to(cap))
            assert got == want, (pool, owners, borrowed)
        # held_once: the first h owners (a tree's lists) together list no id twice as well
        h = rnd.randint(0, len(owners))
        tree = [i for o in list(owners.values())[:h] for i in o]
        once = want and len(set(tree)) == len(tree)
        got = consistent_lists(free, cap, pool.reserved, list(owners.values()),
                               list(borrowed.values()) if borrowed else None, None, h)
        assert got == once, (pool, owners, borrowed, h)
        clean += want
        twice += want and not once
    assert clean > 1000  # the clean case is exercised, not only the broken ones
    assert twice > 100  # and conserved states with an id twice in the tree


def test_quiescence_names_a_page_freed_twice_as_conservation():
    """After draining, a free list with every page but one of them twice is not a leak (no
    page is missing from the count of distinct ones): conservation names the page freed
    twice; an id that is no page of the pool likewise; a real leak stays quiescence."""
    from invariants.quiescence import check_quiescence

    tree = TreeView({0: NodeView(0, None, (), (), {"lock": 1})}, 0)
    twice = PoolView("kv", "page", 3, (1, 2, 3, 2))
    v = broken_with(lambda: check_quiescence(tree, [twice], {"lock": 1}))
    assert v.prop == "conservation" and "2" in v.message and "more than once" in v.message
    stray = PoolView("kv", "page", 3, (1, 2, 7))
    assert broken_with(lambda: check_quiescence(tree, [stray], {"lock": 1})).prop == \
        "conservation"
    leak = PoolView("kv", "page", 3, (1, 3))
    v = broken_with(lambda: check_quiescence(tree, [leak], {"lock": 1}))
    assert v.prop == "quiescence" and "1 leaked" in v.message
    check_quiescence(tree, [PoolView("kv", "page", 3, (3, 1, 2))], {"lock": 1})


def broken_with(fn):
    with pytest.raises(Violation) as err:
        fn()
    return err.value


def test_a_declared_pool_layout_is_honoured():
    """An allocator with 0-based ids and no padding slot (``caches.seam.ZERO_BASED``): id 0 is
    a slot like any other for conservation and quiescence, and an id past the end is not."""
    from caches.seam import ONE_BASED, ZERO_BASED
    from invariants import check_conservation, check_quiescence

    zero = ZERO_BASED.view("kv", "slot", 4, [0, 1])
    check_conservation(zero, {"tree": [2, 3]})
    tree = TreeView({0: NodeView(0, None, (), (), {"lock": 1})}, 0)
    check_quiescence(tree, [ZERO_BASED.view("kv", "slot", 4, [3, 2, 1, 0])], {"lock": 1})
    with pytest.raises(Violation) as err:  # 4 is no slot of a 0-based pool of 4
        check_conservation(ZERO_BASED.view("kv", "slot", 4, [1, 2, 3]), {"tree": [4]})
    assert err.value.prop == "conservation" and "out-of-range" in err.value.message
    with pytest.raises(Violation):  # the same ids, judged as a 1-based pool with padding 0
        check_conservation(ONE_BASED.view("kv", "slot", 4, [0, 1]), {"tree": [2, 3]})
    with pytest.raises(Violation) as err:
        check_quiescence(tree, [ZERO_BASED.view("kv", "slot", 4, [3, 2, 1])], {"lock": 1})
    assert "1 leaked" in err.value.message
