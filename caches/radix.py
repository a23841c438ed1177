"""Reference radix prefix cache with lock refs (SGLang / pymllm semantics).

A radix tree over token ids whose nodes own KV slots from a token pool:

* ``match_prefix`` walks the tree along a key (page-aligned when ``page_size > 1``) and splits
  the node where the match ends inside it; it returns the slots of the matched prefix and the
  deepest matched node.  It takes no ref.
* ``insert`` adds what is missing as a new leaf and returns how much of the key the tree
  already had (the caller frees its own copy of that part).
* ``inc_lock_ref`` / ``dec_lock_ref`` lock the path from a node to the root; a node's tokens
  move from ``evictable_size_`` to ``protected_size_`` when its ref goes 0 -> 1, and back on
  1 -> 0.  The root keeps a fixed ref of 1 and is never locked or evicted.
* ``evict`` frees unlocked leaves in LRU order, cascading to parents that become unlocked
  leaves.  ``evictable_leaves`` is kept exactly equal to the set of such leaves.
* ``cache_unfinished_req`` / ``cache_finished_req`` are the scheduler's request paths: insert
  what the request computed, free the part the tree already had, and move the request's lock.
  A finished request that decoded inserts its prompt **and output** (every token whose KV
  it computed), a longer key over the row its prefill inserted, as SGLang does.
  ``cache_unfinished_req`` keys only on the request's final tokens (``_cacheable_len``): a
  diffusion LM's in-flight block (``req.volatile`` trailing tokens, rewritten every denoising
  step) stays the request's own until it resolves -- sgl-project/sglang PR #35470's
  ``get_cacheable_fill_ids`` (SGLang issue #35270: caching it makes the next step's key
  diverge and leaves two nodes owning the same pages; fault D6).
* Past the prefill (``caches/lifecycle.py``): ``decode_slot`` allocates one decode step's
  slot, ``free_rejected`` gives back a speculative step's rejected drafts, ``release_req``
  retracts a request (release without insert), and ``admission`` is the scheduler's batch
  budget rule (``caches/admission.py``).

The size counters count key tokens (as SGLang does since 0.5.3); the key and value of a
node always have the same length.  Time is a logical clock so replays are deterministic.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from caches.admission import PrefillBudget
from caches.arith import floor_align, lock_transfer
from caches.lifecycle import decode_slot, trim_rejected
from caches.pools import PagedAllocator
from caches.request import Req


class LockUnderflow(ValueError):
    """``dec_lock_ref`` on a path with a node whose ref is already 0 (an unmatched unlock)."""


class TreeNode:
    __slots__ = ("id", "parent", "children", "key", "value", "lock_ref", "last_access_time")

    def __init__(self, nid: int):
        self.id = nid
        self.parent: TreeNode | None = None
        self.children: dict = {}
        self.key: tuple = ()
        self.value: list[int] = []
        self.lock_ref = 0
        self.last_access_time = 0

    def __repr__(self) -> str:
        return f"TreeNode({self.id}, key={list(self.key)}, lock_ref={self.lock_ref})"


@dataclass
class MatchResult:
    indices: list[int]
    last_node: TreeNode


class RadixCache:
    admission = PrefillBudget  # the batch admission rule the scheduler applies over this cache

    def __init__(self, allocator: PagedAllocator, page_size: int = 1):
        self.allocator = allocator
        self.page_size = page_size
        self.reset()

    def reset(self) -> None:
        self._next_id = 0
        self._clock = 0
        self.root_node = self._new_node()
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves: set[TreeNode] = set()

    # -- helpers ------------------------------------------------------------------------
    def _new_node(self) -> TreeNode:
        node = TreeNode(self._next_id)
        self._next_id += 1
        return node

    def _touch(self, node: TreeNode) -> None:
        self._clock += 1
        node.last_access_time = self._clock

    def _child_key(self, key: Sequence[int]):
        """First token, or first page of tokens (indexing: a key shorter than a page is an error)."""
        return key[0] if self.page_size == 1 else tuple(key[j] for j in range(self.page_size))

    def _page_align(self, key: Sequence[int]) -> tuple:
        return tuple(key[: floor_align(len(key), self.page_size)])

    def _key_match(self, a: Sequence[int], b: Sequence[int]) -> int:
        """Length of the common prefix of a and b, in whole pages."""
        ps, n = self.page_size, 0
        limit = min(len(a), len(b))
        while n + ps <= limit and a[n:n + ps] == b[n:n + ps]:
            n += ps
        return n

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node is not self.root_node and not node.children and node.lock_ref == 0:
            self.evictable_leaves.add(node)
        else:
            self.evictable_leaves.discard(node)

    # -- match / insert -----------------------------------------------------------------
    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        key = self._page_align(key)
        if len(key) == 0:
            return MatchResult([], self.root_node)
        value, node = self._match_prefix_helper(self.root_node, key)
        return MatchResult(value, node)

    def _match_prefix_helper(self, node: TreeNode, key: tuple):
        self._touch(node)
        value: list[int] = []
        ck = self._child_key(key)
        while len(key) > 0 and ck in node.children:
            child = node.children[ck]
            self._touch(child)
            n = self._key_match(child.key, key)
            if n < len(child.key):
                node = self._split_node(child, n)
                value.extend(node.value)
                break
            value.extend(child.value)
            node, key = child, key[n:]
            if len(key) > 0:
                ck = self._child_key(key)
        return value, node

    def insert(self, key: Sequence[int], value: Sequence[int]) -> int:
        """Insert key -> value; returns the length of the prefix the tree already had."""
        key = self._page_align(key)
        value = self._value_for_key(value, key)
        node, prefix = self.root_node, 0
        self._touch(node)
        while len(key) > 0 and self._child_key(key) in node.children:
            node = node.children[self._child_key(key)]
            self._touch(node)
            n = self._key_match(node.key, key)
            prefix += n
            key, value = key[n:], value[n:]
            if n < len(node.key):
                node = self._split_node(node, n)
        if len(key) > 0:
            self._add_leaf(node, key, value)
        return prefix

    def _value_for_key(self, value: Sequence[int], key: tuple) -> list[int]:
        """The part of ``value`` the (page-aligned) key covers."""
        return list(value[: len(key)])

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut ``child`` at ``split_len``: a new parent takes the head, ``child`` keeps the rest."""
        new = self._new_node()
        new.parent = child.parent
        new.lock_ref = child.lock_ref
        new.last_access_time = child.last_access_time
        new.key, new.value = child.key[:split_len], child.value[:split_len]
        child.key, child.value = child.key[split_len:], child.value[split_len:]
        new.children = {self._child_key(child.key): child}
        child.parent = new
        new.parent.children[self._child_key(new.key)] = new
        return new

    def _add_leaf(self, parent: TreeNode, key: tuple, value: list[int]) -> TreeNode:
        leaf = self._new_node()
        leaf.parent, leaf.key, leaf.value = parent, key, value
        self._touch(leaf)
        parent.children[self._child_key(key)] = leaf
        self.evictable_size_ += len(key)
        self._update_leaf_status(leaf)
        self._update_leaf_status(parent)
        return leaf

    def _delete_leaf(self, node: TreeNode) -> None:
        parent = node.parent
        del parent.children[self._child_key(node.key)]
        self.evictable_size_ -= len(node.key)
        self.evictable_leaves.discard(node)
        self._update_leaf_status(parent)

    # -- locks --------------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root_node:
            d_evictable, d_protected = lock_transfer(node.lock_ref, 1, len(node.key))
            self.evictable_size_ += d_evictable
            self.protected_size_ += d_protected
            node.lock_ref += 1
            self._update_leaf_status(node)
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        self._reject_unmatched_unlock(node)
        while node is not self.root_node:
            d_evictable, d_protected = lock_transfer(node.lock_ref, -1, len(node.key))
            self.evictable_size_ += d_evictable
            self.protected_size_ += d_protected
            node.lock_ref -= 1
            self._update_leaf_status(node)
            node = node.parent

    def _reject_unmatched_unlock(self, node: TreeNode) -> None:
        """Refuse a dec that would take any ref on the path below 0, before changing anything."""
        while node is not self.root_node:
            if node.lock_ref <= 0:
                raise LockUnderflow(f"dec_lock_ref: node {node.id} has lock_ref "
                                    f"{node.lock_ref}; unmatched unlock rejected")
            node = node.parent

    # -- eviction -----------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` tokens of unlocked leaves, oldest first; returns freed."""
        heap = [(n.last_access_time, n.id, n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            if not self._evictable(node):
                continue
            self.allocator.free(node.value)
            freed += len(node.value)
            self._delete_leaf(node)
            parent = node.parent
            if parent in self.evictable_leaves:
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        return freed

    def _evictable(self, node: TreeNode) -> bool:
        return node is not self.root_node and node.lock_ref == 0

    def alloc_with_eviction(self, num_tokens: int) -> list[int] | None:
        """Allocate, evicting when short; None (out of memory) when eviction cannot help."""
        while self.allocator.available_size() < num_tokens:
            if self.evictable_size_ <= 0:
                return None
            freed = self.evict(num_tokens - self.allocator.available_size())
            if freed == 0:
                return None  # the counter says there is something, but nothing could go
        return self.allocator.alloc(num_tokens)

    # -- request paths ------------------------------------------------------------------
    def cache_unfinished_req(self, req: Req) -> None:
        """Between prefill chunks (or dLLM denoising steps): insert what was computed and is
        final, move the lock to the new node."""
        filled = self._cacheable_len(req)
        aligned = floor_align(filled, self.page_size)
        tokens, kv = req.tokens[:aligned], req.kv_indices[:aligned]
        old = req.cache_protected_len
        new_prefix = self.insert(tokens, kv)
        self.allocator.free(req.kv_indices[old:new_prefix])
        match = self.match_prefix(tokens)
        req.kv_indices[old:len(match.indices)] = match.indices[old:]
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_node)
        req.cache_protected_len = len(match.indices)
        req.last_node = match.last_node

    def _cacheable_len(self, req: Req) -> int:
        """The computed positions whose token ids are final: all but an in-flight dLLM block
        (sgl-project/sglang PR #35470, ``ReqDllmMixin.get_cacheable_fill_ids``)."""
        return req.filled - req.volatile

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        """Request done (or aborted with ``is_insert=False``): hand its KV to the tree or free it."""
        old = req.cache_protected_len
        aligned = floor_align(req.filled, self.page_size)
        if is_insert:
            new_prefix = self.insert(req.tokens[:aligned], req.kv_indices[:aligned])
            self.allocator.free(req.kv_indices[old:new_prefix])
            self.allocator.free(req.kv_indices[max(aligned, old):])
        else:
            self.allocator.free(req.kv_indices[old:])
        self.dec_lock_ref(req.last_node)

    # -- past the prefill ---------------------------------------------------------------
    def decode_slot(self, req: Req) -> int | None:
        """The slot of one decode step for ``req`` (its next position), or None (OOM)."""
        return decode_slot(req.kv_indices, self.page_size, self.alloc_with_eviction)

    def free_rejected(self, req: Req, keep: int) -> None:
        """A speculative step verified: ``req`` keeps ``keep`` positions, the rest go back."""
        trim_rejected(req.kv_indices, keep, self.page_size, self.allocator.free)

    def release_req(self, req: Req) -> None:
        """Retract: release the request without inserting it (SGLang 0.5.23
        ``release_kv_cache(req, tree_cache, checkpoint=False)``): its own slots are freed,
        its lock released; the caller resets and re-queues it."""
        self.cache_finished_req(req, is_insert=False)
