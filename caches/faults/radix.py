"""Faults of the plain radix cache (R1-R6, P1-P4, D1-D6), each the smallest mutation of
``RadixCache``."""

from __future__ import annotations

import heapq

from caches.admission import UnroundedBudget
from caches.arith import floor_align
from caches.faults import fault
from caches.radix import MatchResult, RadixCache


@fault("R1", "add-leaf-subtracts-parent", variant="radix", upstream="pymllm #656",
       properties=("size-accounting",),
       summary="a leaf gaining its first child has its tokens subtracted from evictable; "
               "split does not, so lock/unlock drives evictable negative")
class AddLeafSubtractsParent(RadixCache):
    def _add_leaf(self, parent, key, value):
        if not parent.children and parent is not self.root_node and parent.lock_ref == 0:
            self.evictable_size_ -= len(parent.key)  # the defect
        return super()._add_leaf(parent, key, value)


@fault("R2", "dec-lock-underflow", variant="radix", upstream="pymllm #656 review",
       properties=("ref-balance", "size-accounting"),
       summary="dec_lock_ref on a node whose ref is already 0 is not rejected: the ref goes "
               "to -1 and the next inc skips the 0->1 transfer")
class DecLockUnderflow(RadixCache):
    def _reject_unmatched_unlock(self, node):
        pass  # the defect: no guard, an unmatched unlock goes through


@fault("R3", "evict-spins", variant="radix", upstream="pymllm #656 follow-up",
       properties=("progress",),
       summary="eviction frees nothing although the evictable counter says > 0 (its 'never "
               "evict the root' guard tests the parent), and the allocate-with-eviction loop "
               "has no no-progress exit, so it retries forever")
class EvictSpins(RadixCache):
    def _evictable(self, node):
        return node.parent is not self.root_node and node.lock_ref == 0  # the defect

    def alloc_with_eviction(self, num_tokens):
        while self.allocator.available_size() < num_tokens:
            if self.evictable_size_ <= 0:
                return None
            self.evict(num_tokens - self.allocator.available_size())  # no progress check
        return self.allocator.alloc(num_tokens)


@fault("R4", "lock-skips-node", variant="radix", upstream="mini-sglang #52",
       properties=("ref-balance",),
       summary="lock/unlock walk to the parent before touching the ref, so the matched node "
               "stays unlocked (evictable while in use) and the root's ref moves instead")
class LockSkipsNode(RadixCache):
    def inc_lock_ref(self, node):
        while node is not self.root_node:
            node = node.parent  # the defect: moved above the increment
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
            node.lock_ref += 1
            self._update_leaf_status(node)

    def dec_lock_ref(self, node):
        while node is not self.root_node:
            node = node.parent  # the defect, mirrored
            if node.lock_ref == 1:
                self.protected_size_ -= len(node.key)
                self.evictable_size_ += len(node.key)
            node.lock_ref -= 1
            self._update_leaf_status(node)


@fault("R5", "size-by-key", variant="radix", upstream="SGLang #10637",
       properties=("size-accounting",), params={"page_size": 4},
       summary="the counters are updated with the (page-aligned) key length while the node "
               "keeps the whole value, so evictable + protected != tokens in the tree")
class SizeByKey(RadixCache):
    def _value_for_key(self, value, key):
        return list(value)  # the defect: the value keeps what the page-aligned key dropped


@fault("R6", "page-key-truncated-to-zero", variant="radix", upstream="SGLang #10637",
       properties=("match-contract",), params={"page_size": 4},
       summary="with page_size > 1 a key shorter than a page aligns to length 0 and match "
               "does not return early as empty")
class PageKeyTruncatedToZero(RadixCache):
    def match_prefix(self, key):
        key = self._page_align(key)  # the defect: no `if len(key) == 0: return empty`
        value, node = self._match_prefix_helper(self.root_node, key)
        return MatchResult(value, node)


# -- policy faults: invisible to the accounting properties, each caught only by the
# -- policy property it names (invariants/policy.py)

@fault("P1", "mru-victim", variant="radix", upstream="kvcheck policy mutant",
       properties=("victim",),
       summary="eviction takes the most- instead of the least-recently-used unlocked leaf "
               "(the heap is keyed by -last_access_time): hot prefixes are recomputed")
class MruVictim(RadixCache):
    def evict(self, num_tokens):
        heap = [(-n.last_access_time, n.id, n) for n in self.evictable_leaves]  # the defect
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
                heapq.heappush(heap, (-parent.last_access_time, parent.id, parent))
        return freed


@fault("P2", "alloc-oom-off-by-one", variant="radix", upstream="kvcheck policy mutant",
       properties=("spurious-oom",),
       summary="allocate-with-eviction gives up when free + evictable exactly covers the "
               "request (<= instead of <): out-of-memory reported although eviction could "
               "have made room")
class AllocOomOffByOne(RadixCache):
    def alloc_with_eviction(self, num_tokens):
        while self.allocator.available_size() < num_tokens:
            if self.evictable_size_ + self.allocator.available_size() <= num_tokens:
                return None  # the defect: should be `<`
            freed = self.evict(num_tokens - self.allocator.available_size())
            if freed == 0:
                return None
        return self.allocator.alloc(num_tokens)


@fault("P3", "over-evict-one-page", variant="radix", upstream="kvcheck policy mutant",
       properties=("over-eviction",),
       summary="allocate-with-eviction asks evict for one page more than the shortfall, so a "
               "leaf that was not needed goes too")
class OverEvictOnePage(RadixCache):
    def alloc_with_eviction(self, num_tokens):
        while self.allocator.available_size() < num_tokens:
            if self.evictable_size_ <= 0:
                return None
            freed = self.evict(num_tokens - self.allocator.available_size()
                               + self.page_size)  # the defect: one page too many
            if freed == 0:
                return None
        return self.allocator.alloc(num_tokens)


@fault("P4", "hit-no-refresh", variant="radix", upstream="kvcheck policy mutant",
       properties=("recency",),
       summary="a match refreshes only the node it starts from, not the nodes it walks: a "
               "prefix hit leaves its path at its old access time and it is evicted next")
class HitNoRefresh(RadixCache):
    def _match_prefix_helper(self, node, key):
        self._touch(node)
        value = []
        ck = self._child_key(key)
        while len(key) > 0 and ck in node.children:
            child = node.children[ck]  # the defect: no self._touch(child)
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


# -- the serving lifecycle past the prefill (decode, finish with output, retract, batch
# -- admission, speculative decode): each a small mutation of one new path

@fault("D1", "decode-short-at-page-boundary", variant="radix",
       upstream="SGLang alloc_paged_token_slots_decode's page-boundary rule (model)",
       properties=("conservation", "data-integrity"),
       summary="a decode step at a page boundary takes last_loc + 1 instead of a fresh page: "
               "the request writes into a page it never allocated")
class DecodeShortAtPageBoundary(RadixCache):
    def decode_slot(self, req):
        if req.kv_indices:
            return req.kv_indices[-1] + 1  # the defect: no new page when a page is full
        return super().decode_slot(req)


@fault("D2", "finish-tail-from-prompt", variant="radix",
       upstream="SGLang cache_finished_req (tail cut at the committed length; model)",
       properties=("conservation",),
       summary="finish cuts the unaligned tail at the prompt's aligned end, not the committed "
               "length's: the output pages it just handed to the tree are freed too")
class FinishTailFromPrompt(RadixCache):
    def cache_finished_req(self, req, is_insert=True):
        if not is_insert or not req.output:
            return super().cache_finished_req(req, is_insert)
        old = req.cache_protected_len
        aligned = floor_align(req.filled, self.page_size)
        new_prefix = self.insert(req.tokens[:aligned], req.kv_indices[:aligned])
        self.allocator.free(req.kv_indices[old:new_prefix])
        prompt = floor_align(len(req.tokens) - req.output, self.page_size)  # the defect
        self.allocator.free(req.kv_indices[max(prompt, old):])
        self.dec_lock_ref(req.last_node)


@fault("D3", "retract-keeps-lock", variant="radix",
       upstream="SGLang release_kv_cache's unlock on retract (model)",
       properties=("ref-balance",),
       summary="a retracted request's slots are freed but the lock on its matched prefix is "
               "kept: the prefix stays protected for a request that no longer holds it")
class RetractKeepsLock(RadixCache):
    def release_req(self, req):
        self.allocator.free(req.kv_indices[req.cache_protected_len:])  # the defect: no unlock


@fault("D4", "admission-ignores-page-rounding", variant="radix",
       upstream="SGLang PrefillAdder's per-request page (schedule_policy.py, model)",
       properties=("admission-sound",), params={"page_size": 4, "pool_pages": 3},
       summary="the batch budget charges raw extend lengths and no page per request: a batch "
               "of short requests is admitted whose prefill or first decode step cannot "
               "allocate")
class AdmissionIgnoresPageRounding(RadixCache):
    admission = UnroundedBudget  # the defect


@fault("D5", "spec-rejected-not-freed", variant="radix",
       upstream="SGLang EAGLE verify frees the rejected draft slots (model)",
       properties=("conservation",),
       summary="after a speculative verify the row drops the rejected drafts but their slots "
               "are never freed")
class SpecRejectedNotFreed(RadixCache):
    def free_rejected(self, req, keep):
        del req.kv_indices[keep:]  # the defect: nothing goes back to the allocator


@fault("D6", "dllm-block-cached-in-flight", variant="radix",
       upstream="sgl-project/sglang #35270 (fix: PR #35470)",
       properties=("conservation",), params={"page_size": 4, "pool_pages": 6},
       summary="cache_unfinished_req keys a diffusion LM's in-flight block too: the next "
               "denoising step rewrites its ids over the same slots, the key diverges at the "
               "block, and two nodes own the block's pages")
class DllmBlockCachedInFlight(RadixCache):
    def _cacheable_len(self, req):
        return req.filled  # the defect: the in-flight block (req.volatile) is keyed too
