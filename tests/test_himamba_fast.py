"""The himamba fast verdict (``caches/subjects/himamba_fast.py``) against the full state check,
side by side after every step of random walks: clean, and with every himamba fault, in every
regime.  The two must agree on every step -- the fast path passes exactly when ``check_state``
does -- and the faulty runs must reach failing steps (else the comparison proves nothing)."""

from __future__ import annotations

import pytest

from caches.faults import faults_of
from caches.subjects.himamba import HiMambaSubject
from caches.subjects.himamba_fast import himamba_fast_ok
from invariants import Violation
from state_machines.native import run_walk
from state_machines.variants import all_variants
from tests.side_by_side import CORRUPTED_WALKS

SPEC = all_variants()["himamba"]
WALKS = 300


def _judge(subject, seen) -> None:
    """Both verdicts on the subject's state, recorded as (fast ok, property the full check
    broke or None); then fails as the full check did (a tree the views cannot even be built
    from is recorded by its exception's name)."""
    fast = himamba_fast_ok(subject)
    try:
        subject.check_state()
    except Violation as v:
        seen.append((fast, v.prop))
        raise
    except Exception as exc:  # noqa: BLE001
        seen.append((fast, type(exc).__name__))
        raise Violation("crash", str(exc)) from exc
    seen.append((fast, None))


@pytest.fixture
def side_by_side(monkeypatch):
    """Every ``check`` computes both verdicts, records them, then fails as the full one did."""
    seen = []

    def check(self):
        _judge(self, seen)
        self.check_policy()

    monkeypatch.setattr(HiMambaSubject, "check", check)
    return seen


def _walks(params, fault, seen, walks=WALKS, until=None):
    """Run walks (at most ``walks``; with ``until``, stop once 3 steps broke one of those
    properties), then require the same verdict from both checks on every step."""
    for index in range(walks):
        run_walk(SPEC, params, seed=11, index=index, fault=fault)
        if until and sum(1 for _, prop in seen if prop in until) >= 3:
            break
    disagree = [(fast, prop) for fast, prop in seen if fast != (prop is None)]
    assert not disagree, f"fast and full verdicts differ on {len(disagree)} of {len(seen)} " \
                         f"steps, e.g. {disagree[:5]}"
    return [prop for _, prop in seen if prop is not None]


@pytest.mark.slow  # whole clean machine runs, both verdicts
@pytest.mark.parametrize("regime", range(len(SPEC.regimes)))
def test_clean_runs_agree_on_every_step(side_by_side, regime):
    params = SPEC.check_params(SPEC.regimes[regime])
    assert _walks(params, None, side_by_side) == []
    assert len(side_by_side) > 500  # the walks did run


# the faults whose property is a state check (victim: the policy checks; hit-count: checked
# inside the chunked insert itself; crash: the cache itself asserts, WB1)
STATE_FAULTS = [f for f in faults_of("himamba")
                if not {"victim", "hit-count", "crash"} & set(f.properties)]


@pytest.mark.parametrize("fault", STATE_FAULTS, ids=lambda f: f.id)
def test_faulty_runs_agree_on_every_step(side_by_side, fault):
    params = SPEC.check_params({**SPEC.regimes[0], **fault.params})
    failed = _walks(params, fault.id, side_by_side, walks=1000, until=set(fault.properties))
    assert set(fault.properties) & set(failed), \
        f"{fault.id}: the walks never broke {fault.properties} (broke {sorted(set(failed))})"


def test_the_fast_verdict_is_what_check_uses(monkeypatch):
    """The subject's own ``check`` takes the fast path, and falls back to the views only when it
    sees something wrong: a corrupted counter is still reported on its property."""
    calls = []
    real = HiMambaSubject.check_state
    monkeypatch.setattr(HiMambaSubject, "check_state",
                        lambda self: (calls.append(1), real(self))[1])
    s = HiMambaSubject()
    s.check()
    assert calls == []
    s.cache.full_evictable_size_ += 1
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "size-accounting" and calls == [1]


# -- corrupted states: every condition of the fast path, not only what the faults break ---------
def _nodes(s):
    out, stack = [], [s.cache.root_node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return [n for n in out if n is not s.cache.root_node]


def _bump(field, by):
    def corrupt(s, rnd):
        nodes = _nodes(s) + [s.cache.root_node]
        n = rnd.choice(nodes)
        setattr(n, field, getattr(n, field) + by)
    return corrupt


def _counter(name, by):
    def corrupt(s, rnd):
        setattr(s.cache, name, getattr(s.cache, name) + by)
    return corrupt


def _toggle_leaf_set(name):
    def corrupt(s, rnd):
        leaves = getattr(s.cache, name)
        n = rnd.choice(_nodes(s))
        (leaves.discard if n in leaves else leaves.add)(n)
    return corrupt


def _lru_time(s, rnd):
    n = rnd.choice(_nodes(s))
    n.last_access_time = rnd.randint(0, max(1, n.last_access_time + 2))


def _lru_tie(s, rnd):
    order = s.cache.full_lru.mru_first()
    if len(order) > 1:
        i = rnd.randrange(len(order) - 1)
        order[i].last_access_time = order[i + 1].last_access_time


def _shift(pair):
    def corrupt(s, rnd):  # the sum stays right, the split does not
        ev, pr = pair
        setattr(s.cache, ev, getattr(s.cache, ev) + 1)
        setattr(s.cache, pr, getattr(s.cache, pr) - 1)
    return corrupt


def _lru_drop(s, rnd):
    lru = rnd.choice([s.cache.full_lru, s.cache.mamba_lru, s.cache.host_mamba_lru])
    if lru.d:
        lru.d.pop(rnd.choice(list(lru.d)))


def _data(pool_name):
    def corrupt(s, rnd):
        pool = getattr(s, pool_name)
        pool.data[rnd.randrange(1, len(pool.data))] += 1
    return corrupt


def _free_list(pool_name):
    def corrupt(s, rnd):  # (the KV pools have no ``size``: each pool says its own capacity)
        free, capacity = getattr(s, pool_name).free_and_capacity()
        if free and rnd.random() < 0.5:
            free.pop(rnd.randrange(len(free)))  # a leak
        else:
            free.append(rnd.randrange(1, capacity + 1))  # a double owner
    return corrupt


def _free_swap(pool_name):
    def corrupt(s, rnd):  # a free entry becomes another id: as many listed, not the same ones
        free, capacity = getattr(s, pool_name).free_and_capacity()
        if free:
            free[rnd.randrange(len(free))] = rnd.randrange(1, capacity + 1)
    return corrupt


def _borrow_free(s, rnd):
    """A request's borrowed prefix names a free slot (nothing else changes)."""
    reqs = [r for r in s.requests.values() if r.cache_protected_len > 0]
    if reqs and s.kv.free_pages:
        req = rnd.choice(reqs)
        req.kv_indices[rnd.randrange(req.cache_protected_len)] = rnd.choice(s.kv.free_pages)


def _drop_state(field):
    def corrupt(s, rnd):
        n = rnd.choice(_nodes(s))
        setattr(n, field, None)
    return corrupt


def _rekey(s, rnd):
    n = rnd.choice(_nodes(s))
    n.key = (n.key[0] + 1,) + tuple(n.key[1:]) if n.key else (0,)


def _reparent(s, rnd):
    nodes = _nodes(s)
    n = rnd.choice(nodes)
    n.parent = rnd.choice(nodes + [s.cache.root_node])


def _unlink(s, rnd):
    n = rnd.choice(_nodes(s))
    n.parent.children.pop(n.key[0], None)


def _protect(s, rnd):
    n = rnd.choice(_nodes(s))
    s.prefetches[999] = {"node": n, "host": [], "mamba": None, "seq": [], "tail": []}


CORRUPTIONS = {
    "full-lock": _bump("full_lock_ref", 1), "full-unlock": _bump("full_lock_ref", -1),
    "mamba-lock": _bump("mamba_lock_ref", 1), "host-ref": _bump("host_ref_counter", 1),
    "host-mamba-ref": _bump("host_mamba_ref_counter", 1),
    "full-evictable": _counter("full_evictable_size_", 1),
    "full-protected": _counter("full_protected_size_", -1),
    "mamba-evictable": _counter("mamba_evictable_size_", -1),
    "mamba-protected": _counter("mamba_protected_size_", 1),
    "device-leaves": _toggle_leaf_set("evictable_full_device_leaves"),
    "host-leaves": _toggle_leaf_set("evictable_full_host_leaves"),
    "full-split": _shift(("full_evictable_size_", "full_protected_size_")),
    "mamba-split": _shift(("mamba_evictable_size_", "mamba_protected_size_")),
    "lru-time": _lru_time, "lru-tie": _lru_tie, "lru-drop": _lru_drop,
    "kv-data": _data("kv"), "mamba-data": _data("mamba"), "host-kv-data": _data("host_kv"),
    "host-mamba-data": _data("host_mamba"),
    "kv-free": _free_list("kv"), "mamba-free": _free_list("mamba"),
    "host-kv-free": _free_list("host_kv"), "host-mamba-free": _free_list("host_mamba"),
    "kv-free-swap": _free_swap("kv"), "mamba-free-swap": _free_swap("mamba"),
    "host-kv-free-swap": _free_swap("host_kv"),
    "host-mamba-free-swap": _free_swap("host_mamba"), "borrow-free": _borrow_free,
    "drop-mamba": _drop_state("mamba_value"), "drop-host-mamba": _drop_state("mamba_host_value"),
    "drop-host-kv": _drop_state("host_value"), "rekey": _rekey, "reparent": _reparent,
    "unlink": _unlink, "protect": _protect,
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupted_states_get_the_same_verdict(monkeypatch, kind):
    """Walks in every regime; at a random step the state is corrupted in one way, then both
    checks judge it.  They must agree every time, and the corruption must break the state
    check at least once (so the fast path's condition for it was exercised)."""
    import random

    seen = _judged_corruptions(monkeypatch, CORRUPTIONS[kind], random.Random(kind), kind)
    assert any(prop is not None for _, prop in seen), f"{kind} never broke the state check"


def _judged_corruptions(monkeypatch, corrupt, rnd, kind: str, checking=None) -> list:
    """Walks in every regime, each corrupted once by ``corrupt`` at a random step (read-backs
    set to ``checking`` unless None) and judged by both checks, which must agree on every
    such state; the (fast verdict, property) pairs."""
    seen = []

    def check(self):
        if _nodes(self) and rnd.random() < 0.3:
            corrupt(self, rnd)
            if checking is not None:
                self.checking = checking  # (the walk ends after this state is judged)
            _judge(self, seen)
            raise Violation("done", "corrupted once: end the walk")
        HiMambaSubject.check_state(self)
        self.check_policy()

    monkeypatch.setattr(HiMambaSubject, "check", check)
    for regime in SPEC.regimes:
        params = SPEC.check_params(regime)
        for index in range(CORRUPTED_WALKS):
            run_walk(SPEC, params, seed=5, index=index)
    disagree = [(fast, prop) for fast, prop in seen if fast != (prop is None)]
    assert not disagree, f"{kind}: fast and full verdicts differ on {len(disagree)} of " \
                         f"{len(seen)} corrupted states, e.g. {disagree[:5]}"
    return seen


def _alias_slot(value, pool_name):
    """One tree node's id in ``pool_name`` (an entry of its ``value`` list, or its state id)
    replaced by another node's (its own freed, unless a request borrows it -- then
    conservation would see a borrowed slot free): every id is still listed once by the free
    list and the tree's set, which conservation allows (an owner may list an id twice), but
    two positions of the tree now share one -- ``check_held_once`` reports it, before the
    read-backs see the data is another position's."""
    def held(s):
        out = []
        for n in _nodes(s):
            v = getattr(n, value)
            if isinstance(v, list):
                out += [(n, i) for i in range(len(v))]
            elif v is not None:
                out.append((n, None))
        return out

    def corrupt(s, rnd):
        spots = held(s)
        if len(spots) < 2:
            return
        (a, i), (b, j) = rnd.sample(spots, 2)
        get = (lambda n, k: getattr(n, value)[k]) if i is not None else \
            (lambda n, k: getattr(n, value))
        old, new = get(b, j), get(a, i)
        lent = {x for r in s.requests.values() for x in r.borrowed_indices} \
            if pool_name == "kv" else set()
        if old == new or old in lent:
            return
        getattr(s, pool_name).free_and_capacity()[0].append(old)
        if j is None:
            setattr(b, value, new)
        else:
            getattr(b, value)[j] = new
    return corrupt


ALIASES = {"kv": _alias_slot("value", "kv"), "mamba": _alias_slot("mamba_value", "mamba"),
           "host-kv": _alias_slot("host_value", "host_kv"),
           "host-mamba": _alias_slot("mamba_host_value", "host_mamba")}


@pytest.mark.parametrize("checking", [True, False])
@pytest.mark.parametrize("kind", sorted(ALIASES))
def test_an_id_aliased_within_the_tree_is_a_conservation_violation(monkeypatch, kind,
                                                                    checking):
    """An id the tree holds at two positions, in each of the four pools, is reported on
    conservation by ``check_state``, and the fast verdict agrees on every such state; with
    ``checking`` off (no read-backs) only ``check_held_once`` can see it, in the fast verdict
    too."""
    import random

    seen = _judged_corruptions(monkeypatch, ALIASES[kind], random.Random(f"alias-{kind}"),
                               kind, checking)
    assert any(prop == "conservation" for _, prop in seen), \
        f"{kind}: the alias never broke conservation (saw {set(p for _, p in seen)})"


# -- the cheaper stand-ins for views outside the state check ---------------------------------
def test_device_tokens_match_the_full_view(monkeypatch):
    """An allocation's policy check reads ``_device_tokens()`` instead of the ``full`` view:
    after every step of walks in every regime it must say what the view says (each node's
    device tokens, and ``evictable_tokens``), locked nodes and evicted ones included."""
    from invariants.policy import evictable_tokens

    compared, differ = [], []

    def check(self):  # (a walk records what a check raises: the differences are kept here)
        view = self.tree_view("full")
        want = ({nid: len(n.value) for nid, n in view.nodes.items()},
                evictable_tokens(view, "full"))
        if self._device_tokens() != want:
            differ.append((self._device_tokens(), want))
        compared.append(want[1])
        HiMambaSubject.check_state(self)
        self.check_policy()

    monkeypatch.setattr(HiMambaSubject, "check", check)
    for regime in SPEC.regimes:
        for index in range(60):
            run_walk(SPEC, SPEC.check_params(regime), seed=3, index=index)
    assert not differ, f"{len(differ)} of {len(compared)} steps differ, e.g. {differ[:2]}"
    assert len(compared) > 500 and any(compared) and 0 in compared


def _drained(index):
    s = HiMambaSubject()
    for rid, tokens in enumerate(([1, 2, 3], [1, 2, 4, 5], [7, 8])[index % 2:][:2]):
        s.admit(rid, tokens)
        s.prefill(rid, max(1, len(tokens) - index % 3))
    s.drain()
    return s


def _quiescent_free(pool_name, how):
    def corrupt(s, rnd):
        free, capacity = getattr(s, pool_name).free_and_capacity()
        if how == "leak":
            free.pop(rnd.randrange(len(free)))
        elif how == "twice":  # freed twice
            free.append(rnd.randrange(1, capacity + 1))
        elif len(free) > 1:  # one unit listed twice, another missing: the count still right
            i, j = rnd.sample(range(len(free)), 2)
            free[i] = free[j]
    return corrupt


def _leftover_child(s, rnd):
    from caches.himamba import Node

    child = Node(999, 0)
    child.parent, child.key = s.cache.root_node, (42,)
    s.cache.root_node.children[42] = child


QUIESCENT_CORRUPTIONS = {
    **{f"{name}-{how}": _quiescent_free(name, how)
       for name in ("kv", "mamba", "host_kv", "host_mamba") for how in ("leak", "twice", "swap")},
    "root-full": lambda s, rnd: setattr(s.cache.root_node, "full_lock_ref", 2),
    "root-mamba": lambda s, rnd: setattr(s.cache.root_node, "mamba_lock_ref", 0),
    "child": _leftover_child,
}


@pytest.mark.parametrize("kind", sorted(QUIESCENT_CORRUPTIONS) + [None])
def test_check_quiescent_agrees_with_the_views(kind):
    """``check_quiescent`` answers from the live cache and pools when all is well; on a drained
    cache corrupted in each way it must fail exactly as ``check_quiescence`` on the views."""
    import random

    from invariants import check_quiescence

    rnd = random.Random(kind)
    for index in range(8):
        s = _drained(index)
        if kind is not None:
            QUIESCENT_CORRUPTIONS[kind](s, rnd)
        try:
            check_quiescence(s.tree_view(), [p.view() for p in (s.kv, s.mamba, s.host_kv,
                                                                 s.host_mamba)],
                             {"full": 1, "mamba": 1})
            want = None
        except Violation as v:
            want = v.prop
        try:
            s.check_quiescent()
            got = None
        except Violation as v:
            got = v.prop
        assert got == want
        assert (want is None) == (kind is None), f"{kind} left a quiescent state"


def _one_pass(tree, victims, key, *, counter, tier, leaf_in_tree=False, cascade_exposes=True):
    """``check_victims``' fast verdict (``invariants.policy._victims_pass``) with its arguments
    as the subject passes them."""
    from invariants.policy import _victims_pass

    counters = (counter,) if isinstance(counter, str) else tuple(counter)
    on_tier = tier if callable(tier) else (lambda n: bool(n.extra.get(tier)))
    return _victims_pass(tree, victims, key, counters, on_tier, leaf_in_tree, cascade_exposes)


def _replay(tree, victims, key, *, counter, tier, leaf_in_tree=False, cascade_exposes=True,
            what="x"):
    from invariants.policy import _replay_victims

    counters = (counter,) if isinstance(counter, str) else tuple(counter)
    on_tier = tier if callable(tier) else (lambda n: bool(n.extra.get(tier)))
    _replay_victims(tree, victims, key, counters, on_tier, leaf_in_tree, cascade_exposes, what)


def test_the_one_pass_victim_verdict_is_the_replay_on_himamba_evictions(monkeypatch):
    """``check_victims``' fast verdict against its replay on every device and host eviction of
    walks in every regime and with the victim faults (the host tier: leaves in the tree, the
    heap of ``cascade_exposes=False``), on the victims as recorded and on orders a wrong
    policy could have taken (reversed, shuffled, the first one skipped, a random node first):
    the same verdict every time."""
    import random

    import caches.subjects.himamba as subject_module

    real, rnd, seen, tiers = subject_module.check_victims, random.Random(7), [], set()

    def judged(tree, victims, key, *, what, **kw):
        victims = list(victims)
        tiers.add(str(kw["tier"]))
        orders = [victims]
        if len(victims) > 1:
            orders += [victims[::-1], rnd.sample(victims, len(victims)), victims[1:]]
        orders.append([rnd.choice(list(tree.nodes))] + victims)
        for order in orders:
            try:
                _replay(tree, order, key, what=what, **kw)
                full = True
            except Violation:
                full = False
            seen.append((_one_pass(tree, order, key, **kw), full))
        real(tree, victims, key, what=what, **kw)  # the walk goes on as the real check says

    monkeypatch.setattr(subject_module, "check_victims", judged)
    for regime in SPEC.regimes:
        for index in range(100):
            run_walk(SPEC, SPEC.check_params(regime), seed=9, index=index)
    for fault in faults_of("himamba"):
        if "victim" in fault.properties:
            params = SPEC.check_params({**SPEC.regimes[0], **fault.params})
            for index in range(100):
                run_walk(SPEC, params, seed=9, index=index, fault=fault.id)
    disagree = [(fast, full) for fast, full in seen if fast != full]
    assert not disagree, f"{len(disagree)} of {len(seen)} evictions judged differently"
    assert len(tiers) == 2 and {True, False} <= {full for _, full in seen}


def test_a_host_node_above_a_device_child_is_no_host_leaf():
    """On the host tier a leaf has no child left in the tree at all (``leaf_in_tree``), not
    merely none on host: a host node above a device node may not go first -- by the replay
    and by the fast verdict."""
    from caches.subjects.himamba import on_host
    from invariants import NodeView, TreeView
    from invariants.policy import check_victims, lru_key

    def node(nid, parent, kids, device, time):
        refs = {"full": 0, "mamba": 0, "host": 0, "host_mamba": 0}
        return NodeView(nid, parent, (nid,), (nid,), refs, kids,
                        {"device": device, "backuped": True, "time": time})

    tree = TreeView({0: node(0, None, {1: 1, 3: 3}, True, 0), 1: node(1, 0, {2: 2}, False, 1),
                     2: node(2, 1, {}, True, 2), 3: node(3, 0, {}, False, 3)}, 0, 1)
    kw = dict(counter=("host", "host_mamba"), tier=on_host, leaf_in_tree=True,
              cascade_exposes=False)
    with pytest.raises(Violation):
        check_victims(tree, [1], lru_key, **kw)
    assert not _one_pass(tree, [1], lru_key, **kw)
    check_victims(tree, [3], lru_key, **kw)
    assert _one_pass(tree, [3], lru_key, **kw)
