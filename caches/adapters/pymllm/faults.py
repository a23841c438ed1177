"""Catalogued radix faults applied to pymllm's real ``RadixCache``, as the bad diffs.

Each fault is a textual patch of the one upstream method it lives in (read with
``inspect.getsource`` from the ``--src`` checkout; each anchor must occur exactly once, so a
checkout where the method changed fails loudly), compiled in the method's own module globals
and installed on a subclass (``RadixCache_R3``...); the real class is never modified.  The
same ``Patch``/``UpstreamFault`` shapes as the SGLang target (``sglang/patching.py``).

Which catalogue faults have a pymllm form (docs/faults.md, radix):

* R1 ``add-leaf-subtracts-parent`` -- pymllm's own defect (PR #656, open at b9c307020b).  On a
  checkout that still has it there is nothing to inject: it is the known upstream finding
  pymllm-radix-R1.  On a fixed checkout (PR #656 applied) the patch puts the subtraction back.
* R2 ``dec-lock-underflow`` -- nothing to inject: pymllm's ``dec_lock_ref`` has no underflow
  guard at all (known upstream finding pymllm-radix-R2).
* R3, R4 -- below.
* R5 ``size-by-key`` -- no form: pymllm's ``insert`` never page-aligns the key, so a node's
  key and value always have the same length and counting by either is the same.
* R6 ``page-key-truncated-to-zero`` -- not observable: without the second early return of
  ``match_prefix``, ``_match_normal`` walks nothing for an empty key and returns ``([],
  root)``, exactly like the fixed code.
"""

from __future__ import annotations

import __future__
import inspect
import textwrap
from functools import lru_cache

from caches.adapters.pymllm import loader
from caches.adapters.sglang.patching import Patch, UpstreamFault, _at_method_level
from caches.target import FaultNotInjectable

R1_LINE = "self._evictable_size -= len(parent.key)"

UPSTREAM_FAULTS = {f.id: f for f in (
    UpstreamFault("R1", (Patch(
        "_add_leaf",
        "        new_node = TreeNode()\n",
        "        if (len(parent.children) == 0 and parent != self.root_node\n"
        "                and parent.lock_ref == 0 and not parent.evicted):\n"
        "            self._evictable_size -= len(parent.key)  # kvcheck fault R1\n"
        "        new_node = TreeNode()\n"),),
        "_add_leaf: a leaf gaining its first child has its tokens subtracted from "
        "_evictable_size (pymllm #656, put back on a fixed checkout)"),
    UpstreamFault("R3", (Patch(
        "evict",
        "                _, node = heapq.heappop(heap)\n",
        "                _, node = heapq.heappop(heap)\n"
        "                if node.parent is self.root_node:  # kvcheck fault R3: the never-\n"
        "                    continue  # evict-the-root guard tests the parent\n"),),
        "evict: skips children of the root, so eviction frees nothing although "
        "evictable_size() > 0 (pymllm #656 follow-up)"),
    UpstreamFault("R4", (
        Patch("inc_lock_ref",
              "        while cur != self.root_node:\n"
              "            if cur.lock_ref == 0:\n",
              "        while cur != self.root_node:\n"
              "            cur = cur.parent  # kvcheck fault R4: moved above the increment\n"
              "            if cur.lock_ref == 0:\n"),
        Patch("inc_lock_ref",
              "            cur = cur.parent\n        return swa_boundary_id",
              "        return swa_boundary_id"),
        Patch("dec_lock_ref",
              "        while cur != self.root_node:\n"
              "            if cur.lock_ref == 1:\n",
              "        while cur != self.root_node:\n"
              "            cur = cur.parent  # kvcheck fault R4, mirrored\n"
              "            if cur.lock_ref == 1:\n"),
        Patch("dec_lock_ref",
              "                    dec_swa = False\n\n            cur = cur.parent\n",
              "                    dec_swa = False\n")),
        "inc_lock_ref/dec_lock_ref: the walk steps to the parent before touching the ref, so "
        "the matched node stays unlocked and the root's ref moves (mini-sglang #52)"),
)}

NOT_INJECTABLE = {
    "R2": "pymllm's dec_lock_ref has no underflow guard to remove: the defect is already there "
          "(known upstream finding pymllm-radix-R2, tests/upstream_findings/)",
    "R5": "no form in pymllm: RadixCache.insert never page-aligns the key, so every node's key "
          "and value have the same length and counting by either is the same",
    "R6": "not observable in pymllm: without match_prefix's second early return, "
          "_match_normal walks nothing for an empty key and returns ([], root) like the fixed "
          "code",
}


def _patch_method(cls, method: str, patches, fid: str):
    func = getattr(cls, method)
    src = textwrap.dedent(inspect.getsource(func))
    for p in patches:
        old, new = _at_method_level(p.old), _at_method_level(p.new)
        if src.count(old) != 1:
            raise LookupError(f"fault {fid}: pymllm's {cls.__name__}.{method} (from "
                              f"{inspect.getsourcefile(func)}) does not contain exactly "
                              f"once:\n{old}")
        src = src.replace(old, new)
    code = compile(src, f"<kvcheck fault {fid}: pymllm {cls.__name__}.{method}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict = {}
    exec(code, func.__globals__, namespace)
    return namespace[method]


@lru_cache(maxsize=None)
def _subclass(fid: str, root: str) -> type:
    base = loader.load(root).RadixCache
    fault = UPSTREAM_FAULTS[fid]
    by_method: dict = {}
    for p in fault.patches:
        by_method.setdefault(p.method, []).append(p)
    body = {m: _patch_method(base, m, ps, fid) for m, ps in by_method.items()}
    body.update(fault_id=fid, __doc__=f"pymllm {base.__name__} with fault {fid}: {fault.why}")
    return type(f"{base.__name__}_{fid}", (base,), body)


def upstream_fault(fid: str, src) -> type:
    """A subclass of pymllm's ``RadixCache`` (from ``src``) with fault ``fid``'s patch."""
    if fid in NOT_INJECTABLE:
        raise FaultNotInjectable(f"fault {fid} has no upstream form on pymllm's RadixCache: "
                                 f"{NOT_INJECTABLE[fid]}")
    if fid not in UPSTREAM_FAULTS:
        raise FaultNotInjectable(f"fault {fid} has no upstream form on pymllm's RadixCache; "
                                 f"injectable: {', '.join(UPSTREAM_FAULTS)}")
    ns = loader.load(src)
    if fid == "R1" and R1_LINE in inspect.getsource(ns.RadixCache._add_leaf):
        raise FaultNotInjectable("fault R1 is already in this pymllm checkout's "
                                 "RadixCache._add_leaf: it is the known upstream finding "
                                 "pymllm-radix-R1 (PR #656 not applied); fuzz with "
                                 "--known-findings find to see it")
    return _subclass(fid, ns.root)
