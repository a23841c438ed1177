"""The radix properties in the terms of an engine's own ``TreeNode`` tree (``root_node``,
``children``, ``key.token_ids``, ``value``, ``lock_ref``) -- the design SGLang's and pymllm's
``RadixCache`` share -- as the checks ``kvcheck report`` writes into its scripts."""

from __future__ import annotations

from caches.reporting import Check

_NODES = '''def tree_nodes(cache):
    """Every TreeNode reachable from cache.root_node."""
    out, stack = [], [cache.root_node]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out'''


def radix_checks(evictable: str, protected: str) -> dict[str, Check]:
    """``ref-balance`` and ``size-accounting`` for a tree whose size counters read as the
    expressions ``evictable`` / ``protected`` (e.g. ``cache.evictable_size_``)."""
    return {
        "ref-balance": Check(
            code=_NODES + '''


def check_ref_balance(cache):
    """No TreeNode's lock_ref is below 0 (a lock taken by nobody was released)."""
    for node in tree_nodes(cache):
        if node.lock_ref < 0:
            raise Broken("ref-balance", f"TreeNode with key {list(node.key.token_ids)}: "
                         f"lock_ref is {node.lock_ref} < 0")''',
            call="check_ref_balance(cache)",
            words="every `TreeNode.lock_ref` is >= 0 (a node's lock_ref counts the live locks "
                  "on it or below it; an unlock with no matching lock takes it below 0, and the "
                  "next `inc_lock_ref` then skips the evictable -> protected move)"),
        "size-accounting": Check(
            code=_NODES + f'''


def check_size_accounting(cache):
    """The evictable + protected counters == the tokens the tree holds; neither below 0."""
    root = cache.root_node
    tokens = sum(len(n.value) for n in tree_nodes(cache)
                 if n is not root and n.value is not None)
    ev, pr = {evictable}, {protected}
    if ev < 0 or pr < 0 or ev + pr != tokens:
        raise Broken("size-accounting", f"{evictable} {{ev}} + {protected} {{pr}} = "
                     f"{{ev + pr}} != {{tokens}} tokens in the tree")''',
            call="check_size_accounting(cache)",
            words=f"`{evictable} + {protected}` equals the tokens in the tree's nodes, neither "
                  "below 0"),
    }
