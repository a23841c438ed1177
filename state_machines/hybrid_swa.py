"""The hybrid-swa variant: its op table, parameters, and ``HybridSWAMachine``.

The radix variant's ops (``state_machines/radix.py``: admission, chunks, decode, speculative
steps, finish, abort, retract, batch scheduling, the bare tree API; not the dLLM step) over a
radix cache with a sliding-window pool, plus what the window adds: ``evict_swa`` (window room
asked for: tombstones) and ``release_window`` (a request decoded past its prefix's window
releases that part of its lock).  Decode steps release out-of-window KV by themselves.

The pools are small and the window short, so within seconds requests decode out of their
window, insertions leave tombstones below it, later requests recover them, and window room
runs out before full room does.  Regimes: ``page_size`` 1 (window 2) and 2 (window 3, not a
whole number of pages).
"""

from __future__ import annotations

from state_machines.gen import Bools, Drawn, Gen, Ints, Scenario, tokens
from state_machines.lifecycle import DECODING, driven
from state_machines.machine import KVMachine
from state_machines.ops import INT, OpSpec, OpTable
from state_machines.radix import BURST, OPS as RADIX_OPS, VOCAB, WHOLE
from state_machines.spec import Param, VariantSpec



def window_story(d, prompt, tail, recover):
    """A request decodes past its window and finishes (its sequence cached with a tombstone
    below the window), then a second request comes back to it: the whole sequence and more
    (a hit over the tombstone), or -- ``recover`` -- the sequence cut just past the
    tombstone with a new tail (the hit stops before the tombstone, the second request
    computes it again, and caching it recovers the tombstone); the second request then decodes
    a window and releases its lock's window part, while a bare lock holds the first sequence
    (and a sibling branch splits the locked window).
    Steered: independent draws
    rarely decode a request a whole window past its prompt and then come back to it."""
    window = d.params["window"]
    first = d.new_id()
    d.do("admit", rid=first, tokens=prompt)
    req = d.subject.requests.get(first)
    if req is None:
        return
    d.do("prefill", rid=first, n=WHOLE)
    d.do("decode", rid=first, n=window + d.params["page_size"] + 1)
    if first not in d.subject.requests:
        return
    seq = list(d.subject.requests[first].tokens)
    d.do("finish", rid=first)
    hid = d.new_id()
    d.do("lock", hid=hid, tokens=seq)  # a holder over the tombstone while the second runs
    d.do("insert", tokens=seq[:-1] + [(seq[-1] + 1) % VOCAB])  # a sibling: splits its segment
    cut = req.swa_evicted_seqlen + 1 if recover else len(seq)
    second = d.new_id()
    d.do("admit", rid=second, tokens=seq[:cut] + tail)
    if second in d.subject.requests:  # it decodes past its hit's window and lets it go
        d.do("prefill", rid=second, n=WHOLE)
        d.do("decode", rid=second, n=window)
        d.do("release_window", rid=second)
    if hid in d.subject.locks:
        d.do("unlock", hid=hid)


OPS = OpTable(
    *(spec for name, spec in RADIX_OPS.specs.items() if name not in ("dllm_step", "quiesce")),
    OpSpec("evict_swa", {"n": INT}, "evict {n} tokens of window KV (tombstones)",
           gen=Gen(n=Drawn(Ints(1, 8), small=(1, WHOLE)))),
    OpSpec("release_window", {"rid": INT},
           "release r{rid}'s window lock early (decoded a window past its prefix)",
           gen=Gen(rid=DECODING, when=driven("release_window"))),
    scenarios=(BURST, Scenario("window_story", window_story,
                               {"prompt": tokens(VOCAB, 2, 6), "tail": tokens(VOCAB, 1, 3),
                                "recover": Bools()})),
)


class HybridSWAMachine(KVMachine, ops=OPS):
    """Whole request lifecycles and the bare tree API over a radix cache with a full pool and
    a sliding-window pool (rules: one per generator in ``OPS``)."""


SPEC = VariantSpec(
    name="hybrid-swa",
    summary="radix prefix cache over a full pool and a sliding-window pool: tombstones, "
            "window locks, out-of-window frees (SGLang's Full + SWA components)",
    ops=OPS,
    params={"page_size": Param(1, 1, 64, "tokens per page"),
            "pool_pages": Param(12, 1, 4096, "pages in the full KV pool"),
            "swa_pages": Param(6, 1, 4096, "pages in the sliding-window pool"),
            "window": Param(3, 1, 256, "sliding window W, in tokens")},
    machine=HybridSWAMachine,
    regimes=({"page_size": 1, "pool_pages": 24, "swa_pages": 10, "window": 2},
             {"page_size": 2, "pool_pages": 14, "swa_pages": 7, "window": 3}),
    small_params=({"page_size": 1, "pool_pages": 4, "swa_pages": 3, "window": 2},),
    sometimes=("node-split", "cascade-eviction", "alloc-evicted", "out-of-memory",
               "prefix-hit", "shared-lock", "chunk-cached", "decode-new-page",
               "output-inserted", "retract-readmitted", "batch-admitted",
               "tombstone-made", "tombstone-recovered", "tombstone-leaf",
               "out-of-window-freed", "hit-over-tombstone", "window-lock-released"),
)
