"""The radix variant: its op table, parameters, and ``RadixMachine``.

Requests draw from a three-token vocabulary and often extend a sequence seen before, so
prefixes are shared, nodes split and locks overlap; the token pool is small, so admissions
evict and run out of memory.  Regimes: ``page_size`` 1 and 4.  At ``page_size`` 4 a decoding
request may also take diffusion-LM steps (``dllm_step``: its trailing block, one page, rewritten
every step; sgl-project/sglang issue #35270).
"""

from __future__ import annotations

from state_machines.gen import Among, Drawn, Fresh, Gen, Held, Ints, Live, Seq, Shared, tokens
from state_machines.lifecycle import DECODING, driven, lifecycle
from state_machines.machine import KVMachine
from state_machines.ops import INT, TOKENS, OpSpec, OpTable
from state_machines.spec import Param, VariantSpec

VOCAB = 3
WHOLE = 64  # "the rest": a whole prefill, an eviction of everything


def seqs(params) -> list[list[int]]:
    """The exhaustive search's sequences, from pages ``a`` = [0]*page_size and ``b`` =
    [1]*page_size: a, a+b, a+a (shared prefix, branch, split), b (a second root child), and
    with page_size > 1 a+[1] (a partial last page) and [0] (a key shorter than a page)."""
    ps = params["page_size"]
    a, b = [0] * ps, [1] * ps
    out: list[list[int]] = []
    for t in (a, a + b, a + a, b) + ((a + [1], [0]) if ps > 1 else ()):
        if t not in out:
            out.append(t)
    return out


# requests draw from a three-token vocabulary and often extend a sequence seen before
# (``Shared``: cut and extra shrink towards re-using a whole earlier sequence); the exhaustive
# search uses request ids {1, 2}, one bare lock holder l1 and the sequences ``seqs``
NEW = Seq(tokens(VOCAB, 1, 12), small=seqs, remember=True)
SHARED = Shared(Ints(0, 12), small=seqs)  # a seen prefix, as it is


def arrivals(params) -> list[list[int]]:
    """The exhaustive search's arrivals: a page ``a`` and two pages ``a+a`` (at page_size > 1
    together more than a small pool's budget once pages are rounded)."""
    a = [0] * params["page_size"]
    return [a, a + a]


LIFECYCLE, BURST = lifecycle(VOCAB, arrivals, speculative=True)


def dllm_regime(params) -> bool:
    """Diffusion-LM steps at page_size > 1: the block is a page (SGLang pins the page size to
    the dLLM block size)."""
    return params["page_size"] > 1


def in_flight(d) -> list[int]:
    """Live requests with an in-flight dLLM block (its next step rewrites it)."""
    reqs = d.subject.requests
    return [rid for rid in d.live() if reqs[rid].volatile]


OPS = OpTable(
    OpSpec("admit", {"rid": INT, "tokens": TOKENS},
           "admit request r{rid} with tokens {tokens} (match, lock, allocate the rest)",
           gen=(Gen(rid=Fresh(), tokens=NEW),
                Gen("admit_sharing", rid=Fresh(), tokens=Shared(
                    Ints(0, 12), tokens(VOCAB, 1, 6), small=seqs, remember=True)))),
    OpSpec("prefill", {"rid": INT, "n": INT}, "prefill the next {n} tokens of r{rid}",
           gen=Gen(rid=Live(), n=Drawn(Ints(1, 6), small=lambda p: sorted(
               {1, p["page_size"], WHOLE})))),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (cache_finished_req)", gen=Gen(rid=Live())),
    OpSpec("abort", {"rid": INT}, "abort r{rid}", gen=Gen(rid=Live())),
    OpSpec("evict", {"n": INT}, "evict {n} tokens",
           gen=Gen(n=Drawn(Ints(1, 16), small=(1, WHOLE)))),
    OpSpec("insert", {"tokens": TOKENS}, "insert {tokens} into the tree (no lock)",
           gen=Gen(tokens=NEW)),
    OpSpec("match", {"tokens": TOKENS}, "match {tokens}",
           gen=Gen(tokens=Shared(Ints(0, 12), tokens(VOCAB, 0, 3), small=seqs))),
    OpSpec("lock", {"hid": INT, "tokens": TOKENS}, "lock l{hid} on the match of {tokens}",
           gen=Gen(hid=Fresh(small=(1,)), tokens=SHARED)),
    OpSpec("unlock", {"hid": INT}, "unlock l{hid}", gen=Gen(hid=Held())),
    OpSpec("stray_unlock", {"tokens": TOKENS},
           "unlock the match of {tokens} without holding a lock (must be refused)",
           gen=Gen(tokens=SHARED), pure_skips=False),  # the match runs first
    OpSpec("dllm_step", {"rid": INT, "resolve": INT},
           "dLLM denoising step of r{rid}: rewrite its in-flight block (the trailing page; "
           "started if none) over the same slots, resolve={resolve}, cache as the scheduler does",
           gen=(Gen(rid=DECODING, resolve=Drawn(Ints(0, 1), small=(0, 1)),
                    regime=dllm_regime, when=driven("dllm_step")),
                Gen("dllm_continue", rid=Among(in_flight), resolve=Drawn(Ints(0, 1), small=(0,)),
                    regime=dllm_regime, when=driven("dllm_step")))),
    *LIFECYCLE,
    scenarios=(BURST,),
)


class RadixMachine(KVMachine, ops=OPS):
    """Whole request lifecycles plus the bare tree API over one radix cache and token pool
    (rules: one per generator in ``OPS``)."""


SPEC = VariantSpec(
    name="radix",
    summary="plain radix prefix cache with lock refs (SGLang / pymllm semantics)",
    ops=OPS,
    params={"page_size": Param(1, 1, 64, "tokens per page"),
            "pool_pages": Param(16, 1, 4096, "pages in the token pool")},
    machine=RadixMachine,
    regimes=({"page_size": 1, "pool_pages": 16}, {"page_size": 4, "pool_pages": 6}),
    small_params=({"page_size": 1, "pool_pages": 3}, {"page_size": 4, "pool_pages": 3}),
    sometimes=("node-split", "leaf-gains-child", "cascade-eviction", "alloc-evicted",
               "out-of-memory", "prefix-hit", "shared-lock", "chunk-cached",
               "abort-mid-prefill", "stray-unlock-rejected", "partial-page-tail",
               "sub-page-match", "decode-new-page", "output-inserted", "spec-draft-rejected",
               "retract-readmitted", "retract-evicts", "batch-admitted", "admission-refused",
               "dllm-block-rewritten"),
)
