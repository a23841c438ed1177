"""Reference model of LightLLM's linear-attention paged radix cache (small pages + big pages).

Upstream: ``lightllm/server/router/dynamic_prompt/linear_att_radix_cache.py``
(``LinearAttPagedRadixCache``, "RC" below) and the request paths in
``lightllm/server/router/model_infer/infer_batch.py`` ("IB"), ModelTC/LightLLM @ 87881ae7, with the
root-ref fixes of PR #1348's head 187cbda93 (reverted before merge; our clean reference has them).

For hybrid linear-attention models a prefix hit needs the recurrent state at exactly the hit
length, not only the KV.  The tree therefore works in hash pages of ``P`` tokens:

* a node is a *small page* (``P`` tokens) or a *big page* (``N = big_page_num`` pages, ``BT = P*N``
  tokens); a node whose prefix length is a multiple of ``BT`` is big (the root, at 0, counts as
  big); children are keyed by the chained hash of the child's last page (we model the hash as
  the tuple of all prefix tokens: injective and chained);
* KV slots come from the token pool; linear state lives in two buffer pools: a big-page buffer
  on every big node (never None there) and an optional small-page buffer on small nodes;
* the root carries a baseline ref of 1; ``match_prefix`` takes a ref on every node it visits,
  root included, then trims the unusable tail (small pages without a state buffer) and must give
  back the root ref when nothing usable is left (L2/L3);
* ``_evict_tree_set`` holds every non-root leaf, sorted ``(ref>0, usable, time)``;
  ``_evict_tree_set_for_linear_att`` every node with a small buffer, sorted by time.  Keys are
  computed when a node enters a set (SortedSet semantics), so every mutation is wrapped in
  ``_discard_node`` ... ``_add_node``; we keep each member's key as of insertion and the subject
  checks it is still current.

The request paths of IB (match at admission/resume, the per-chunk state copy, and
``_linear_att_free_req``) live here too, as methods on the cache, so that a fault in them is a
cache subclass like every other fault.  Time is a logical clock; node ids are deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from caches.admission import PeakTokenBudget
from caches.pools import StatePool, TokenSlotAllocator


class PagedNode:
    __slots__ = (
        "big_page_buffer_idx",
        "big_page_tokens",
        "children",
        "id",
        "key",
        "node_prefix_total_len",
        "node_value_len",
        "page_hash",
        "page_num",
        "parent",
        "ref_counter",
        "small_page_buffer_idx",
        "time_id",
        "value",
    )

    def __init__(self, nid: int, big_page_tokens: int, time_id: int):
        self.id = nid
        self.big_page_tokens = big_page_tokens
        self.children: dict = {}  # chained hash of the child's last page -> child
        self.parent: PagedNode | None = None
        self.page_hash = None
        self.page_num = 0
        self.key: tuple = ()
        self.value: list[int] = []
        self.ref_counter = 0
        self.time_id = time_id
        self.node_value_len = 0
        self.node_prefix_total_len = 0
        self.small_page_buffer_idx: int | None = None
        self.big_page_buffer_idx: int | None = None

    def is_big_page_node(self) -> bool:
        return self.node_prefix_total_len % self.big_page_tokens == 0

    def is_leaf(self) -> bool:
        return not self.children

    def get_compare_key(self) -> tuple:
        """RC 41-51: unreferenced first; among those, unusable small leaves first; then LRU."""
        usable = 1 if (self.is_big_page_node() or self.small_page_buffer_idx is not None) else 0
        return (0 if self.ref_counter == 0 else 1, usable, self.time_id)

    def get_compare_key_for_buffer_idx(self) -> tuple:
        return (self.time_id,)

    def __repr__(self) -> str:
        return f"PagedNode({self.id}, prefix={self.node_prefix_total_len}, ref={self.ref_counter})"


@dataclass
class LinearAttReq:
    """The request as IB's ``InferReq`` holds it.

    ``tokens`` is input + output so far (``get_cur_total_len``, IB 808-809): a decode step
    appends its token, but the hashes -- and so ``linear_att_cache_len`` -- are the prompt's
    only (``Req._fill_linear_att_token_hash`` hashes ``get_prompt_ids()``, LightLLM
    ``server/core/objs/req.py`` lines 269-274; IB 622-626 takes the length from them once):
    decode output is never cached, ``free_a_req_mem`` frees its KV.  ``filled`` and
    ``kv_indices`` are the lifecycle ops' names (``caches/subjects/lifecycle.py``) for
    ``cur_kv_len`` and ``slots``."""

    rid: int
    tokens: list[int]
    hashes: list  # chained hashes of the (len-1)//P hashed prompt pages
    linear_att_cache_len: int  # #hashed pages * P
    slots: list[int] = field(default_factory=list)  # req_to_token_indexs[req][0:cur_kv_len]
    cur_kv_len: int = 0
    shared_kv_node: PagedNode | None = None
    tail_linear_att_small_page_buffer_id: int | None = None
    linear_att_len_to_big_page_id: dict = field(default_factory=dict)  # length -> big id
    paused: bool = False
    restored: tuple = ()  # what the linear state was restored from: (pool, id, length)
    max_new: int = 0  # max_new_tokens
    output: int = 0  # cur_output_len
    retracted: int = 0  # (the lifecycle ops' count; LightLLM retracts by pausing)
    state_len: int = 0  # how many tokens the request's own linear state has consumed

    @property
    def total_len(self) -> int:
        return len(self.tokens)

    @property
    def input_len(self) -> int:
        return len(self.tokens) - self.output

    @property
    def filled(self) -> int:
        return self.cur_kv_len

    @filled.setter
    def filled(self, n: int) -> None:
        self.cur_kv_len = n

    @property
    def kv_indices(self) -> list[int]:
        return self.slots

    @kv_indices.setter
    def kv_indices(self, slots: list[int]) -> None:
        self.slots = slots

    def shared_len(self) -> int:
        return 0 if self.shared_kv_node is None else self.shared_kv_node.node_prefix_total_len


def chained_hashes(tokens: Sequence[int], page_size: int, pages: int) -> list:
    """``h_i`` encodes pages ``0..i``: modelled as the tuple of the whole prefix (injective)."""
    return [tuple(tokens[:(i + 1) * page_size]) for i in range(pages)]


class LinearAttPagedRadixCache:
    admission = PeakTokenBudget  # LightLLM's router rule over this cache (a fault swaps it)

    def __init__(self, kv_pool: TokenSlotAllocator, small_pool: StatePool, big_pool: StatePool,
                 hash_page_size: int, big_page_num: int, max_req_total_len: int):
        assert hash_page_size >= 1 and big_page_num >= 1
        self.mem = kv_pool
        self.linear_att_small_page_buffers = small_pool
        self.linear_att_big_page_buffers = big_pool
        self.hash_page_size = hash_page_size
        self.big_page_num = big_page_num
        self.big_page_tokens = hash_page_size * big_page_num
        self.max_req_total_len = max_req_total_len
        self._next_id = 0
        self._clock = 0
        self.root_node = self._new_node()
        self.root_node.ref_counter = 1
        self.root_node.page_num = big_page_num
        # member -> its sort key as computed when it entered the set (SortedSet semantics)
        self._evict_tree_set: dict[PagedNode, tuple] = {}
        self._evict_tree_set_for_linear_att: dict[PagedNode, tuple] = {}
        self.refed_tokens_num = 0
        self.tree_total_tokens_num = 0

    # -- helpers ------------------------------------------------------------------------------
    def _time(self) -> int:
        self._clock += 1
        return self._clock

    def _new_node(self) -> PagedNode:
        node = PagedNode(self._next_id, self.big_page_tokens, self._time())
        self._next_id += 1
        return node

    def _update_time(self, node: PagedNode) -> None:
        node.time_id = self._time()

    def _discard_node(self, node: PagedNode) -> None:
        if node.is_leaf():
            self._evict_tree_set.pop(node, None)
        if node.small_page_buffer_idx is not None:
            self._evict_tree_set_for_linear_att.pop(node, None)

    def _add_node(self, node: PagedNode) -> None:
        """RC 165-173 (fixed): the root never enters the eviction set (L1)."""
        if node.is_leaf() and node is not self.root_node:
            self._evict_tree_set[node] = node.get_compare_key()
        if node.small_page_buffer_idx is not None:
            self._evict_tree_set_for_linear_att[node] = node.get_compare_key_for_buffer_idx()

    def _release_root(self, where: str) -> None:
        """Give back the root ref ``match_prefix`` took while descending, on an exit that hands
        the caller nothing: ``miss`` (RC 368), ``trim`` (RC 373), ``deref`` (RC 485).  These
        are PR #1348's fixes (187cbda93), reverted before merge; faults L2-L4 drop one each."""
        self.dec_node_ref_counter(self.root_node)

    def _add_child(self, parent: PagedNode, key, value, page_hash, page_num: int,
                   small=None, big=None) -> PagedNode:
        child = self._new_node()
        child.page_hash, child.page_num = page_hash, page_num
        child.key, child.value = tuple(key), list(value)
        child.small_page_buffer_idx, child.big_page_buffer_idx = small, big
        assert page_hash not in parent.children, "duplicate last block hash in children"
        parent.children[page_hash] = child
        child.parent = parent
        child.node_value_len = len(child.value)
        child.node_prefix_total_len = parent.node_prefix_total_len + len(child.value)
        return child

    # -- insert (RC 175-340) ------------------------------------------------------------------
    def insert(self, key: Sequence[int], value: Sequence[int], block_hashs: list,
               block_linear_idxs: list, len_to_big_page_id: dict):
        P, N = self.hash_page_size, self.big_page_num
        assert len(key) == len(value) == len(block_hashs) * P
        assert len(block_hashs) == len(block_linear_idxs)
        assert len(block_hashs) // N >= len(len_to_big_page_id)
        if not block_hashs:
            return 0, None
        if len(block_hashs) % N == 0:
            assert all(e is None for e in block_linear_idxs)
        else:
            assert all(e is None for e in block_linear_idxs[:-1])
            assert block_linear_idxs[-1] is not None
        ans = self._insert_helper(self.root_node, list(key), list(value), list(block_hashs),
                                  list(block_linear_idxs), len_to_big_page_id)
        assert not len_to_big_page_id
        return ans

    def _insert_helper(self, node, key, value, hashs, linear_idxs, l2b):
        P, N, BT = self.hash_page_size, self.big_page_num, self.big_page_tokens
        self._discard_node(node)
        self._update_time(node)
        try:
            if not hashs:
                return 0, node
            if len(hashs) >= N:  # a big step first
                h = hashs[N - 1]
                if h in node.children:
                    child = node.children[h]
                    dup = l2b.pop(child.node_prefix_total_len, None)
                    if dup is not None:  # the state exists already: the cache frees the copy
                        self.linear_att_big_page_buffers.free([dup])
                    sub, last = self._insert_helper(child, key[BT:], value[BT:], hashs[N:],
                                                    linear_idxs[N:], l2b)
                    return BT + sub, last
                assert node.is_big_page_node()
                big = l2b.pop(node.node_prefix_total_len + BT, None)
                assert big is not None, "no big-page buffer for a new big node"
                child = self._add_child(node, key[:BT], value[:BT], h, N, big=big)
                self.tree_total_tokens_num += BT
                _, last = self._insert_helper(child, key[BT:], value[BT:], hashs[N:],
                                              linear_idxs[N:], l2b)
                return 0, last
            h = hashs[0]  # fewer than N pages left: small steps
            if h in node.children:
                child = node.children[h]
                if linear_idxs[0] is not None:
                    assert len(hashs) == 1
                    if child.small_page_buffer_idx is None:  # hand the buffer to the node
                        self._discard_node(child)
                        child.small_page_buffer_idx = linear_idxs[0]
                        self._add_node(child)
                    else:  # duplicate state: freed by the cache
                        self.linear_att_small_page_buffers.free([linear_idxs[0]])
                sub, last = self._insert_helper(child, key[P:], value[P:], hashs[1:],
                                                linear_idxs[1:], l2b)
                return P + sub, last
            child = self._add_child(node, key[:P], value[:P], h, 1, small=linear_idxs[0])
            assert not child.is_big_page_node()
            self.tree_total_tokens_num += P
            _, last = self._insert_helper(child, key[P:], value[P:], hashs[1:],
                                          linear_idxs[1:], l2b)
            return 0, last
        finally:
            self._add_node(node)

    # -- match (RC 342-460) -------------------------------------------------------------------
    def match_prefix(self, key: Sequence[int], block_hashs: list):
        """-> (node, length, mem) or (None, 0, None).  Every node from the root to ``node``
        carries +1 ref afterwards; the caller releases it with ``dec_node_ref_counter``."""
        assert len(key) == len(block_hashs) * self.hash_page_size
        if not block_hashs:
            return None, 0, None
        nodes: list[PagedNode] = []
        self._match_prefix_helper(self.root_node, list(block_hashs), nodes)
        if not nodes:
            self._release_root("miss")
            return None, 0, None
        nodes = self._trim_unusable_match_tail(nodes)
        if not nodes:
            self._release_root("trim")
            return None, 0, None
        node = nodes[-1]
        mem = [s for n in nodes for s in n.value]
        assert len(mem) == node.node_prefix_total_len
        return node, len(mem), mem

    def _match_prefix_helper(self, node, hashs, out):
        N = self.big_page_num
        self._discard_node(node)
        self._update_time(node)
        try:
            node.ref_counter += 1
            if node.ref_counter == 1:
                self.refed_tokens_num += len(node.value)
            if not hashs:
                return
            if len(hashs) >= N and hashs[N - 1] in node.children:
                child = node.children[hashs[N - 1]]
                out.append(child)
                self._match_prefix_helper(child, hashs[N:], out)
                return
            if hashs[0] in node.children:  # small fallback, even with >= N pages left
                child = node.children[hashs[0]]
                out.append(child)
                self._match_prefix_helper(child, hashs[1:], out)
        finally:
            self._add_node(node)

    def _trim_unusable_match_tail(self, nodes):
        removed = []
        for node in reversed(nodes):
            if node.is_big_page_node() or node.small_page_buffer_idx is not None:
                break
            removed.append(node)
        for node in removed:
            self._discard_node(node)
            node.ref_counter -= 1
            if node.ref_counter == 0:
                self.refed_tokens_num -= len(node.value)
            self._add_node(node)
        return nodes[:len(nodes) - len(removed)]

    # -- refs (RC 477-524) --------------------------------------------------------------------
    def deref_to_first_big_page_node(self, node: PagedNode) -> PagedNode | None:
        assert not node.is_big_page_node()
        it = node
        while not it.is_big_page_node():
            self._discard_node(it)
            if it.ref_counter == 1:
                self.refed_tokens_num -= len(it.value)
            it.ref_counter -= 1
            self._add_node(it)
            it = it.parent
        if it is self.root_node:
            self._release_root("deref")
            return None
        return it

    def dec_node_ref_counter(self, node: PagedNode | None) -> None:
        if node is None:
            return
        self._discard_node(node)
        it = node
        while it is not None:
            if it.ref_counter == 1:
                self.refed_tokens_num -= len(it.value)
            it.ref_counter -= 1
            it = it.parent
        self._add_node(node)

    # -- eviction (RC 576-640) ----------------------------------------------------------------
    def get_can_alloc_token_num(self) -> int:
        """IB 360-366: free slots + unreferenced tree tokens."""
        return self.mem.available_size() + self.tree_total_tokens_num - self.refed_tokens_num

    def free_radix_cache_to_get_enough_token(self, need_token_num: int) -> None:
        can_use = self.mem.available_size()
        if need_token_num > can_use:
            self.evict(need_token_num - can_use)

    def evict(self, num_tokens: int) -> int:
        """``_evict`` with upstream's release callback: KV slots and small buffers freed."""
        release, smalls = [], []

        def cb(value, small):
            release.extend(value)
            if small is not None:
                smalls.append(small)

        evicted = self._evict(num_tokens, cb)
        self.mem.free(release)
        if smalls:
            self.linear_att_small_page_buffers.free(smalls)
        return evicted

    def _evict(self, need: int, cb: Callable) -> int:
        assert self.tree_total_tokens_num - self.refed_tokens_num >= need, \
            f"can not free {need} tree tokens: total {self.tree_total_tokens_num}, refed " \
            f"{self.refed_tokens_num}"
        evicted = 0
        while evicted < need:
            node = min(self._evict_tree_set, key=self._evict_tree_set.__getitem__)
            self._discard_node(node)
            assert node.ref_counter == 0 and node.is_leaf() and node is not self.root_node, \
                f"error evict tree node state: {node}"
            evicted += len(node.value)
            if node.is_big_page_node():
                assert node.big_page_buffer_idx is not None
                self.linear_att_big_page_buffers.free([node.big_page_buffer_idx])
            cb(node.value, node.small_page_buffer_idx)
            self.tree_total_tokens_num -= len(node.value)
            parent = node.parent
            del parent.children[node.page_hash]
            node.parent = None
            self._add_node(parent)
        return evicted

    def free_one_small_page_linear_att_buffer(self) -> PagedNode | None:
        """RC 596-612: under small-buffer pressure (pool empty), strip the oldest holder's
        buffer -- regardless of refs or leafness; the node and its KV stay."""
        pool = self.linear_att_small_page_buffers
        if pool.available_size() > 0 or not self._evict_tree_set_for_linear_att:
            return None
        node = min(self._evict_tree_set_for_linear_att,
                   key=self._evict_tree_set_for_linear_att.__getitem__)
        self._discard_node(node)
        pool.free([node.small_page_buffer_idx])
        node.small_page_buffer_idx = None
        self._add_node(node)
        return node

    # -- request paths (IB) -------------------------------------------------------------------
    def big_page_is_disabled(self) -> bool:
        return self.big_page_tokens > self.max_req_total_len

    def new_req(self, rid: int, tokens: Sequence[int]) -> LinearAttReq:
        pages = max(0, len(tokens) - 1) // self.hash_page_size
        return LinearAttReq(rid, list(tokens), chained_hashes(tokens, self.hash_page_size, pages),
                            pages * self.hash_page_size)

    def linear_match_radix_cache(self, req: LinearAttReq) -> str:
        """IB 652-769 ``_linear_match_radix_cache`` (admission and resume)."""
        P, BT = self.hash_page_size, self.big_page_tokens
        req.restored = ()
        match_tokens = min(len(req.hashes) * P, req.total_len - 1)
        match_tokens = max(0, match_tokens) // P * P
        hashes = req.hashes[:match_tokens // P]
        if not (match_tokens > 1 and hashes and req.cur_kv_len == 0):
            return "nothing to match"
        node, kv_len, mem = self.match_prefix(req.tokens[:match_tokens], hashes)
        if node is None:
            return "miss"
        assert req.tail_linear_att_small_page_buffer_id is None
        if node.is_big_page_node():
            req.shared_kv_node, req.slots, req.cur_kv_len = node, list(mem), kv_len
            req.restored = ("big", node.big_page_buffer_idx, kv_len)
            return f"big-page hit of {kv_len} tokens"
        if self.big_page_is_disabled():
            req.shared_kv_node, req.slots, req.cur_kv_len = node, list(mem), kv_len
            req.restored = ("small", node.small_page_buffer_idx, kv_len)
            return f"small-page hit of {kv_len} tokens"
        # a small hit with big pages on: copy the tail KV into fresh slots, hold the big ancestor
        S = node.node_prefix_total_len
        B = S // BT * BT
        need = S - B
        if self.get_can_alloc_token_num() > need:
            self.free_radix_cache_to_get_enough_token(need)
            tail = self.mem.alloc(need)
            assert tail is not None
            self.mem.write(tail, self.mem.read(mem[B:S]))  # copy_mem_to_mem
            req.restored = ("small", node.small_page_buffer_idx, S)
            req.shared_kv_node = self.deref_to_first_big_page_node(node)
            req.slots, req.cur_kv_len = list(mem[:B]) + tail, S
            return f"small-page hit of {S} tokens (tail {need} copied, big prefix {B} held)"
        held = self.deref_to_first_big_page_node(node)
        if held is None:
            return f"small-page hit of {S} tokens dropped (no room to copy, no big page)"
        L = held.node_prefix_total_len
        req.shared_kv_node, req.slots, req.cur_kv_len = held, list(mem[:L]), L
        req.restored = ("big", held.big_page_buffer_idx, L)
        return f"small-page hit of {S} tokens cut back to the big page at {L}"

    def chunk_end(self, req: LinearAttReq, chunk: int) -> int:
        """IB 839-848: never past ``cur + chunk``, the next big boundary, or the cache length."""
        BT, start = self.big_page_tokens, req.cur_kv_len
        end = min(req.total_len, start + chunk, (start // BT + 1) * BT)
        if start < req.linear_att_cache_len < end:
            end = req.linear_att_cache_len
        return end

    def copy_linear_att_state_to_cache_buffer(self, req: LinearAttReq, end: int) -> list:
        """IB 368-439, after the forward step that computed ``[cur_kv_len, end)``; returns
        ``[(pool, id)]`` of the buffers that now hold the state at ``end``."""
        out = []
        BT = self.big_page_tokens
        if end % BT == 0 and end <= req.linear_att_cache_len:
            got = self.linear_att_big_page_buffers.alloc(1)
            assert got is not None, "big-page state buffer pool exhausted"
            assert end not in req.linear_att_len_to_big_page_id
            req.linear_att_len_to_big_page_id[end] = got[0]
            out.append((self.linear_att_big_page_buffers, got[0]))
        if end == req.linear_att_cache_len:
            assert req.tail_linear_att_small_page_buffer_id is None
            if req.linear_att_cache_len % BT != 0:
                self.free_one_small_page_linear_att_buffer()
                got = self.linear_att_small_page_buffers.alloc(1)
                if got is not None:
                    req.tail_linear_att_small_page_buffer_id = got[0]
                    out.append((self.linear_att_small_page_buffers, got[0]))
        return out

    def free_a_req_mem(self, req: LinearAttReq) -> None:
        """IB 125-136: ``_linear_att_free_req``, then the request holds nothing.  (IB 133's
        ``assert not len_to_big_page_id`` is played by the harness's pending-buffer check.)"""
        free_token_index: list[int] = []
        self._linear_att_free_req(free_token_index, req)
        self.mem.free(free_token_index)
        req.cur_kv_len = 0
        req.slots = []

    def _linear_att_free_req(self, free_token_index: list, req: LinearAttReq) -> None:
        P, N, BT = self.hash_page_size, self.big_page_num, self.big_page_tokens
        shared = req.shared_len()
        cache_len = req.linear_att_cache_len
        tail_big = cache_len // BT * BT
        pages = cache_len // P
        assert cache_len >= shared
        if req.tail_linear_att_small_page_buffer_id is not None:
            assert cache_len <= req.cur_kv_len
        if req.cur_kv_len == 0:
            return
        if cache_len <= req.cur_kv_len and req.tail_linear_att_small_page_buffer_id is not None:
            # A: insert the whole cached prefix with the tail small buffer (IB 170-197)
            assert pages % N != 0
            free_token_index.extend(req.slots[cache_len:req.cur_kv_len])
            req.cur_kv_len = cache_len
            idxs = [None] * pages
            idxs[-1] = req.tail_linear_att_small_page_buffer_id
            req.tail_linear_att_small_page_buffer_id = None
            prefix_len, _ = self.insert(req.tokens[:cache_len], req.slots[:cache_len],
                                        req.hashes[:pages], idxs, req.linear_att_len_to_big_page_id)
            self._release_held(free_token_index, req, prefix_len)
            return
        if shared < tail_big <= req.cur_kv_len:
            # B: insert up to the last big boundary (IB 199-226)
            free_token_index.extend(req.slots[tail_big:req.cur_kv_len])
            req.cur_kv_len = tail_big
            assert req.tail_linear_att_small_page_buffer_id is None
            n = tail_big // P
            prefix_len, _ = self.insert(req.tokens[:tail_big], req.slots[:tail_big],
                                        req.hashes[:n], [None] * n,
                                        req.linear_att_len_to_big_page_id)
            self._release_held(free_token_index, req, prefix_len)
            return
        if shared <= req.cur_kv_len:
            # C: insert nothing (IB 228-249): pause/abort mid-prefill lands here
            free_token_index.extend(req.slots[shared:req.cur_kv_len])
            self._release_pending_big_pages(req)
            req.cur_kv_len = shared
            assert req.tail_linear_att_small_page_buffer_id is None
            if req.shared_kv_node is not None:
                self.dec_node_ref_counter(req.shared_kv_node)
                req.shared_kv_node = None
            return
        raise AssertionError(f"error state: cur_kv_len {req.cur_kv_len}")

    def _release_pending_big_pages(self, req: LinearAttReq) -> None:
        """IB 237-241 (the L5 fix): big-page buffers filled during prefill that branch C will
        never insert go back to the pool."""
        if req.linear_att_len_to_big_page_id:
            self.linear_att_big_page_buffers.free(
                list(req.linear_att_len_to_big_page_id.values()))
            req.linear_att_len_to_big_page_id.clear()

    def _release_held(self, free_token_index: list, req: LinearAttReq, prefix_len: int) -> None:
        old = req.shared_len()
        free_token_index.extend(req.slots[old:prefix_len])  # duplicates of what the tree had
        if req.shared_kv_node is not None:
            assert old <= prefix_len
            self.dec_node_ref_counter(req.shared_kv_node)
            req.shared_kv_node = None
