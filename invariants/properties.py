"""The property list: every property a check, a fault or a finding may name, in one place.

Each ``Property`` is a stable id (what ``Violation.prop`` carries, what a trace's
``violation.property`` records, what a fault's ``properties`` name), a one-line meaning, the
variants whose runs check it, and where it is checked when that is narrower than every target
of those variants.  ``docs/properties.md`` and the README's table are generated from this list
(``kvcheck list --properties``), and ``tests/test_properties.py`` fails when a check, a fault
or a recorded trace names a property that is not here.

Adding a property is a one-line change: one ``Property(...)`` entry below.  Then regenerate
the two tables (``python3 -m state_machines list --properties > docs/properties.md``, and the
README's block between its ``properties`` markers, which ``tests/test_properties.py`` prints
when it differs).
"""

from __future__ import annotations

from dataclasses import dataclass

RADIX, PAGED, SESSION, HIMAMBA, CONT, BLOCKS = ("radix", "paged-bigpage", "streaming-session",
                                                "himamba", "continuation-state", "block-hash")
SWA = "hybrid-swa"
TREES = (RADIX, PAGED, SESSION, HIMAMBA, CONT, SWA)  # the radix-tree variants
ALL = TREES + (BLOCKS,)


@dataclass(frozen=True)
class Property:
    name: str
    meaning: str
    variants: tuple = ALL
    where: str = ""  # narrower than every target of those variants ("tokenspeed target")


PROPERTIES = (
    # -- accounting: nothing is lost ------------------------------------------------------------
    Property("ref-balance", "every node's ref == live holders locking it or a descendant; none "
             "negative; the root's baseline fixed"),
    Property("conservation", "per pool: free + owned by the tree + held by live requests == "
             "capacity; no id in two places, none freed twice, none free while a request still "
             "reads it"),
    Property("size-accounting", "evictable + protected == tokens in the tree, none negative, "
             "split by lock state (hybrid-swa: per component)", (RADIX, PAGED, SESSION, HIMAMBA, SWA)),
    Property("structure", "parent/child links agree, child key == first token/page of the "
             "child, key/value shapes", TREES),
    Property("eviction-set", "the eviction set/LRU list holds exactly the evictable leaves",
             (RADIX, PAGED, SESSION, HIMAMBA, SWA)),
    Property("data-integrity", "every hit reads back the fingerprints written when the KV was "
             "computed"),
    Property("match-contract", "a match returns a page-aligned prefix of the key (an empty one "
             "ends at the root)", (RADIX, PAGED, SESSION, SWA)),
    Property("progress", "an eviction with something evictable frees something; an allocation "
             "terminates"),
    Property("quiescence", "at the end of every example: drain everything -> only the root, "
             "every pool full"),
    Property("admission-sound", "a batch the scheduler's budget admitted (`schedule`) runs its "
             "prefill and first decode step without an allocation failure when nothing else "
             "changed; an admitted batch that cannot run is a violation, never a skip "
             "(block-hash, where vLLM admits by allocating and preempts on a later shortfall: "
             "an admitted chunk has its slots, and a refused admission leaves the pool as it "
             "was; continuation-state, where TokenSpeed secures pages per request: each "
             "admitted first chunk can be acquired; streaming-session: session turns and plain "
             "requests in one pass, a slot's KV neither free nor evictable)",
             (RADIX, HIMAMBA, PAGED, SESSION, BLOCKS, CONT, SWA)),
    # -- the run itself ---------------------------------------------------------------------------
    Property("crash", "the cache itself raised; reported with the trace", where="every run"),
    Property("hang", "an op (with its checks) overran the per-op deadline (`--op-deadline`); "
             "reported with the trace so far", where="every run"),
    Property("divergence", "the two targets of `kvcheck diff` answered one op differently",
             where="`kvcheck diff`"),
    # -- policy: memory is spent the way the engine declares (invariants/policy.py) -------------
    Property("victim", "every evicted node was minimal under the variant's declared policy key "
             "among the nodes allowed to go"),
    Property("spurious-oom", "an allocation that failed needed more than free + evictable "
             "(whole pages)", (RADIX, PAGED, SESSION, HIMAMBA, BLOCKS)),
    Property("over-eviction", "an allocation (or `evict(n)`) evicted no more than its declared "
             "need, beyond leaf/page granularity", (RADIX, PAGED, SESSION, HIMAMBA, SWA)),
    Property("recency", "a match refreshes every matched node to a time later than any access "
             "before it", TREES),
    Property("lru-order", "an LRU list runs in the declared eviction order (block-hash: "
             "uncached blocks first, then cached ones in the order they were freed, a "
             "request's tail first; himamba: most recent first)", (HIMAMBA, BLOCKS)),
    # -- block-hash -------------------------------------------------------------------------------
    Property("hash-map", "the hash -> block map holds exactly the cached blocks, each under its "
             "own hash", (BLOCKS,)),
    # -- streaming sessions (invariants/session.py) -----------------------------------------------
    Property("session-prefix", "a turn resuming from a session slot reuses exactly "
             "min(kv_committed_len, len(token_ids)) positions", (SESSION,)),
    Property("append-only", "a turn's prefix_len never drops below the slot's "
             "cache_protected_len", (SESSION,)),
    # -- two tiers (invariants/tiers.py) ----------------------------------------------------------
    Property("host-protection", "a node whose host copies are protected is never deleted and "
             "never host-evictable", (HIMAMBA,)),
    Property("tombstone", "a tombstone holds no state lock, and a tombstone leaf is protected "
             "or waiting in an eviction set (hybrid-swa: a tombstoned node maps no window slot, "
             "a live one maps a live window slot for each of its full slots)", (HIMAMBA, SWA)),
    Property("hit-count", "a chunked (unfinished) insert counts no hit and starts no backup",
             (HIMAMBA,)),
    Property("storage-keys", "each page a storage backup writes is filed under the hash chain "
             "of its own prefix (a state under its last page's), no key twice in a write nor "
             "for two prefixes (invariants/storage_keys.py)", (HIMAMBA,),
             "sglang target, host=1 storage=1 on 0.5.23"),
    # -- sliding windows (invariants/window.py) ------------------------------------------------
    Property("window-hit", "a prefix hit's last W tokens (all of it, if shorter) have live "
             "window slots: the engine's match contract for a sliding window of W",
             (SWA, BLOCKS), "block-hash: the hybrid regimes (a sliding-window group)"),
    Property("window-release", "once a running request's out-of-window slots are released, it "
             "holds no window slot more than the window (rounded to pages) behind its end",
             (SWA, BLOCKS), "block-hash: the hybrid regimes (a sliding-window group)"),
    Property("sentinel", "a reserved or sentinel slot (SGLang's window page 0, vLLM's null "
             "block) is never freed, queued, cached or handed out", (SWA, BLOCKS)),
    # -- cache groups with snapshots (invariants/cache_groups.py) ---------------------------------
    Property("dangling-borrow", "a page a request table borrows is held by a snapshot segment",
             (CONT,)),
    Property("snapshot-placement", "snapshots only at multiples of L, prefix_len == the node's "
             "depth, never on a split node", (CONT,)),
    Property("commit-complete", "after a commit that should succeed, the terminal has a "
             "complete snapshot holding every required group", (CONT,)),
    Property("superseded-state", "after a commit, no ancestor the request has advanced past "
             "(and only it passes through) still holds State pages", (CONT,)),
    Property("owned-bounded", "after a commit, the request owns only the pages past the "
             "terminal", (CONT,)),
    # -- a compiled scheduler seen through its counters (invariants/scheduler.py) ---------------
    Property("page-conservation", "per cache group: live requests' pages plus free pages never "
             "exceed the usable total; ids in [1, total)", (CONT,), "tokenspeed target"),
    Property("no-shared-write", "a page a forward batch writes for one request is in no other "
             "live request's table", (CONT,), "tokenspeed target"),
    Property("snapshot-balance", "the snapshot pool's free blocks + suspended requests' blocks "
             "== its capacity", (CONT,), "tokenspeed target"),
    Property("kv-event-balance", "a block hash is stored at most once while stored, removed "
             "only after a store, at most once per store", (CONT,), "tokenspeed target"),
    Property("request-tokens", "the tokens a forward batch feeds a request are its sequence at "
             "those positions", (CONT,), "tokenspeed target"),
    Property("request-ledger", "the scheduler's queue counts equal the live (and retracted) "
             "requests it was given", (CONT,), "tokenspeed target"),
    Property("sched-quiescence", "after draining: every page free, the snapshot pool full, no "
             "request queued, every stored block removed", (CONT,), "tokenspeed target"),
)

BY_NAME = {p.name: p for p in PROPERTIES}
assert len(BY_NAME) == len(PROPERTIES), "a property is listed twice"


def get_property(name: str) -> Property:
    if name not in BY_NAME:
        raise KeyError(f"unknown property {name!r}: not on the list in invariants/properties.py")
    return BY_NAME[name]


def markdown_table() -> str:
    """The property table the README and ``docs/properties.md`` show."""
    rows = ["| property | meaning | variants |", "|---|---|---|"]
    for p in PROPERTIES:
        variants = "all" if p.variants == ALL else ", ".join(p.variants)
        rows.append(f"| `{p.name}` | {p.meaning} | {variants}"
                    + (f" ({p.where})" if p.where else "") + " |")
    return "\n".join(rows) + "\n"
