"""The himamba variant: SGLang's HiMamba radix cache (full KV + mamba state, device + host).

Sequences draw from a two-token vocabulary and are 1-3 tokens long, so prefixes are shared,
nodes split into tombstones, and the few-slot pools force eviction on both tiers.  Regimes:
write-through (every hit backs up), write-through-selective (the second hit does), and
``host=0``: the device tier alone, which is SGLang's plain ``MambaRadixCache`` (no backups,
eviction deletes; the host-tier rules are off).
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from caches.himamba import WRITE_THROUGH, WRITE_THROUGH_SELECTIVE, HiMambaRadixCache
from caches.subjects.himamba import HiMambaSubject
from state_machines.machine import PICK, KVMachine
from state_machines.ops import INT, TOKENS, Op, OpSpec, OpTable
from state_machines.variants import Param, VariantSpec

OPS = OpTable(
    OpSpec("admit", {"rid": INT, "tokens": TOKENS},
           "admit r{rid} with {tokens} (match, load back, lock, copy mamba, allocate)"),
    OpSpec("prefill", {"rid": INT, "n": INT},
           "prefill {n} more tokens of r{rid} (chunked: cache_unfinished_req if not done)"),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (cache_finished_req)"),
    OpSpec("abort", {"rid": INT}, "abort r{rid}"),
    OpSpec("insert", {"tokens": TOKENS}, "insert {tokens} with its mamba state"),
    OpSpec("match", {"tokens": TOKENS}, "match {tokens}"),
    OpSpec("lock", {"hid": INT, "tokens": TOKENS}, "lock l{hid} on the match of {tokens}"),
    OpSpec("unlock", {"hid": INT}, "unlock l{hid}"),
    OpSpec("evict", {"n": INT}, "evict {n} device tokens (to host, or delete)"),
    OpSpec("evict_mamba", {"n": INT}, "evict {n} mamba states"),
    OpSpec("evict_host", {"n": INT}, "evict {n} host tokens"),
    OpSpec("evict_mamba_host", {"n": INT}, "evict {n} host mamba states"),
    OpSpec("backup", {"tokens": TOKENS}, "back up the device match of {tokens} to host"),
    OpSpec("write_ack", {}, "acknowledge the write-throughs in flight (storage backups begin)"),
    OpSpec("storage_ack", {}, "storage acknowledges its backups (host protection released)"),
    OpSpec("prefetch", {"hid": INT, "tokens": TOKENS},
           "begin storage prefetch p{hid} of {tokens} (protects the last host node)"),
    OpSpec("prefetch_done", {"hid": INT}, "complete prefetch p{hid} (insert on host, release)"),
    OpSpec("prefetch_abort", {"hid": INT}, "abort prefetch p{hid} (release)"),
)

VOCAB = 2
# tokens are drawn directly (not derived from earlier sequences): with two token ids and at most
# three tokens, prefixes are shared all the time, and the shrinker can delete any step without
# changing what the others mean
TOKENS_ST = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3)
POLICIES = (WRITE_THROUGH, WRITE_THROUGH_SELECTIVE)


def has_host(machine) -> bool:
    """host=0 is SGLang's MambaRadixCache: no host tier, so no host-tier rules."""
    return bool(machine.params["host"])


class HiMambaMachine(KVMachine):
    # -- requests -----------------------------------------------------------------------
    @rule(tokens=TOKENS_ST)
    def admit(self, tokens):
        self.do("admit", rid=self.new_id(), tokens=tokens)

    @precondition(lambda self: self.live())
    @rule(pick=PICK, n=st.integers(1, 4))
    def prefill(self, pick, n):
        self.do("prefill", rid=self.pick_live(pick), n=n)

    @precondition(lambda self: self.live())
    @rule(pick=PICK, abort=st.booleans())
    def finish(self, pick, abort):
        self.do("abort" if abort else "finish", rid=self.pick_live(pick))

    # -- tree API -----------------------------------------------------------------------
    @rule(tokens=TOKENS_ST)
    def insert(self, tokens):
        self.do("insert", tokens=tokens)

    @rule(tokens=TOKENS_ST)
    def lock(self, tokens):
        self.do("lock", hid=self.new_id(), tokens=tokens)

    @precondition(lambda self: self.subject.locks)
    @rule(pick=PICK)
    def unlock(self, pick):
        held = sorted(self.subject.locks)
        self.do("unlock", hid=held[pick % len(held)])

    @rule(mamba=st.booleans(), n=st.integers(1, 8))
    def evict(self, mamba, n):
        if mamba:
            self.do("evict_mamba", n=min(n, 3))
        else:
            self.do("evict", n=n)

    @precondition(has_host)
    @rule(mamba=st.booleans(), n=st.integers(1, 8))
    def evict_host(self, mamba, n):
        if mamba:
            self.do("evict_mamba_host", n=min(n, 3))
        else:
            self.do("evict_host", n=n)

    @precondition(has_host)
    @rule(tokens=TOKENS_ST, landed=st.booleans())
    def backup(self, tokens, landed):
        """A node reaching its write-through threshold; ``landed``: the copy is acknowledged
        right away (the common case), else it stays in flight until an ``ack``."""
        self.do("backup", tokens=tokens)
        if landed and self.subject.cache.ongoing_write_through:
            self.do("write_ack")

    @precondition(has_host)
    @rule(tokens=st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=3),
          landed=st.booleans())
    def backup_prefix(self, tokens, landed):
        """Insert a sequence and back up its first token: the split leaves a backed-up
        tombstone above the rest, which write_through_selective has not backed up -- the shape
        in which the tombstone cascade must stop at a write lock or at a storage backup's host
        ref (H1, H2; rare with independent draws, so steered here)."""
        self.do("insert", tokens=tokens)
        self.do("backup", tokens=tokens[:1])
        if landed and self.subject.cache.ongoing_write_through:
            self.do("write_ack")

    @precondition(lambda self: self.subject.cache.ongoing_write_through
                  or self.subject.cache.ongoing_backup)
    @rule(storage=st.booleans())
    def ack(self, storage):
        """Completion events: a write-through lands on host, or storage finishes a backup."""
        c = self.subject.cache
        if c.ongoing_write_through and not (storage and c.ongoing_backup):
            self.do("write_ack")
        else:
            self.do("storage_ack")

    # -- storage prefetch (host protection) -----------------------------------------------
    @precondition(has_host)
    @rule(tokens=TOKENS_ST)
    def prefetch(self, tokens):
        self.do("prefetch", hid=self.new_id(), tokens=tokens)

    @precondition(lambda self: self.subject.prefetches)
    @rule(pick=PICK, abort=st.booleans())
    def prefetch_done(self, pick, abort):
        live = sorted(self.subject.prefetches)
        self.do("prefetch_abort" if abort else "prefetch_done", hid=live[pick % len(live)])


# the exhaustive search's sequences (``kvcheck check himamba``): [0] and [0 0] share a prefix
# (an insert of one splits the other into a tombstone), [0 1] branches below [0]
SEQS = ([0], [0, 0], [0, 1])
WHOLE = 64  # "the rest": a whole prefill, an eviction of everything


def alphabet(params) -> list[Op]:
    """The exhaustive search's ops: request ids {1, 2}, one bare lock holder and one prefetch
    (l1, p1), the sequences ``SEQS``; prefill 1 (a chunk: ``cache_unfinished_req``) or the
    rest; evict / evict_host 1 or everything, evict_mamba / evict_mamba_host 1.  The ops the
    faults' shortest traces use come first (the search expands paths in alphabet order)."""
    ops = [Op("insert", {"tokens": t}) for t in SEQS]
    ops += [Op("backup", {"tokens": t}) for t in SEQS]
    ops += [Op("write_ack", {}), Op("storage_ack", {})]
    ops += [Op("evict", {"n": n}) for n in (1, WHOLE)]
    ops += [Op("evict_mamba", {"n": 1})]
    ops += [Op("evict_host", {"n": n}) for n in (1, WHOLE)]
    ops += [Op("evict_mamba_host", {"n": 1})]
    ops += [Op("prefetch", {"hid": 1, "tokens": t}) for t in SEQS]
    ops += [Op("prefetch_done", {"hid": 1}), Op("prefetch_abort", {"hid": 1})]
    ops += [Op("admit", {"rid": r, "tokens": t}) for r in (1, 2) for t in SEQS]
    ops += [Op("prefill", {"rid": r, "n": n}) for r in (1, 2) for n in (1, WHOLE)]
    ops += [Op(name, {"rid": r}) for name in ("finish", "abort") for r in (1, 2)]
    ops += [Op("match", {"tokens": t}) for t in SEQS]
    ops += [Op("lock", {"hid": 1, "tokens": t}) for t in SEQS]
    ops += [Op("unlock", {"hid": 1})]
    if not params.get("host", 1):
        ops = [op for op in ops if op.name not in HOST_OPS]
    return ops


HOST_OPS = ("backup", "write_ack", "storage_ack", "evict_host", "evict_mamba_host", "prefetch",
            "prefetch_done", "prefetch_abort")


def _build(params, cache_cls, device):
    return HiMambaSubject(cache_cls or HiMambaRadixCache, kv_slots=params["kv_slots"],
                          mamba_slots=params["mamba_slots"],
                          host_kv_slots=params["host_kv_slots"],
                          host_mamba_slots=params["host_mamba_slots"],
                          write_policy=POLICIES[params["policy"]],
                          storage=bool(params["storage"]), device=device,
                          host=bool(params["host"]))


SPEC = VariantSpec(
    name="himamba",
    summary="SGLang HiMamba radix cache: full KV + mamba state, device + host tiers, tombstones",
    ops=OPS,
    params={"host": Param(1, 0, 1, "1: device + host tiers (HiMambaRadixCache); 0: device "
                           "tier only (SGLang's MambaRadixCache)"),
            "policy": Param(0, 0, 1, "0 write_through, 1 write_through_selective"),
            "storage": Param(1, 0, 1, "1: storage (L3) backups host-protect acknowledged nodes"),
            "kv_slots": Param(12, 2, 4096, "device KV token slots"),
            "mamba_slots": Param(8, 3, 1024, "device mamba state slots (>= 3 x running + slack)"),
            "host_kv_slots": Param(16, 2, 8192, "host KV token slots"),
            "host_mamba_slots": Param(10, 1, 2048, "host mamba state slots")},
    build=_build,
    machine=HiMambaMachine,
    regimes=({"policy": 0}, {"policy": 1}, {"host": 0, "kv_slots": 6, "mamba_slots": 6}),
    alphabet=alphabet,
    # tiny pools: two requests and the tree compete for 4 device slots and 3 states, host
    # eviction is one backup away; both write-through policies (H1/H2 bring their own)
    small_params=(
        {"policy": 0, "kv_slots": 4, "mamba_slots": 3, "host_kv_slots": 4,
         "host_mamba_slots": 2},
        {"policy": 1, "kv_slots": 4, "mamba_slots": 3, "host_kv_slots": 4,
         "host_mamba_slots": 2},
    ),
    sometimes=("node-split", "tombstone-created", "tombstone-cascade",
               "cascade-stopped-by-host-ref", "cascade-stopped-by-lock", "evict-to-host",
               "inner-host-node", "load-back", "host-mamba-restored", "host-eviction",
               "host-eviction-cascade", "host-backup", "storage-backup", "prefetch-inserted",
               "prefetch-aborted", "chunked-insert", "out-of-memory"),
)
