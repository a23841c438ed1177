"""The radix fast verdict (``caches/subjects/radix_fast.py``) against the full view-based state
checks, side by side after every step of random walks: clean, and with every radix fault, in
every regime.  The two must agree on every step -- the fast path passes exactly when the state
checks do -- and the faulty runs must reach failing steps on the fault's property (else the
comparison proves nothing)."""

from __future__ import annotations

import random

import pytest

from caches.faults import faults_of
from caches.subjects.radix import RadixSubject
from caches.subjects.radix_fast import radix_fast_ok
from state_machines.variants import all_variants
from tests.side_by_side import FastVerdictSuite, SideBySide, tree_nodes

SPEC = all_variants()["radix"]
SBS = SideBySide(RadixSubject, radix_fast_ok, SPEC)


class TestSideBySide(FastVerdictSuite):
    SBS = SBS
    # every radix fault but the hang (T1: an op that never returns, nothing to check after it)
    FAULTS = [f for f in faults_of("radix") if "hang" not in f.properties]
    # the properties the state checks report (the rest: the policy checks and the ops themselves)
    STATE_PROPS = {"size-accounting", "ref-balance", "structure", "eviction-set", "conservation"}


def test_the_fast_verdict_is_what_check_uses(monkeypatch):
    """The subject's own ``check`` takes the fast path, and builds the view only when it sees
    something wrong: a corrupted counter is still reported on its property."""
    s = RadixSubject()
    s.insert([1, 2, 3])

    def corrupt(s):
        s.cache.evictable_size_ += 1

    SBS.assert_check_takes_fast_path(monkeypatch, s, corrupt, "size-accounting")


# -- corrupted states: every condition of the fast path, not only what the faults break ---------
def _nodes(s):
    return tree_nodes(s.cache.root_node)[1:]


def _bump(by, root=False):
    def corrupt(s, rnd):
        n = s.cache.root_node if root else rnd.choice(_nodes(s))
        n.lock_ref += by
    return corrupt


def _counter(name, by):
    def corrupt(s, rnd):
        setattr(s.cache, name, getattr(s.cache, name) + by)
    return corrupt


def _shift(s, rnd):  # the sum stays right, the split does not
    s.cache.evictable_size_ += 1
    s.cache.protected_size_ -= 1


def _toggle_leaf(s, rnd):
    leaves = s.cache.evictable_leaves
    n = rnd.choice(_nodes(s))
    (leaves.discard if n in leaves else leaves.add)(n)


def _free_list(s, rnd):
    free = s.pool.free_pages
    if free and rnd.random() < 0.5:
        free.pop(rnd.randrange(len(free)))  # a leak
    else:
        free.append(rnd.randrange(1, s.pool.num_pages + 1))  # a double owner


def _shorten_value(s, rnd):
    n = rnd.choice(_nodes(s))
    n.value = n.value[:-1]


def _lengthen_key(s, rnd):  # the counters (value lengths) stay right, the shapes do not
    n = rnd.choice(_nodes(s))
    n.key = tuple(n.key) + (0,)


def _move_token(s, rnd):
    """One token (key and slot) moved from the end of a node to the end of another in the same
    lock state: the counters and the pool stay right, the keys may end inside a page."""
    nodes = _nodes(s)
    a = rnd.choice(nodes)
    others = [n for n in nodes if n is not a and (n.lock_ref > 0) == (a.lock_ref > 0)]
    if not others or len(a.key) < 2:
        return _lengthen_key(s, rnd)
    b = rnd.choice(others)
    b.key, b.value = tuple(b.key) + (a.key[-1],), list(b.value) + [a.value[-1]]
    a.key, a.value = a.key[:-1], a.value[:-1]


def _shorten_both(s, rnd):  # key and value agree, but may end inside a page
    n = rnd.choice(_nodes(s))
    n.key, n.value = n.key[:-1], n.value[:-1]


def _rekey(s, rnd):
    n = rnd.choice(_nodes(s))
    n.key = (n.key[0] + 1,) + tuple(n.key[1:]) if n.key else (0,)


def _empty_key(s, rnd):
    n = rnd.choice(_nodes(s))
    n.key, n.value = (), []


def _reparent(s, rnd):
    nodes = _nodes(s)
    n = rnd.choice(nodes)
    n.parent = rnd.choice(nodes + [s.cache.root_node, None])


def _unlink(s, rnd):
    n = rnd.choice(_nodes(s))
    n.parent.children.pop(next(k for k, c in n.parent.children.items() if c is n), None)


def _relist(s, rnd):  # a node listed under a second parent too
    nodes = _nodes(s)
    n, other = rnd.choice(nodes), rnd.choice(nodes + [s.cache.root_node])
    other.children[rnd.randrange(10**6, 2 * 10**6)] = n


def _lock_detached(s, rnd):
    n = rnd.choice(_nodes(s))
    s.locks[999] = type(n)(n.id + 10**6)


def _borrow_free(s, rnd):
    live = [r for r in s.requests.values() if r.kv_indices]
    if live and s.pool.free_pages:
        req = rnd.choice(live)
        page = rnd.choice(s.pool.free_pages)
        req.kv_indices[rnd.randrange(len(req.kv_indices))] = page * s.page_size
    else:
        _free_list(s, rnd)


def _duplicate_id(s, rnd):
    nodes = _nodes(s)
    n = rnd.choice(nodes)
    n.id = rnd.choice(nodes + [s.cache.root_node]).id


def _alias(s, rnd):  # one node's slot becomes another's (the slot it had goes back free):
    # every page still has one place, but two tree positions share one slot's KV
    held = [(n, i) for n in _nodes(s) for i in range(len(n.value))]
    if len(held) < 2:
        return _free_list(s, rnd)
    (a, i), (b, j) = rnd.sample(held, 2)
    if a.value[i] // s.page_size != b.value[j] // s.page_size:
        if s.page_size > 1:  # (the lost slot's page may still hold the node's other slots)
            b.value[j] = a.value[i]
            return
        s.pool.free_pages.append(b.value[j])
    b.value[j] = a.value[i]


CORRUPTIONS = {
    "lock": _bump(1), "unlock": _bump(-1), "root-lock": _bump(1, root=True),
    "root-unlock": _bump(-1, root=True),
    "evictable": _counter("evictable_size_", 1), "protected": _counter("protected_size_", -1),
    "split": _shift, "leaves": _toggle_leaf, "free-list": _free_list,
    "short-value": _shorten_value, "short-key": _shorten_both,
    "long-key": _lengthen_key, "move-token": _move_token, "rekey": _rekey,
    "empty-key": _empty_key, "reparent": _reparent, "unlink": _unlink, "relist": _relist,
    "lock-detached": _lock_detached, "borrow-free": _borrow_free, "duplicate-id": _duplicate_id,
    "alias": _alias,
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupted_states_get_the_same_verdict(monkeypatch, kind):
    """Walks in every regime; at a random step the state is corrupted in one way, then both
    checks judge it.  They must agree every time, and the corruption must break the state
    checks at least once (so the fast path's condition for it was exercised)."""
    seen = SBS.corrupted(monkeypatch, CORRUPTIONS[kind], random.Random(kind), _nodes)
    assert any(prop is not None for _, prop in seen), f"{kind} never broke the state check"
