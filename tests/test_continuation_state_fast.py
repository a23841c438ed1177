"""The continuation-state fast verdict (``caches/subjects/continuation_state_fast.py``) against
the full view-based state checks, side by side after every step of random walks: clean, and
with every continuation-state fault, in every regime.  The two must agree on every step -- the
fast path passes exactly when the state checks do -- and the faulty runs must reach failing
steps on the fault's property (else the comparison proves nothing)."""

from __future__ import annotations

import random

import pytest

from caches.continuation_state import Node
from caches.faults import faults_of
from caches.subjects.continuation_state import ContinuationStateSubject
from caches.subjects.continuation_state_fast import continuation_state_fast_ok
from state_machines.variants import all_variants
from tests.side_by_side import FastVerdictSuite, SideBySide

SPEC = all_variants()["continuation-state"]
SBS = SideBySide(ContinuationStateSubject, continuation_state_fast_ok, SPEC)


class TestSideBySide(FastVerdictSuite):
    SBS = SBS
    FAULTS = faults_of("continuation-state")
    # the properties the state checks report (the rest: the commit's postconditions, checked in
    # the op -- C1 is caught there, before its leak shows -- and the policy checks)
    STATE_PROPS = {"snapshot-placement", "ref-balance", "structure", "dangling-borrow",
                   "conservation", "data-integrity"}


def test_the_fast_verdict_is_what_check_uses(monkeypatch):
    """The subject's own ``check`` takes the fast path, and builds the view only when it sees
    something wrong: a corrupted ref is still reported on its property."""
    s = SPEC.make_subject(SPEC.check_params(SPEC.regimes[0]))
    s.admit(1, [1, 2, 3, 4, 5], 4)

    def corrupt(s):
        s.requests[1].node.devref += 1

    SBS.assert_check_takes_fast_path(monkeypatch, s, corrupt, "ref-balance")


# -- corrupted states: every condition of the fast path, not only what the faults break ---------
def _nodes(s):
    return [n for n in s.cache.nodes() if n is not s.cache.root]


def _snaps(s):
    return [n for n in _nodes(s) if n.snapshot is not None and n.snapshot.groups]


def _bump(field, by, root=False):
    def corrupt(s, rnd):
        n = s.cache.root if root else rnd.choice(_nodes(s))
        setattr(n, field, getattr(n, field) + by)
    return corrupt


def _prefix_len(s, rnd):
    snaps = [n for n in _nodes(s) if n.snapshot is not None]
    if snaps:
        rnd.choice(snaps).snapshot.prefix_len += s.L
    else:
        _rekey(s, rnd)


def _rekey(s, rnd):  # the parent still indexes it by its old key
    n = rnd.choice(_nodes(s))
    n.key = (n.key[0] + 1,) + tuple(n.key[1:])


def _long_key(s, rnd):  # an edge that is not whole L-blocks (on a node without a snapshot)
    n = rnd.choice([n for n in _nodes(s) if n.snapshot is None] or _nodes(s))
    n.key = tuple(n.key) + (0,)


def _two_blocks(s, rnd):  # a snapshot node's edge of two whole L-blocks (a split node)
    snaps = [n for n in _nodes(s) if n.snapshot is not None]
    n = rnd.choice(snaps or _nodes(s))
    n.key = tuple(n.key) + tuple(n.key[:s.L])


def _relist(s, rnd):  # a node listed by a second parent too, under its own key
    nodes = _nodes(s)
    n = rnd.choice(nodes)
    below, stack = set(), [n]  # not under a node of its own subtree: no cycle
    while stack:
        x = stack.pop()
        below.add(id(x))
        stack.extend(x.children.values())
    others = [x for x in nodes + [s.cache.root] if id(x) not in below and n.key not in x.children]
    if others:
        rnd.choice(others).children[n.key] = n
    else:
        _reparent(s, rnd)


def _cycle(s, rnd):  # a node listed again below itself (or by itself): a cyclic tree
    n = rnd.choice(_nodes(s))
    below, stack = [], [n]
    while stack:
        x = stack.pop()
        below.append(x)
        stack.extend(x.children.values())
    rnd.choice(below).children[n.key[:s.L]] = n


def _reparent(s, rnd):
    nodes = _nodes(s)
    rnd.choice(nodes).parent = rnd.choice(nodes + [s.cache.root, None])


def _unlink(s, rnd):
    n = rnd.choice(_nodes(s))
    n.parent.children.pop(n.key, None)


def _duplicate_id(s, rnd):
    nodes = _nodes(s)
    rnd.choice(nodes).id = rnd.choice(nodes + [s.cache.root]).id


def _free_list(s, rnd):
    pool = rnd.choice(list(s.pools.values()))
    free = pool.free_slots
    if free and rnd.random() < 0.5:
        free.pop(rnd.randrange(len(free)))  # a leak
    else:
        free.append(rnd.randrange(1, pool.size + 1))  # a double owner


def _segment_page(s, rnd):  # a snapshot page moved (or lost), or a page data overwritten
    snaps = _snaps(s)
    if not snaps:
        return _data(s, rnd)
    seg = rnd.choice(list(rnd.choice(snaps).snapshot.groups.values()))
    if seg.pages and rnd.random() < 0.5:
        seg.pages.pop()
    else:
        seg.pages.append(rnd.randrange(1, 9))


def _borrow(s, rnd):  # a table borrows a page no snapshot holds (or loses one it owned)
    tabs = [t for ts in s.cache.tables.values() for t in ts.values()]
    if not tabs:
        return _free_list(s, rnd)
    tab = rnd.choice(tabs)
    if tab.owned and rnd.random() < 0.5:
        tab.borrowed.append(tab.owned.pop())
    else:
        tab.borrowed.append(rnd.randrange(1, 9))


def _data(s, rnd):
    pool = rnd.choice(list(s.pools.values()))
    pool.data[rnd.randrange(1, len(pool.data))] += 1


def _table_data(s, rnd):  # a computed page a request's table owns reads back wrong
    pages = [(tab.pool, pid) for rid, tabs in s.cache.tables.items() for tab in tabs.values()
             for k, pid, borrowed in tab.entries()
             if not borrowed and rid in s.requests and (k + 1) * tab.P <= s.requests[rid].computed]
    if not pages:
        return _data(s, rnd)
    pool, pid = rnd.choice(pages)
    pool.data[pid] += 1


def _holder(s, rnd):  # a request moves its ref holder without moving the ref
    reqs = list(s.requests.values())
    if not reqs:
        return _bump("devref", 1)(s, rnd)
    rnd.choice(reqs).node = rnd.choice(_nodes(s) + [s.cache.root])


def _root_parent(s, rnd):  # the root gets a parent (in the tree or not)
    s.cache.root.parent = rnd.choice(_nodes(s) + [Node(10 ** 6, None, ())])


def _lost_holder(s, rnd):  # a request holds a node gone from the tree, its refs taken back
    reqs = list(s.requests.values())
    if not reqs:
        return _unlink(s, rnd)
    req = rnd.choice(reqs)
    (s.cache.unlock if req.active else s.cache.host_unlock)(req.node)
    req.node = Node(10 ** 6, None, ())


CORRUPTIONS = {
    "dev": _bump("devref", 1), "undev": _bump("devref", -1), "host": _bump("hostref", 1),
    "unhost": _bump("hostref", -1), "root-dev": _bump("devref", 1, root=True),
    "root-host": _bump("hostref", -1, root=True), "prefix-len": _prefix_len, "rekey": _rekey,
    "long-key": _long_key, "reparent": _reparent, "unlink": _unlink,
    "duplicate-id": _duplicate_id, "free-list": _free_list, "segment": _segment_page,
    "borrow": _borrow, "data": _data, "holder": _holder, "two-blocks": _two_blocks,
    "relist": _relist, "table-data": _table_data, "lost-holder": _lost_holder,
    "root-parent": _root_parent, "cycle": _cycle,
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupted_states_get_the_same_verdict(monkeypatch, kind):
    """Walks in every regime; at a random step the state is corrupted in one way, then both
    checks judge it.  They must agree every time, and the corruption must break the state
    checks at least once (so the fast path's condition for it was exercised)."""
    seen = SBS.corrupted(monkeypatch, CORRUPTIONS[kind], random.Random(kind), _nodes)
    assert any(prop is not None for _, prop in seen), f"{kind} never broke the state check"


def _aliasable(s) -> list:
    """(group, segment) of every snapshot segment of more than one page."""
    return [(gid, seg) for n in _snaps(s) for gid, seg in n.snapshot.groups.items()
            if len(seg.pages) > 1]


def _alias(checking):
    def corrupt(s, rnd):
        """One page of a snapshot segment replaced by another page of the same segment (its
        own freed, when no table borrows it -- else the borrow dangles): every page is still
        listed once by the free list and the segment's set, which conservation allows within
        one owner (two nodes sharing a page are two owners of it), but two positions of the
        tree now read one page -- ``check_held_once`` reports it, on conservation, before the
        read-backs see the page holds another position's data.  With ``checking`` off (no
        read-backs) only ``check_held_once`` can see it, in the fast verdict too."""
        gid, seg = rnd.choice(_aliasable(s))
        i, j = rnd.sample(range(len(seg.pages)), 2)
        if any(seg.pages[j] in tabs[gid].borrowed for tabs in s.cache.tables.values()):
            return
        s.pools[gid].free_slots.append(seg.pages[j])
        seg.pages[j] = seg.pages[i]
        s.checking = checking  # (the walk ends after this state is judged)
    return corrupt


@pytest.mark.parametrize("checking", [True, False])
def test_a_page_aliased_within_a_segment_is_a_conservation_violation(monkeypatch, checking):
    """A page the tree holds at two positions is reported on conservation by the full check,
    and the fast verdict agrees on every such state (asserted inside)."""
    # (150 walks: a segment the alias can take is rare -- 50 found none)
    seen = SBS.corrupted(monkeypatch, _alias(checking), random.Random("alias"), _aliasable,
                         walks=150)
    assert any(prop == "conservation" for _, prop in seen), \
        f"the alias never broke conservation (saw {set(p for _, p in seen)})"
