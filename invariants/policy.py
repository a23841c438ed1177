"""Policy properties: which node an eviction takes, when an allocation may fail, how much it may
evict, and what a hit refreshes.  The accounting properties (ref balance, conservation, sizes)
say nothing is lost; these say the cache spends its memory the way its engine declares, so that
a prefix which should have been kept is not silently recomputed.

Pure functions over plain data (a ``TreeView`` taken just before an eviction or allocation, node
ids, token counts, access times); each raises a ``Violation``:

* ``victim`` -- every node an eviction removes is, at the moment it goes, minimal under the
  variant's declared policy key among the nodes allowed to go (unlocked non-root leaves; a
  parent that becomes one during the eviction -- the cascade -- joins them).  The key is a
  function of a ``NodeView`` declared per variant (``lru_key``, ``lightllm_key``), read from
  the view and never from the cache under test.  Ties are allowed: any minimal node may go.
* ``spurious-oom`` -- an allocation that failed needed more than free + evictable at the
  cache's granularity (whole pages).
* ``over-eviction`` -- an allocation (or an explicit ``evict(n)``) evicted no more than its
  declared need: removing its last victim would have left the need unmet.  The leaf and page
  granularity is the only slack: the last victim may overshoot, an earlier one may not.
* ``recency`` -- a match refreshes every node of the matched path (root excluded) to a time
  later than any access time in the tree before the match, so the next victim is right.

The need of an allocation is declared per subject/target: ``shortfall_need`` (our reference
caches: evict exactly what is missing) or ``sglang_scheduler_need`` (SGLang's scheduler:
``evict_from_tree_cache`` asks for the whole extension, plus one page when paged, whenever the
allocator is short of that -- 0.5.12.post1's rule) or ``sglang_0523_scheduler_need`` (0.5.23:
the same request size, but only its shortfall is evicted).
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from .violation import fail
from .views import NodeView, TreeView

# -- declared policy keys (smaller goes first) ---------------------------------------------


def lru_key(node: NodeView) -> tuple:
    """LRU by last access time (SGLang ``LRUStrategy``, pymllm, the reference radix caches)."""
    return (node.extra["time"],)


def lightllm_key(node: NodeView) -> tuple:
    """LightLLM ``get_compare_key``: unreferenced first; among those, unusable small leaves (no
    state at that length) before usable ones (big pages, small pages with a buffer); then LRU.
    ``extra``: ``big`` (buffer id or None), ``small`` (buffer id or None), ``time``."""
    usable = 1 if (node.extra.get("big") is not None or
                   node.extra.get("small") is not None) else 0
    return (0 if node.refs.get("ref", 0) == 0 else 1, usable, node.extra["time"])


def tokenspeed_lru_key(node: NodeView) -> tuple:
    """TokenSpeed's prune and KV-eviction scan order: least recently used first, the deeper
    node first on a tie, then id.  ``extra``: ``time``, ``depth``."""
    return (node.extra["time"], -node.extra["depth"], node.id)


# -- declared allocation needs (tokens of whole pages) -----------------------------------------


def ceil_pages(n: int, page_size: int) -> int:
    """``n`` tokens rounded up to whole pages, in tokens."""
    return -(-n // page_size) * page_size


def shortfall_need(alloc_tokens: int, free_tokens: int) -> int:
    """Evict exactly what is missing: ``max(0, alloc - free)`` tokens."""
    return max(0, alloc_tokens - free_tokens)


def sglang_scheduler_need(extend_tokens: int, free_tokens: int, page_size: int) -> int:
    """SGLang's ``evict_from_tree_cache`` (mem_cache/common.py): when the allocator has fewer
    than ``extend + page`` (paged) / ``extend`` (page 1) tokens free, evict that many tokens --
    the whole request, not the shortfall; otherwise evict nothing."""
    want = extend_tokens + (page_size if page_size > 1 else 0)
    return want if free_tokens < want else 0


def sglang_0523_scheduler_need(extend_tokens: int, free_tokens: int, page_size: int) -> int:
    """SGLang 0.5.23's scheduler: only the *shortfall* of the request, ``max(0, extend + page
    - free)`` (page 1: ``max(0, extend - free)``).

    The request size is unchanged from 0.5.12 -- ``alloc_token_slots`` asks for ``extend``
    (mem_cache/allocation.py:152-157), ``alloc_paged_token_slots_extend`` for ``extend + page``
    per request (allocation.py:188-201, ``conservative_num_tokens``; the stock allocator's
    ``get_extend_allocation_demand`` returns it unchanged, allocator/base.py:144-153) -- but
    ``evict_from_tree_cache`` (mem_cache/common.py:283-289) now hands it to
    ``allocator.evict_to_free_tokens`` (allocator/base.py:155-169), which evicts only
    ``num_tokens - available_size()`` through ``tree_cache.evict_for_alloc`` (a second pass,
    ``_evict_until_allocatable``, common.py:292-318, runs only for a sharded allocator).
    ``UnifiedRadixCache.evict_for_alloc`` (unified_radix_cache.py:697-778) turns that
    shortfall into an availability target (free + shortfall) and stops at the first victim
    that meets it (``_evict_components``, 952-1058); ``BasePrefixCache.evict_for_alloc``
    (base_prefix_cache.py:518-538) forwards the shortfall to ``evict``."""
    want = extend_tokens + (page_size if page_size > 1 else 0)
    return max(0, want - free_tokens)


def evictable_tokens(tree: TreeView, counter: str = "lock") -> int:
    """Tokens an eviction could free: every non-root node nobody locks (a lock covers the path
    to the root, so an unlocked node's whole subtree is unlocked and goes leaf by leaf)."""
    return sum(len(n.value) for n in tree.nodes.values()
               if n.id != tree.root and n.refs.get(counter, 0) == 0)


# -- the properties --------------------------------------------------------------------------


def check_victims(tree: TreeView, victims: Sequence, key: Callable[[NodeView], tuple], *,
                  counter: str | tuple[str, ...] = "lock",
                  tier: str | Callable[[NodeView], bool] | None = None,
                  leaf_in_tree: bool = False, cascade_exposes: bool = True,
                  what: str = "eviction") -> None:
    """``tree``: the view just before the eviction; ``victims``: the node ids it removed, in
    order.  Replays the removals on the view: each victim must be an unlocked non-root leaf of
    what is left, with the smallest ``key`` among them (a parent left childless joins).

    ``tier``: only nodes with ``extra[tier]`` true count as present (``"device"`` for a two-tier
    cache: a victim leaves the tier, to host or out of the tree; a leaf = no child on the
    tier).  An entry ``(id, "cascade")`` is a removal the variant forces after a victim (a
    tombstone cascade): it leaves the replay without being judged as a choice.  With
    ``cascade_exposes=False`` (SGLang's HiMamba ``evict``: only the victim's own parent is
    pushed back on the heap) the ancestor a cascade leaves behind joins the candidates only at
    the next eviction call: a victim's parent rejoins only if it is an evictable leaf once the
    victim and its cascade are gone.

    ``tier`` may also be a predicate on the node (the host tier: evicted from device and backed
    up); ``counter`` a tuple of counters that must all be 0 (host and host-state refs).  With
    ``leaf_in_tree`` a leaf has no child left in the tree at all (the host tier, where a victim
    leaves the tree), not merely none on the tier.

    Most evictions pass: ``_victims_pass`` answers those with the leaves kept up to date, and
    the replay runs only when it says no."""
    on_tier = (tier if callable(tier) else
               (lambda n: True) if tier is None else (lambda n: bool(n.extra.get(tier))))
    counters = (counter,) if isinstance(counter, str) else tuple(counter)
    if _victims_pass(tree, victims, key, counters, on_tier, leaf_in_tree, cascade_exposes):
        return  # (the replay decides the same, and says why when it fails)
    _replay_victims(tree, victims, key, counters, on_tier, leaf_in_tree, cascade_exposes, what)


def _replay_victims(tree: TreeView, victims: Sequence, key, counters: tuple, on_tier,
                    leaf_in_tree: bool, cascade_exposes: bool, what: str) -> None:
    """``check_victims`` itself: the removals replayed on the view, the candidates worked
    out afresh at each victim, and the first victim that was not allowed to go reported."""
    nodes = tree.nodes
    present = {nid for nid, n in nodes.items() if on_tier(n)}
    alive = set(nodes)  # still in the tree (for leaf_in_tree)

    def locked(nid):
        return any(nodes[nid].refs.get(c, 0) for c in counters)

    def leaves():
        kids = alive if leaf_in_tree else present
        return {nid for nid in present if nid != tree.root and not locked(nid)
                and not any(c in kids for c in nodes[nid].children.values())}

    # without cascade_exposes, what the heap holds: the leaves at the start, and the parent of
    # each chosen victim (pushed back); an ancestor exposed by a cascade alone is not in it
    heap = None if cascade_exposes else leaves()
    step, pushed = 0, None

    def push_parent():
        # upstream pushes the victim's parent only if, once the victim and its cascade are
        # gone, that parent is itself an evictable leaf (a parent still holding a device child
        # is not pushed, and is not on the heap when a later cascade exposes it)
        if heap is not None and pushed is not None and pushed in leaves():
            heap.add(pushed)

    for entry in victims:
        if isinstance(entry, tuple):
            present.discard(entry[0])
            alive.discard(entry[0])
            continue
        push_parent()
        vid, step, pushed = entry, step + 1, None
        now = leaves()
        cands = sorted(now if heap is None else now & heap)
        if vid not in cands:
            why = ("not in the tree before the eviction" if vid not in nodes else
                   "the root" if vid == tree.root else
                   "already evicted" if vid not in present else
                   "locked" if locked(vid) else
                   "not a leaf" if vid not in now else
                   "exposed by a cascade, not back on the heap this call")
            fail("victim", f"{what}: victim #{step} node {vid} was not allowed to go ({why}); "
                 f"evictable leaves were {cands}", node=vid, step=step, candidates=cands)
        best = min(cands, key=lambda c: (key(nodes[c]), c))
        if key(nodes[vid]) > key(nodes[best]):
            fail("victim", f"{what}: victim #{step} node {vid} has key {key(nodes[vid])}, but "
                 f"node {best} with key {key(nodes[best])} was evictable and goes first under "
                 "the declared policy", node=vid, step=step, key=list(key(nodes[vid])),
                 better=best, better_key=list(key(nodes[best])))
        present.discard(vid)
        if leaf_in_tree:
            alive.discard(vid)
        pushed = nodes[vid].parent


def _victims_pass(tree: TreeView, victims: Sequence, key, counters: tuple, on_tier,
                  leaf_in_tree: bool, cascade_exposes: bool) -> bool:
    """True only when ``_replay_victims`` passes: the same replay, with the evictable leaves
    kept up to date instead of worked out again at every victim (taking a node out can change
    only the standing of the nodes that list it as a child) and each node's key computed once.
    A victim must be one of the candidates -- the evictable leaves of what is left (on the
    tier, not the root, no counter held, no child left on the tier, or with ``leaf_in_tree``
    in the tree), and without ``cascade_exposes`` also on the heap -- and no candidate may have
    a smaller key (the replay fails exactly then: the smallest, ties broken by id, sorts
    strictly before it).  Anything unusual (a key that cannot be computed, an id that cannot
    be looked up) is False: the replay decides, and says why."""
    try:
        nodes, root = tree.nodes, tree.root
        present = {nid for nid, n in nodes.items() if on_tier(n)}
        alive = set(nodes)
        kids = alive if leaf_in_tree else present

        def leaf(nid) -> bool:
            n = nodes[nid]
            return nid in present and nid != root and \
                not any(n.refs.get(c, 0) for c in counters) and \
                not any(c in kids for c in n.children.values())

        listed_by: dict = {}  # child id -> the nodes listing it (its parent, in a sound tree)
        for nid, n in nodes.items():
            for c in n.children.values():
                listed_by.setdefault(c, []).append(nid)

        def taken(nid) -> None:  # gone: a node that listed it may have become a leaf
            leaves.discard(nid)
            for p in listed_by.get(nid, ()):
                if leaf(p):
                    leaves.add(p)

        keys: dict = {}

        def key_of(nid):
            k = keys.get(nid)
            if k is None:
                k = keys[nid] = key(nodes[nid])
            return k

        leaves = set(filter(leaf, present))
        heap = None if cascade_exposes else set(leaves)
        pushed = None
        for entry in victims:
            if isinstance(entry, tuple):  # a cascade: out of the replay, not judged
                present.discard(entry[0])
                alive.discard(entry[0])
                taken(entry[0])
                continue
            if heap is not None and pushed is not None and pushed in leaves:
                heap.add(pushed)  # the victim's parent back on the heap, if now a leaf
            cands = leaves if heap is None else leaves & heap
            if entry not in cands:
                return False
            mine = key_of(entry)
            if any(key_of(c) < mine for c in cands):
                return False
            present.discard(entry)
            if leaf_in_tree:
                alive.discard(entry)
            taken(entry)
            pushed = nodes[entry].parent
        return True
    except Exception:  # noqa: BLE001 -- the replay raises it again, or says what is wrong
        return False


def check_state_victims(tree: TreeView, victims: Sequence,
                        key: Callable[[NodeView], tuple], *, what: str = "state eviction",
                        state: str = "mamba", state_lock: str = "mamba",
                        path_lock: str = "full") -> None:
    """The state component of a hybrid cache (SGLang ``evict_mamba``): each victim is the
    smallest-``key`` node holding a device state (``extra[state]``) that may give it up --
    not the root, ``refs[state_lock]`` 0, and either an inner node (it becomes a tombstone) or
    a leaf nobody path-locks (``refs[path_lock]`` 0; it leaves the device whole: to host when
    ``extra["backuped"]``, else out of the tree, which may force ``(id, "cascade")`` entries).
    There is no heap: every pick scans the whole LRU list, so nothing waits for a later call."""
    nodes = tree.nodes
    present = {nid for nid, n in nodes.items() if n.extra.get(state)}
    alive = set(nodes)

    def inner(nid):
        return any(c in alive for c in nodes[nid].children.values())

    def allowed(nid):
        n = nodes[nid]
        return (nid != tree.root and not n.refs.get(state_lock, 0)
                and (inner(nid) or not n.refs.get(path_lock, 0)))

    step = 0
    for entry in victims:
        if isinstance(entry, tuple):
            alive.discard(entry[0])
            present.discard(entry[0])
            continue
        vid, step = entry, step + 1
        cands = sorted(nid for nid in present if allowed(nid))
        if vid not in cands:
            why = ("not in the tree before the eviction" if vid not in nodes else
                   "the root" if vid == tree.root else
                   "holds no state" if vid not in present else
                   f"{state_lock}-locked" if nodes[vid].refs.get(state_lock, 0) else
                   f"a {path_lock}-locked leaf")
            fail("victim", f"{what}: victim #{step} node {vid} was not allowed to give up its "
                 f"state ({why}); candidates were {cands}", node=vid, step=step,
                 candidates=cands)
        best = min(cands, key=lambda c: (key(nodes[c]), c))
        if key(nodes[vid]) > key(nodes[best]):
            fail("victim", f"{what}: victim #{step} node {vid} has key {key(nodes[vid])}, but "
                 f"node {best} with key {key(nodes[best])} could give up its state and goes "
                 "first under the declared policy", node=vid, step=step,
                 key=list(key(nodes[vid])), better=best, better_key=list(key(nodes[best])))
        if not inner(vid) and not nodes[vid].extra.get("backuped"):
            alive.discard(vid)
        present.discard(vid)


def check_pick(what: str, chosen: int, candidates: Iterable[NodeView],
               key: Callable[[NodeView], tuple]) -> None:
    """One choice by a scan over a candidate list (TokenSpeed's one-step snapshot prune): the
    chosen node must be a candidate, and the smallest under the declared ``key``."""
    cands = sorted(candidates, key=lambda n: (key(n), n.id))
    ids = [n.id for n in cands]
    if chosen not in ids:
        fail("victim", f"{what}: node {chosen} was not allowed to go; the candidates were "
             f"{ids}", node=chosen, candidates=ids)
    best = cands[0]
    mine = next(n for n in cands if n.id == chosen)
    if key(mine) > key(best):
        fail("victim", f"{what}: node {chosen} has key {key(mine)}, but node {best.id} with key "
             f"{key(best)} was a candidate and goes first under the declared policy",
             node=chosen, key=list(key(mine)), better=best.id, better_key=list(key(best)))


def check_leaf_evictions(tree: TreeView, removed: Iterable[int], limit: int,
                         key: Callable[[NodeView], tuple],
                         allowed: Callable[[NodeView], bool], *,
                         what: str = "eviction") -> None:
    """An eviction that removes up to ``limit`` leaves, re-scanning after each (a parent left
    childless joins): replays the declared order on ``tree`` (the view before) and compares
    the set it removes with ``removed``.  ``allowed``: which leaves may go at all."""
    nodes, alive, expected = tree.nodes, set(tree.nodes), []
    for _ in range(limit):
        leaves = [n for nid, n in nodes.items() if nid in alive and nid != tree.root
                  and allowed(n) and not any(c in alive for c in n.children.values())]
        if not leaves:
            break
        pick = min(leaves, key=lambda n: (key(n), n.id))
        expected.append(pick.id)
        alive.discard(pick.id)
    removed = set(removed)
    if removed == set(expected):
        return
    kept = [nid for nid in expected if nid not in removed]
    extra = sorted(removed - set(expected))
    if kept and extra:
        k, x = nodes[kept[0]], extra[0]
        fail("victim", f"{what}: node {x} went, but node {k.id} with key {key(k)} goes first "
             f"under the declared policy (expected the order {expected})", node=x,
             better=k.id, better_key=list(key(k)), expected=expected, removed=sorted(removed))
    fail("victim", f"{what}: removed {sorted(removed)}, the declared policy removes "
         f"{expected}", expected=expected, removed=sorted(removed))


def with_cascades(victims: Sequence, size: Callable[[int], int]) -> list[tuple[int, int]]:
    """(victim id, tokens it freed with the cascade it forced) per chosen victim: the sizes
    ``check_no_over_eviction`` weighs (a forced cascade belongs to the victim that caused it)."""
    out: list[list] = []
    for entry in victims:
        if isinstance(entry, tuple):
            if out:
                out[-1][1] += size(entry[0])
            continue
        out.append([entry, size(entry)])
    return [(nid, n) for nid, n in out]


def check_no_spurious_oom(what: str, need: int, free: int, evictable: int,
                          unit: str = "tokens") -> None:
    """A failed allocation of ``need`` (whole pages) with ``free`` free and ``evictable`` that
    eviction could free: it must have needed more than both together."""
    if need <= free + evictable:
        fail("spurious-oom", f"{what}: reported out of memory for {need} {unit}, but free "
             f"{free} + evictable {evictable} = {free + evictable} covered it", need=need,
             free=free, evictable=evictable)


def check_no_over_eviction(what: str, need: int, victims: Sequence[tuple[int, int]],
                           unit: str = "tokens") -> None:
    """``victims``: (node id, size) in eviction order; ``need``: what the declared policy
    needed freed.  Every victim but the last left the need unmet (the last may overshoot by
    its own leaf/page granularity); with ``need <= 0`` nothing may go."""
    if not victims:
        return
    before_last = sum(size for _, size in victims[:-1])
    if before_last >= need:
        extra = [nid for nid, _ in victims[len(_enough(victims, need)):]]
        fail("over-eviction", f"{what}: needed {max(need, 0)} {unit} evicted, but evicted "
             f"{before_last + victims[-1][1]} in {len(victims)} node(s); node(s) {extra} went "
             f"after the need was met", need=need, evicted=before_last + victims[-1][1],
             victims=[nid for nid, _ in victims], extra=extra)


def _enough(victims, need):
    """The shortest prefix of ``victims`` that meets ``need`` (empty when need <= 0)."""
    total, out = 0, []
    for v in victims:
        if total >= need:
            break
        out.append(v)
        total += v[1]
    return out


def check_recency(what: str, before: Mapping[int, float] | float,
                  path: Iterable[tuple[int, float]]) -> None:
    """``before``: access times before the match (or their max); ``path``: (node id, access
    time right after the match) for each matched node below the root."""
    latest = before if isinstance(before, (int, float)) else max(before.values(), default=0)
    for nid, t in path:
        if t <= latest:
            fail("recency", f"{what}: matched node {nid} has access time {t}, not later than "
                 f"{latest} (the latest before the match): the hit did not refresh it",
                 node=nid, time=t, latest=latest)


# -- a free queue of blocks (vLLM's FreeKVCacheBlockQueue; variant block-hash) ---------------

def vllm_free_key(cached: bool, clock: int, pos: int) -> tuple:
    """vLLM's eviction order of a block that reached ref count 0 in free call ``clock`` as the
    ``pos``-th block of that call (a request's blocks go tail first): blocks without a hash
    go to the front, the latest call foremost (LIFO); cached blocks to the back in the order
    they were freed (LRU).  The initial queue is free call 0 in block-id order."""
    return (1, clock, pos) if cached else (0, -clock, pos)


def check_queue_order(queue: Sequence[int], keys: Mapping[int, tuple]) -> None:
    """``lru-order``: the free queue runs from the smallest declared key (the next block
    reused: evicted first) to the largest (the most recently freed cached block)."""
    for a, b in zip(queue, queue[1:]):
        if keys[a] > keys[b]:
            fail("lru-order", f"free queue has block {a} (key {keys[a]}) before block {b} "
                 f"(key {keys[b]}): {b} should be reused first under the declared order",
                 block=a, key=list(keys[a]), next=b, next_key=list(keys[b]))


def check_queue_victims(what: str, victims: Sequence[int], free: Sequence[int],
                        keys: Mapping[int, tuple]) -> None:
    """``victim``: an allocation of k blocks out of the free queue takes the k free blocks
    with the smallest declared keys (``free``: the queue's ids just before it)."""
    best = sorted(free, key=lambda b: (keys[b], b))[:len(victims)]
    for bid in victims:
        if bid not in free:
            fail("victim", f"{what}: block {bid} was not free", block=bid, free=list(free))
    worse = [b for b in victims if keys[b] > keys[best[-1]]] if best else []
    if worse:
        other = next(b for b in best if b not in victims)
        fail("victim", f"{what}: took block {worse[0]} (key {keys[worse[0]]}), but block "
             f"{other} (key {keys[other]}) was free and goes first (the LRU end)",
             block=worse[0], key=list(keys[worse[0]]), better=other,
             better_key=list(keys[other]))
