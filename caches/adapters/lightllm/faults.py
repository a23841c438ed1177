"""Catalogued paged-bigpage faults as patches of LightLLM's real ``LinearAttPagedRadixCache``.

Each fault rewrites the one upstream method it lives in: the method's source is read from the
``--src`` checkout (``inspect.getsource``), a regular expression that must match **exactly
once** is replaced, and the result is compiled in the method's own module globals and
installed on a subclass (``LinearAttPagedRadixCache_L1``...).  The loaded class is never
modified; a checkout where the method changed fails loudly (``LookupError``) instead of
testing something else.  Patterns are written against the dedented method (``def`` at column
0, its body at 4 spaces).

Which catalogue faults have a form here (docs/faults.md, paged-bigpage):

* L1 ``root-in-evict-set`` -- ``_add_node`` without its ``node is not self.root_node`` guard
  (the part of PR #1348 that was merged, b0231dea8).
* L2 / L3 / L4 (the root release at the miss / trim-to-empty / deref-to-root exits) -- on a
  checkout that has PR #1348's root-ref fixes (187cbda93, e.g. the fixed copy the tests make)
  the fault removes the release again.  On a checkout without them (87881ae7 and upstream main)
  the defect is already there: the fault is refused (``FaultNotInjectable``) naming the known
  finding (``tests/upstream_findings/lightllm-paged-bigpage-L2-*.json``).
* L5 ``bigpage-buffer-leak-on-abort`` -- not injectable: its code is ``_linear_att_free_req``
  in ``infer_batch.py`` (the request path), which this target does not load (it needs the GPU
  request manager); the driver is kvcheck's port of it, and the reference target catches L5.
* L6 ``decode-kv-leak-on-finish`` (the same request path) and L7
  ``admission-ignores-running-batch`` (the router's queue, ``caches/admission.py``'s
  ``PeakTokenBudget`` here) -- not injectable, for the same reason.
* P5 ``inverted-usable-flag`` -- ``LinearAttPagedTreeNode.get_compare_key`` with the usable
  flag inverted; nodes are created by the module-global class name (in the cache's
  ``__init__`` and the node's two ``add_and_return_new_*child`` methods), so those three are
  recompiled unchanged with that name bound to the patched node subclass.
"""

from __future__ import annotations

import __future__
import inspect
import re
import textwrap
from dataclasses import dataclass, field

from caches.target import FaultNotInjectable


@dataclass(frozen=True)
class Patch:
    method: str
    old: str  # a regular expression over the dedented method; must match exactly once
    new: str  # its replacement (``re.sub`` template)
    present: str | None = None  # matches when the checkout already has the defect


@dataclass(frozen=True)
class UpstreamFault:
    id: str
    patches: tuple
    why: str
    finding: str | None = None  # the known finding id when the unpatched checkout has it
    node_patches: tuple = field(default=())  # patches of LinearAttPagedTreeNode (P5)


_RELEASE = r"        self\.dec_node_ref_counter\(self\.root_node\)\n"
_COMMENTS = r"(?:    #[^\n]*\n)*"  # PR #1348 put a comment block above the miss release

UPSTREAM_FAULTS = {f.id: f for f in (
    UpstreamFault("L1", (Patch(
        "_add_node",
        r"if node\.is_leaf\(\) and node is not self\.root_node:",
        "if node.is_leaf():  # kvcheck fault L1: the root may enter the eviction set"),),
        "_add_node: the root, a leaf once the tree is empty, enters _evict_tree_set"),
    UpstreamFault("L2", (Patch(
        "match_prefix",
        r"(update_refs=update_refs,\n    \)\n" + _COMMENTS +
        r"    if len\(ans_node_list\) == 0:\n)" + _RELEASE,
        r"\1",
        r"update_refs=update_refs,\n    \)\n" + _COMMENTS +
        r"    if len\(ans_node_list\) == 0:\n        return None, 0, None"),),
        "match_prefix: the 'no match' return keeps the root ref the descent took",
        finding="lightllm-paged-bigpage-L2"),
    UpstreamFault("L3", (Patch(
        "match_prefix",
        r"(ans_node_list = self\._trim_unusable_match_tail\(ans_node_list\)\n"
        r"    if len\(ans_node_list\) == 0:\n)" + _RELEASE,
        r"\1",
        r"ans_node_list = self\._trim_unusable_match_tail\(ans_node_list\)\n"
        r"    if len\(ans_node_list\) == 0:\n        return None, 0, None"),),
        "match_prefix: the 'trimmed to empty' return keeps the root ref",
        finding="lightllm-paged-bigpage-L2"),
    UpstreamFault("L4", (Patch(
        "deref_to_first_big_page_node",
        r"(    if iter_node is self\.root_node:\n" + r"(?:        #[^\n]*\n)*)" + _RELEASE,
        r"\1",
        r"    if iter_node is self\.root_node:\n        return None"),),
        "deref_to_first_big_page_node: bottoming out at the root keeps the match's root ref",
        finding="lightllm-paged-bigpage-L2"),
    UpstreamFault("P5", (), "LinearAttPagedTreeNode.get_compare_key: the usable flag is "
                  "inverted, so leaves with a linear state are evicted first",
                  node_patches=(Patch(
                      "get_compare_key",
                      r"return \(0 if self\.ref_counter == 0 else 1, keya, self\.time_id\)",
                      "return (0 if self.ref_counter == 0 else 1, 1 - keya, self.time_id)"
                      "  # kvcheck fault P5: the usable flag inverted"),)),
)}

NOT_INJECTABLE = {
    "L5": "its code is _linear_att_free_req in infer_batch.py (the request path), which the "
          "lightllm target does not load (it needs the GPU request manager): the driver is "
          "kvcheck's port of it, and the reference target catches L5",
    "L6": "its code is _linear_att_free_req in infer_batch.py (the request path), which the "
          "lightllm target does not load: the reference target catches L6",
    "L7": "its code is the router's ChunkedPrefillQueue (req_queue/chunked_prefill/impl.py), "
          "which the lightllm target does not load: kvcheck's PeakTokenBudget plays it, and "
          "the reference target catches L7",
}


def _source(cls, method: str) -> str:
    return textwrap.dedent(inspect.getsource(getattr(cls, method)))


def _compile(cls, method: str, src: str, fid: str, extra_globals=None):
    func = getattr(cls, method)
    code = compile(src, f"<kvcheck fault {fid}: {cls.__name__}.{method}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    glb = func.__globals__ if not extra_globals else {**func.__globals__, **extra_globals}
    namespace: dict = {}
    exec(code, glb, namespace)
    return namespace[method]


def _patched(cls, method: str, patches, fid: str, extra_globals=None):
    src = _source(cls, method)
    for p in patches:
        src, n = re.subn(p.old, p.new, src)
        if n != 1:
            raise LookupError(f"fault {fid}: {cls.__name__}.{method} of this LightLLM checkout "
                              f"({inspect.getsourcefile(cls)}) matches {n} times, not once:\n"
                              f"{p.old}")
    return _compile(cls, method, src, fid, extra_globals)


def upstream_fault(ns, fid: str) -> type:
    """A subclass of the checkout's ``LinearAttPagedRadixCache`` with fault ``fid`` applied."""
    if fid in NOT_INJECTABLE:
        raise FaultNotInjectable(f"fault {fid} has no upstream form on LightLLM's "
                                 f"LinearAttPagedRadixCache: {NOT_INJECTABLE[fid]}")
    fault = UPSTREAM_FAULTS.get(fid)
    if fault is None:
        raise FaultNotInjectable(f"fault {fid} has no upstream form on LightLLM's "
                                 f"LinearAttPagedRadixCache; injectable: "
                                 f"{', '.join(UPSTREAM_FAULTS)}")
    return _fault_class(ns.LinearAttPagedRadixCache, ns.LinearAttPagedTreeNode, fault)


_CACHE: dict = {}


def _fault_class(base: type, node_base: type, fault: UpstreamFault) -> type:
    key = (base, fault.id)
    if key in _CACHE:
        return _CACHE[key]
    for p in fault.patches:
        if p.present is not None and re.search(p.present, _source(base, p.method)) and \
                not re.search(p.old, _source(base, p.method)):
            raise FaultNotInjectable(
                f"fault {fault.id} has no upstream form to inject on this LightLLM checkout: "
                f"its {base.__name__}.{p.method} already has the defect (known upstream "
                f"finding {fault.finding}, tests/upstream_findings/); a checkout with LightLLM "
                "PR #1348's root-ref fixes takes it")
    by_method: dict = {}
    for p in fault.patches:
        by_method.setdefault(p.method, []).append(p)
    body = {m: _patched(base, m, ps, fault.id) for m, ps in by_method.items()}
    if fault.node_patches:
        node_cls = type(f"{node_base.__name__}_{fault.id}", (node_base,), {})
        rebind = {node_base.__name__: node_cls}
        node_body = {p.method: _patched(node_base, p.method, [p], fault.id)
                     for p in fault.node_patches}
        for m in ("add_and_return_new_child", "add_and_return_new_big_page_child"):
            node_body[m] = _compile(node_base, m, _source(node_base, m), fault.id, rebind)
        for name, func in node_body.items():
            setattr(node_cls, name, func)
        body["__init__"] = _compile(base, "__init__", _source(base, "__init__"), fault.id, rebind)
    body.update(fault_id=fault.id,
                __doc__=f"LightLLM {base.__name__} with fault {fault.id}: {fault.why}")
    cls = _CACHE[key] = type(f"{base.__name__}_{fault.id}", (base,), body)
    return cls
