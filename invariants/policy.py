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
allocator is short of that).
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


def evictable_tokens(tree: TreeView, counter: str = "lock") -> int:
    """Tokens an eviction could free: every non-root node nobody locks (a lock covers the path
    to the root, so an unlocked node's whole subtree is unlocked and goes leaf by leaf)."""
    return sum(len(n.value) for n in tree.nodes.values()
               if n.id != tree.root and n.refs.get(counter, 0) == 0)


# -- the properties --------------------------------------------------------------------------


def check_victims(tree: TreeView, victims: Sequence, key: Callable[[NodeView], tuple], *,
                  counter: str = "lock", tier: str | None = None,
                  cascade_exposes: bool = True, what: str = "eviction") -> None:
    """``tree``: the view just before the eviction; ``victims``: the node ids it removed, in
    order.  Replays the removals on the view: each victim must be an unlocked non-root leaf of
    what is left, with the smallest ``key`` among them (a parent left childless joins).

    ``tier``: only nodes with ``extra[tier]`` true count as present (``"device"`` for a two-tier
    cache: a victim leaves the tier, to host or out of the tree; a leaf = no child on the
    tier).  An entry ``(id, "cascade")`` is a removal the variant forces after a victim (a
    tombstone cascade): it leaves the replay without being judged as a choice.  With
    ``cascade_exposes=False`` (SGLang's HiMamba ``evict``: only the victim's own parent is
    pushed back on the heap) the ancestor a cascade leaves behind joins the candidates only at
    the next eviction call."""
    nodes = tree.nodes
    present = {nid for nid, n in nodes.items() if tier is None or n.extra.get(tier)}

    def leaves():
        return {nid for nid in present if nid != tree.root
                and nodes[nid].refs.get(counter, 0) == 0
                and not any(c in present for c in nodes[nid].children.values())}

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
            continue
        push_parent()
        vid, step, pushed = entry, step + 1, None
        now = leaves()
        cands = sorted(now if heap is None else now & heap)
        if vid not in cands:
            why = ("not in the tree before the eviction" if vid not in nodes else
                   "the root" if vid == tree.root else
                   "already evicted" if vid not in present else
                   "locked" if nodes[vid].refs.get(counter, 0) else
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
        pushed = nodes[vid].parent


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
