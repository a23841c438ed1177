"""kvcheck target ``tinyserve``: the toy engine in ``tinyserve`` plugged in through kvcheck's
public seam only (``caches/seam.py``, docs/adapters.md section 2a): what differs from kvcheck's
reference is *declared* -- its node field names, its 0-based pool without a padding slot, an
``evict`` that returns the slots it freed, an empty list for out-of-memory, its recency rule
(one accepted difference from the reference), its page size and a feature switch -- and the
driver follows its ``Scheduler`` (which evicts on its own when it allocates: the eviction
observer sees those victims too).
"""

from pathlib import Path
from typing import NamedTuple

import tinyserve
from caches.pools import DataTensor, resolve_device
from caches.reporting import Built, ReportSetup
from caches.request import Req
from caches.seam import (INDICES, ZERO_BASED, Difference, NodeFields, NodeProxies, Policy,
                         Results)
from caches.seam_report import drained_check, pool_check, tree_checks
from caches.subjects.base import Skip, watch
from caches.subjects.radix import RadixSubject
from caches.target import DECLINE, FaultNotInjectable, Identity, Target, content_hash
from state_machines.variants import Param

VERSION = "0.1.0"
FIELDS = NodeFields(id="serial", parent="up", children="kids", key="tokens", value="slots",
                    lock="pins", time="stamp")


class MatchResult(NamedTuple):
    indices: list
    last_node: object


class Slots(DataTensor):
    """The engine's ``SlotPool`` as the checks see it (and the fingerprints of its slots)."""

    unit, page_size, name = "slot", 1, "kv"

    def __init__(self, pool, device):
        super().__init__(pool.size, device)
        self.engine_pool, self.num_pages = pool, pool.size

    @property
    def free_pages(self):
        return list(self.engine_pool.free_ids)

    def free(self, ids):
        self.engine_pool.give(list(ids))

    def pages_of(self, ids):
        return list(ids)

    def view(self):
        return ZERO_BASED.view(self.name, self.unit, self.num_pages, self.engine_pool.free_ids)


class Cache(NodeProxies):
    """The engine's tree behind the radix interface the subject's bare ops call."""

    node_fields = FIELDS

    def __init__(self, sched, device):
        self.sched, self.tree = sched, sched.tree
        self.pool = Slots(sched.pool, resolve_device(device))

    def raw_root(self):
        return self.tree.root

    evictable_size_ = property(lambda self: self.tree.cached - self.tree.pinned)
    protected_size_ = property(lambda self: self.tree.pinned)
    evictable_leaves = property(lambda self: [self.node(e) for e in self.tree.leaves()])

    def match_prefix(self, tokens):
        hit = self.tree.lookup(list(tokens))
        return MatchResult(hit.slots, self.node(hit.entry))

    def insert(self, tokens, slots):
        return self.tree.store(list(tokens), list(slots))

    def inc_lock_ref(self, node):
        self.tree.pin(node.raw)

    def dec_lock_ref(self, node):
        self.tree.unpin(node.raw)

    def evict(self, n):
        return self.tree.evict(n)

    def alloc_with_eviction(self, n):
        return self.sched._allocate(n)


class TinyServeSubject(RadixSubject):
    target = "tinyserve"
    node_fields = FIELDS
    results = Results(out_of_memory=lambda got: not got, evict_returns=INDICES)
    policy = Policy(tie_break="by serial (creation order)",
                    recency="a lookup or store stamps every entry it reads; of an entry it "
                            "splits, only the upper part it read",
                    differences=(Difference(
                        "split-keeps-lower-stamp",
                        "an entry split by a lookup or store keeps its old stamp on the lower "
                        "part (the reference refreshes both parts), so a later eviction may "
                        "take that part first",
                        ops=("admit", "insert", "evict"),
                        fields=("tree", "evictable", "protected", "free_pages", "live",
                                "requests")),))
    # tinyserve's toy scheduler prefills and finishes; it has no decode loop, retraction,
    # batch budget or speculative path, so those lifecycle ops are never drawn on it
    lifecycle_declined = {op: "tinyserve's scheduler has no such path"
                          for op in ("decode", "spec_decode", "retract", "schedule")}

    def __init__(self, *, pool_pages=16, fast_finish=0, device=None,
                 tree_cls=tinyserve.PrefixTree):
        self.built = Built()
        pool = self.built.make("pool", tinyserve.SlotPool, pool_pages)
        tree = self.built.make("tree", tree_cls)
        sched = self.built.make("sched", tinyserve.Scheduler, pool, tree,
                                fast_finish=bool(fast_finish))
        super().__init__(page_size=1, pool_pages=pool_pages, device=device,
                         cache=Cache(sched, device))
        self.sched, self.tree, self.seqs = sched, tree, {}
        # the engine's own eviction path: every pass, every victim, whoever starts it
        self.observe_evictions(tree, passes=("evict",), victim="_drop")
        self.observe_evictions(sched, allocs={"_allocate": self.alloc_demands()[
            "alloc_with_eviction"]})
        watch(tree, "_split", before=lambda *a: self.reached("node-split"))  # coverage

    def raw_tree_root(self):
        return self.tree.root

    # -- the driver: tinyserve's Scheduler, as its serving loop calls it ------------------------
    def _mirror(self, rid):
        seq, req = self.seqs[rid], self.requests[rid]
        req.kv_indices, req.filled = list(seq.slots), seq.done
        req.cache_protected_len, req.last_node = seq.cached, self.cache.node(seq.anchor)

    def admit(self, rid, tokens):
        if rid in self.requests:
            raise Skip(f"r{rid} is already live")
        seq = self.sched.admit(list(tokens))
        if seq is None:
            self.reached("out-of-memory")
            return f"out of memory: r{rid} not admitted"
        self.verify_data(self.pool, seq.slots[:seq.cached], tokens, f"r{rid} prefix hit, ")
        if seq.cached:
            self.reached("prefix-hit")
        self.seqs[rid], self.requests[rid] = seq, Req(rid, list(tokens))
        self._mirror(rid)
        return f"admitted r{rid}, {seq.cached} of {len(tokens)} cached"

    def prefill(self, rid, n):
        req, seq = self.req(rid), self.seqs.get(rid)
        if seq.done >= len(seq.tokens):
            raise Skip(f"r{rid} is fully prefilled")
        k = min(n, len(seq.tokens) - seq.done)
        want = self.expected_data(seq.tokens)[seq.done:seq.done + k]
        self.pool.write(seq.slots[seq.done:seq.done + k], want)
        self.sched.step(seq, k)
        if seq.done < len(seq.tokens):
            before = seq.cached
            self.sched.checkpoint(seq)
            if seq.cached > before:
                self.reached("chunk-cached")
        self._mirror(rid)
        return f"computed {k} ({req.filled}/{len(seq.tokens)})"

    def finish(self, rid):
        self.req(rid)
        seq = self.seqs[rid]
        if seq.done < len(seq.tokens):
            raise Skip(f"r{rid} is still prefilling")
        self.verify_data(self.pool, seq.slots, seq.tokens, f"r{rid} at finish, ")
        self.sched.finish(seq)
        del self.requests[rid], self.seqs[rid]
        return "finished"

    def abort(self, rid):
        if self.req(rid).filled < len(self.seqs[rid].tokens):
            self.reached("abort-mid-prefill")
        self.sched.abort(self.seqs.pop(rid))
        del self.requests[rid]
        return "aborted"

    def stray_unlock(self, tokens):
        node = self._match(tokens).last_node
        if node is self.cache.root_node or self.held_locks_below(node):
            raise Skip("the node is held by a live holder")
        try:
            self.cache.dec_lock_ref(node)
        except ValueError:
            self.reached("stray-unlock-rejected")
            return "rejected (not pinned)"
        return "accepted"

    # -- kvcheck report: the properties in tinyserve's terms -------------------------------------
    def report_setup(self):
        checks = {**tree_checks(FIELDS, uses="tree", root="tree.root", evictable="tree.cached - tree.pinned",
                                protected="tree.pinned"),
                  **pool_check(FIELDS, uses="tree, pool, sched", root="tree.root", free="pool.free_ids",
                               capacity="pool.size", base=0,
                               holders="[(f'running sequence {i}', s.slots[s.cached:]) "
                                       "for i, s in enumerate(sched.running)]"),
                  **drained_check(FIELDS, uses="tree, pool", root="tree.root", free="pool.free_ids",
                                  capacity="pool.size", base=0)}
        return ReportSetup(engine="tinyserve", version="", driven="tinyserve.PrefixTree",
                           built=self.built, checks=checks, node_fields=FIELDS,
                           anchors={"tree.root": self.tree.root})


def build_radix(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    if fault is not None:
        raise FaultNotInjectable(f"tinyserve injects no catalogued faults (asked for {fault})")
    return TinyServeSubject(pool_pages=params["pool_pages"],
                            fast_finish=params["fast_finish"], device=device)


def identify(src=None) -> Identity:
    return Identity("tinyserve", VERSION, content_hash([Path(tinyserve.__file__)]))


TARGET = Target(
    name="tinyserve", engine="tinyserve", summary="example plug-in: a toy engine's prefix tree "
    "and scheduler (not SGLang-shaped)", builders={"radix": build_radix}, identify=identify,
    params={"radix": {"page_size": Param(1, 1, 1, "tinyserve caches single tokens"),
                      "fast_finish": Param(0, 0, 1, "Scheduler(fast_finish=...): finish skips "
                                           "giving back duplicate slots (a planted defect)")}},
    regimes={"radix": ({"pool_pages": 8}, {"pool_pages": 16})})
