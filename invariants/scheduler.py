"""Properties of a scheduler seen only through its public counters, plans and events.

For engines whose cache lives in compiled code (TokenSpeed's C++ scheduler): the views are
what the bindings hand out -- per-group page counters, the block tables of each forward batch,
the snapshot pool's free count, the KV events -- never the engine's internals.  Each function
is pure over plain data and raises a ``Violation`` naming the property:

* ``page-conservation`` -- per cache group: page ids in live requests' tables lie in
  ``[1, total)`` (0 is the null page), and the pages live requests hold (distinct ids, over all
  groups sharing one arena) plus the group's free pages never exceed the usable total (the
  rest is held by the prefix cache, which cannot be negative);
* ``no-shared-write`` -- a page a forward batch writes for one request (its History pages
  under the positions it computes, every State page) is in no other live request's table;
* ``snapshot-balance`` -- the snapshot pool's free blocks plus the blocks held by suspended
  requests' images equal its capacity;
* ``kv-event-balance`` -- a block hash is stored at most once while stored, removed only
  after being stored, removed at most once per store;
* ``request-tokens`` -- the tokens a forward batch feeds for a request are that request's
  sequence at those positions (a retraction/restore round trip keeps its tokens);
* ``sched-quiescence`` -- after draining: every page free, the snapshot pool full, no host
  pins, no request in any queue, every stored block removed.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from .violation import fail


def check_page_conservation(total: Mapping[str, int], available: Mapping[str, int],
                            tables: Mapping[str, Mapping[str, Sequence[int]]],
                            shared_arena: bool = True) -> int:
    """``total[g]`` pages of group ``g`` (page 0 the null page), ``available[g]`` free ones,
    ``tables[owner][g]`` the page ids each live request holds.  Returns the pages the cache
    itself holds (usable - free - live).  With ``shared_arena`` the groups draw from one pool
    (TokenSpeed: one LCM-block arena), so live pages are counted once over all groups."""
    live_all: set = set()
    for g, tot in total.items():
        live_g: dict = {}
        for owner, by_group in tables.items():
            for p in by_group.get(g, ()):
                if not 0 < p < tot:
                    fail("page-conservation", f"group {g}: {owner} holds page {p}, outside "
                         f"[1, {tot})", group=g, owner=owner, page=p, total=tot)
                live_g.setdefault(p, owner)
        free = available[g]
        if not 0 <= free <= tot - 1:
            fail("page-conservation", f"group {g}: {free} free pages of {tot - 1} usable",
                 group=g, free=free, total=tot)
        live_all |= set(live_g)
        if not shared_arena and len(live_g) + free > tot - 1:
            fail("page-conservation", f"group {g}: live requests hold {len(live_g)} pages and "
                 f"{free} are free, more than the {tot - 1} usable", group=g,
                 live=len(live_g), free=free, total=tot)
    if shared_arena and total:
        usable = min(total.values()) - 1
        free = min(available.values())
        if len(live_all) + free > usable:
            fail("page-conservation", f"live requests hold {len(live_all)} pages and {free} "
                 f"are free, more than the {usable} usable: a page is counted free while a "
                 "live request holds it", live=sorted(live_all), free=free, usable=usable)
        return usable - free - len(live_all)
    return 0


def check_no_shared_write(written: Mapping[str, Mapping[str, Iterable[int]]],
                          tables: Mapping[str, Mapping[str, Sequence[int]]]) -> None:
    """``written[owner][g]`` the pages a batch writes for ``owner``; no other live request may
    hold one of them in group ``g``'s table."""
    for owner, by_group in written.items():
        for g, pages in by_group.items():
            for p in pages:
                if p <= 0:
                    continue
                for other, theirs in tables.items():
                    if other != owner and p in theirs.get(g, ()):
                        fail("no-shared-write", f"group {g}: the batch writes page {p} for "
                             f"{owner}, which {other}'s table also holds", group=g, page=p,
                             writer=owner, holder=other)


def check_snapshot_balance(free: int, capacity: int, held: Mapping[str, int]) -> None:
    """``free`` blocks of the snapshot pool out of ``capacity``; ``held[owner]`` blocks each
    suspended request's image holds."""
    if free + sum(held.values()) != capacity:
        fail("snapshot-balance", f"snapshot pool: {free} free + {sum(held.values())} held by "
             f"images {dict(held)} != capacity {capacity}", free=free, held=dict(held),
             capacity=capacity)


def apply_kv_events(stored: dict, events: Iterable[tuple]) -> None:
    """Fold ``events`` (``("stored" | "removed", hash)``) into ``stored`` (hash -> True while
    stored) and check the balance on the way."""
    for kind, h in events:
        if kind == "stored":
            if stored.get(h):
                fail("kv-event-balance", f"block {h} stored twice without a removal between",
                     block=h)
            stored[h] = True
        elif kind == "removed":
            if h not in stored:
                fail("kv-event-balance", f"block {h} removed but never stored", block=h)
            if not stored[h]:
                fail("kv-event-balance", f"block {h} removed twice", block=h)
            stored[h] = False
        else:
            raise ValueError(f"unknown KV event kind {kind!r}")


def check_request_tokens(owner: str, start: int, fed: Sequence[int],
                         sequence: Sequence[int]) -> None:
    """A batch feeds ``fed`` for ``owner`` from position ``start``: they must be the request's
    ``sequence`` there."""
    want = list(sequence[start:start + len(fed)])
    if list(fed) != want:
        fail("request-tokens", f"{owner}: the batch feeds {list(fed)} at positions "
             f"[{start}, {start + len(fed)}), the request's tokens there are {want}",
             owner=owner, start=start, fed=list(fed), expected=want)


def check_sched_quiescence(total: Mapping[str, int], available: Mapping[str, int],
                           snapshot_free: int, snapshot_capacity: int, host_pinned: int,
                           queues: Mapping[str, int], stored: Mapping) -> None:
    """After draining every request and clearing the cache."""
    for g, tot in total.items():
        if available[g] != tot - 1:
            fail("sched-quiescence", f"group {g}: {tot - 1 - available[g]} page(s) still held "
                 f"after the drain ({available[g]} of {tot - 1} free)", group=g,
                 free=available[g], total=tot)
    if snapshot_free != snapshot_capacity:
        fail("sched-quiescence", f"snapshot pool: {snapshot_free} of {snapshot_capacity} "
             "blocks free after the drain", free=snapshot_free, capacity=snapshot_capacity)
    if host_pinned:
        fail("sched-quiescence", f"{host_pinned} host block(s) still pinned after the drain",
             pinned=host_pinned)
    busy = {k: v for k, v in queues.items() if v}
    if busy:
        fail("sched-quiescence", f"requests left after the drain: {busy}", queues=busy)
    left = sorted(h for h, on in stored.items() if on)
    if left:
        fail("sched-quiescence", f"{len(left)} stored block(s) never removed after the cache "
             "was cleared", blocks=left[:8])
