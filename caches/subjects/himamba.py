"""The HiMamba subject: the cache, its four pools, and a scheduler-like driver.

Pools: device KV (token slots) and device mamba states on the harness device; host KV and host
mamba states on CPU (upstream's pinned host pools).  Fingerprints: KV slot i of a sequence holds
``Fingerprint.of_prefix(tokens)[i]``; a mamba state after ``n`` tokens holds the fingerprint of
the n-th position (0 for the empty prefix).  Transfers copy the data tensors between tiers.

The driver calls the cache the way SGLang's scheduler does (docs/variants/himamba.md):
admit = match + (load back from host when the best node is on host) + lock + copy the mamba
state (COW) + allocate the rest with eviction; a prefill chunk that leaves the request unfinished
calls ``cache_unfinished_req(chunked=True)``; finish / abort = ``cache_finished_req``.  Storage
prefetches are the host-protection holders: ``prefetch`` protects the last host node and
allocates host slots, ``prefetch_done`` inserts the fetched tokens on host and releases it,
``prefetch_abort`` releases it.  ``write_ack`` acknowledges the in-flight write-throughs.
"""

from __future__ import annotations

import functools
from collections import Counter
from operator import attrgetter

from caches.himamba import (DEVICE_ONLY, WRITE_BACK, WRITE_THROUGH,
                            HiMambaRadixCache, HiReq)
from caches.pools import Fingerprint, StatePool, TokenSlotAllocator
from caches.subjects.base import Skip, Subject, watch
from caches.subjects.canon import Ref, Time, TreeState, Unordered, one
from caches.subjects.canon import ids as pool_ids
from caches.subjects.himamba_fast import himamba_fast_ok
from caches.subjects.lifecycle import Lifecycle
from invariants import (NodeView, TreeView, check_conservation, check_eviction_set, fail,
                        check_fingerprints, check_held_once, check_quiescence,
                        check_ref_balance, check_size_accounting, check_structure)
from invariants.policy import (check_no_over_eviction, check_no_spurious_oom, check_recency,
                               check_state_victims, check_victims, lru_key,
                               shortfall_need, with_cascades)
from invariants.tiers import (check_hit_counts, check_host_protection, check_lock_order,
                              check_lru_order, check_node_refs, check_tombstones,
                              device_leaves, host_leaves, lru_members)


def mamba_fp(tokens) -> int:
    return Fingerprint.of_prefix(tokens)[-1] if tokens else 0


def on_host(node: NodeView) -> bool:
    """On the host tier only: evicted from device, backed up (``tiers.host_leaves``)."""
    return not node.extra["device"] and bool(node.extra["backuped"])


def _all_free(pool) -> bool:
    """Every unit of ``pool`` is on its free list, once (``check_quiescence``'s pool test)."""
    free, capacity = pool.free_and_capacity()
    return len(free) == capacity and len(set(free)) == capacity


def host_tier(op):
    """An op of the host tier: a no-op ("skipped") on a subject without one."""
    @functools.wraps(op)
    def wrapped(self, *args, **kwargs):
        if not self.host:
            raise Skip("no host tier (MambaRadixCache)")
        return op(self, *args, **kwargs)

    return wrapped


class HiMambaSubject(Lifecycle, Subject):
    variant = "himamba"

    def __init__(self, cache_cls=HiMambaRadixCache, *, kv_slots: int = 12, mamba_slots: int = 8,
                 host_kv_slots: int = 16, host_mamba_slots: int = 10,
                 write_policy: str = WRITE_THROUGH, storage: bool = True,
                 max_running: int = 2, device: str | None = None, host: bool = True,
                 cache=None):
        """``cache_cls`` over pools built here, or ``cache``: an engine's cache already built
        over the pools it owns (``cache.kv``, ``.mamba``, ``.host_kv``, ``.host_mamba``)."""
        super().__init__()
        self.host = host  # False: no host tier (SGLang's MambaRadixCache); host ops are no-ops
        if not host:
            write_policy, storage = DEVICE_ONLY, False
            self.device_cascade_exposes = True  # MambaRadixCache.evict_full's restart
        self.max_running = max_running
        self.page_size = 1  # token slots
        self.waiting: dict[int, HiReq] = {}  # the scheduler's waiting queue (lifecycle.py)
        if cache is None:
            self.kv = TokenSlotAllocator(kv_slots, device, name="kv")
            self.mamba = StatePool(mamba_slots, device, name="mamba")
            self.host_kv = TokenSlotAllocator(host_kv_slots, "cpu", name="host_kv")
            self.host_mamba = StatePool(host_mamba_slots, "cpu", name="host_mamba")
            cache = cache_cls(self.kv, self.mamba, self.host_kv, self.host_mamba,
                              write_policy, storage)
            self.device_cascade_exposes = cache.evict_exposes_cascade
        else:
            self.kv, self.mamba = cache.kv, cache.mamba
            # a cache without a host tier (host=0) owns no host pools: empty ones stand in,
            # and every check on them then says they were never touched
            self.host_kv = getattr(cache, "host_kv", None)
            if self.host_kv is None:
                self.host_kv = TokenSlotAllocator(host_kv_slots, "cpu", name="host_kv")
            self.host_mamba = getattr(cache, "host_mamba", None)
            if self.host_mamba is None:
                self.host_mamba = StatePool(host_mamba_slots, "cpu", name="host_mamba")
        self.cache = cache
        evict, evictable = self.cache.evict, lambda: self.cache.full_evictable_size_
        if self.write_back:  # progress judged below bounded: a failed write-back excuses it
            evict, evictable = self._write_back_progress(evict, evictable), lambda: 0
        self.cache.evict = self.bounded(evict, kv_slots + 2, evictable)
        self.lock_mamba: dict[int, bool] = {}  # bare lock id -> took a mamba lock
        self.prefetches: dict[int, dict] = {}
        self._watch_transitions()
        self._watch_policy()

    _kept = 0  # write-back leaves kept on device so far (their backup failed, drop declined)

    def _write_back_progress(self, evict, evictable):
        """``bounded``'s progress property under write_back: an eviction asked to free
        something while the counter says there is something must free something -- unless a
        write-back failed under host memory pressure and kept its leaf on device (upstream's
        "subtree drop declined (node locked) ... stays device-resident until host space
        frees"), which is the policy, not a stall."""
        subject = self

        def run(num_tokens, *args, **kwargs):
            before, kept = evictable(), subject._kept
            freed = evict(num_tokens, *args, **kwargs)
            if subject.checking and num_tokens > 0 and before > 0 and not freed and \
                    subject._kept == kept:
                fail("progress", f"evict({num_tokens}) freed nothing although the evictable "
                     f"counter says {before} (and no write-back kept its leaf)",
                     asked=num_tokens, evictable=before)
            return freed
        return run

    # -- helpers --------------------------------------------------------------------------
    def _alloc_kv(self, n: int):
        if n == 0:
            return []
        self.cache.evict.reset()
        got = self.kv.alloc(n)
        if got is None:
            self.cache.evict(n - self.kv.available_size())
            got = self.kv.alloc(n)
        return got

    def _alloc_mamba(self, protect=None):
        got = self.mamba.alloc(1)
        if got is None:
            if protect is not None:
                self.cache.inc_lock_ref(protect)
            self.cache.evict_mamba(1)
            got = self.mamba.alloc(1)
            if protect is not None:
                self.cache.dec_lock_ref(protect)
        return None if got is None else got[0]

    def _path_kv(self, node) -> list[int]:
        out = []
        while node is not self.cache.root_node:
            out = list(node.value) + out
            node = node.parent
        return out

    def _match_and_load(self, tokens):
        """match_prefix + init_load_back, as the scheduler admits a request: the node to lock
        (device KV on its whole path, a device mamba state unless it is the root)."""
        c = self.cache
        m = c.match_prefix(tokens)
        self.verify_data(self.kv, m.device_indices, tokens, "match hit, ")
        node = m.last_device_node
        if m.host_hit_length > 0 and m.last_host_node is m.best_node:
            _, node = c.init_load_back(m.best_node)
        while node is not c.root_node and node.mamba_value is None:
            node = node.parent  # never lock a tombstone (see docs: prefix_indices quirk)
        return node

    def _copy_mamba(self, slot: int, node) -> None:
        if node is self.cache.root_node:
            self.mamba.write([slot], [0])
        else:
            self.mamba.write([slot], self.mamba.read([node.mamba_value]))

    # -- reachability ("sometimes") coverage: transitions seen from the outside ---------------
    def _watch_transitions(self) -> None:
        """Report the interesting transitions (``SPEC.sometimes``) by wrapping the cache's
        methods on this instance: the cache carries no harness code, faults (subclasses) are
        wrapped the same way, and a cache without one of the methods reports fewer."""
        cache, subject = self.cache, self
        self._host_evicting = 0  # inside _evict_host_leaf: a cascade there is a host cascade

        def wrap(name, before=None, after=None):
            watch(cache, name, before, after)

        def split(child, split_len):
            subject.reached("node-split")
            if child.evicted:
                subject.reached("inner-host-node")  # the evicted prefix gets a child

        def to_host(node):
            if node.children:
                subject.reached("inner-host-node")
            subject.reached("evict-to-host")

        def host_leaf_in(node):
            subject._host_evicting += 1
            subject.reached("host-eviction")

        def host_leaf_out(out, note, node):
            subject._host_evicting -= 1

        def tombstone_deleted(node):
            subject.reached("host-eviction-cascade" if subject._host_evicting
                            else "tombstone-cascade")

        def stops(out, note, p):
            # called on a childless parent the cascade would delete next
            if not out or p is cache.root_node or p.mamba_value is not None \
                    or p.mamba_host_value is not None:
                return
            if p.full_lock_ref > 0 or p.mamba_lock_ref > 0:
                subject.reached("cascade-stopped-by-lock")
            if p.host_ref_counter > 0 or p.host_mamba_ref_counter > 0:
                subject.reached("cascade-stopped-by-host-ref")

        def load_note(node):
            return (node.evicted, node.mamba_value is None and node.mamba_backuped)

        def loaded(out, note, node):
            if out is not None:
                kv, state = note
                if kv:
                    subject.reached("load-back")
                if state:
                    subject.reached("host-mamba-restored")

        def backed_up(out, note, node):
            if out:
                subject.reached("host-backup")

        wrap("_split_node", before=split)
        wrap("_tombstone_internal_node", before=lambda n: subject.reached("tombstone-created"))
        wrap("_evict_to_host", before=to_host)
        wrap("_evict_host_leaf", before=host_leaf_in, after=host_leaf_out)
        wrap("_delete_tombstone_leaf", before=tombstone_deleted)
        wrap("_cascade_stops_at", after=stops)
        wrap("load_back", before=load_note, after=loaded)
        wrap("write_backup", after=backed_up)
        wrap("write_backup_storage", before=lambda n: subject.reached("storage-backup"))
        # write_back: a leaf backed up as eviction picks it, and the backup failing under host
        # memory pressure (the leaf dropped with its host-only subtree, or kept on device)
        wrap("_write_back", after=lambda out, note, n: out and subject.reached("write-back"))
        wrap("_write_back_failed", before=lambda n: subject.reached("write-back-failed"))

        def kept(node):
            subject._kept += 1
        wrap("_write_back_kept", before=kept)

    # -- serving operations ---------------------------------------------------------------
    def admit(self, rid: int, tokens: list[int]) -> str:
        if rid in self.requests or rid in self.waiting:
            raise Skip(f"r{rid} is already live or waiting")
        if len(self.requests) >= self.max_running:
            raise Skip(f"{self.max_running} requests already running")
        node = self._match_and_load(tokens[:-1])
        prefix = self._path_kv(node)
        self.verify_data(self.kv, prefix, tokens, f"r{rid} prefix hit, ")
        self.cache.inc_lock_ref(node)
        slot = self._alloc_mamba(protect=node)
        if slot is None:
            self.cache.dec_lock_ref(node)
            self.reached("out-of-memory")
            return f"out of mamba states, r{rid} not admitted"
        self._copy_mamba(slot, node)
        if self.checking:
            check_fingerprints("mamba", [slot], self.mamba.read([slot]),
                               [mamba_fp(tokens[:len(prefix)])], what=f"r{rid} mamba COW, ")
        own = self._alloc_kv(len(tokens) - len(prefix))
        if own is None:
            self.mamba.free([slot])
            self.cache.dec_lock_ref(node)
            self.reached("out-of-memory")
            return f"out of memory: {len(tokens) - len(prefix)} tokens needed, r{rid} not admitted"
        self.requests[rid] = HiReq(rid, list(tokens), prefix + own, filled=len(prefix),
                                   cache_protected_len=len(prefix), last_node=node,
                                   mamba_slot=slot)
        return f"hit {len(prefix)} of {len(tokens)} tokens at #{node.id}, allocated {len(own)}"

    def prefill(self, rid: int, n: int) -> str:
        req = self.req(rid)
        if n < 1:  # the shrinker may take n below the generator's 1; no scheduler extends by 0
            raise Skip("a prefill chunk computes at least one token")
        if req.filled >= len(req.tokens):
            raise Skip(f"r{rid} is fully prefilled")
        k = min(n, len(req.tokens) - req.filled)
        unfinished = req.filled + k < len(req.tokens)
        if unfinished and self.mamba.available_size() == 0 and \
                self.cache.mamba_evictable_size_ == 0:
            self._fork_starved(req)
        span = req.kv_indices[req.filled:req.filled + k]
        self.kv.write(span, self.expected_data(req.tokens)[req.filled:req.filled + k])
        req.filled += k
        self.mamba.write([req.mamba_slot], [mamba_fp(req.tokens[:req.filled])])
        if not unfinished:
            return f"computed {k} tokens, prefill complete"
        before, backed = self._hits()
        self.reached("chunked-insert")
        note = self._before_chunk(req)
        self.cache.cache_unfinished_req(req, chunked=True)
        if self.checking:
            self._check_chunk_hits(req, before, backed, note)
        return f"computed {k} tokens ({req.filled}/{len(req.tokens)}), cached unfinished (chunked)"

    def _fork_starved(self, req) -> None:
        """The chunk's fork would find no state free and none evictable, where SGLang asserts
        "Can not alloc mamba cache".  Declined here (the reference, the 0.5.12.post1 /
        0.5.10.post1 adapters, 0.5.23 at host=0); 0.5.23 at host=1 drives it (finding F7)."""
        raise Skip("no mamba state can be freed for the chunk's fork")

    def _before_chunk(self, req):
        """What a subject needs to remember before a chunked insert for its hit check."""
        return None

    def _check_chunk_hits(self, req, before, backed, note) -> None:
        """The hit-count contract of a chunked insert (0.5.12's: no hit counted at all)."""
        after, backed_after = self._hits()
        if self.write_back:  # the backups are eviction's (its mamba slot), never a hit's
            backed_after = set(backed_after) & set(backed)
        check_hit_counts(before, after, backed, backed_after, what=f"r{req.rid} chunk: ")

    def _hits(self):
        hits, backed = {}, set()
        for n in self._walk():
            hits[n.id] = n.hit_count
            if n.backuped:
                backed.add(n.id)
        return hits, backed

    def finish(self, rid: int) -> str:
        req = self.req(rid)
        if req.filled < len(req.tokens):
            raise Skip(f"r{rid} is still prefilling")
        self.verify_data(self.kv, req.kv_indices, req.tokens, f"r{rid} at finish, ")
        self.cache.cache_finished_req(req)
        del self.requests[rid]
        return "finished, KV and mamba state handed to the tree"

    def abort(self, rid: int) -> str:
        req = self.req(rid)
        self.cache.cache_finished_req(req, is_insert=False)
        del self.requests[rid]
        return f"aborted after {req.filled}/{len(req.tokens)} tokens"

    # -- past the prefill (caches/subjects/lifecycle.py): this cache's hooks ---------------
    # a decode step takes one token slot and advances the request's mamba state in place;
    # retract is ``cache_finished_req(is_insert=False)`` (KV past the prefix and the mamba
    # state freed, the lock dropped); a scheduled request is matched and loaded back like an
    # admission, pinned, and given its mamba state (copy-on-write of the matched node's) --
    # refused when no mamba state can be had (SGLang 0.5.23 gates new mamba slots before
    # the KV budget: ``PrefillAdder.add_one_req``, schedule_policy.py lines 1414-1424)
    def kv_pool(self):
        return self.kv

    def _decode_alloc(self, req):
        got = self._alloc_kv(1)
        return None if got is None else got[0]

    def _advance(self, req) -> None:
        self.mamba.write([req.mamba_slot], [mamba_fp(req.tokens[:req.filled])])

    def _release_no_insert(self, req) -> None:
        self.cache.cache_finished_req(req, is_insert=False)

    def _reset(self, req) -> None:
        super()._reset(req)
        req.mamba_slot = None

    def _new_waiting(self, rid: int, tokens: list[int], max_new: int) -> HiReq:
        return HiReq(rid, list(tokens), max_new=max_new)

    def _pin(self, req, admitted: int):
        if len(self.requests) + admitted >= self.max_running:
            return None
        node = self._match_and_load(req.tokens[:-1])
        prefix = self._path_kv(node)
        self.verify_data(self.kv, prefix, req.tokens, f"r{req.rid} prefix hit, ")
        self.cache.inc_lock_ref(node)
        slot = self._alloc_mamba(protect=node)
        if slot is None:
            self.cache.dec_lock_ref(node)
            return None
        self._copy_mamba(slot, node)
        return prefix, node, slot

    def _unpin(self, req, pinned) -> None:
        self.mamba.free([pinned[2]])
        self.cache.dec_lock_ref(pinned[1])

    def _place(self, req, pinned, own: list[int]) -> None:
        prefix, node, slot = pinned
        req.kv_indices = list(prefix) + own
        req.filled = req.cache_protected_len = len(prefix)
        req.last_node, req.mamba_slot = node, slot
        self.requests[req.rid] = req

    def _alloc_prefill(self, n: int):
        return self._alloc_kv(n)

    def _free_and_evictable(self) -> int:
        return self.kv.available_size() + self.cache.full_evictable_size_

    def _free_kv_tokens(self) -> int:
        return self.kv.available_size()

    def _evict_tokens(self, n: int) -> int:
        self.cache.evict.reset()
        return self.cache.evict(n)

    def insert(self, tokens: list[int]) -> str:
        slots = self._alloc_kv(len(tokens))
        if slots is None:
            self.reached("out-of-memory")
            return "out of memory"
        mslot = self._alloc_mamba()
        if mslot is None:
            self.kv.free(slots)
            self.reached("out-of-memory")
            return "out of mamba states"
        self.kv.write(slots, self.expected_data(tokens))
        self.mamba.write([mslot], [mamba_fp(tokens)])
        total, exist = self.cache.insert(tokens, slots, mslot)
        if exist:
            self.mamba.free([mslot])
        return f"tree already had {total} tokens" + (" and the mamba state" if exist else "")

    def match(self, tokens: list[int]) -> str:
        m = self.cache.match_prefix(tokens)
        self.verify_data(self.kv, m.device_indices, tokens, "match, ")
        return (f"hit {len(m.device_indices)} tokens on device at #{m.last_device_node.id}, "
                f"host hit {m.host_hit_length}")

    def lock(self, hid: int, tokens: list[int]) -> str:
        if hid in self.locks:
            raise Skip(f"lock l{hid} is already held")
        if len(self.locks) >= 2:
            raise Skip("two bare locks already held")
        node = self._match_and_load(tokens)
        if node is self.cache.root_node:
            return "nothing matched, nothing locked"
        self.lock_mamba[hid] = node.mamba_value is not None
        self.cache.inc_lock_ref(node)
        self.locks[hid] = node
        return f"locked #{node.id}"

    def unlock(self, hid: int) -> str:
        if hid not in self.locks:
            raise Skip(f"lock l{hid} is not held")
        self.lock_mamba.pop(hid)
        self.cache.dec_lock_ref(self.locks.pop(hid))
        return "unlocked"

    def evict(self, n: int) -> str:
        return f"evicted {self._evict_tokens(n)} device tokens"

    def evict_mamba(self, n: int) -> str:
        return f"evicted {self.cache.evict_mamba(n)} mamba states"

    @host_tier
    def evict_host(self, n: int) -> str:
        return f"evicted {self.cache.evict_host(n)} host tokens"

    @host_tier
    def evict_mamba_host(self, n: int) -> str:
        return f"evicted {self.cache.evict_mamba_host(n)} host mamba states"

    @host_tier
    def backup(self, tokens: list[int]) -> str:
        """write_backup of the device node the tokens end at (a hit reaching its threshold)."""
        if self.write_back:
            raise Skip("write_back backs a node up only when eviction picks it")
        c = self.cache
        c.match_prefix(tokens)  # splits at the end of the tokens, like any match
        node, key = c.root_node, list(tokens)
        while key and key[0] in node.children and not node.children[key[0]].evicted:
            child = node.children[key[0]]
            if list(child.key) != key[:len(child.key)]:
                break
            node, key = child, key[len(child.key):]
        if node is c.root_node or node.backuped:
            raise Skip("nothing to back up")
        got = c.write_backup(node)
        return f"backing up #{node.id} ({got} tokens)" if got else "backup refused"

    @property
    def write_back(self) -> bool:
        return getattr(self.cache, "write_policy", None) == WRITE_BACK

    @host_tier
    def write_ack(self) -> str:
        return f"acknowledged {self.cache.writing_check()} write(s)"

    @host_tier
    def storage_ack(self) -> str:
        return f"storage acknowledged {self.cache.drain_backup()} backup(s)"

    @host_tier
    def prefetch(self, hid: int, tokens: list[int]) -> str:
        """prefetch_from_storage(last_host_node of the match, the tokens beyond it)."""
        if hid in self.prefetches:
            raise Skip(f"prefetch p{hid} is live")
        if len(self.prefetches) >= 2:
            raise Skip("two prefetches already live")
        c = self.cache
        m = c.match_prefix(tokens)
        node = m.last_host_node
        # scheduler._prefetch_kvcache: the tokens beyond the device + host hit, fetched from
        # storage by the hash chain of the last host node (so they extend *its* prefix)
        tail = tokens[len(m.device_indices) + m.host_hit_length:]
        if not tail:
            raise Skip("nothing beyond the host hit to prefetch")
        if not self._host_insert_stays_backed(node, tail):
            raise Skip("the fetched tokens would hang below a node that is not backed up")
        c.protect_host_node(node, protect_mamba=False)
        host = self.host_kv.alloc(len(tail))
        if host is None:
            c.evict_host(len(tail))
            host = self.host_kv.alloc(len(tail))
        if host is None:
            c.release_host_node(node, release_mamba=False)
            return "prefetch refused: host KV full"
        mslot = self.host_mamba.alloc(1)
        if mslot is None:
            c.evict_mamba_host(1)
            mslot = self.host_mamba.alloc(1)
        if mslot is None:
            self.host_kv.free(host)
            c.release_host_node(node, release_mamba=False)
            return "prefetch refused: host mamba full"
        c.protect_host_mamba(node)
        self.prefetches[hid] = {"node": node, "seq": c.path_tokens(node) + tail, "tail": tail,
                                "host": host, "mamba": mslot[0]}
        return f"prefetching {len(tail)} tokens below #{node.id}"

    @staticmethod
    def _host_insert_stays_backed(node, key) -> bool:
        """Would ``insert_helper_host(node, key)`` put a host-only node below a device node that
        is not backed up?  Upstream allows it, and the next eviction of that device node
        asserts in ``_evict_regular`` (a "leaf" with host-only children): a finding we report
        (docs/variants/himamba.md) and keep out of the clean model's op space."""
        key = list(key)
        while key and key[0] in node.children:
            child = node.children[key[0]]
            p = 0
            while p < min(len(child.key), len(key)) and child.key[p] == key[p]:
                p += 1
            key = key[p:]
            if key and not child.backuped:
                return False
            node = child
        return True

    @host_tier
    def prefetch_done(self, hid: int) -> str:
        if hid not in self.prefetches:
            raise Skip(f"prefetch p{hid} is not live")
        p = self.prefetches.pop(hid)
        seq, tail, host = p["seq"], p["tail"], p["host"]
        if not self._host_insert_stays_backed(p["node"], tail):
            # the tree changed meanwhile; model the storage returning nothing (0 completed)
            self.host_kv.free(host)
            self.host_mamba.free([p["mamba"]])
            self.cache.release_host_node(p["node"])
            return "prefetch completed with nothing usable (released)"
        self.host_kv.write(host, self.expected_data(seq)[len(seq) - len(tail):])
        self.host_mamba.write([p["mamba"]], [mamba_fp(seq)])
        matched = self.cache.insert_helper_host(p["node"], tail, host, p["mamba"])
        self.host_kv.free(host[:matched])
        if matched >= len(tail):
            self.host_mamba.free([p["mamba"]])
        self.cache.release_host_node(p["node"])
        if matched < len(tail):
            self.reached("prefetch-inserted")
        return f"prefetched: {matched} tokens were already there, {len(tail) - matched} new on host"

    @host_tier
    def prefetch_abort(self, hid: int) -> str:
        if hid not in self.prefetches:
            raise Skip(f"prefetch p{hid} is not live")
        p = self.prefetches.pop(hid)
        self.host_kv.free(p["host"])
        self.host_mamba.free([p["mamba"]])
        self.cache.release_host_node(p["node"])
        self.reached("prefetch-aborted")
        return "prefetch released"

    # -- views ------------------------------------------------------------------------------
    def _walk(self) -> list:
        """The tree's nodes, depth first from the root, the first object seen per id (a list,
        not a generator: every caller reads the whole walk, several per step)."""
        order, seen, stack = [], set(), [self.cache.root_node]
        while stack:
            n = stack.pop()
            if n.id in seen:
                continue
            seen.add(n.id)
            order.append(n)
            stack.extend(n.children.values())
        return order

    def tree_view(self, kind: str = "all") -> TreeView:
        """kind: ``all`` (value = device or host KV), ``full`` (device KV only), ``mamba``
        (the device state slot as a one-element value)."""
        return self._views((kind,))[kind]

    def _views(self, kinds=("all", "full", "mamba")) -> dict:
        """The views of ``kinds`` in one walk (``check_state`` needs all three)."""
        views = {k: {} for k in ("all", "full", "mamba")}
        for n in self._walk():
            refs = {"full": n.full_lock_ref, "mamba": n.mamba_lock_ref,
                    "host": n.host_ref_counter, "host_mamba": n.host_mamba_ref_counter}
            extra = {"device": not n.evicted, "backuped": n.backuped,
                     "mamba": n.mamba_value is not None,
                     "mamba_host": n.mamba_host_value is not None,
                     "time": n.last_access_time}
            parent = n.parent.id if n.parent is not None else None
            kids = {ck: ch.id for ck, ch in n.children.items()}
            key = tuple(n.key)
            dev = tuple(n.value) if n.value is not None else ()
            if "all" in kinds:
                views["all"][n.id] = NodeView(n.id, parent, key,
                                              dev or tuple(n.host_value or ()), refs, kids, extra)
            if "full" in kinds:
                views["full"][n.id] = NodeView(n.id, parent, key, dev, refs, kids, extra)
            if "mamba" in kinds:
                views["mamba"][n.id] = NodeView(
                    n.id, parent, key, (n.mamba_value,) if n.mamba_value is not None else (),
                    refs, kids, extra)
        root = self.cache.root_node.id
        return {k: TreeView(views[k], root, 1) for k in kinds}

    def held_locks(self) -> Counter:
        """Full-lock holders: requests and bare locks (``Subject.held_locks``), and the
        write-throughs in flight (each holds a lock on its node until acknowledged)."""
        return Counter(self.held_ledger()[0])

    def held_mamba(self) -> Counter:
        """Mamba-lock holders: requests past the root, bare locks that took a mamba lock,
        write-throughs that did."""
        return Counter(self.held_ledger()[1])

    def held_host(self, mamba: bool = False) -> Counter:
        """Host-protection holders: live prefetches and storage backups in flight (with
        ``mamba``: only the backups that protect the mamba state count)."""
        return Counter(self.held_ledger()[3 if mamba else 2])

    def held_ledger(self) -> tuple[dict, dict, dict, dict]:
        """``(held_locks(), held_mamba(), held_host(), held_host(mamba=True))`` in one pass
        over the holders, as plain dicts of node id -> count (the fast verdict reads them
        every step; the Counters above are these)."""
        full: dict = {}
        mamba: dict = {}
        fget, mget, root = full.get, mamba.get, self.cache.root_node
        for req in self.requests.values():
            node = req.last_node
            nid = node.id
            full[nid] = fget(nid, 0) + 1
            if node is not root:
                mamba[nid] = mget(nid, 0) + 1
        lock_mamba = self.lock_mamba
        for hid, node in self.locks.items():
            nid = node.id
            full[nid] = fget(nid, 0) + 1
            mamba[nid] = mget(nid, 0) + int(lock_mamba[hid])
        cache = self.cache
        for node in cache.ongoing_write_through.values():
            full[node.id] = fget(node.id, 0) + 1
        for nid, took in cache.write_lock_took_mamba.items():
            mamba[nid] = mget(nid, 0) + int(took)
        host: dict = {}
        host_mamba: dict = {}
        hget, hmget = host.get, host_mamba.get
        for p in self.prefetches.values():
            nid = p["node"].id
            host[nid] = hget(nid, 0) + 1
            host_mamba[nid] = hmget(nid, 0) + 1
        for node, protect_mamba in cache.ongoing_backup.values():
            nid = node.id
            host[nid] = hget(nid, 0) + 1
            host_mamba[nid] = hmget(nid, 0) + int(protect_mamba or False)
        return full, mamba, host, host_mamba

    # -- exhaustive search: what the state is ---------------------------------------------
    def state(self) -> TreeState:
        """The exhaustive search's state (``canon.py``): every node field (key, both tiers'
        slots and their fingerprints, the four ref counts, hit count; access times by rank),
        the live requests (tokens, row, computed prefix, mamba slot and its fingerprint, held
        node), bare locks (and whether they took a mamba lock), prefetches, the write-throughs
        and storage backups in flight (in order: an ack walks them in that order), the three
        LRU lists in order, both leaf sets, the four pools' free lists (their order decides
        which ids the next allocation gets) and the four counters."""
        c = self.cache
        kv, mamba, host_kv, host_mamba = (p.data.tolist() for p in (
            self.kv, self.mamba, self.host_kv, self.host_mamba))

        def fps(data, xs):
            return None if xs is None else tuple(data[x] for x in xs)

        def fp(data, x):
            return None if x is None else data[x]

        return TreeState(
            c.root_node,
            lambda n: (tuple(n.key), pool_ids("kv", n.value), pool_ids("host_kv", n.host_value),
                       one("mamba", n.mamba_value), one("host_mamba", n.mamba_host_value),
                       fps(kv, n.value), fps(host_kv, n.host_value), fp(mamba, n.mamba_value),
                       fp(host_mamba, n.mamba_host_value), n.full_lock_ref, n.mamba_lock_ref,
                       n.host_ref_counter, n.host_mamba_ref_counter, n.hit_count,
                       Time((n.last_access_time, n.id))),
            (tuple((rid, tuple(r.tokens), pool_ids("kv", r.kv_indices),
                    fps(kv, r.kv_indices[:r.filled]), r.filled, r.cache_protected_len,
                    Ref(r.last_node), one("mamba", r.mamba_slot), fp(mamba, r.mamba_slot),
                    r.max_new, r.output)
                   for rid, r in sorted(self.requests.items())),
             tuple((hid, Ref(n), self.lock_mamba.get(hid))
                   for hid, n in sorted(self.locks.items())),
             self.waiting_state(),
             tuple((hid, Ref(p["node"]), tuple(p["seq"]), tuple(p["tail"]),
                    pool_ids("host_kv", p["host"]), one("host_mamba", p["mamba"]))
                   for hid, p in sorted(self.prefetches.items())),
             tuple((Ref(n), c.write_lock_took_mamba.get(nid))
                   for nid, n in c.ongoing_write_through.items()),
             tuple((Ref(n), pm) for n, pm in c.ongoing_backup.values()),
             tuple(tuple(Ref(n) for n in lru.lru_first())
                   for lru in (c.full_lru, c.mamba_lru, c.host_mamba_lru)),
             tuple(Unordered(Ref(n) for n in sorted(s, key=lambda n: n.id))
                   for s in (c.evictable_full_device_leaves, c.evictable_full_host_leaves)),
             (pool_ids("kv", self.kv.free_pages), pool_ids("mamba", self.mamba.free_slots),
              pool_ids("host_kv", self.host_kv.free_pages),
              pool_ids("host_mamba", self.host_mamba.free_slots)),
             (c.full_evictable_size_, c.full_protected_size_, c.mamba_evictable_size_,
              c.mamba_protected_size_)))

    def check(self) -> None:
        """Every invariant after every op.  On the reference cache the one-walk fast verdict
        (``himamba_fast.py``) answers first; only when it sees anything wrong are the views
        built and every state check run, to say what broke (``check_state``).  The policy
        checks (of the evictions and matches this op made) always run."""
        if not (self.fast_check and isinstance(self.cache, HiMambaRadixCache)
                and himamba_fast_ok(self)):
            self.check_state()
        self.check_policy()

    fast_check = True  # False: always build the views (the fast path's side-by-side test)

    def check_state(self) -> None:
        """The state invariants on the views (everything but the policy checks)."""
        c = self.cache
        views = self._views()
        tree = views["all"]
        root = c.root_node.id
        # a node under host protection is never deleted (H1)
        check_host_protection(tree, self.held_host(),
                              [n.id for n in c.evictable_full_host_leaves])
        # locks: path-locked full refs (a deleted locked node is caught here: H2)
        check_ref_balance(tree, self.held_locks(), counter="full")
        check_node_refs(tree, "mamba", self.held_mamba(), root_baseline=1)
        check_lock_order(tree)
        check_node_refs(tree, "host", self.held_host())
        check_node_refs(tree, "host_mamba", self.held_host(mamba=True))
        check_structure(tree)
        # counters per kind
        check_size_accounting(views["full"], c.full_evictable_size_, c.full_protected_size_,
                              counter="full", label="full")
        check_size_accounting(views["mamba"], c.mamba_evictable_size_,
                              c.mamba_protected_size_, counter="mamba", label="mamba")
        # eviction sets and LRU lists (H4, H5)
        dev_set = [n.id for n in c.evictable_full_device_leaves]
        host_set = [n.id for n in c.evictable_full_host_leaves]
        check_eviction_set("evictable_full_device_leaves", dev_set, device_leaves(tree))
        check_eviction_set("evictable_full_host_leaves", host_set, host_leaves(tree))
        times = {n.id: n.extra["time"] for n in tree.nodes.values()}
        for lru, kind in ((c.full_lru, "full"), (c.mamba_lru, "mamba"),
                          (c.host_mamba_lru, "host_mamba")):
            ids = [n.id for n in lru.mru_first()]
            check_eviction_set(lru.name, ids, lru_members(tree, kind))
        for lru in (c.full_lru, c.mamba_lru):
            check_lru_order(lru.name, [n.id for n in lru.mru_first()], times)
        check_tombstones(tree, set(dev_set) | set(host_set))
        # conservation, per pool
        dev = [n for n in self._walk() if n.id != root]  # every tree node, on either tier
        kv_owners = {"tree": [i for n in dev if n.value for i in n.value]}
        kv_borrowed, m_owners = {}, {"tree": [n.mamba_value for n in dev
                                              if n.mamba_value is not None]}
        for rid, req in self.requests.items():
            kv_owners[f"request r{rid}"] = req.own_indices
            kv_borrowed[f"request r{rid}"] = req.borrowed_indices
            m_owners[f"request r{rid}"] = [req.mamba_slot]
        hk = {"tree": [i for n in dev if n.host_value for i in n.host_value]}
        hm = {"tree": [n.mamba_host_value for n in dev if n.mamba_host_value is not None]}
        for hid, p in self.prefetches.items():
            hk[f"prefetch p{hid}"] = p["host"]
            hm[f"prefetch p{hid}"] = [p["mamba"]]
        # each id the tree holds sits at one position (a node's KV slot or mamba state, on
        # either tier): conservation lets an owner list an id twice, so it cannot see two
        # positions sharing one
        for pool, owners, borrowed in ((self.kv, kv_owners, kv_borrowed),
                                       (self.mamba, m_owners, None),
                                       (self.host_kv, hk, None), (self.host_mamba, hm, None)):
            view = pool.view()
            check_held_once(view.name, "the tree", owners["tree"], view.unit)
            check_conservation(view, owners, borrowed)
        if self.checking:
            self._check_data(dev)

    # -- policy (invariants/policy.py): device KV eviction by LRU, tombstone cascades forced ---
    # Checked on the reference model (``HiMambaRadixCache`` and its fault subclasses) and on
    # every engine subject that says where its eviction internals are (``policy_internals``).
    victim_key = staticmethod(lru_key)

    # where the eviction internals live, and how a node there becomes a view id; the device
    # victim hook also serves the mamba pass; an engine adapter overrides these (see
    # caches/adapters/sglang/mamba.py, himamba.py; 0.5.23: unified_mamba.py, through
    # _watch_victims, with its own Mamba key and lock counters)
    device_cascade_exposes = False  # upstream's heap: only a victim's own parent is pushed back
    # the key of the state (mamba) pass, when it is not ``victim_key``; the counters that keep
    # a node off the device / host candidates (0.5.12's: the full lock; the host refs)
    state_victim_key = None
    device_victim_counters: str | tuple = "full"
    host_victim_counters: tuple = ("host", "host_mamba")
    # the device victim is seen when the eviction picks it (``_evict_leaf``: under write_back
    # before its backup, whose host eviction may cascade into device tombstones -- frees that
    # belong to this victim)
    victim_hooks = {"device": "_evict_leaf", "tombstone": "_tombstone_internal_node",
                    "host": "_evict_host_leaf", "cascade": "_delete_tombstone_leaf"}

    def policy_internals(self):
        """(object whose eviction internals are watched, node -> view id), or None where no
        policy is declared (a cache the subject does not know)."""
        if isinstance(self.cache, HiMambaRadixCache):
            return self.cache, (lambda node: node.id)
        return None

    def _watch_policy(self) -> None:
        # one eviction pass per stack entry: (kind, victims); evict() runs evict_mamba inside
        self._policy_events, self._passes = [], []
        cache, subject = self.cache, self
        internals = self.policy_internals()
        if internals is None:
            return
        owner, id_of = internals
        evict, alloc_kv, match = cache.evict, self._alloc_kv, cache.match_prefix

        def note(*kinds):
            def add(node, *args):
                if subject._passes and subject._passes[-1][0] in kinds:
                    subject._passes[-1][1].append(id_of(node))
            return add

        def cascade(node, *args):
            if subject._passes:
                entry = (id_of(node), "cascade")
                subject._passes[-1][1].append(entry)
                # write_back: a backup inside a device pass makes room on host, and that host
                # eviction's cascade may delete a device tombstone -- gone for the device
                # pass too
                if subject._passes[-1][0] == "evict_host" and len(subject._passes) > 1 and \
                        not getattr(node, "evicted", True):
                    subject._passes[-2][1].append(entry)

        recorded = self._recorded_pass
        policy_evict = recorded("evict", evict, "full")
        cache.evict_mamba = recorded("evict_mamba", cache.evict_mamba, "mamba")
        cache.evict_host = recorded("evict_host", cache.evict_host, "all")
        self._watch_victims(owner, note, cascade)
        self._watch_kept(owner, id_of)

        def policy_alloc_kv(n):
            if not subject.checking or n <= 0:
                return alloc_kv(n)
            before, free = subject._device_tokens(), subject.kv.available_size()
            start = len(subject._policy_events)
            got = alloc_kv(n)
            victims = [v for ev in subject._policy_events[start:] if ev[0] == "evict"
                       for v in ev[3]]
            subject._policy_events.append(("alloc", n, before, free, victims, got))
            return got

        def policy_match(key, *args, **kwargs):
            if not subject.checking:
                return match(key, *args, **kwargs)
            latest = max(map(attrgetter("last_access_time"), subject._walk()), default=0)
            out = match(key, *args, **kwargs)
            path, node = [], out.best_node
            while node is not None and node is not cache.root_node:
                path.append((node.id, node.last_access_time))
                node = node.parent
            subject._policy_events.append(("match", len(key), latest, path[::-1]))
            return out

        cache.evict, self._alloc_kv, cache.match_prefix = policy_evict, policy_alloc_kv, \
            policy_match

    def _recorded_pass(self, kind: str, fn, view: str, asked=None):
        """``fn(n, ...)`` (an eviction entry point) recorded as one pass of ``kind``: the
        ``view`` before it, the victims ``_watch_victims`` notes during it, and what it was
        asked -- ``asked(n)``, ``n`` itself by default (an entry point that is handed a
        request and evicts only its shortfall says so); not recorded while not checking,
        when nothing is asked, or inside a pass of the same kind."""
        subject = self

        def run(n, *args, **kwargs):
            want = n if asked is None else asked(n)
            if not subject.checking or want <= 0 or any(k == kind for k, _ in subject._passes):
                return fn(n, *args, **kwargs)
            before = subject.tree_view(view)
            subject._passes.append((kind, []))
            try:
                return fn(n, *args, **kwargs)
            finally:
                _, victims = subject._passes.pop()
                subject._policy_events.append((kind, want, before, victims))
        if hasattr(fn, "reset"):
            run.reset = fn.reset
        return run

    def _watch_victims(self, owner, note, cascade) -> None:
        """Where each pass's victims are seen: ``note(*passes)`` is a hook recording its first
        argument (a node, or whatever ``id_of`` maps) as a victim of the pass in progress when
        that pass is one of ``passes``; ``cascade`` records a forced removal.  Here: the
        methods ``victim_hooks`` names on ``owner``; an engine whose passes remove nodes
        through other seams overrides this (``unified_mamba.py``)."""
        hooks = self.victim_hooks
        watch(owner, hooks["device"], before=note("evict", "evict_mamba"))
        watch(owner, hooks["tombstone"], before=note("evict_mamba"))
        watch(owner, hooks["host"], before=note("evict_host"))
        watch(owner, hooks["cascade"], before=cascade)

    # a write-back leaf whose backup failed and that stays on device: the eviction popped it and
    # goes on without it (an entry ``(id, KEPT)``: gone from the candidates for the rest of the
    # pass, as a forced removal is, but it freed nothing)
    KEPT = "kept on device"
    kept_hook = "_write_back_kept"

    def _watch_kept(self, owner, id_of) -> None:
        if self.kept_hook:
            watch(owner, self.kept_hook, before=lambda node, *a: self._note_kept(id_of(node)))

    def _note_kept(self, nid) -> None:
        """Leaf ``nid`` (a view id) stays on device: in the device or state pass in progress it
        is a ``KEPT`` entry, not a victim."""
        if self._passes and self._passes[-1][0] in ("evict", "evict_mamba"):
            victims = self._passes[-1][1]
            if nid in victims:  # noted when picked: it freed nothing after all
                victims.remove(nid)
            victims.append((nid, self.KEPT))

    @classmethod
    def _kept_as_held(cls, before, victims, counter: str) -> list:
        """A kept leaf stays on device: its parent is no leaf, and it is no candidate for the
        rest of the pass.  The replay gets that as the leaf being held (``counter`` + 1 in the
        view before the pass) and the pass's victims without it.  (The pick of the kept leaf
        itself goes unjudged.)"""
        out = []
        for v in victims:
            if isinstance(v, tuple) and v[1] == cls.KEPT:
                refs = before.nodes[v[0]].refs
                refs[counter] = refs.get(counter, 0) + 1
            else:
                out.append(v)
        return out

    @classmethod
    def _freeing(cls, victims) -> list:
        """The victims that freed something (the kept ones left out), for the sizes
        ``with_cascades`` weighs."""
        return [v for v in victims if not (isinstance(v, tuple) and v[1] == cls.KEPT)]

    def _device_tokens(self) -> tuple[dict, int]:
        """What an allocation's policy check reads of the tree before it: each node's device
        KV tokens (by id) and ``evictable_tokens`` of the ``full`` view (the tokens of every
        non-root node no full lock holds), in one walk instead of the view."""
        sizes, evictable, root = {}, 0, self.cache.root_node
        for n in self._walk():
            tokens = len(n.value) if n.value is not None else 0
            sizes[n.id] = tokens
            if n is not root and n.full_lock_ref == 0:
                evictable += tokens
        return sizes, evictable

    def check_policy(self) -> None:
        events, self._policy_events = self._policy_events, []
        for ev in events:
            if ev[0] == "evict":
                _, asked, before, victims = ev
                what = f"evict({asked}) on device"
                counter = self.device_victim_counters
                victims = self._kept_as_held(before, victims, counter if isinstance(counter, str)
                                             else counter[0])
                check_victims(before, victims, self.victim_key,
                              counter=self.device_victim_counters, tier="device",
                              cascade_exposes=self.device_cascade_exposes, what=what)
                check_no_over_eviction(what, asked, with_cascades(
                    self._freeing(victims), lambda nid: len(before.nodes[nid].value)))
            elif ev[0] == "evict_mamba":
                _, asked, before, victims = ev
                victims = self._kept_as_held(before, victims, "mamba")
                check_state_victims(before, victims, self.state_victim_key or self.victim_key,
                                    what=f"evict_mamba({asked})")
            elif ev[0] == "evict_host":
                _, asked, before, victims = ev
                check_victims(before, victims, self.victim_key,
                              counter=self.host_victim_counters, tier=on_host,
                              leaf_in_tree=True, cascade_exposes=False,
                              what=f"evict_host({asked})")
            elif ev[0] == "alloc":
                _, n, (sizes, evictable), free, victims, got = ev
                what = f"allocating {n} KV slots ({free} free)"
                if got is None and not any(isinstance(v, tuple) and v[1] == self.KEPT
                                           for v in victims):
                    # (a write-back kept on device: the KV behind it was not evictable)
                    check_no_spurious_oom(what, n, free, evictable)
                else:
                    check_no_over_eviction(what, shortfall_need(n, free),
                                           with_cascades(self._freeing(victims),
                                                         sizes.__getitem__))
            else:
                _, n, latest, path = ev
                check_recency(f"match of a {n}-token key (best node and its ancestors)",
                              latest, path)

    def _check_data(self, nodes) -> None:
        """Every slot the tree owns, on either tier, holds its prefix's fingerprints."""
        kv, hkv = self.kv.data.tolist(), self.host_kv.data.tolist()
        mm, hmm = self.mamba.data.tolist(), self.host_mamba.data.tolist()
        for n in nodes:
            toks = self.cache.path_tokens(n)
            fp = Fingerprint.of_prefix(toks)[len(toks) - len(n.key):]
            for name, ids, data in (("kv", n.value, kv), ("host_kv", n.host_value, hkv)):
                if ids:
                    check_fingerprints(name, ids, [data[i] for i in ids], fp,
                                       what=f"node {n.id}, ")
            for name, sid, data in (("mamba", n.mamba_value, mm),
                                    ("host_mamba", n.mamba_host_value, hmm)):
                if sid is not None:
                    check_fingerprints(name, [sid], [data[sid]], [mamba_fp(toks)],
                                       what=f"node {n.id} state, ")

    # -- drain / quiescence -----------------------------------------------------------------
    def drain(self) -> None:
        self.waiting.clear()  # a waiting request holds nothing
        self.release_holders()
        for hid in sorted(self.prefetches):
            self.prefetch_abort(hid)
        self.cache.writing_check()
        self.cache.drain_backup()
        c = self.cache
        for _ in range(64):
            if not c.root_node.children:
                break
            self.cache.evict.reset()
            c.evict(self.kv.num_pages)
            self.check()  # the drain's own steps are checked like ops
            if self.write_back and c.drain_backup():  # write-backs start storage backups
                self.check()
            c.evict_host(self.host_kv.num_pages)
            self.check()

    def check_quiescent(self) -> None:
        pools = (self.kv, self.mamba, self.host_kv, self.host_mamba)
        root = self.cache.root_node
        if isinstance(self.cache, HiMambaRadixCache) and not root.children and \
                root.full_lock_ref == 1 and root.mamba_lock_ref == 1 and all(map(_all_free, pools)):
            return  # what check_quiescence finds on the views: only the root, at its baselines,
            # and every pool entirely free (views are built only to say what is wrong)
        check_quiescence(self.tree_view(), [p.view() for p in pools], {"full": 1, "mamba": 1})

    def counters(self) -> dict:
        c = self.cache
        return {"full_evictable": c.full_evictable_size_, "full_protected": c.full_protected_size_,
                "mamba_evictable": c.mamba_evictable_size_,
                "mamba_protected": c.mamba_protected_size_,
                "free_kv": self.kv.available_size(), "free_mamba": self.mamba.available_size(),
                "free_host_kv": self.host_kv.available_size(),
                "free_host_mamba": self.host_mamba.available_size(),
                "writes_in_flight": len(c.ongoing_write_through), "live": len(self.requests)}

    def outline(self) -> str:
        c, lines = self.cache, []

        def walk(n, depth):
            if n is c.root_node:
                lines.append("root")
            else:
                where = ("dev" if not n.evicted else "host") + ("+host" if
                                                                n.backuped and not n.evicted else "")
                m = ("M" if n.mamba_value is not None else "-") + \
                    ("h" if n.mamba_host_value is not None else "-")
                lines.append(f"{'  ' * depth}#{n.id} {list(n.key)} {where} mamba={m} "
                             f"lock={n.full_lock_ref}/{n.mamba_lock_ref} "
                             f"host_ref={n.host_ref_counter}/{n.host_mamba_ref_counter} "
                             f"hits={n.hit_count} t={n.last_access_time}")
            for _, ch in sorted(n.children.items()):
                walk(ch, depth + 1)

        walk(c.root_node, 0)
        for rid in self.live():
            r = self.requests[rid]
            lines.append(f"r{rid}: {r.filled}/{len(r.tokens)} computed, tree owns "
                         f"{r.cache_protected_len}, holds #{r.last_node.id}")
        for hid, node in sorted(self.locks.items()):
            lines.append(f"l{hid}: locks #{node.id}")
        lines.extend(self.waiting_lines())
        for hid, p in sorted(self.prefetches.items()):
            lines.append(f"p{hid}: prefetch protects #{p['node'].id}")
        if c.ongoing_write_through:
            lines.append(f"writes in flight: {sorted(c.ongoing_write_through)}")
        if c.ongoing_backup:
            lines.append("storage backups in flight: "
                         f"{sorted(n.id for n, _ in c.ongoing_backup.values())}")
        return "\n".join(lines)
