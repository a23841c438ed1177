"""The paged-bigpage subject's fast verdict: every state check of ``PagedBigPageSubject.check``
answered in one walk of the live tree, without building a ``TreeView``.

``paged_bigpage_fast_ok(subject)`` returns True only when every state check ``check`` runs
would pass: the paged structure (links both ways, chained hashes, page sizes, prefix lengths,
big/small shape and buffers), both eviction sets and their stored sort keys, the size
accounting of ``tree_total_tokens_num`` / ``refed_tokens_num``, ref balance (the root counts
its holders on top of its baseline 1), every live request's pending buffers, and conservation
of the three pools (KV slots, small and big state buffers), each id the tree holds at one
position only.  Anything else -- a check that
would fail, or a tree too broken to walk -- returns False, and the subject then builds the view
and runs the checks themselves, which find the violation and say it with the node and the
numbers.  So the fast path decides nothing on its own: it only skips building the view on the
(overwhelmingly common) steps where nothing is wrong.  The policy checks are not part of it:
they read what the op recorded and forget it, and the subject always runs them.

Each condition here restates one pure check of ``invariants/`` over the same node fields
``PagedBigPageSubject.tree_view`` reads (id, parent's id, key, value, ``ref_counter``,
``page_hash``, ``node_prefix_total_len``, both buffer ids, the children);
``tests/test_paged_bigpage_fast.py`` runs both side by side after every step of random runs,
clean and with every paged-bigpage fault, and on states corrupted one condition at a time, and
requires the same verdict.
"""

from __future__ import annotations

from caches.paged_bigpage import PagedNode
from caches.subjects.fast_refs import add_path_refs
from invariants.conservation import _consistent


def paged_bigpage_fast_ok(s) -> bool:
    """True when every state check of ``s.check()`` passes (see the module doc)."""
    try:
        return _ok(s)
    except Exception:  # noqa: BLE001 -- a tree too broken to walk: the full check says why
        return False


def _ok(s) -> bool:  # noqa: C901 -- one pass on purpose: that is the point of this module
    c = s.cache
    P, BT = s.P, s.BT
    root = c.root_node
    rid = root.id
    # the walk.  The view keys nodes by id; a node reached twice (listed by two parents, or
    # twice by one) or two nodes sharing an id always break check_paged_structure there (a
    # child names one parent, and is indexed by one hash), so both just say "not ok" here
    by_id = {rid: root}
    stack = [root]
    total = locked = nonzero = 0  # nonzero: the non-root nodes whose ref is not 0
    # every id of each pool, free or owned (conservation): the free list, then the tree's,
    # then the requests'
    kv_all, small_all, big_all = list(s.kv.free_pages), list(s.small.free_slots), \
        list(s.big.free_slots)
    kv_all += root.value
    # what each eviction set should be, member -> the sort key it should have stored: every
    # non-root leaf with ``get_compare_key()``, every small-buffer holder with
    # ``get_compare_key_for_buffer_idx()`` (both inlined for a plain ``PagedNode``; a node of
    # another class -- a fault's -- is asked)
    leaf_keys, small_keys = {}, {}
    if root.small_page_buffer_idx is not None:
        small_all.append(root.small_page_buffer_idx)
        small_keys[root] = (root.time_id,) if root.__class__ is PagedNode else \
            root.get_compare_key_for_buffer_idx()
    if root.big_page_buffer_idx is not None:
        big_all.append(root.big_page_buffer_idx)
    # (not restated, being implied by what is: check_ref_balance's "no ref negative" -- every
    # ref must equal a count of holders, the root's 1 + one; check_size_accounting's "no
    # counter negative" -- refed equals the referenced tokens, and the total the tokens, which
    # are at least as many; check_paged_structure's "one small page or one big page" -- the
    # big and small shapes below each demand one of the two)
    while stack:
        n = stack.pop()
        nid = n.id
        # check_paged_structure's prefix tokens of ``n``: the root's are none; any other
        # node's are its own hash, which its parent's turn found equal to them
        mine = n.page_hash if n is not root else ()
        pp = n.node_prefix_total_len
        # check_paged_structure, the links down: each listed child names this node as its
        # parent and is indexed by the chained hash (the prefix tokens) of its own prefix
        for h, ch in n.children.items():
            cid = ch.id
            if cid in by_id:
                return False
            parent = ch.parent
            if parent is not n and (parent is None or parent.id != nid):
                return False
            key = ch.key
            if ch.page_hash != h or h != mine + (key if key.__class__ is tuple else tuple(key)):
                return False
            # the child's own shape (the link up is implied: it is here only because this
            # node lists it, and it names this node's id as its parent)
            k = len(key)
            value = ch.value
            if k != len(value):
                return False
            want = pp + k
            if ch.node_prefix_total_len != want:
                return False
            small, big = ch.small_page_buffer_idx, ch.big_page_buffer_idx
            if want % BT == 0:
                if k != BT or big is None or small is not None:
                    return False
            elif k != P or big is not None:
                return False
            # check_size_accounting: the tokens in the tree and the referenced ones
            total += k
            ref = ch.ref_counter
            if ref:
                nonzero += 1
                if ref > 0:
                    locked += k
            kv_all += value
            if small is not None:
                small_all.append(small)
                small_keys[ch] = (ch.time_id,) if ch.__class__ is PagedNode else \
                    ch.get_compare_key_for_buffer_idx()
            if big is not None:
                big_all.append(big)
            if not ch.children:
                if ch.__class__ is PagedNode:  # get_compare_key, ``want`` being its prefix
                    leaf_keys[ch] = (0 if ref == 0 else 1, 1 if (
                        want % ch.big_page_tokens == 0 or small is not None) else 0,
                        ch.time_id)
                else:
                    leaf_keys[ch] = ch.get_compare_key()
            by_id[cid] = ch
            stack.append(ch)
    refed = c.refed_tokens_num
    if c.tree_total_tokens_num != total or refed != locked:
        return False
    # check_eviction_set and check_sort_keys: at once when each set is exactly its expected
    # members with their keys (node objects are distinct tree nodes, so their ids are too);
    # otherwise by ids, as the view-based checks compare
    tree_set, lin_set = c._evict_tree_set, c._evict_tree_set_for_linear_att
    if (tree_set != leaf_keys or lin_set != small_keys) and not _sets_ok(
            tree_set, lin_set, {n.id for n in leaf_keys}, {n.id for n in small_keys}):
        return False
    # each live request: check_pending_buffers, the node it holds (held_locks), and its share
    # of the three pools (its own KV past the shared prefix, the prefix it borrows, its tail
    # small buffer, its pending big buffers); a request holding nothing owns nothing
    held = {}
    borrowed = []
    for req in s.requests.values():
        node, cur, pending = req.shared_kv_node, req.cur_kv_len, req.linear_att_len_to_big_page_id
        if node is None:  # req.shared_len(), inline
            if not cur and not pending and req.tail_linear_att_small_page_buffer_id is None:
                continue  # holds nothing (not started, or paused)
            shared = 0
        else:
            shared = node.node_prefix_total_len
            held[node.id] = held.get(node.id, 0) + 1
        cache_len = req.linear_att_cache_len
        if pending:
            top = cur if cur < cache_len else cache_len
            for length in pending:
                if length % BT or not shared < length <= top:
                    return False
            big_all += pending.values()
        tail = req.tail_linear_att_small_page_buffer_id
        if tail is not None:
            if cur < cache_len:
                return False
            small_all.append(tail)
        if cur > shared:
            kv_all += req.slots[shared:cur]
        if shared:
            borrowed += req.slots[:shared]
    # check_ref_balance: each node's ref is the holders holding it or a node below it (the
    # holders' paths to the root, parents by id as the view has them); the root keeps its
    # baseline 1 plus every holder below it.  Every expected count is at least 1, so the
    # other nodes' refs are all 0 exactly when as many nodes have a ref as are expected to
    if held:
        expected = {}
        if not add_path_refs(expected, held.items(), by_id):
            return False
        at_root = expected.pop(rid, 0)
        if len(expected) != nonzero:
            return False
        for nid, count in expected.items():
            if by_id[nid].ref_counter != count:
                return False
    elif nonzero:
        return False
    else:
        at_root = 0
    if root.ref_counter != 1 + at_root:
        return False
    # check_held_once and check_conservation of the three pools: at once when the free list
    # and the owners together list every usable id exactly once (then no id is at two
    # positions of the tree either, and only the readers are left to check); otherwise -- an
    # id held twice within one owner is allowed by conservation, so this is not yet a "no" --
    # by the tree's ids once each and ``_consistent`` itself, on the owners the view-based
    # check builds
    kv, small, big = s.kv, s.small, s.big
    if not (_once(kv_all, kv.num_pages) and _once(small_all, small.size)
            and _once(big_all, big.size)):
        return _conserved(s, by_id)
    return not borrowed or set(kv.free_pages).isdisjoint(borrowed)


def _sets_ok(tree_set, lin_set, leaves, small_ids) -> bool:
    """check_eviction_set and check_sort_keys by node id: each set lists each of its nodes
    once and nothing else (``leaves``: the non-root leaves' ids; ``small_ids``: the small
    buffer holders'), and every member still sorts by the key it entered with (the tree
    set's only where the member is a leaf)."""
    got = {n.id for n in tree_set}
    if len(got) != len(tree_set) or got != leaves:
        return False
    got = {n.id for n in lin_set}
    if len(got) != len(lin_set) or got != small_ids:
        return False
    for n, k in tree_set.items():
        if n.is_leaf() and n.get_compare_key() != k:
            return False
    for n, k in lin_set.items():
        if n.get_compare_key_for_buffer_idx() != k:
            return False
    return True


_FULL: dict = {}  # capacity -> frozenset(range(1, capacity + 1))


def _once(ids, capacity) -> bool:
    """``ids`` lists each of 1..capacity exactly once."""
    full = _FULL.get(capacity)
    if full is None:
        full = _FULL[capacity] = frozenset(range(1, capacity + 1))
    return len(ids) == capacity and not full.symmetric_difference(ids)


def _conserved(s, by_id) -> bool:
    """The three ``check_held_once`` and ``check_conservation`` calls of
    ``PagedBigPageSubject.check``, on the same owners (the tree's ids, each request's), by
    one set each and ``_consistent``."""
    nodes = by_id.values()
    kv_owners = {"tree": [x for n in nodes for x in n.value]}
    small_owners = {"tree": [n.small_page_buffer_idx for n in nodes
                             if n.small_page_buffer_idx is not None]}
    big_owners = {"tree": [n.big_page_buffer_idx for n in nodes
                           if n.big_page_buffer_idx is not None]}
    for owners in (kv_owners, small_owners, big_owners):
        tree = owners["tree"]
        if len(set(tree)) != len(tree):  # check_held_once: an id at two positions of the tree
            return False
    borrowed = {}
    for r, req in s.requests.items():
        shared = req.shared_len()
        if req.tail_linear_att_small_page_buffer_id is not None:
            small_owners[r] = [req.tail_linear_att_small_page_buffer_id]
        big_owners[r] = list(req.linear_att_len_to_big_page_id.values())
        kv_owners[r] = req.slots[shared:req.cur_kv_len]
        borrowed[r] = req.slots[:shared]
    return _consistent(s.big.view(), big_owners, None) and \
        _consistent(s.small.view(), small_owners, None) and \
        _consistent(s.kv.view(), kv_owners, borrowed)
