"""An engine's own radix ``TreeNode`` seen through kvcheck's radix node interface: what the
SGLang and pymllm radix adapters share (their trees come from one design).  Both are users of
the public seam (``caches/seam.py``): their nodes are read through a ``NodeFields`` mapping
whose key is a ``RadixKey``'s ``token_ids``."""

from __future__ import annotations

from typing import NamedTuple

from caches.seam import NodeFields, NodeProxies, NodeProxy, ids_of  # noqa: F401  (re-exported)


class MatchResult(NamedTuple):
    indices: list
    last_node: "RawNode"


def radix_key_tokens(raw) -> tuple:
    """A ``TreeNode``'s key (a ``RadixKey``) as tokens."""
    return tuple(raw.key.token_ids)


RADIX_KEY_FIELDS = NodeFields(key=radix_key_tokens)  # SGLang's / pymllm's ``TreeNode``


class RawNode(NodeProxy):
    """One engine ``TreeNode`` (one wrapper per node, so ``is`` works); ids relative to the
    root's.  Subclasses name the engine."""

    __slots__ = ()


class RawNodes(NodeProxies):
    """An adapter's wrappers of the engine's ``TreeNode``s (needs ``tree``, the engine's
    cache); ``node_fields`` says how a key's tokens are read."""

    node_class = RawNode
    node_fields = RADIX_KEY_FIELDS


def check_request_rows(free, size: int, held: dict, live, unit: str = "slot",
                       reserved: tuple = (0,), base: int = 1) -> None:
    """The engine's request-to-token table: every row free or held by exactly one live
    request (``held``: rid -> row), and no finished request still holding one."""
    from invariants import PoolView, check_conservation, fail

    pool = PoolView("req_to_token", unit, size, tuple(free), reserved, base=base)
    check_conservation(pool, {f"request r{rid}": [i] for rid, i in held.items()})
    stale = sorted(set(held) - set(live))
    if stale:
        fail("conservation", f"request-table rows of finished requests {stale} are still "
             "held", pool="req_to_token", requests=stale)
