"""The himamba variant: SGLang's HiMamba radix cache (full KV + mamba state, device + host).

Sequences draw from a two-token vocabulary and are 1-3 tokens long, so prefixes are shared,
nodes split into tombstones, and the few-slot pools force eviction on both tiers.  Regimes:
write-through (every hit backs up), write-through-selective (the second hit does), ``host=0``:
the device tier alone, which is SGLang's plain ``MambaRadixCache`` (no backups, eviction
deletes; the host-tier rules are off), and write-back under host pressure (a leaf is backed up
when evicted; a 3-slot host makes backups fail).
"""

from __future__ import annotations

from state_machines.gen import (PICK, Among, Bools, Drawn, Fresh, Gen, Held, Ints, Live,
                                Scenario, Seq, tokens)
from state_machines.lifecycle import lifecycle
from state_machines.machine import KVMachine
from state_machines.ops import INT, TOKENS, OpSpec, OpTable
from state_machines.spec import Param, VariantSpec

VOCAB = 2
# tokens are drawn directly (not derived from earlier sequences): with two token ids and at most
# three tokens, prefixes are shared all the time, and the shrinker can delete any step without
# changing what the others mean
TOKENS_ST = tokens(VOCAB, 1, 3)
# the exhaustive search's sequences (``kvcheck check himamba``): [0] and [0 0] share a prefix
# (an insert of one splits the other into a tombstone), [0 1] branches below [0]; request ids
# {1, 2}, one bare lock holder and one prefetch (l1, p1); prefill 1 (a chunk:
# ``cache_unfinished_req``) or the rest; evict / evict_host 1 or everything, evict_mamba /
# evict_mamba_host 1.  The table lists first the ops the faults' shortest traces use (the
# search expands paths in alphabet order, which is table order).
SEQS = ([0], [0, 0], [0, 1])
WHOLE = 64  # "the rest": a whole prefill, an eviction of everything
SEQ = Seq(TOKENS_ST, small=SEQS)
ONE = Fresh(small=(1,))  # a new bare lock / prefetch id
WRITE_BACK_REGIME = {"policy": 2, "kv_slots": 6, "mamba_slots": 4, "host_kv_slots": 3,
                     "host_mamba_slots": 2}


def has_host(params) -> bool:
    """host=0 is SGLang's MambaRadixCache: no host tier, so no host-tier ops."""
    return bool(params["host"])


PREFETCHING = Among(lambda d: sorted(d.subject.prefetches), small=(1,))  # a live prefetch id


# -- steering: rules that choose between two ops, or drive several -----------------------------
def finish(d, pick, abort):
    d.do("abort" if abort else "finish", rid=Live().value(d, {"pick": pick}))


def evict(d, mamba, n):
    if mamba:
        d.do("evict_mamba", n=min(n, 3))
    else:
        d.do("evict", n=n)


def evict_host(d, mamba, n):
    if mamba:
        d.do("evict_mamba_host", n=min(n, 3))
    else:
        d.do("evict_host", n=n)


def backup(d, tokens, landed):
    """A node reaching its write-through threshold; ``landed``: the copy is acknowledged
    right away (the common case), else it stays in flight until an ``ack``."""
    d.do("backup", tokens=tokens)
    if landed and d.subject.cache.ongoing_write_through:
        d.do("write_ack")


def backup_prefix(d, tokens, landed):
    """Insert a sequence and back up its first token: the split leaves a backed-up tombstone
    above the rest, which write_through_selective has not backed up -- the shape in which the
    tombstone cascade must stop at a write lock or at a storage backup's host ref (H1, H2;
    rare with independent draws, so steered here)."""
    d.do("insert", tokens=tokens)
    d.do("backup", tokens=tokens[:1])
    if landed and d.subject.cache.ongoing_write_through:
        d.do("write_ack")


def ack(d, storage):
    """Completion events: a write-through lands on host, or storage finishes a backup."""
    c = d.subject.cache
    if c.ongoing_write_through and not (storage and c.ongoing_backup):
        d.do("write_ack")
    else:
        d.do("storage_ack")


def prefetch_done(d, pick, abort):
    d.do("prefetch_abort" if abort else "prefetch_done",
         hid=PREFETCHING.value(d, {"pick": pick}))


def has_storage(params) -> bool:
    """A host tier with storage (L3) on: prefetches read what storage backups wrote."""
    return has_host(params) and bool(params["storage"])


def prefetch_stored(d, tokens, settle, abort):
    """Store a sequence to L3, evict it from both tiers, then prefetch it back.  A target's
    storage holds only what its backups wrote, so a prefetch stages a hit (is live, can be
    completed or aborted) only after a backup, both acknowledgements and both tiers' evictions
    -- rare with independent draws, so steered here.  ``settle``: complete it (``abort``:
    abort it) at once, else it stays live for the ``prefetch_done`` scenario."""
    d.do("insert", tokens=tokens)
    backup(d, tokens, landed=True)
    if d.subject.cache.ongoing_backup:
        d.do("storage_ack")
    d.do("evict", n=WHOLE)
    d.do("evict_host", n=WHOLE)
    hid = d.new_id()
    d.do("prefetch", hid=hid, tokens=tokens)
    if settle and hid in d.subject.prefetches:
        d.do("prefetch_abort" if abort else "prefetch_done", hid=hid)


def _in_flight(d) -> bool:
    return bool(d.subject.cache.ongoing_write_through or d.subject.cache.ongoing_backup)


def _n(small):
    return Drawn(Ints(1, 8), small=small)


def arrivals(params) -> list[list[int]]:
    """The exhaustive search's arrivals: one token, and a token after a seen prefix."""
    return [[0], [0, 1]]


LIFECYCLE, BURST = lifecycle(VOCAB, arrivals, max_len=3)

# ``rule=False``: the machine reaches the op through a steering scenario below
OPS = OpTable(
    OpSpec("insert", {"tokens": TOKENS}, "insert {tokens} with its mamba state",
           gen=Gen(tokens=SEQ)),
    OpSpec("backup", {"tokens": TOKENS}, "back up the device match of {tokens} to host",
           gen=Gen(tokens=SEQ, regime=has_host, rule=False),
           pure_skips=False),  # the match runs first
    OpSpec("write_ack", {}, "acknowledge the write-throughs in flight (storage backups begin)",
           gen=Gen(regime=has_host, rule=False)),
    OpSpec("storage_ack", {}, "storage acknowledges its backups (host protection released)",
           gen=Gen(regime=has_host, rule=False)),
    OpSpec("evict", {"n": INT}, "evict {n} device tokens (to host, or delete)",
           gen=Gen(n=_n((1, WHOLE)), rule=False)),
    OpSpec("evict_mamba", {"n": INT}, "evict {n} mamba states",
           gen=Gen(n=_n((1,)), rule=False)),
    OpSpec("evict_host", {"n": INT}, "evict {n} host tokens",
           gen=Gen(n=_n((1, WHOLE)), regime=has_host, rule=False)),
    OpSpec("evict_mamba_host", {"n": INT}, "evict {n} host mamba states",
           gen=Gen(n=_n((1,)), regime=has_host, rule=False)),
    OpSpec("prefetch", {"hid": INT, "tokens": TOKENS},
           "begin storage prefetch p{hid} of {tokens} (protects the last host node)",
           gen=Gen(hid=ONE, tokens=SEQ, regime=has_host), pure_skips=False),  # match first
    OpSpec("prefetch_done", {"hid": INT}, "complete prefetch p{hid} (insert on host, release)",
           gen=Gen(hid=PREFETCHING, regime=has_host, rule=False)),
    OpSpec("prefetch_abort", {"hid": INT}, "abort prefetch p{hid} (release)",
           gen=Gen(hid=PREFETCHING, regime=has_host, rule=False)),
    OpSpec("admit", {"rid": INT, "tokens": TOKENS},
           "admit r{rid} with {tokens} (match, load back, lock, copy mamba, allocate)",
           gen=Gen(rid=Fresh(), tokens=SEQ)),
    OpSpec("prefill", {"rid": INT, "n": INT},
           "prefill {n} more tokens of r{rid} (chunked: cache_unfinished_req if not done)",
           gen=Gen(rid=Live(), n=Drawn(Ints(1, 4), small=(1, WHOLE)))),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (cache_finished_req)",
           gen=Gen(rid=Live(), rule=False)),
    OpSpec("abort", {"rid": INT}, "abort r{rid}", gen=Gen(rid=Live(), rule=False)),
    OpSpec("match", {"tokens": TOKENS}, "match {tokens}", gen=Gen(tokens=SEQ)),
    OpSpec("lock", {"hid": INT, "tokens": TOKENS}, "lock l{hid} on the match of {tokens}",
           gen=Gen(hid=ONE, tokens=SEQ)),
    OpSpec("unlock", {"hid": INT}, "unlock l{hid}", gen=Gen(hid=Held())),
    *LIFECYCLE,
    scenarios=(
        BURST,
        Scenario("finish", finish, {"pick": PICK, "abort": Bools()}, when=Live().ready),
        Scenario("evict", evict, {"mamba": Bools(), "n": Ints(1, 8)}),
        Scenario("evict_host", evict_host, {"mamba": Bools(), "n": Ints(1, 8)},
                 regime=has_host),
        Scenario("backup", backup, {"tokens": TOKENS_ST, "landed": Bools()}, regime=has_host),
        Scenario("backup_prefix", backup_prefix,
                 {"tokens": tokens(VOCAB, 2, 3), "landed": Bools()}, regime=has_host),
        Scenario("ack", ack, {"storage": Bools()}, when=_in_flight),
        Scenario("prefetch_done", prefetch_done, {"pick": PICK, "abort": Bools()},
                 when=PREFETCHING.ready),
        Scenario("prefetch_stored", prefetch_stored,
                 {"tokens": TOKENS_ST, "settle": Bools(), "abort": Bools()},
                 regime=has_storage),
    ),
)


class HiMambaMachine(KVMachine, ops=OPS):
    """Requests, the tree API, both tiers' evictions, backups and prefetches (rules: one per
    generator and scenario in ``OPS``)."""


SPEC = VariantSpec(
    name="himamba",
    summary="SGLang HiMamba radix cache: full KV + mamba state, device + host tiers, tombstones",
    ops=OPS,
    params={"host": Param(1, 0, 1, "1: device + host tiers (HiMambaRadixCache); 0: device "
                           "tier only (SGLang's MambaRadixCache)"),
            "policy": Param(0, 0, 2, "0 write_through, 1 write_through_selective, 2 "
                            "write_back (a leaf is backed up when it is evicted)"),
            "storage": Param(1, 0, 1, "1: storage (L3) backups host-protect acknowledged nodes"),
            "kv_slots": Param(12, 2, 4096, "device KV token slots"),
            "mamba_slots": Param(8, 3, 1024, "device mamba state slots (>= 3 x running + slack)"),
            "host_kv_slots": Param(16, 2, 8192, "host KV token slots"),
            "host_mamba_slots": Param(10, 1, 2048, "host mamba state slots")},
    machine=HiMambaMachine,
    # write_back under host pressure: a 3-slot host, so a leaf's backup fails and it is dropped
    # with its host-only subtree, or kept on device while something there is held
    regimes=({"policy": 0}, {"policy": 1}, {"host": 0, "kv_slots": 6, "mamba_slots": 6},
             WRITE_BACK_REGIME),
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
               "prefetch-aborted", "chunked-insert", "out-of-memory", "retract-readmitted",
               "write-back", "write-back-failed",
               "retract-evicts", "batch-admitted", "admission-refused", "prefix-hit"),
)
