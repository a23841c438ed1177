"""``--target lightllm`` for the paged-bigpage variant: LightLLM's real
``LinearAttPagedRadixCache`` (from the ``--src`` checkout) under the paged-bigpage machine.

Three pieces, from the inside out:

* the **pools, shown through LightLLM's names** -- the cache is built with kvcheck's own pools
  (the KV token slots, the small- and big-page state-buffer pools the reference subject makes)
  behind two small stand-ins: ``MemManagerStandIn`` for ``kv_cache_mem_manager``
  (``allocator.can_use_mem_size``, ``free(mem_index)``, ``linear_att_big_page_buffers``) and
  ``StateBuffersStandIn`` for ``LinearAttCacheManager`` (``free_state_cache``,
  ``get_free_cache_num``, ``alloc_one_state_cache``, ``alloc_state_cache``).  The real
  ``LinearAttCacheManager`` allocates pinned host memory for the conv/ssm states and does not
  build without an accelerator; its free-list bookkeeping is what the stand-in replaces (its
  range/over-free asserts are not exercised: kvcheck's conservation check plays them).
* ``LightLLMPagedCache`` -- the adapter: the method names the reference subject drives
  (``caches/subjects/paged_bigpage.py``), over the real cache.  Tree methods go straight to
  LightLLM (``match_prefix``, ``insert``, ``dec_node_ref_counter``,
  ``deref_to_first_big_page_node``, ``free_radix_cache_to_get_enough_token``,
  ``free_one_small_page_linear_att_buffer``, ``_evict``); nodes are seen through ``Node``
  proxies (ids in creation order, ``key``/``value`` as plain tuples/lists); the two sorted sets
  are read with the keys SortedSet stored when each member entered (so a key that went stale
  inside the set shows).  The real cache's calls to ``self._discard_node`` / ``self._evict``
  are routed through the adapter's methods of those names (same class methods underneath), so
  the subject's coverage and eviction-policy watchers see LightLLM's own evictions.
* the **request paths** (``infer_batch.py``, "IB": ``_linear_match_radix_cache``,
  ``copy_linear_att_state_to_cache_buffer``, ``_linear_att_free_req`` / ``free_a_req_mem``,
  ``get_can_alloc_token_num``) are kvcheck's port of them, the reference model's own methods
  run over this adapter: ``infer_batch.py`` needs the GPU request manager, Triton copy kernels
  and the shared-memory request objects, so it is not loaded.  What that leaves untested on the
  real code: the IB request paths themselves -- L5 (big-page buffers leaked by a pause/abort
  mid-prefill) lives there, so this target cannot inject it and the reference target is where
  it is caught; the state copies (``copy_*_buffer_to_linear_att_state``, ``copy_mem_to_mem``)
  are fingerprint writes; hashes are the reference's chained prefix tuples, not LightLLM's
  xxhash ints (the tree only compares them).
* the **serving lifecycle past the prefill** (``caches/subjects/lifecycle.py``) runs here the
  way LightLLM's scheduler drives it, over the real tree: ``decode`` takes a slot per step as
  ``prepare_decode_inputs`` does (``mode_backend/generic_pre_process.py`` lines 142-144:
  ``free_radix_cache_to_get_enough_token`` -- LightLLM's own -- then the allocator), the token
  joins the sequence (``InferReqUpdatePack.handle``, IB 935-990) and ``finish`` is the IB port's
  ``_linear_att_free_req``, which inserts the prompt's hashed pages only and frees the output's
  KV (IB 172-176, 202-205, 229); ``enqueue`` / ``schedule`` admit against the router's rule
  (``ChunkedPrefillQueue._can_add_new_req``, ``req_queue/chunked_prefill/impl.py`` lines 24-93,
  modelled as ``caches/admission.py``'s ``PeakTokenBudget``), then match, prefill chunk by chunk
  and decode each admitted request as the backend does after ``add_reqs`` (IB 85-123).
  ``retract`` is not an op of this variant: LightLLM retracts by ``pause_reqs`` /
  ``recover_paused_reqs`` (IB 318-358), the ``pause`` / ``resume`` ops.

Page granularity: LightLLM's tree holds whole hash pages only (a node is one page of
``hash_page_size`` tokens or one big page of ``big_page_num`` pages; the unhashed tail of a
prompt -- ``linear_att_cache_len`` stops at the last whole page before the final token -- is
never inserted), so the subject keeps the structure check at hash-page granularity; any
``hash_page_size`` >= 1 and ``big_page_num`` >= 1 that upstream's asserts accept runs.

Known findings (LightLLM PR #1348's root-ref fixes, reverted before the merge; the snapshot
87881ae7 has none of them): ``match_prefix`` takes a ref on the root while it descends, and its
"miss" and "trim to empty" returns (L2, L3) -- and ``deref_to_first_big_page_node`` when it
bottoms out at the root (L4) -- hand the caller nothing without giving it back.  *Every* first
admission of a request with a hashed page runs into L2 (an empty tree misses), so the op cannot
be declined without the fuzzer never growing a tree.  With ``--known-findings decline`` (the
default) the adapter therefore **compensates** instead: at each of those three exits it
measures the root's ref before and after, and if upstream kept the ref it gives it back itself
(``dec_node_ref_counter(root)``, the very line of the fix) and counts it (``compensated``,
shown in ``outline()``).  On a fixed checkout nothing is kept, so nothing is compensated.  With
``--known-findings find`` nothing is compensated and ref-balance fails at the first miss.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

import torch

from caches.adapters.lightllm import loader
from caches.paged_bigpage import LinearAttPagedRadixCache as _Reference
from caches.paged_bigpage import LinearAttReq, chained_hashes
from caches.subjects.paged_bigpage import PagedBigPageSubject

# the exits where upstream hands back nothing and (at 87881ae7) keeps the root ref it took
KNOWN = {"miss": "L2", "trim": "L3", "deref": "L4"}


class Node:
    """One ``LinearAttPagedTreeNode`` seen through the reference node's interface (one proxy per
    node, so ``is`` works).  ``id`` is creation order in this tree (the root is 0)."""

    __slots__ = ("raw", "id", "_c")

    def __init__(self, raw, nid: int, cache: "LightLLMPagedCache"):
        self.raw, self.id, self._c = raw, nid, cache

    @property
    def parent(self):
        return None if self.raw.parent is None else self._c.node(self.raw.parent)

    @property
    def children(self) -> dict:
        return {h: self._c.node(c) for h, c in self.raw.children.items()}

    @property
    def key(self) -> tuple:
        return tuple(self.raw.token_id_key.tolist())

    @property
    def value(self) -> list:
        return self.raw.token_mem_index_value.tolist()

    ref_counter = property(lambda self: self.raw.ref_counter)
    time_id = property(lambda self: self.raw.time_id)
    page_hash = property(lambda self: self.raw.page_hash)
    page_num = property(lambda self: self.raw.page_num)
    node_value_len = property(lambda self: int(self.raw.node_value_len))
    node_prefix_total_len = property(lambda self: int(self.raw.node_prefix_total_len))
    small_page_buffer_idx = property(lambda self: self.raw.small_page_buffer_idx)
    big_page_buffer_idx = property(lambda self: self.raw.big_page_buffer_idx)

    def is_big_page_node(self) -> bool:
        return self.raw.is_big_page_node()

    def is_leaf(self) -> bool:
        return self.raw.is_leaf()

    def get_compare_key(self) -> tuple:
        return self.raw.get_compare_key()

    def get_compare_key_for_buffer_idx(self) -> tuple:
        return self.raw.get_compare_key_for_buffer_idx()

    def __repr__(self) -> str:
        return (f"lightllm.LinearAttPagedTreeNode({self.id}, prefix="
                f"{self.node_prefix_total_len}, ref={self.ref_counter})")


# -- kvcheck's pools under LightLLM's names --------------------------------------------------------
class StateBuffersStandIn:
    """``LinearAttCacheManager``'s free-list API over a kvcheck ``StatePool`` (no conv/ssm
    tensors: the harness keeps a fingerprint per buffer in the pool's data tensor)."""

    def __init__(self, pool):
        self.pool = pool
        self.size = pool.size

    def alloc_one_state_cache(self):
        got = self.pool.alloc(1)
        return None if got is None else got[0]

    def alloc_state_cache(self, need_size: int):
        return self.pool.alloc(need_size)

    def free_state_cache(self, free_indexes) -> None:
        self.pool.free([int(i) for i in free_indexes])

    def get_free_cache_num(self) -> int:
        return self.pool.available_size()

    def get_used_cache_num(self) -> int:
        return self.pool.size - self.pool.available_size()


class _AllocatorStandIn:
    def __init__(self, kv):
        self.kv = kv

    @property
    def can_use_mem_size(self) -> int:
        return self.kv.available_size()


class MemManagerStandIn:
    """The ``kv_cache_mem_manager`` members the cache reads: ``allocator.can_use_mem_size``,
    ``free(mem_index)`` and ``linear_att_big_page_buffers``."""

    def __init__(self, kv, big_buffers: StateBuffersStandIn):
        self.kv = kv
        self.allocator = _AllocatorStandIn(kv)
        self.linear_att_big_page_buffers = big_buffers

    def free(self, mem_index) -> None:
        ids = mem_index.tolist() if isinstance(mem_index, torch.Tensor) else list(mem_index)
        self.kv.free([int(i) for i in ids])

    def alloc(self, need_size: int):
        got = self.kv.alloc(need_size)
        return None if got is None else torch.tensor(got, dtype=torch.int64)


def _stored(sorted_set) -> list:
    """(member, the key SortedSet stored for it on entry), in set order."""
    sl = sorted_set._list
    return [(m, k) for ms, ks in zip(sl._lists, sl._keys) for m, k in zip(ms, ks)]


class LightLLMPagedCache:
    """LightLLM's ``LinearAttPagedRadixCache`` behind the cache interface
    ``PagedBigPageSubject`` drives (the module docstring says what is real and what stands
    in)."""

    # the IB request paths: kvcheck's port of infer_batch.py (the reference model's methods),
    # calling this adapter's tree methods -- so both targets run under one driver
    linear_match_radix_cache = _Reference.linear_match_radix_cache
    chunk_end = _Reference.chunk_end
    copy_linear_att_state_to_cache_buffer = _Reference.copy_linear_att_state_to_cache_buffer
    free_a_req_mem = _Reference.free_a_req_mem
    _linear_att_free_req = _Reference._linear_att_free_req
    _release_pending_big_pages = _Reference._release_pending_big_pages
    _release_held = _Reference._release_held
    big_page_is_disabled = _Reference.big_page_is_disabled
    get_can_alloc_token_num = _Reference.get_can_alloc_token_num

    def __init__(self, kv_pool, small_pool, big_pool, hash_page_size: int, big_page_num: int,
                 max_req_total_len: int, *, ns, cache_cls=None, compensate=()):
        self.ns = ns
        self.mem = kv_pool
        self.linear_att_small_page_buffers = small_pool
        self.linear_att_big_page_buffers = big_pool
        self.hash_page_size, self.big_page_num = hash_page_size, big_page_num
        self.big_page_tokens = hash_page_size * big_page_num
        self.max_req_total_len = max_req_total_len
        self.compensate = frozenset(compensate)  # exits ("miss", "trim", "deref") to repair
        self.compensated: Counter = Counter()
        self.mem_manager = MemManagerStandIn(kv_pool, StateBuffersStandIn(big_pool))
        self.small_buffers = StateBuffersStandIn(small_pool)
        self.unique_name = loader.unique_name()
        rc = None
        try:
            with loader.annotation_stand_in():
                rc = (cache_cls or ns.LinearAttPagedRadixCache)(
                    self.unique_name, kv_pool.num_pages * kv_pool.page_size, 0, hash_page_size, big_page_num,
                    kv_cache_mem_manager=self.mem_manager,
                    linear_att_small_page_buffers=self.small_buffers)
        finally:  # the segments and lock files go at once (the mappings stay valid)
            loader.release_os_resources(rc, self.unique_name)
        self.rc = rc
        self._nodes: dict[int, Node] = {}  # id(raw node) -> its proxy (keeps raw nodes alive)
        self._next_id = 0
        self.node(rc.root_node)
        # LightLLM's internal calls go through this adapter's methods of the same name (the
        # class's own code underneath), so instance-level watchers see them
        rc._discard_node = lambda raw: self._discard_node(self.node(raw))
        rc._evict = lambda need, cb: self._evict(need, cb)

    # -- nodes ------------------------------------------------------------------------------------
    def node(self, raw) -> Node:
        n = self._nodes.get(id(raw))
        if n is None:
            n = self._nodes[id(raw)] = Node(raw, self._next_id, self)
            self._next_id += 1
        return n

    def _name_path(self, raw) -> None:
        """Give the nodes an insert created (all on the path to the node it returns) their ids
        in creation order: root-side first."""
        path = []
        while raw is not None and id(raw) not in self._nodes:
            path.append(raw)
            raw = raw.parent
        for r in reversed(path):
            self.node(r)

    @property
    def root_node(self) -> Node:
        return self.node(self.rc.root_node)

    @property
    def tree_total_tokens_num(self) -> int:
        return int(self.rc.tree_total_tokens_num.arr[0])

    @property
    def refed_tokens_num(self) -> int:
        return int(self.rc.refed_tokens_num.arr[0])

    @property
    def _evict_tree_set(self) -> dict:
        return {self.node(m): k for m, k in _stored(self.rc._evict_tree_set)}

    @property
    def _evict_tree_set_for_linear_att(self) -> dict:
        return {self.node(m): k for m, k in _stored(self.rc._evict_tree_set_for_linear_att)}

    # -- requests -----------------------------------------------------------------------------------
    def new_req(self, rid: int, tokens) -> LinearAttReq:
        """IB ``_init_all_state``: the hashed prompt pages and an empty ``SortedDict`` of
        pending big-page buffers (what ``insert`` pops)."""
        P = self.hash_page_size
        pages = max(0, len(tokens) - 1) // P
        return LinearAttReq(rid, list(tokens), chained_hashes(tokens, P, pages), pages * P,
                            linear_att_len_to_big_page_id=self.ns.SortedDict())

    # -- the tree, straight to LightLLM ---------------------------------------------------------------
    def match_prefix(self, key, block_hashs):
        """-> (node, length, mem list) or (None, 0, None), as the reference's."""
        rc, hashes = self.rc, list(block_hashs)
        root = rc.root_node
        before = root.ref_counter
        node, n, mem = rc.match_prefix(torch.tensor(list(key), dtype=torch.int64),
                                       block_hashs=hashes, update_refs=True)
        if node is None:
            if hashes:  # the helper ran (it refs the root first): a miss or a trim to empty
                N = self.big_page_num
                visited = hashes[0] in root.children or (
                    len(hashes) >= N and hashes[N - 1] in root.children)
                self._release_root("trim" if visited else "miss",
                                   leaked=root.ref_counter - before)
            return None, 0, None
        return self.node(node), int(n), mem.tolist()

    def insert(self, key, value, block_hashs, block_linear_idxs, len_to_big_page_id):
        prefix_len, last = self.rc.insert(
            torch.tensor(list(key), dtype=torch.int64), torch.tensor(list(value),
                                                                    dtype=torch.int64),
            block_hashs=list(block_hashs), block_linear_idxs=list(block_linear_idxs),
            len_to_big_page_id=len_to_big_page_id)
        if last is None:
            return int(prefix_len), None
        self._name_path(last)
        return int(prefix_len), self.node(last)

    def dec_node_ref_counter(self, node) -> None:
        if node is not None:
            self.rc.dec_node_ref_counter(node.raw)

    def deref_to_first_big_page_node(self, node):
        root = self.rc.root_node
        before = root.ref_counter
        got = self.rc.deref_to_first_big_page_node(node.raw)
        if got is None:  # bottomed out at the root: the match's root ref is the caller's no more
            self._release_root("deref", leaked=1 - (before - root.ref_counter))
            return None
        return self.node(got)

    def _release_root(self, where: str, leaked: int = 0) -> None:
        """An exit that hands the caller nothing (``miss``, ``trim``, ``deref``); ``leaked`` is
        how many root refs upstream kept there (1 at 87881ae7, 0 with PR #1348's fix).  With the
        known finding declined, the adapter gives it back (the subject counts each exit)."""
        if leaked > 0 and where in self.compensate:
            for _ in range(leaked):
                self.rc.dec_node_ref_counter(self.rc.root_node)
            self.compensated[KNOWN[where]] += leaked

    def free_radix_cache_to_get_enough_token(self, need_token_num: int) -> None:
        self.rc.free_radix_cache_to_get_enough_token(need_token_num)

    def free_one_small_page_linear_att_buffer(self):
        """Upstream returns nothing; the node whose buffer it took is read off the set."""
        holders = [m for m, _ in _stored(self.rc._evict_tree_set_for_linear_att)]
        self.rc.free_one_small_page_linear_att_buffer()
        stripped = [m for m in holders if m.small_page_buffer_idx is None]
        return self.node(stripped[0]) if stripped else None

    def evict(self, num_tokens: int) -> int:
        """Evict ``num_tokens`` unreferenced tree tokens.  upstream: the release of
        ``free_radix_cache_to_get_enough_token`` (its ``_evict`` callback, then
        ``mem_manager.free`` and ``free_state_cache`` of the small buffers) for an explicit
        amount rather than the shortfall against the free slots."""
        release, smalls = [], []

        def release_mem(mem_index, small_id):
            release.append(mem_index)
            smalls.append(small_id)

        self._evict(num_tokens, release_mem)
        mems = torch.concat(release) if release else torch.zeros((0,), dtype=torch.int64)
        self.mem_manager.free(mems)
        smalls = [s for s in smalls if s is not None]
        if smalls:
            self.small_buffers.free_state_cache(smalls)
        return len(mems)

    # -- the two methods LightLLM's own code calls through this adapter ---------------------------
    def _evict(self, need, cb):
        return type(self.rc)._evict(self.rc, need, cb)

    def _discard_node(self, node: Node):
        return type(self.rc)._discard_node(self.rc, node.raw)


class LightLLMPagedSubject(PagedBigPageSubject):
    """The paged-bigpage subject (same ops, driver, invariants) over LightLLM's real cache."""

    variant = "paged-bigpage"
    target = "lightllm"

    def __init__(self, *, src, hash_page_size: int = 2, big_page_num: int = 10_000_000,
                 kv_tokens: int = 24, small_buffers: int = 2, max_req_total_len: int = 16,
                 device: str | None = None, fault: str | None = None,
                 compensate=tuple(KNOWN)):
        ns = loader.require(src)
        cache_cls = None
        if fault is not None:
            from caches.adapters.lightllm.faults import upstream_fault

            cache_cls = upstream_fault(ns, fault)
        factory = partial(LightLLMPagedCache, ns=ns, cache_cls=cache_cls, compensate=compensate)
        super().__init__(factory, hash_page_size=hash_page_size, big_page_num=big_page_num,
                         kv_tokens=kv_tokens, small_buffers=small_buffers,
                         max_req_total_len=max_req_total_len, device=device)

    def outline(self) -> str:
        out = super().outline()
        done = self.cache.compensated
        if done:
            out += "\n(known upstream findings compensated: " + ", ".join(
                f"{k} x{v}" for k, v in sorted(done.items())) + ")"
        return out


def make_subject(params, *, src, fault=None, device=None, compensate=tuple(KNOWN)):
    """The ``lightllm`` target's builder for paged-bigpage."""
    return LightLLMPagedSubject(src=src, hash_page_size=params["hash_page_size"],
                                big_page_num=params["big_page_num"],
                                kv_tokens=params["kv_tokens"],
                                small_buffers=params["small_buffers"],
                                max_req_total_len=params["max_req_total_len"], device=device,
                                fault=fault, compensate=compensate)
