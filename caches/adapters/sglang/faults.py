"""Catalogued radix faults applied to SGLang's real ``RadixCache``, as the bad diffs.

Each fault is a textual patch of the one upstream method it lives in: the method's source is
read from the installed release (``inspect.getsource``), the patch's ``old`` lines are replaced
by its ``new`` lines (each ``old`` must occur exactly once, so a release where the method moved
or changed fails loudly instead of testing something else), and the result is compiled in the
method's own module globals and installed on a subclass (``RadixCache_R1``...).  The real class
is never modified; only a subject built with ``--fault`` uses the subclass.

Which catalogue faults have an upstream form (FAULTS.md, radix):

* R1, R3, R4, R5 -- below.
* R2 ``dec-lock-underflow`` -- nothing to inject: SGLang 0.5.12.post1's ``dec_lock_ref`` has no
  underflow guard at all.  That is the known upstream finding sglang-radix-F1
  (``tests/upstream_findings/``).
* R6 ``page-key-truncated-to-zero`` -- not observable here: without the second early return,
  SGLang's ``child_key`` slices (``tuple(t[:page_size])``) instead of indexing, so a sub-page key
  walks nothing and returns ``([], root)``, the same as the fixed code (notes/radix.md, R6).
"""

from __future__ import annotations

import __future__
import inspect
import textwrap
from dataclasses import dataclass
from functools import lru_cache

from caches.adapters.sglang import loader


@dataclass(frozen=True)
class Patch:
    method: str
    old: str  # lines of the upstream method (dedented to the method's level)
    new: str


@dataclass(frozen=True)
class UpstreamFault:
    id: str
    patches: tuple
    why: str  # one line: where the defect sits in SGLang's code


UPSTREAM_FAULTS = {f.id: f for f in (
    UpstreamFault("R1", (Patch(
        "_insert_helper",
        "            node.children[child_key] = new_node\n",
        "            if not node.children and node is not self.root_node and node.lock_ref == 0:\n"
        "                self.evictable_size_ -= len(node.key)  # kvcheck fault R1\n"
        "            node.children[child_key] = new_node\n"),),
        "_insert_helper: a leaf gaining its first child has its tokens subtracted from "
        "evictable_size_ (pymllm #656)"),
    UpstreamFault("R3", (Patch(
        "evict",
        "            _priority, x = heapq.heappop(eviction_heap)\n",
        "            _priority, x = heapq.heappop(eviction_heap)\n"
        "            if x.parent is self.root_node:  # kvcheck fault R3: the never-evict-the-\n"
        "                continue  # root guard tests the parent, so one-level leaves stay\n"),),
        "evict: skips children of the root, so eviction frees nothing although "
        "evictable_size_ > 0 (pymllm #656 follow-up)"),
    UpstreamFault("R4", (
        Patch("inc_lock_ref",
              "        while node != self.root_node:\n"
              "            if node.lock_ref == 0:\n",
              "        while node != self.root_node:\n"
              "            node = node.parent  # kvcheck fault R4: moved above the increment\n"
              "            if node.lock_ref == 0:\n"),
        Patch("inc_lock_ref",
              "            node = node.parent\n        return IncLockRefResult",
              "        return IncLockRefResult"),
        Patch("dec_lock_ref",
              "        while node != self.root_node:\n"
              "            if node.lock_ref == 1:\n",
              "        while node != self.root_node:\n"
              "            node = node.parent  # kvcheck fault R4, mirrored\n"
              "            if node.lock_ref == 1:\n"),
        Patch("dec_lock_ref",
              "            node = node.parent\n        return DecLockRefResult",
              "        return DecLockRefResult")),
        "inc_lock_ref/dec_lock_ref: the walk steps to the parent before touching the ref, so "
        "the matched node stays unlocked and the root's ref moves (mini-sglang #52)"),
    UpstreamFault("R5", (Patch(
        "insert",
        "            value = value[: len(key)]\n",
        "            pass  # kvcheck fault R5: the value keeps what the page-aligned key dropped\n"),),
        "insert: the value is not cut to the page-aligned key, so counters (by key) and the "
        "tree's tokens (by value) disagree at page_size > 1 (SGLang #10637)"),
)}

NOT_INJECTABLE = {
    "R2": "SGLang 0.5.12.post1's dec_lock_ref has no underflow guard to remove: the defect is "
          "already there (known upstream finding sglang-radix-F1, tests/upstream_findings/)",
    "R6": "not observable on SGLang 0.5.12.post1: without the early return, child_key slices "
          "a sub-page key to () and the match returns ([], root) exactly like the fixed code",
}


def _patch_method(cls, method: str, patches, fid: str):
    func = getattr(cls, method)
    src = textwrap.dedent(inspect.getsource(func))
    for p in patches:
        old, new = _at_method_level(p.old), _at_method_level(p.new)
        if src.count(old) != 1:
            raise LookupError(f"fault {fid}: SGLang {loader.load().version}'s "
                              f"{cls.__name__}.{method} does not contain exactly once:\n{old}")
        src = src.replace(old, new)
    code = compile(src, f"<kvcheck fault {fid}: {cls.__name__}.{method}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict = {}
    exec(code, func.__globals__, namespace)
    return namespace[method]


def _at_method_level(text: str) -> str:
    """Patch text is written at class-body indentation (4 spaces); getsource+dedent puts the
    method at column 0."""
    return "\n".join(line[4:] if line.startswith("    ") else line
                     for line in text.split("\n"))


@lru_cache(maxsize=None)
def upstream_fault(fid: str) -> type:
    """A subclass of SGLang's ``RadixCache`` with fault ``fid``'s patch applied."""
    if fid in NOT_INJECTABLE:
        raise KeyError(f"fault {fid} has no upstream form on SGLang: {NOT_INJECTABLE[fid]}")
    if fid not in UPSTREAM_FAULTS:
        raise KeyError(f"fault {fid} has no upstream form on SGLang; injectable: "
                       f"{', '.join(UPSTREAM_FAULTS)}")
    base = loader.require().RadixCache
    fault = UPSTREAM_FAULTS[fid]
    by_method: dict = {}
    for p in fault.patches:
        by_method.setdefault(p.method, []).append(p)
    body = {m: _patch_method(base, m, ps, fid) for m, ps in by_method.items()}
    body.update(fault_id=fid, __doc__=f"SGLang RadixCache with fault {fid}: {fault.why}")
    return type(f"RadixCache_{fid}", (base,), body)

