"""The paged-bigpage subject: LightLLM's linear-attention paged radix cache, its three pools
(KV token slots, small-page state buffers, big-page state buffers) and a scheduler-like driver.

The driver calls the cache the way LightLLM's backend does (IB = ``infer_batch.py``):

* ``admit`` -- a new request: ``_linear_match_radix_cache`` (match the hashed prompt pages,
  hold the hit node; with big pages on, a small hit copies its tail KV and holds the nearest big
  ancestor instead);
* ``prefill`` -- one chunk (ends at the next big boundary or the cache length at the latest):
  evict for room, allocate, write KV fingerprints ("the forward"), then
  ``copy_linear_att_state_to_cache_buffer`` (a big-page buffer on each big boundary, kept on the
  request until insert; the tail small buffer at the cache length) and write state fingerprints;
* ``finish`` / ``abort`` / ``pause`` -- ``free_a_req_mem`` (insert what can be inserted, free the
  rest); ``resume`` -- ``recover_paused_reqs`` (match again);
* ``match`` -- a bare lookup (match, then release what it holds); ``evict`` -- evict tokens;
  ``evict_small_buffer`` -- ``free_one_small_page_linear_att_buffer`` (acts only when the small
  pool is empty).

Data: KV slots carry ``Fingerprint.of_prefix(tokens)``; a state buffer for length ``L`` carries a
fingerprint of ``tokens[:L]``.  Hits read both back.

The cache interface this subject drives -- LightLLM's own names, so the reference model and
LightLLM's real ``LinearAttPagedRadixCache`` (target ``lightllm``) plug in alike:

* calls: ``match_prefix``, ``linear_match_radix_cache``, ``new_req``, ``chunk_end``,
  ``copy_linear_att_state_to_cache_buffer``, ``free_a_req_mem``, ``dec_node_ref_counter``,
  ``deref_to_first_big_page_node``, ``free_radix_cache_to_get_enough_token``,
  ``get_can_alloc_token_num``, ``free_one_small_page_linear_att_buffer``, ``evict``;
* wrapped on the instance for coverage and the progress property: ``_evict``,
  ``_release_root`` (the cache's own code is untouched);
* read for the views: ``root_node``, ``tree_total_tokens_num``, ``refed_tokens_num``,
  ``_evict_tree_set``, ``_evict_tree_set_for_linear_att`` (node -> sort key), ``mem`` (the KV
  allocator: ``available_size()``), ``big_page_is_disabled``, ``id``.
"""

from __future__ import annotations

from collections import Counter

from caches.admission import PeakTokenBudget, lightllm_tuple_tokens
from caches.paged_bigpage import LinearAttPagedRadixCache, chained_hashes
from caches.pools import Fingerprint, StatePool, TokenSlotAllocator
from caches.subjects.base import Skip, Subject, _prefix_fingerprints, node_objects
from caches.subjects.canon import Id, Ref, Time, TreeState, Unordered, ids, one
from caches.subjects.lifecycle import Lifecycle
from caches.subjects.paged_bigpage_fast import paged_bigpage_fast_ok
from invariants import (
    NodeView,
    TreeView,
    check_conservation,
    check_eviction_set,
    check_fingerprints,
    check_held_once,
    check_quiescence,
    check_ref_balance,
    check_size_accounting,
    fail,
)
from invariants.policy import (check_no_over_eviction, check_no_spurious_oom, check_recency,
                               check_victims, evictable_tokens, lightllm_key, shortfall_need)
from invariants.linear_att import (
    check_matched_tail,
    check_paged_structure,
    check_pending_buffers,
    check_sort_keys,
)


def state_fingerprint(tokens, length: int) -> int:
    """What a state buffer summarising ``tokens[:length]`` holds."""
    if 1 <= length <= len(tokens):  # (the prefix fingerprints the ops have cached)
        return _state_after(_prefix_fingerprints(tuple(tokens))[length - 1], length)
    return _state_after(Fingerprint.of_prefix(tokens[:length])[-1], length)


def _state_after(last: int, length: int) -> int:
    """The state fingerprint of a ``length``-token prefix whose last KV fingerprint is
    ``last``."""
    return (last * 31 + 7 * length) & 0x7FFF_FFFF


class PagedBigPageSubject(Lifecycle, Subject):
    variant = "paged-bigpage"

    def __init__(self, cache_cls=LinearAttPagedRadixCache, *, hash_page_size: int = 2,
                 big_page_num: int = 10_000_000, kv_tokens: int = 24, small_buffers: int = 2,
                 max_req_total_len: int = 16, device: str | None = None):
        super().__init__()
        self.waiting: dict = {}  # the router's waiting queue (lifecycle.py)
        self.P, self.N = hash_page_size, big_page_num
        self.BT = hash_page_size * big_page_num
        self.max_len = max_req_total_len
        self.kv = TokenSlotAllocator(kv_tokens, device, name="kv")
        self.small = StatePool(small_buffers, device, name="small_state")
        # qwen3next_mem_manager: one big buffer per BT tokens of KV (its 2 CPU temp slots are
        # never allocated and are left out here)
        self.big = StatePool(max(1, -(-kv_tokens // self.BT)), device, name="big_state")
        self.cache = cache_cls(self.kv, self.small, self.big, hash_page_size, big_page_num,
                               max_req_total_len)
        self.cache.match_prefix = self._checked_match(self.cache.match_prefix)
        self._watch_transitions()
        self._watch_policy()

    # -- the ledger -------------------------------------------------------------------------
    def held_locks(self) -> Counter:
        held: Counter = Counter()
        for req in self.requests.values():
            if req.shared_kv_node is not None:
                held[req.shared_kv_node.id] += 1
        return held

    # -- serving operations ---------------------------------------------------------------------
    def admit(self, rid: int, tokens: list[int]) -> str:
        if rid in self.requests or rid in self.waiting:
            raise Skip(f"r{rid} is already live or waiting")
        if not 1 <= len(tokens) <= self.max_len:
            raise Skip(f"a prompt of {len(tokens)} tokens (max_req_total_len {self.max_len})")
        req = self.cache.new_req(rid, tokens)
        req.max_new = self.max_len - len(tokens)  # (LightLLM bounds input + output by it)
        self.requests[rid] = req
        res = self._linear_match(req)
        self._verify_req(req, "at admission, ")
        return res

    def prefill(self, rid: int, n: int) -> str:
        req = self.req(rid)
        if req.paused:
            raise Skip(f"r{rid} is paused")
        if req.cur_kv_len >= req.total_len:
            raise Skip(f"r{rid} is fully prefilled")
        return self._chunk(req, n)

    def _chunk(self, req, n: int) -> str:
        """One prefill chunk of up to ``n`` tokens (``chunk_end``); "waits: ..." when the
        KV cannot be had."""
        rid, start = req.rid, req.cur_kv_len
        end = self.cache.chunk_end(req, max(1, n))
        need = end - start
        if self.cache.get_can_alloc_token_num() < need:
            self.reached("out-of-memory")
            if self.checking:  # IB: the request waits; it must really not fit
                check_no_spurious_oom(f"r{rid} prefill of {need} tokens", need,
                                      self.kv.available_size(), self._evictable_tokens())
            return f"waits: {need} KV slots needed, {self.cache.get_can_alloc_token_num()} " \
                   "can be had"
        self.cache.free_radix_cache_to_get_enough_token(need)
        slots = self.kv.alloc(need)
        if slots is None:
            fail("progress", f"r{rid}: {need} slots promised by get_can_alloc_token_num but "
                 "not allocatable after eviction", need=need)
        fps = _prefix_fingerprints(tuple(req.tokens))  # (expected_data, without its copy)
        self.kv.write(slots, fps[start:end])  # the forward
        filled = self.cache.copy_linear_att_state_to_cache_buffer(req, end)
        what = ""
        for pool, sid in filled:  # state_fingerprint(req.tokens, end), from fps (end >= 1)
            pool.write([sid], [_state_after(fps[end - 1], end)])
            self.reached("big-boundary-crossed" if pool is self.big else "tail-small-buffer")
            what += f", state -> {pool.name} {sid}"
        req.slots = req.slots[:start] + slots
        req.cur_kv_len = req.state_len = end
        return f"computed [{start}, {end}) of {req.total_len}{what}"

    def finish(self, rid: int) -> str:
        req = self.req(rid)
        if req.paused or req.cur_kv_len < req.total_len:
            raise Skip(f"r{rid} is not fully prefilled")
        self._verify_req(req, "at finish, ")
        self._note_free(req)
        self.cache.free_a_req_mem(req)
        del self.requests[rid]
        return "finished (free_a_req_mem)"

    def abort(self, rid: int) -> str:
        req = self.req(rid)
        done = req.cur_kv_len
        self._note_free(req)
        self.cache.free_a_req_mem(req)
        del self.requests[rid]
        return f"aborted after {done}/{req.total_len} tokens"

    def pause(self, rid: int) -> str:
        req = self.req(rid)
        if req.paused:
            raise Skip(f"r{rid} is already paused")
        done = req.cur_kv_len
        self._note_free(req)
        self.cache.free_a_req_mem(req)
        req.paused = True
        return f"paused after {done}/{req.total_len} tokens"

    def resume(self, rid: int) -> str:
        req = self.req(rid)
        if not req.paused:
            raise Skip(f"r{rid} is not paused")
        if req.total_len > self.cache.get_can_alloc_token_num():
            self.reached("out-of-memory")
            return "stays paused: not enough KV"
        res = self._linear_match(req)
        req.paused = False
        self.reached("paused-resumed")
        self._verify_req(req, "at resume, ")
        return f"resumed: {res}"

    def match(self, tokens: list[int]) -> str:
        pages = len(tokens) // self.P
        key = tokens[:pages * self.P]
        node, n, _ = self.cache.match_prefix(key, chained_hashes(tokens, self.P, pages))
        self.cache.dec_node_ref_counter(node)
        return f"hit {n} tokens" if node is not None else "miss"

    def evict(self, n: int) -> str:
        k = min(n, self.cache.tree_total_tokens_num - self.cache.refed_tokens_num)
        if k <= 0:
            return "nothing evictable"
        return f"evicted {self.cache.evict(k)} tokens"

    def evict_small_buffer(self) -> str:
        node = self.cache.free_one_small_page_linear_att_buffer()
        if node is None:
            return "no-op (small pool not empty, or no holder)"
        return f"stripped the small buffer of node {node.id}"

    # -- past the prefill (caches/subjects/lifecycle.py): this cache's hooks ------------------
    # decode (IB = infer_batch.py; PRE = mode_backend/generic_pre_process.py): a step takes one
    # KV token slot -- ``prepare_decode_inputs`` (PRE 98-144) asserts ``cur_kv_len ==
    # seq_len - 1``, calls ``free_radix_cache_to_get_enough_token(batch)`` and
    # ``mem_manager.alloc(batch)`` -- and the linear state advances in place in the request's
    # own buffer (``req_to_conv_state`` / ``req_to_ssm_state`` at ``req_idx``), which the cache
    # never reads again: only the prefill copies it into cache buffers (IB 368-439, at big
    # boundaries and at ``linear_att_cache_len``, both within the prompt).  The token joins the
    # sequence (``InferReqUpdatePack.handle``, IB 935-990: ``cur_output_len`` grows,
    # ``get_cur_total_len`` = input + output), so ``finish`` (``free_a_req_mem`` ->
    # ``_linear_att_free_req``, IB 125-251) inserts the prompt's hashed pages as before and
    # frees every decoded slot with the unhashed tail (``[linear_att_cache_len:cur_kv_len]``,
    # IB 172-176; ``[tail_big:cur_kv_len]``, 202-205; ``[shared:cur_kv_len]``, 229):
    # LightLLM caches no output.  A pause after decode frees the same way and its resume
    # prefills input + output again (``recover_paused_reqs``, IB 339-358).
    #
    # schedule: LightLLM's router admits against ``PeakTokenBudget`` (``caches/admission.py``)
    # without matching -- the router never sees prefix hits, so ``_pin`` only holds the place;
    # the backend then matches each admitted request (``_linear_match_radix_cache``, IB
    # 652-769, from ``InferReq.__init__`` via ``add_reqs``, IB 85-123), prefills it chunk by
    # chunk (``get_chuncked_input_token_len_for_linear_att``, IB 839-848) and decodes.
    # retract is not an op of this variant (called directly, it says why): LightLLM's retract
    # path is pause / resume.
    lifecycle_declined = {
        "retract": "LightLLM retracts by pausing: pause_reqs (free_a_req_mem, which inserts "
                   "what it can) and recover_paused_reqs (match again, prefill input + output) "
                   "-- infer_batch.py lines 318-358 -- which the pause and resume ops drive"}
    page_size = 1  # KV token slots
    max_running = 4  # running_max_req_size (LightLLM's default: 256)
    added_output_len = 0  # ADDED_OUTPUT_LEN (16 upstream): 0 in pools of a few dozen tokens

    def kv_pool(self):
        return self.kv

    def _decode_limit(self, req) -> int:
        return self.max_len - req.total_len

    def _decode_alloc(self, req):
        if self.cache.get_can_alloc_token_num() < 1:
            return None
        self.cache.free_radix_cache_to_get_enough_token(1)
        got = self.kv.alloc(1)
        return None if got is None else got[0]

    def _advance(self, req) -> None:
        req.state_len = req.cur_kv_len

    def _new_waiting(self, rid: int, tokens: list[int], max_new: int):
        if not tokens or len(tokens) + max_new > self.max_len:
            raise Skip(f"a prompt of {len(tokens)} tokens + {max_new} new "
                       f"(max_req_total_len {self.max_len})")
        req = self.cache.new_req(rid, tokens)
        req.max_new = max_new
        return req

    def _tuple_tokens(self, req) -> tuple[int, int]:
        return lightllm_tuple_tokens(req.total_len, req.cur_kv_len, req.output, req.max_new,
                                     chunk=self.max_len, added_output_len=self.added_output_len)

    def _budget(self):
        rule = getattr(self.cache, "admission", PeakTokenBudget)
        return rule(self.kv.num_pages, [self._tuple_tokens(r) for r in self.requests.values()],
                    self.max_running, self._tuple_tokens)

    def _pin(self, req, admitted: int):
        return ((),)  # the router judges the whole sequence; the match comes after

    def _unpin(self, req, pinned) -> None:
        pass

    def _extend(self, req, pinned) -> str | None:
        self.requests[req.rid] = req
        self._linear_match(req)  # (its hits count as small-/big-page-hit)
        self._verify_req(req, "at admission, ")
        while req.cur_kv_len < req.total_len:
            res = self._chunk(req, req.total_len)
            if res.startswith("waits"):
                return f"r{req.rid}'s prefill chunk at {req.cur_kv_len} ({res})"
        return None

    def _free_and_evictable(self) -> int:
        return self.cache.get_can_alloc_token_num()

    # -- reachability ("sometimes") coverage: transitions seen from the outside ---------------
    def _linear_match(self, req) -> str:
        """``_linear_match_radix_cache``, noting what a small hit with big pages on did."""
        self._last_match = None
        res = self.cache.linear_match_radix_cache(req)
        node = self._last_match
        if node is not None and not node.is_big_page_node() \
                and not self.cache.big_page_is_disabled():
            if req.cur_kv_len > req.shared_len():
                self.reached("small-hit-tail-copied")
            else:  # no room to copy the tail: cut back to the big ancestor (or to nothing)
                self.reached("out-of-memory")
        return res

    def _note_free(self, req) -> None:
        """Which branch of ``_linear_att_free_req`` (IB 125-251) a release takes: B inserts up
        to the last big boundary; C inserts nothing and must free pending big ids (L5)."""
        if req.cur_kv_len == 0:
            return
        cache_len, shared = req.linear_att_cache_len, req.shared_len()
        tail_big = cache_len // self.BT * self.BT
        if cache_len <= req.cur_kv_len and req.tail_linear_att_small_page_buffer_id is not None:
            return  # A: insert with the tail small buffer
        if shared < tail_big <= req.cur_kv_len:
            self.reached("insert-to-big-boundary")
        elif req.linear_att_len_to_big_page_id:
            self.reached("free-pending-big-pages")

    def _watch_transitions(self) -> None:
        """Count root releases (miss / trim to empty / deref to the root), downgrades to a big
        node, small-buffer steals, evictions that make room, cascading evictions and the tree
        emptying, by wrapping those cache methods on this instance (the cache carries no
        harness code; faults subclass, so they are wrapped too)."""
        cache, subject = self.cache, self
        self._last_match = None
        release_root = cache._release_root
        exits = {"miss": "match-miss", "trim": "trim-to-empty", "deref": "deref-to-root"}

        def release(where, *args, **kwargs):
            subject.reached(exits.get(where, f"release-root-{where}"))
            return release_root(where, *args, **kwargs)
        cache._release_root = release

        deref = cache.deref_to_first_big_page_node

        def deref_to_big(node, *args, **kwargs):
            got = deref(node, *args, **kwargs)
            if got is not None:
                subject.reached("deref-to-big-node")
            return got
        cache.deref_to_first_big_page_node = deref_to_big

        steal = cache.free_one_small_page_linear_att_buffer

        def steal_small(*args, **kwargs):
            got = steal(*args, **kwargs)
            if got is not None:
                subject.reached("small-buffer-stolen")
            return got
        cache.free_one_small_page_linear_att_buffer = steal_small

        make_room = cache.free_radix_cache_to_get_enough_token

        def room(need, *args, **kwargs):
            if need > cache.mem.available_size():
                subject.reached("evict-for-room")
            return make_room(need, *args, **kwargs)
        cache.free_radix_cache_to_get_enough_token = room

        evict = cache._evict

        def watched_evict(*args, **kwargs):
            parent = {id(n): id(n.parent) for n in subject._nodes() if n.parent is not None}
            had_children = bool(cache.root_node.children)
            try:
                return evict(*args, **kwargs)
            finally:
                left = {id(n) for n in subject._nodes()}
                gone = set(parent) - left
                if any(parent[g] in gone for g in gone):
                    subject.reached("cascade-eviction")
                if had_children and not cache.root_node.children:
                    subject.reached("tree-emptied")
        cache._evict = watched_evict

    # -- policy (invariants/policy.py): LightLLM's sort key picks the victim, room is made for
    # -- exactly the shortfall, a match refreshes its path ----------------------------------------
    victim_key = staticmethod(lightllm_key)
    _victims = None  # ids ``_evict`` removed, in order, while one runs

    def _watch_policy(self) -> None:
        cache, subject = self.cache, self
        self._policy_events: list = []
        evict, discard, room = cache._evict, cache._discard_node, \
            cache.free_radix_cache_to_get_enough_token

        def policy_evict(need, *args, **kwargs):
            if not subject.checking or subject._victims is not None:
                return evict(need, *args, **kwargs)
            before, subject._victims = subject.tree_view(times=True), []
            try:
                return evict(need, *args, **kwargs)
            finally:
                victims, subject._victims = subject._victims, None
                subject._policy_events.append(("evict", need, before, victims))

        def discarded(node, *args, **kwargs):  # in ``_evict``: the victim leaves its set
            if subject._victims is not None:
                subject._victims.append(node.id)
            return discard(node, *args, **kwargs)

        def make_room(need, *args, **kwargs):
            if not subject.checking:
                return room(need, *args, **kwargs)
            free = cache.mem.available_size()
            events = subject._policy_events
            n = len(events)
            out = room(need, *args, **kwargs)
            if len(events) > n:  # (no _evict: nothing evicted, nothing over-evicted)
                victims = [v for ev in events[n:] for v in ev[3]]
                if victims:  # (none evicted: nothing over-evicted, nothing to check)
                    events.append(("room", need, free, victims, events[n][2]))
            return out

        cache._evict, cache._discard_node = policy_evict, discarded
        cache.free_radix_cache_to_get_enough_token = make_room

    def check_policy(self) -> None:
        events = self._policy_events
        if not events:
            return
        self._policy_events = []
        for ev in events:
            if ev[0] == "evict":
                _, need, before, victims = ev
                check_victims(before, victims, self.victim_key, counter="ref",
                              what=f"_evict({need})")
                check_no_over_eviction(f"_evict({need})", need,
                                       [(v, len(before.nodes[v].value)) for v in victims])
            elif ev[0] == "room":
                _, need, free, victims, before = ev
                what = f"making room for {need} tokens ({free} free)"
                check_no_over_eviction(what, shortfall_need(need, free),
                                       [(v, len(before.nodes[v].value)) for v in victims])
            else:
                _, n, latest, path = ev
                if any(t <= latest for _, t in path):  # (else check_recency passes: no message)
                    check_recency(f"match of a {n}-token key", latest, path)

    # -- the exhaustive search's state -----------------------------------------------------------
    def state(self) -> TreeState:
        """The exhaustive search's state (``canon.py``): every node field (key, hash,
        page_num, lengths, value and the data of its slots, ref, both buffers and their state
        fingerprints; time ids by rank among every time the cache holds: node times and the
        sort keys the two sets stored), every live request (tokens, hashes, cache length,
        slots and their computed data, cur_kv_len, held node, tail buffer, pending big ids in
        order, paused, restored, max_new, output, state length), the waiting queue, both sets with their stored keys, both counters, and each
        free-list order (it decides the next allocation)."""
        c = self.cache
        kv_data, small_data, big_data = (p.data.tolist() for p in (self.kv, self.small,
                                                                    self.big))

        def kv(slots):
            return ids("kv", slots), tuple(kv_data[s] for s in slots)

        def buf(pool, data, x):
            return None if x is None else (Id(pool, x), data[x])

        reqs = []
        for rid, r in sorted(self.requests.items()):
            restored = ()
            if r.restored:
                kind, sid, length = r.restored
                restored = (kind, one(kind, sid), length)
            reqs.append((rid, tuple(r.tokens), tuple(r.hashes), r.linear_att_cache_len,
                         kv(r.slots), r.cur_kv_len, Ref(r.shared_kv_node),
                         buf("small", small_data, r.tail_linear_att_small_page_buffer_id),
                         tuple((length, buf("big", big_data, b))
                               for length, b in r.linear_att_len_to_big_page_id.items()),
                         r.paused, restored, r.max_new, r.output, r.state_len))
        return TreeState(
            c.root_node,
            lambda n: (n.key, n.page_hash, n.page_num, n.node_value_len,
                       n.node_prefix_total_len, kv(n.value), n.ref_counter, Time(n.time_id),
                       buf("small", small_data, n.small_page_buffer_idx),
                       buf("big", big_data, n.big_page_buffer_idx)),
            (tuple(reqs), self.waiting_state(),
             Unordered((Ref(n), k[:-1] + (Time(k[-1]),)) for n, k in c._evict_tree_set.items()),
             Unordered((Ref(n), Time(k[-1]))
                       for n, k in c._evict_tree_set_for_linear_att.items()),
             (ids("kv", self.kv.free_pages), ids("small", self.small.free_slots),
              ids("big", self.big.free_slots)),
             c.tree_total_tokens_num, c.refed_tokens_num))

    # -- read-backs -----------------------------------------------------------------------------
    def _checked_match(self, match):
        """``match_prefix`` with its contract checked and the hit read back."""
        def wrapped(key, hashes):
            checking = self.checking
            latest = self._latest_time() if checking else 0
            node, n, mem = match(key, hashes)
            self._last_match = node
            if node is not None:
                self.reached("big-page-hit" if node.is_big_page_node() else "small-page-hit")
            if not checking:
                return node, n, mem
            # one walk up from the hit: the matched path below the root with its times (the
            # recency check), and the KV ids root..node (the contract)
            root, path, values, it = self.cache.root_node, [], [], node
            below = True
            while it is not None:
                if it is root:
                    below = False
                if below:
                    path.append((it.id, it.time_id))
                values.append(it.value)
                it = it.parent
            self._policy_events.append(("match", len(key), latest, path[::-1]))
            path_value = []
            for v in reversed(values):
                path_value += v
            check_matched_tail(len(key), None if node is None else node.id, n, mem,
                               big=node is not None and node.is_big_page_node(),
                               small=None if node is None else node.small_page_buffer_idx,
                               prefix=0 if node is None else node.node_prefix_total_len,
                               path_value=path_value)
            if node is not None:
                self.verify_data(self.kv, mem, key, "matched KV, ")
                if node.is_big_page_node():
                    self._verify_state(self.big, node.big_page_buffer_idx, key, n, "matched ")
                else:
                    self._verify_state(self.small, node.small_page_buffer_idx, key, n,
                                       "matched ")
            return node, n, mem
        return wrapped

    def _latest_time(self) -> int:
        """The latest access time in the tree (every node's ``time_id``, the root's too)."""
        latest, stack = None, [self.cache.root_node]
        while stack:
            n = stack.pop()
            t = n.time_id
            if latest is None or t > latest:
                latest = t
            stack.extend(n.children.values())
        return latest

    def _verify_state(self, pool, sid, tokens, length, what=""):
        if self.checking:
            check_fingerprints(pool.name, [sid], pool.read([sid]),
                               [state_fingerprint(tokens, length)],
                               what=f"{what}state for {length} tokens, ")

    def _verify_req(self, req, what):
        self.verify_data(self.kv, req.slots[:req.cur_kv_len], req.tokens, f"r{req.rid} KV {what}")
        if req.restored:
            kind, sid, length = req.restored
            self._verify_state(self.big if kind == "big" else self.small, sid, req.tokens,
                               length, f"r{req.rid} restored {what}")
            req.restored = ()

    # -- views and checks -------------------------------------------------------------------------
    def _nodes(self):
        """Every node object reachable from the root, once each (``node_objects``: a cyclic
        tree is reported on structure, not walked forever)."""
        return node_objects(self.cache.root_node)

    def _evictable_tokens(self) -> int:
        """``evictable_tokens(self.tree_view(), counter="ref")``: the tokens of every non-root
        node whose ref is 0.  Read off the nodes when their ids are distinct (then the view,
        which keys nodes by id, holds each of them); else from the view itself."""
        rid, total, ids = self.cache.root_node.id, 0, set()
        nodes = self._nodes()
        for n in nodes:
            nid = n.id
            ids.add(nid)
            if nid != rid and n.ref_counter == 0:
                total += len(n.value)
        if len(ids) != len(nodes):
            return evictable_tokens(self.tree_view(), counter="ref")
        return total

    def tree_view(self, times: bool = False) -> TreeView:
        """The tree; with ``times`` each node's ``extra["time"]`` is its ``time_id`` (the LRU
        part of LightLLM's sort key, read by the policy checks)."""
        nodes = {}
        for n in self._nodes():
            extra = {"prefix": n.node_prefix_total_len, "hash": n.page_hash,
                     "small": n.small_page_buffer_idx, "big": n.big_page_buffer_idx}
            if times:
                extra["time"] = n.time_id
            parent, children = n.parent, n.children
            nodes[n.id] = NodeView(
                n.id, parent.id if parent is not None else None, n.key, tuple(n.value),
                {"ref": n.ref_counter}, {h: c.id for h, c in children.items()}, extra)
        return TreeView(nodes, self.cache.root_node.id, self.P)

    def check(self) -> None:
        """Every invariant after every op.  On the reference cache the one-walk fast verdict
        (``paged_bigpage_fast.py``) answers first, and then only the policy checks (of the
        evictions, room-making and matches this op made) run; when it sees anything wrong the
        view is built and every check runs, to say what broke.  Upstream adapters (whose
        caches are not ``LinearAttPagedRadixCache``) always take the view-based checks."""
        if self.fast_check and isinstance(self.cache, LinearAttPagedRadixCache) \
                and paged_bigpage_fast_ok(self):
            self.check_policy()
            return
        c = self.cache
        tree = self.tree_view()
        check_paged_structure(tree, self.P, self.N)
        leaves = {n.id for n in tree.nodes.values() if n.id != tree.root and not n.children}
        check_eviction_set("evict_tree_set", [n.id for n in c._evict_tree_set], leaves)
        check_eviction_set("evict_tree_set_for_linear_att",
                           [n.id for n in c._evict_tree_set_for_linear_att],
                           {n.id for n in tree.nodes.values() if n.extra["small"] is not None})
        check_sort_keys("evict_tree_set", {n.id: k for n, k in c._evict_tree_set.items()},
                        {n.id: n.get_compare_key() for n in c._evict_tree_set if n.is_leaf()})
        check_sort_keys("evict_tree_set_for_linear_att",
                        {n.id: k for n, k in c._evict_tree_set_for_linear_att.items()},
                        {n.id: n.get_compare_key_for_buffer_idx()
                         for n in c._evict_tree_set_for_linear_att})
        refed = c.refed_tokens_num
        check_size_accounting(tree, c.tree_total_tokens_num - refed, refed, counter="ref",
                              label="tree_total - refed / refed")
        check_ref_balance(tree, self.held_locks(), counter="ref", root_counts_holders=True)
        self.check_policy()
        kv_owners = {"tree": [s for n in tree.nodes.values() for s in n.value]}
        small_owners = {"tree": [n.extra["small"] for n in tree.nodes.values()
                                 if n.extra["small"] is not None]}
        big_owners = {"tree": [n.extra["big"] for n in tree.nodes.values()
                               if n.extra["big"] is not None]}
        borrowed = {}
        for rid, req in self.requests.items():
            who = f"request r{rid}"
            shared = req.shared_len()
            check_pending_buffers(who, req.linear_att_len_to_big_page_id, shared,
                                  req.cur_kv_len, req.linear_att_cache_len, self.BT,
                                  req.tail_linear_att_small_page_buffer_id)
            kv_owners[who] = req.slots[shared:req.cur_kv_len]
            borrowed[who] = req.slots[:shared]
            if req.tail_linear_att_small_page_buffer_id is not None:
                small_owners[who] = [req.tail_linear_att_small_page_buffer_id]
            big_owners[who] = list(req.linear_att_len_to_big_page_id.values())
        # each id the tree holds sits at one position (one node's KV slot, one node's buffer):
        # conservation allows an owner to list an id twice, so it cannot see two positions
        # sharing one
        for pool, owners in ((self.big, big_owners), (self.small, small_owners),
                             (self.kv, kv_owners)):
            check_held_once(pool.name, "the tree", owners["tree"], pool.unit)
        check_conservation(self.big.view(), big_owners)
        check_conservation(self.small.view(), small_owners)
        check_conservation(self.kv.view(), kv_owners, borrowed)

    fast_check = True  # False: always build the view (the fast path's side-by-side test)

    def drain(self) -> None:
        for rid in self.live():
            req = self.requests[rid]
            if not req.paused and req.cur_kv_len == req.total_len:
                self.finish(rid)
            else:
                self.abort(rid)
            self.check()  # name what each release broke (a leak shows as conservation here)
        self.waiting.clear()  # a waiting request holds nothing
        c = self.cache
        while c.tree_total_tokens_num - c.refed_tokens_num > 0:
            c.evict(c.tree_total_tokens_num - c.refed_tokens_num)

    def check_quiescent(self) -> None:
        check_quiescence(self.tree_view(), [self.kv.view(), self.small.view(), self.big.view()],
                         {"ref": 1})

    def counters(self) -> dict:
        c = self.cache
        return {"tree_total": c.tree_total_tokens_num, "refed": c.refed_tokens_num,
                "kv_free": self.kv.available_size(), "small_free": self.small.available_size(),
                "big_free": self.big.available_size(), "live": len(self.requests),
                "waiting": len(self.waiting),
                "root_ref": c.root_node.ref_counter}

    def outline(self) -> str:
        lines, held = [], self.held_locks()
        c = self.cache

        def walk(node, depth):
            if node is c.root_node:
                lines.append(f"root  ref={node.ref_counter}")
            else:
                kind = (f"big big_buf={node.big_page_buffer_idx}" if node.is_big_page_node()
                        else f"small small_buf={node.small_page_buffer_idx}")
                holders = f" held by {held[node.id]}" if held.get(node.id) else ""
                lines.append(f"{'  ' * depth}#{node.id} {list(node.key)} "
                             f"@{node.node_prefix_total_len} {kind} ref={node.ref_counter} slots={node.value}{holders}")
            for _, child in sorted(node.children.items()):
                walk(child, depth + 1)

        walk(c.root_node, 0)
        for rid in self.live():
            r = self.requests[rid]
            lines.append(
                f"r{rid}: {r.cur_kv_len}/{r.total_len} computed (cache_len "
                f"{r.linear_att_cache_len}){' paused' if r.paused else ''}, holds "
                f"{'#' + str(r.shared_kv_node.id) if r.shared_kv_node else 'nothing'}, "
                f"pending big {dict(r.linear_att_len_to_big_page_id)}, tail small "
                f"{r.tail_linear_att_small_page_buffer_id}")
        lines.extend(self.waiting_lines())
        return "\n".join(lines)
