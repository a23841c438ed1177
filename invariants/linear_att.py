"""Invariants of a paged radix tree with linear-attention state buffers (LightLLM's
``LinearAttPagedRadixCache``).  Pure functions over plain views; each raises a ``Violation``:

* ``check_paged_structure`` -- property ``structure``: links agree both ways; a child is indexed
  by the chained hash of its prefix; a node holds one small page (``P`` tokens) or one big page
  (``P*N``); it is big iff its prefix length is a multiple of ``P*N``; a big node carries a
  big-page buffer and no small one; a small node carries no big-page buffer (so a small node
  never has a big child: that child's prefix would not be a multiple of ``P*N``).
  ``NodeView.extra`` must carry ``prefix``, ``hash`` (how its parent indexes it), ``small``
  and ``big`` (buffer ids or None).
* ``check_sort_keys`` -- property ``eviction-set``: a sorted set's members still sort by the
  key they entered with (a node mutated without ``discard``/``add`` sits at the wrong place).
* ``check_pending_buffers`` -- property ``conservation``: big-page buffers a request holds
  between prefill and insert are for lengths it has computed past its shared prefix; a tail
  small buffer only once the request reached its cache length.  A pending id outside that
  window will never be inserted nor freed (LightLLM IB 133's ``assert`` turned into a check).
* ``check_matched_tail`` -- property ``match-contract``: a match returns nothing, or a node that
  is a big page or holds a small buffer (a state snapshot exists at exactly that length), with
  the KV of its whole prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .views import TreeView
from .violation import fail


def check_paged_structure(tree: TreeView, page_size: int, big_page_num: int) -> None:
    P, BT = page_size, page_size * big_page_num
    prefix_tokens = {tree.root: ()}
    for node in tree.walk():  # parents before children
        mine = prefix_tokens.get(node.id, ())
        for h, cid in node.children.items():
            child = tree.nodes.get(cid)
            if child is None:
                fail("structure", f"node {node.id} lists child {cid}, which does not exist",
                     node=node.id, child=cid)
            if child.parent != node.id:
                fail("structure", f"node {cid} is a child of {node.id} but its parent is "
                     f"{child.parent}", node=cid, parent=child.parent, listed_by=node.id)
            prefix_tokens[cid] = mine + tuple(child.key)
            if child.extra.get("hash") != h or h != prefix_tokens[cid]:
                fail("structure", f"node {cid} is indexed under {node.id} by a hash that is "
                     "not the chained hash of its prefix", node=cid, parent=node.id)
        if node.id == tree.root:
            continue
        ex = node.extra
        parent = tree.nodes.get(node.parent)
        if parent is None or node.id not in parent.children.values():
            fail("structure", f"node {node.id}'s parent {node.parent} does not have it as a "
                 "child", node=node.id, parent=node.parent)
        n = len(node.key)
        if n != len(node.value) or n not in (P, BT):
            fail("structure", f"node {node.id}: key {n} tokens, value {len(node.value)} ids; "
                 f"a node holds one small page ({P}) or one big page ({BT})", node=node.id,
                 key=n, value=len(node.value))
        want_prefix = parent.extra.get("prefix", 0) + n
        if ex.get("prefix") != want_prefix:
            fail("structure", f"node {node.id}: prefix length {ex.get('prefix')}, expected "
                 f"{want_prefix}", node=node.id, prefix=ex.get("prefix"), expected=want_prefix)
        big = want_prefix % BT == 0
        if big and (n != BT or ex.get("big") is None or ex.get("small") is not None):
            fail("structure", f"node {node.id} at prefix {want_prefix} is a big-page node but "
                 f"holds {n} tokens, big buffer {ex.get('big')}, small buffer "
                 f"{ex.get('small')}", node=node.id, prefix=want_prefix)
        if not big and (n != P or ex.get("big") is not None):
            fail("structure", f"node {node.id} at prefix {want_prefix} is a small-page node "
                 f"but holds {n} tokens and big buffer {ex.get('big')}", node=node.id,
                 prefix=want_prefix)


def check_sort_keys(name: str, members: Mapping[int, tuple], current: Mapping[int, tuple]
                    ) -> None:
    """``members`` maps node id -> key it entered the set with; ``current`` its key now."""
    for nid, key in members.items():
        if nid in current and current[nid] != key:
            fail("eviction-set", f"{name}: node {nid} sorts by {key}, but its key is now "
                 f"{current[nid]} (mutated while in the set, without discard/add)", set=name,
                 node=nid, stored=list(key), current=list(current[nid]))


def check_pending_buffers(req: str, pending: Mapping[int, int], shared: int, cur_kv_len: int,
                          cache_len: int, big_page_tokens: int, tail: int | None) -> None:
    """``pending``: length -> big-page buffer id the request holds until it inserts."""
    for length, bid in sorted(pending.items()):
        if length % big_page_tokens or not shared < length <= min(cur_kv_len, cache_len):
            fail("conservation", f"{req} holds big-page buffer {bid} for length {length}, "
                 f"outside what it has computed past its shared prefix ({shared}, "
                 f"{min(cur_kv_len, cache_len)}]: it will never be inserted nor freed "
                 "(leaked)", request=req, id=bid, length=length, shared=shared,
                 cur_kv_len=cur_kv_len)
    if tail is not None and cur_kv_len < cache_len:
        fail("conservation", f"{req} holds tail small buffer {tail} but has computed only "
             f"{cur_kv_len} of its {cache_len} cached tokens", request=req, id=tail,
             cur_kv_len=cur_kv_len, cache_len=cache_len)


def check_matched_tail(key_len: int, node: int | None, length: int,
                       mem: Sequence[int] | None, *, big: bool = False,
                       small: int | None = None, prefix: int = 0,
                       path_value: Iterable[int] = ()) -> None:
    """One ``match_prefix`` result: ``node`` (id or None) returned with ``length``/``mem``;
    ``big``/``small``/``prefix`` describe that node, ``path_value`` the KV ids root..node."""
    if node is None:
        if length != 0 or mem:
            fail("match-contract", f"a miss returned length {length} and "
                 f"{len(mem or ())} KV ids", length=length)
        return
    if not big and small is None:
        fail("match-contract", f"match returned node {node}, a small page without a state "
             "buffer (an unusable tail: no linear state exists at that length)", node=node)
    if length != prefix or length > key_len:
        fail("match-contract", f"match of {key_len} tokens returned length {length} for node "
             f"{node} at prefix {prefix}", node=node, length=length, prefix=prefix,
             key_len=key_len)
    if list(mem or ()) != list(path_value):
        fail("match-contract", f"match returned KV ids that are not node {node}'s prefix "
             "path", node=node)
