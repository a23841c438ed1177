"""The paged-bigpage fast verdict (``caches/subjects/paged_bigpage_fast.py``) against the full
view-based state checks, side by side after every step of random walks: clean, and with every
paged-bigpage fault, in every regime, and on states corrupted one condition at a time.  The two
must agree on every step -- the fast path passes exactly when the state checks do -- and the
faulty runs must reach failing steps on the fault's property (else the comparison proves
nothing)."""

from __future__ import annotations

import random

import pytest

from caches.faults import faults_of, get_fault
from caches.subjects.paged_bigpage import PagedBigPageSubject
from caches.subjects import paged_bigpage_fast as fast
from caches.subjects.paged_bigpage_fast import paged_bigpage_fast_ok
from invariants import Violation
from invariants.policy import check_victims, evictable_tokens, lightllm_key
from state_machines.native import run_walk
from state_machines.variants import all_variants
from tests.side_by_side import FastVerdictSuite, SideBySide, tree_nodes

SPEC = all_variants()["paged-bigpage"]
SBS = SideBySide(PagedBigPageSubject, paged_bigpage_fast_ok, SPEC)


class TestSideBySide(FastVerdictSuite):
    SBS = SBS
    FAULTS = faults_of("paged-bigpage")
    # the properties the state checks report (victim: the policy checks, always run)
    STATE_PROPS = {"structure", "eviction-set", "size-accounting", "ref-balance", "conservation"}


def test_the_fast_verdict_is_what_check_uses(monkeypatch):
    """The subject's own ``check`` takes the fast path, and builds the view only when it sees
    something wrong: a corrupted counter is still reported on its property."""
    s = SPEC.make_subject(SPEC.check_params(SPEC.regimes[1]))
    s.admit(1, [0, 0, 0, 0, 0])
    while s.requests[1].cur_kv_len < 5:
        s.prefill(1, 8)
    s.finish(1)

    def corrupt(s):
        s.cache.refed_tokens_num += 1

    SBS.assert_check_takes_fast_path(monkeypatch, s, corrupt, "size-accounting")


def test_a_cycle_is_a_structure_violation_not_a_hang():
    """A tree whose leaf lists the root as its child (a cycle) is reported on structure by the
    full checks -- their walk visits each node once -- after the fast verdict says no."""
    s = SPEC.make_subject(SPEC.check_params(SPEC.regimes[1]))
    s.admit(1, [0, 0, 0, 0, 0])
    while s.requests[1].cur_kv_len < 5:
        s.prefill(1, 8)
    s.finish(1)
    root = s.cache.root_node
    leaf = next(n for n in _all(s) if n is not root and not n.children)
    leaf.children[(9, 9)] = root
    from state_machines.deadline import deadline

    with deadline(10):  # (a walk that loops: Hang, a failure, not a stuck test)
        assert not paged_bigpage_fast_ok(s)
        with pytest.raises(Violation) as err:
            s.check()
    assert err.value.prop == "structure", err.value


# -- corrupted states: every condition of the fast path, not only what the faults break ---------
def _all(s):
    return tree_nodes(s.cache.root_node)


def _nodes(s):
    return [n for n in _all(s) if n is not s.cache.root_node]


def _bump(by, root=False):
    def corrupt(s, rnd):
        n = s.cache.root_node if root else rnd.choice(_nodes(s))
        n.ref_counter += by
    return corrupt


def _negative_ref(s, rnd):
    rnd.choice(_all(s)).ref_counter = -1


def _counter(name, by):
    def corrupt(s, rnd):
        setattr(s.cache, name, getattr(s.cache, name) + by)
    return corrupt


def _both_counters(s, rnd):  # the evictable part stays right, the total and refed do not
    s.cache.tree_total_tokens_num += s.P
    s.cache.refed_tokens_num += s.P


def _toggle(set_name, root=False):
    def corrupt(s, rnd):
        members = getattr(s.cache, set_name)
        n = s.cache.root_node if root else rnd.choice(_nodes(s))
        if n in members:
            del members[n]
        else:
            members[n] = n.get_compare_key() if set_name == "_evict_tree_set" else (n.time_id,)
    return corrupt


def _stale_key(set_name):
    def corrupt(s, rnd):
        members = getattr(s.cache, set_name)
        if not members:
            return _time(s, rnd)
        n = rnd.choice(list(members))
        k = members[n]
        members[n] = k[:-1] + (k[-1] + rnd.choice((-1, 1)),)
    return corrupt


def _time(s, rnd):  # a node's time moved without discard/add: stale in whichever set has it
    rnd.choice(_nodes(s)).time_id += 1000


def _rekey(s, rnd):  # one token of the edge changed: the chained hash no longer matches
    n = rnd.choice(_nodes(s))
    i = rnd.randrange(len(n.key))
    n.key = n.key[:i] + (n.key[i] + 1,) + n.key[i + 1:]


def _rehash(s, rnd):  # the node's own hash field no longer what the parent indexes it by
    n = rnd.choice(_nodes(s))
    n.page_hash = tuple(n.page_hash) + (7,)


def _reindex(s, rnd):  # the parent indexes the child under another hash
    n = rnd.choice(_nodes(s))
    p = n.parent
    h = next(k for k, c in p.children.items() if c is n)
    del p.children[h]
    p.children[tuple(h) + (7,)] = n


def _short_value(s, rnd):
    n = rnd.choice(_nodes(s))
    n.value = n.value[:-1]


def _short_both(s, rnd):  # key and value agree, but no page size
    n = rnd.choice(_nodes(s))
    n.key, n.value = n.key[:-1], n.value[:-1]


def _long_both(s, rnd):  # key and value agree (one small page grown to two): not a page
    n = rnd.choice(_nodes(s))
    n.key, n.value = tuple(n.key) + tuple(n.key[:s.P]), list(n.value) + list(n.value[:s.P])


def _prefix(s, rnd):
    rnd.choice(_nodes(s)).node_prefix_total_len += rnd.choice((-s.P, s.P, 1))


def _small_buffer(s, rnd):  # a small buffer appears or goes (the set is kept in step)
    n = rnd.choice(_nodes(s))
    c = s.cache
    c._discard_node(n)
    n.small_page_buffer_idx = None if n.small_page_buffer_idx is not None else \
        rnd.randrange(1, s.small.size + 1)
    c._add_node(n)


def _big_buffer(s, rnd):  # a big buffer appears (from the free list) or goes (to it)
    n = rnd.choice(_nodes(s))
    if n.big_page_buffer_idx is not None:
        s.big.free_slots.append(n.big_page_buffer_idx)
        n.big_page_buffer_idx = None
    elif s.big.free_slots:
        n.big_page_buffer_idx = s.big.free_slots.pop()
    else:
        n.big_page_buffer_idx = rnd.randrange(1, s.big.size + 1)


def _move_slot(s, rnd):  # one KV slot moved from one node's value to another's: the tree owns
    nodes = _nodes(s)   # the same slots and holds the same tokens, but two nodes are misshapen
    a, b = rnd.choice(nodes), rnd.choice(nodes)
    b.value = list(b.value) + [a.value[-1]]
    a.value = a.value[:-1]


def _add_child(s, rnd):
    """A well-formed leaf of one small page or one big page (fresh KV slots, a big buffer iff
    its prefix is a multiple of a big page, the counters and sets kept in step) added under a
    random node: wrong exactly when its size does not fit its prefix (a small page ending on
    a big boundary, or a big page ending off one)."""
    c = s.cache
    parent = rnd.choice(_all(s))
    k = rnd.choice((s.P, s.BT)) if s.BT <= 8 else s.P
    end = parent.node_prefix_total_len + k
    key = tuple(rnd.randrange(2) for _ in range(k))
    mine = () if parent is c.root_node else tuple(parent.page_hash)
    h = mine + key
    if h in parent.children or s.kv.available_size() < k or \
            (end % s.BT == 0 and not s.big.free_slots):
        return _move_slot(s, rnd)
    big = s.big.free_slots.pop() if end % s.BT == 0 else None
    c._discard_node(parent)
    child = c._add_child(parent, key, s.kv.alloc(k), h, 1 if k == s.P else s.N, big=big)
    c._add_node(parent)
    c._add_node(child)
    c.tree_total_tokens_num += k


def _set_twin(set_name):
    def corrupt(s, rnd):  # a second object with a member's id enters the set: the id twice
        members = getattr(s.cache, set_name)
        if not members:
            return _toggle(set_name)(s, rnd)
        n = rnd.choice(list(members))
        twin = type(n)(n.id, n.big_page_tokens, n.time_id)
        twin.node_prefix_total_len = n.node_prefix_total_len
        twin.small_page_buffer_idx = n.small_page_buffer_idx
        members[twin] = members[n]
    return corrupt


def _reparent(s, rnd):
    nodes = _nodes(s)
    rnd.choice(nodes).parent = rnd.choice(nodes + [s.cache.root_node, None])


def _unlink(s, rnd):
    n = rnd.choice(_nodes(s))
    p = n.parent
    del p.children[next(k for k, c in p.children.items() if c is n)]


def _relist(s, rnd):  # a node listed by a second parent too (not from its own subtree: no cycle)
    nodes = _nodes(s)
    n = rnd.choice(nodes)
    below, stack = set(), [n]
    while stack:
        x = stack.pop()
        below.add(id(x))
        stack.extend(x.children.values())
    others = [x for x in nodes + [s.cache.root_node] if id(x) not in below]
    if others:
        rnd.choice(others).children[(rnd.randrange(10**6),)] = n
    else:
        _reparent(s, rnd)


def _duplicate_id(s, rnd):
    nodes = _nodes(s)
    rnd.choice(nodes).id = rnd.choice(nodes + [s.cache.root_node]).id


def _hold_detached(s, rnd):  # a request holds a node outside the tree
    reqs = list(s.requests.values())
    if not reqs:
        return _bump(1)(s, rnd)
    n = rnd.choice(_nodes(s))
    rnd.choice(reqs).shared_kv_node = type(n)(n.id + 10**6, n.big_page_tokens, 0)


def _free_list(pool_name):
    def corrupt(s, rnd):
        pool = getattr(s, pool_name)
        free = pool.free_pages if hasattr(pool, "free_pages") else pool.free_slots
        size = pool.num_pages if hasattr(pool, "num_pages") else pool.size
        if free and rnd.random() < 0.5:
            free.pop(rnd.randrange(len(free)))  # a leak
        else:
            free.append(rnd.randrange(1, size + 1))  # a double owner, or freed twice
    return corrupt


def _borrow_free(s, rnd):  # a request reads (or owns) a slot that is free
    reqs = [r for r in s.requests.values() if r.slots]
    if not reqs or not s.kv.free_pages:
        return _free_list("kv")(s, rnd)
    req = rnd.choice(reqs)
    req.slots[rnd.randrange(len(req.slots))] = rnd.choice(s.kv.free_pages)


def _own_tree_slots(s, rnd):
    """A request's own KV slots (past its shared prefix) swapped for slots the tree holds, its
    own given back: every slot is still listed once by the free list and the tree, but the
    tree and the request now both hold some (the request's share must be counted)."""
    tree = [x for n in _nodes(s) for x in n.value]
    reqs = [r for r in s.requests.values() if r.cur_kv_len > r.shared_len()]
    if not reqs or not tree:
        return _borrow_free(s, rnd)
    req = rnd.choice(reqs)
    shared = req.shared_len()
    own = req.slots[shared:req.cur_kv_len]
    s.kv.free_pages.extend(own)
    req.slots[shared:req.cur_kv_len] = [rnd.choice(tree) for _ in own]


def _pending(s, rnd):  # a pending big id for a length outside what the request computed
    reqs = list(s.requests.values())
    if not reqs:
        return _free_list("big")(s, rnd)
    req = rnd.choice(reqs)
    length = rnd.choice((0, s.BT, 2 * s.BT, req.cur_kv_len + s.BT, req.cur_kv_len + 1,
                         s.P))
    bid = s.big.free_slots.pop() if s.big.free_slots else rnd.randrange(1, s.big.size + 1)
    req.linear_att_len_to_big_page_id[length] = bid


def _tail(s, rnd):  # a tail small buffer on a request that has not reached its cache length
    reqs = [r for r in s.requests.values() if r.tail_linear_att_small_page_buffer_id is None]
    if not reqs or not s.small.free_slots:
        return _free_list("small")(s, rnd)
    rnd.choice(reqs).tail_linear_att_small_page_buffer_id = s.small.free_slots.pop()


CORRUPTIONS = {
    "ref": _bump(1), "unref": _bump(-1), "root-ref": _bump(1, root=True),
    "root-unref": _bump(-1, root=True), "negative-ref": _negative_ref,
    "total": _counter("tree_total_tokens_num", 1), "refed": _counter("refed_tokens_num", -1),
    "both-counters": _both_counters,
    "evict-set": _toggle("_evict_tree_set"), "evict-set-root": _toggle("_evict_tree_set", True),
    "linear-set": _toggle("_evict_tree_set_for_linear_att"),
    "linear-set-root": _toggle("_evict_tree_set_for_linear_att", True),
    "stale-key": _stale_key("_evict_tree_set"),
    "stale-linear-key": _stale_key("_evict_tree_set_for_linear_att"), "time": _time,
    "rekey": _rekey, "rehash": _rehash, "reindex": _reindex, "short-value": _short_value,
    "short-both": _short_both, "long-both": _long_both, "prefix": _prefix,
    "small-buffer": _small_buffer, "big-buffer": _big_buffer, "move-slot": _move_slot,
    "add-child": _add_child, "evict-set-twin": _set_twin("_evict_tree_set"),
    "linear-set-twin": _set_twin("_evict_tree_set_for_linear_att"), "reparent": _reparent,
    "unlink": _unlink, "relist": _relist, "duplicate-id": _duplicate_id,
    "hold-detached": _hold_detached, "kv-free-list": _free_list("kv"),
    "small-free-list": _free_list("small"), "big-free-list": _free_list("big"),
    "borrow-free": _borrow_free, "own-tree-slots": _own_tree_slots, "pending": _pending,
    "tail": _tail,
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupted_states_get_the_same_verdict(monkeypatch, kind):
    """Walks in every regime; at a random step the state is corrupted in one way, then both
    checks judge it.  They must agree every time, and the corruption must break the state
    checks at least once (so the fast path's condition for it was exercised)."""
    seen = SBS.corrupted(monkeypatch, CORRUPTIONS[kind], random.Random(kind), _nodes)
    assert any(prop is not None for _, prop in seen), f"{kind} never broke the state check"


def _alias_slot(s, rnd):
    """One node's KV slot replaced by a slot another node already holds (its own freed, one no
    request borrows -- else conservation would see a borrowed slot free): every slot is still
    listed once by the free list and the tree's set, which ``check_conservation`` allows (an
    owner may list an id twice), but two positions of the tree now share one slot's KV --
    only ``check_held_once`` reports it, on conservation."""
    nodes = _nodes(s)
    a, b = rnd.choice(nodes), rnd.choice(nodes)
    i = rnd.randrange(len(b.value))
    lent = {x for r in s.requests.values() for x in r.slots[:r.shared_len()]}
    if a is b or a.value[-1] == b.value[i] or b.value[i] in lent:
        return
    s.kv.free_pages.append(b.value[i])
    b.value = list(b.value)
    b.value[i] = a.value[-1]


def _alias_buffer(kind):
    def corrupt(s, rnd):
        """One node's small (big) state buffer replaced by another node's (its own freed): two
        nodes restore from one buffer.  (The sets' keys do not read the buffer id.)"""
        field = f"{kind}_page_buffer_idx"
        holders = [n for n in _nodes(s) if getattr(n, field) is not None]
        if len(holders) < 2:
            return
        a, b = rnd.sample(holders, 2)
        getattr(s, kind).free_slots.append(getattr(b, field))
        setattr(b, field, getattr(a, field))
    return corrupt


ALIASES = {"kv-slot": _alias_slot, "small-buffer": _alias_buffer("small"),
           "big-buffer": _alias_buffer("big")}


@pytest.mark.parametrize("kind", sorted(ALIASES))
def test_an_id_aliased_within_the_tree_is_a_conservation_violation(monkeypatch, kind):
    """An id the tree holds at two positions (a KV slot, a small or a big buffer) is reported
    on conservation by the full check (``check_held_once``), and the fast verdict agrees on
    every such state (the agreement is asserted inside)."""
    seen = SBS.corrupted(monkeypatch, ALIASES[kind], random.Random(f"alias-{kind}"), _nodes)
    assert any(prop == "conservation" for _, prop in seen), \
        f"{kind}: the alias never broke conservation (saw {set(p for _, p in seen)})"


def _beside_holders(s) -> list:
    """The non-root nodes no live request holds, nor holds below (empty when none holds)."""
    held = [r.shared_kv_node for r in s.requests.values() if r.shared_kv_node is not None]
    on_paths = set()
    for n in held:
        while n is not None:
            on_paths.add(id(n))
            n = n.parent
    return [n for n in _nodes(s) if id(n) not in on_paths] if held else []


def _ref_beside_holder(s, rnd):
    """A ref on a node off every holder's path while some request does hold a node, its tokens
    counted as refed: the refs the holders explain are right and the counters agree, only
    the ref balance is wrong (one node more has a ref than the holders explain)."""
    n = rnd.choice(_beside_holders(s))
    n.ref_counter += 1
    if n.ref_counter == 1:
        s.cache.refed_tokens_num += len(n.value)


def test_a_ref_beside_the_held_paths_gets_the_same_verdict(monkeypatch):
    seen = SBS.corrupted(monkeypatch, _ref_beside_holder, random.Random("beside"),
                         _beside_holders)
    assert any(prop == "ref-balance" for _, prop in seen)


@pytest.mark.parametrize("regime", range(len(SPEC.regimes)))
def test_sound_sets_are_judged_without_the_by_id_fallback(monkeypatch, regime):
    """On clean walks the eviction sets are exactly the members and keys the fast path expects
    (its inlined ``get_compare_key`` and ``get_compare_key_for_buffer_idx`` are the methods'
    keys), so the by-id comparison -- there for states that are wrong, or right in a way only
    ids show -- is never needed: were the inlined keys off, every step would pay for it."""
    calls = []
    real = fast._sets_ok
    monkeypatch.setattr(fast, "_sets_ok", lambda *a: (calls.append(1), real(*a))[1])
    params = SPEC.check_params(SPEC.regimes[regime])
    for index in range(100):
        assert run_walk(SPEC, params, seed=7, index=index).violation is None
    assert calls == []


# -- the op-time read-offs that stand in for a view: the same numbers as the view's ----------
@pytest.mark.parametrize("regime", range(len(SPEC.regimes)))
def test_read_offs_equal_what_the_view_says(monkeypatch, regime):
    """``_evictable_tokens`` (the spurious-OOM check's evictable count) is
    ``evictable_tokens`` of the view, and ``_latest_time`` (the recency check's latest time
    before a match) the latest ``time_id`` of the nodes, on every call of random walks."""
    calls = {"evictable": 0, "latest": 0}
    evictable, latest = PagedBigPageSubject._evictable_tokens, PagedBigPageSubject._latest_time
    wrong = []  # (a failed assert inside an op would end the walk as a crash, not the test)

    def evictable_checked(s):
        got = evictable(s)
        if got != evictable_tokens(s.tree_view(), counter="ref"):
            wrong.append(("evictable", got))
        calls["evictable"] += 1
        return got

    def latest_checked(s):
        got = latest(s)
        if got != max(n.time_id for n in s._nodes()):
            wrong.append(("latest", got))
        calls["latest"] += 1
        return got

    monkeypatch.setattr(PagedBigPageSubject, "_evictable_tokens", evictable_checked)
    monkeypatch.setattr(PagedBigPageSubject, "_latest_time", latest_checked)
    params = SPEC.check_params(SPEC.regimes[regime])
    for index in range(150):
        assert run_walk(SPEC, params, seed=3, index=index).violation is None
    assert wrong == []
    assert calls["evictable"] > 20 and calls["latest"] > 100


def test_evictable_tokens_with_a_shared_id_is_the_views():
    """Two nodes sharing an id: the view keys nodes by id (one of them is left), so the count
    is the view's, not a sum over the nodes."""
    s = SPEC.make_subject(SPEC.check_params(SPEC.regimes[0]))
    for rid, prompt in ((1, [0, 0, 0, 0, 0]), (2, [1, 1, 1])):
        s.admit(rid, prompt)
        while s.requests[rid].cur_kv_len < len(prompt):
            s.prefill(rid, 8)
        s.finish(rid)
    nodes = _nodes(s)
    assert len(nodes) >= 3
    nodes[0].id = nodes[1].id
    assert s._evictable_tokens() == evictable_tokens(s.tree_view(), counter="ref")
    assert s._evictable_tokens() < sum(len(n.value) for n in nodes)


# -- the victim check's fast verdict against check_victims ----------------------------------
def _evict_events(monkeypatch, params, fault=None, walks=200):
    """The ``_evict`` policy events (view before, victims) of random walks."""
    events, check_policy = [], PagedBigPageSubject.check_policy

    def recording(s):
        events.extend((ev[2], list(ev[3])) for ev in s._policy_events if ev[0] == "evict")
        check_policy(s)

    monkeypatch.setattr(PagedBigPageSubject, "check_policy", recording)
    for index in range(walks):
        run_walk(SPEC, params, seed=13, index=index, fault=fault)
    monkeypatch.undo()
    return events


def _passes(view, victims) -> bool:
    try:
        check_victims(view, victims, lightllm_key, counter="ref")
    except Violation as v:
        assert v.prop == "victim"
        return False
    return True


def _variants(view, victims, rnd):
    """The victims as recorded, and changed: reordered, one dropped, a node of the view added
    (a leaf, an inner node, a held one, the root, one already gone), one not in the view."""
    ids = sorted(view.nodes)
    yield victims
    yield victims[::-1]
    if len(victims) > 1:
        yield victims[1:]
        yield victims[:1] + victims
    for _ in range(4):
        extra = list(victims)
        extra.insert(rnd.randrange(len(extra) + 1), rnd.choice(ids))
        yield extra
    yield [view.root] + victims
    yield victims + [max(ids) + 1]


@pytest.mark.parametrize("regime", range(len(SPEC.regimes)))
@pytest.mark.parametrize("fault", [None, "P5"])
def test_the_one_pass_victim_verdict_is_the_replay_on_paged_evictions(monkeypatch, regime,
                                                                     fault):
    """On every eviction of random walks (clean, and with P5's inverted key), and on the
    victims of each changed in the ways ``_variants`` lists, ``check_victims``' one-pass
    verdict says ok exactly when its replay passes (``invariants/policy.py``; the random views
    of ``tests/test_policy.py`` hold it to the replay too); a cascade entry (not a plain id) is
    left unjudged by both."""
    from invariants.policy import _replay_victims, _victims_pass

    def one_pass(view, vs):
        return _victims_pass(view, vs, lightllm_key, ("ref",), lambda n: True, False, True)

    def replay(view, vs):
        try:
            _replay_victims(view, vs, lightllm_key, ("ref",), lambda n: True, False, True, "x")
        except Violation as v:
            assert v.prop == "victim"
            return False
        return True

    params = SPEC.check_params({**SPEC.regimes[regime],
                                **(get_fault(fault).params if fault else {})})
    events = _evict_events(monkeypatch, params, fault)
    rnd = random.Random(regime)
    judged = []
    for view, victims in events:
        for vs in _variants(view, victims, rnd):
            fast_ok = one_pass(view, vs)
            assert fast_ok == replay(view, vs) == _passes(view, vs), (vs, view)
            judged.append(fast_ok)
    assert len(events) > 50 and any(judged) and not all(judged)
    if fault:  # the walks did evict against the declared key
        assert any(not _passes(view, victims) for view, victims in events)
