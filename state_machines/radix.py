"""The radix variant: its op table, parameters, and ``RadixMachine``.

Requests draw from a three-token vocabulary and often extend a sequence seen before, so
prefixes are shared, nodes split and locks overlap; the token pool is small, so admissions
evict and run out of memory.  Regimes: ``page_size`` 1 and 4.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from caches.radix import RadixCache
from caches.subjects.radix import RadixSubject
from state_machines.machine import PICK, KVMachine
from state_machines.ops import INT, TOKENS, Op, OpSpec, OpTable
from state_machines.variants import Param, VariantSpec

OPS = OpTable(
    OpSpec("admit", {"rid": INT, "tokens": TOKENS},
           "admit request r{rid} with tokens {tokens} (match, lock, allocate the rest)"),
    OpSpec("prefill", {"rid": INT, "n": INT}, "prefill the next {n} tokens of r{rid}"),
    OpSpec("finish", {"rid": INT}, "finish r{rid} (cache_finished_req)"),
    OpSpec("abort", {"rid": INT}, "abort r{rid}"),
    OpSpec("evict", {"n": INT}, "evict {n} tokens"),
    OpSpec("insert", {"tokens": TOKENS}, "insert {tokens} into the tree (no lock)"),
    OpSpec("match", {"tokens": TOKENS}, "match {tokens}"),
    OpSpec("lock", {"hid": INT, "tokens": TOKENS}, "lock l{hid} on the match of {tokens}"),
    OpSpec("unlock", {"hid": INT}, "unlock l{hid}"),
    OpSpec("stray_unlock", {"tokens": TOKENS},
           "unlock the match of {tokens} without holding a lock (must be refused)"),
)

VOCAB = 3
TOKENS_ST = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)


class RadixMachine(KVMachine):
    """Whole request lifecycles plus the bare tree API over one radix cache and token pool."""

    def __init__(self):
        super().__init__()
        self.seen: list[list[int]] = []  # sequences used so far, to share prefixes with

    def _remember(self, tokens):
        if tokens not in self.seen:
            self.seen.append(list(tokens))

    def _shared(self, pick, cut, extra):
        """A sequence seen before, minus its last ``cut`` tokens, plus ``extra``.

        Both shrink towards 0, i.e. towards re-using a whole earlier sequence."""
        base = self.seen[pick % len(self.seen)]
        return base[: max(0, len(base) - cut)] + extra

    # -- request lifecycle ----------------------------------------------------------------
    @rule(tokens=TOKENS_ST)
    def admit(self, tokens):
        self._remember(tokens)
        self.do("admit", rid=self.new_id(), tokens=tokens)

    @precondition(lambda self: self.seen)
    @rule(pick=PICK, cut=st.integers(0, 12), extra=st.lists(st.integers(0, VOCAB - 1),
                                                            min_size=1, max_size=6))
    def admit_sharing(self, pick, cut, extra):
        tokens = self._shared(pick, cut, extra)
        self._remember(tokens)
        self.do("admit", rid=self.new_id(), tokens=tokens)

    @precondition(lambda self: self.live())
    @rule(pick=PICK, n=st.integers(1, 6))
    def prefill(self, pick, n):
        self.do("prefill", rid=self.pick_live(pick), n=n)

    @precondition(lambda self: self.live())
    @rule(pick=PICK)
    def finish(self, pick):
        self.do("finish", rid=self.pick_live(pick))

    @precondition(lambda self: self.live())
    @rule(pick=PICK)
    def abort(self, pick):
        self.do("abort", rid=self.pick_live(pick))

    @rule(n=st.integers(1, 16))
    def evict(self, n):
        self.do("evict", n=n)

    # -- bare tree API ----------------------------------------------------------------------
    @rule(tokens=TOKENS_ST)
    def insert(self, tokens):
        self._remember(tokens)
        self.do("insert", tokens=tokens)

    @precondition(lambda self: self.seen)
    @rule(pick=PICK, cut=st.integers(0, 12), extra=st.lists(st.integers(0, VOCAB - 1),
                                                            max_size=3))
    def match(self, pick, cut, extra):
        self.do("match", tokens=self._shared(pick, cut, extra))

    @precondition(lambda self: self.seen)
    @rule(pick=PICK, cut=st.integers(0, 12))
    def lock(self, pick, cut):
        self.do("lock", hid=self.new_id(), tokens=self._shared(pick, cut, []))

    @precondition(lambda self: self.subject.locks)
    @rule(pick=PICK)
    def unlock(self, pick):
        held = sorted(self.subject.locks)
        self.do("unlock", hid=held[pick % len(held)])

    @precondition(lambda self: self.seen)
    @rule(pick=PICK, cut=st.integers(0, 12))
    def stray_unlock(self, pick, cut):
        self.do("stray_unlock", tokens=self._shared(pick, cut, []))


def alphabet(params) -> list[Op]:
    """The exhaustive search's ops (``kvcheck check radix``): two request ids, one bare lock
    holder, and a handful of sequences built from pages ``a`` = [0]*page_size and ``b`` =
    [1]*page_size -- a, a+b, a+a (shared prefix, branch, split), b (a second root child), and
    with page_size > 1 a+[1] (a partial last page) and [0] (a key shorter than a page)."""
    ps = params["page_size"]
    a, b = [0] * ps, [1] * ps
    seqs: list[list[int]] = []
    for t in (a, a + b, a + a, b) + ((a + [1], [0]) if ps > 1 else ()):
        if t not in seqs:
            seqs.append(t)
    rids, whole = (1, 2), 64
    chunks = sorted({1, ps, whole})
    ops = [Op("admit", {"rid": r, "tokens": t}) for r in rids for t in seqs]
    ops += [Op("prefill", {"rid": r, "n": n}) for r in rids for n in chunks]
    ops += [Op(name, {"rid": r}) for name in ("finish", "abort") for r in rids]
    ops += [Op("evict", {"n": n}) for n in (1, whole)]
    ops += [Op("insert", {"tokens": t}) for t in seqs]
    ops += [Op("match", {"tokens": t}) for t in seqs]
    ops += [Op("lock", {"hid": 1, "tokens": t}) for t in seqs]
    ops += [Op("unlock", {"hid": 1})]
    ops += [Op("stray_unlock", {"tokens": t}) for t in seqs]
    return ops


def _build(params, cache_cls, device):
    return RadixSubject(cache_cls or RadixCache, page_size=params["page_size"],
                        pool_pages=params["pool_pages"], device=device)


SPEC = VariantSpec(
    name="radix",
    summary="plain radix prefix cache with lock refs (SGLang / pymllm semantics)",
    ops=OPS,
    params={"page_size": Param(1, 1, 64, "tokens per page"),
            "pool_pages": Param(16, 1, 4096, "pages in the token pool")},
    build=_build,
    machine=RadixMachine,
    regimes=({"page_size": 1, "pool_pages": 16}, {"page_size": 4, "pool_pages": 6}),
    alphabet=alphabet,
    small_params=({"page_size": 1, "pool_pages": 3}, {"page_size": 4, "pool_pages": 3}),
    sometimes=("node-split", "leaf-gains-child", "cascade-eviction", "alloc-evicted",
               "out-of-memory", "prefix-hit", "shared-lock", "chunk-cached",
               "abort-mid-prefill", "stray-unlock-rejected", "partial-page-tail",
               "sub-page-match"),
)
