"""The radix properties in any engine's terms, for ``kvcheck report`` scripts: written from a
``caches.seam.NodeFields`` mapping whose fields are attribute names, and the expressions the
script evaluates to reach the engine's tree, counters, free list and live requests.  An
adapter's ``report_setup()`` (``caches.reporting.ReportSetup``) puts them in its ``checks``.
"""

from __future__ import annotations

from caches.reporting import Check
from caches.seam import NodeFields


def _attrs(fields: NodeFields, *names: str) -> dict:
    out = {}
    for name in names:
        value = getattr(fields, name)
        if not isinstance(value, str):
            raise ValueError(f"a report check reads node field {name!r} by attribute name; "
                             f"this mapping has a function there: write the check yourself")
        out[name] = value
    return out


def _nodes(fields: NodeFields) -> str:
    f = _attrs(fields, "children")
    return f'''def tree_nodes(root):
    """Every node reachable from the root (through .{f["children"]})."""
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.{f["children"]}.values())
    return out'''


def tree_checks(fields: NodeFields, *, uses: str, root: str, evictable: str,
                protected: str) -> dict[str, Check]:
    """``ref-balance`` and ``size-accounting`` over the tree whose root the script reaches as
    ``root``; the cache's size counters read as the expressions ``evictable`` / ``protected``.
    ``uses``: the script's names these expressions read (``"tree"``, ``"pool, sched"``): the
    checks take them as arguments."""
    f = _attrs(fields, "children", "key", "value", "lock", "parent")
    nodes = _nodes(fields)
    return {
        "ref-balance": Check(
            code=nodes + f'''


def check_ref_balance({uses}):
    """No node's lock count is below 0, nor below one of its children's."""
    for node in tree_nodes({root}):
        if node.{f["lock"]} < 0:
            raise Broken("ref-balance", f"node with key {{node.{f["key"]}}}: {f["lock"]} is "
                         f"{{node.{f["lock"]}}} < 0")
        for child in node.{f["children"]}.values():
            if node is not {root} and child.{f["lock"]} > node.{f["lock"]}:
                raise Broken("ref-balance", f"node with key {{child.{f["key"]}}} has "
                             f"{f["lock"]} {{child.{f["lock"]}}} > its parent's "
                             f"{{node.{f["lock"]}}} (a lock covers the path to the root)")''',
            call=f"check_ref_balance({uses})",
            words=f"every node's `{f['lock']}` is >= 0 and no child's exceeds its parent's (a "
                  "lock counts the holders of the node or a node below it)"),
        "size-accounting": Check(
            code=nodes + f'''


def check_size_accounting({uses}):
    """The evictable + protected counters == the tokens the tree holds; neither below 0."""
    root = {root}
    tokens = sum(len(n.{f["value"]}) for n in tree_nodes(root)
                 if n is not root and n.{f["value"]} is not None)
    ev, pr = {evictable}, {protected}
    if ev < 0 or pr < 0 or ev + pr != tokens:
        raise Broken("size-accounting", f"{evictable} {{ev}} + {protected} {{pr}} = "
                     f"{{ev + pr}} != {{tokens}} tokens in the tree")''',
            call=f"check_size_accounting({uses})",
            words=f"`{evictable} + {protected}` equals the tokens in the tree's nodes, neither "
                  "below 0"),
    }


def pool_check(fields: NodeFields, *, uses: str, root: str, free: str, capacity: str,
               base: int, holders: str) -> dict[str, Check]:
    """``conservation`` of one KV pool: every id ``base .. base + capacity - 1`` exactly once
    in the free list (``free``), the tree's nodes, or one live holder (``holders``: an
    expression giving ``(name, ids)`` pairs, e.g. the running requests' own slots)."""
    f = _attrs(fields, "children", "value")
    return {"conservation": Check(
        code=_nodes(fields) + f'''


def check_conservation({uses}):
    """Each KV slot is free, in the tree, or held by one live request -- exactly once."""
    root, where = {root}, {{}}
    places = [("free", list({free}))]
    places += [("the tree", list(n.{f["value"]})) for n in tree_nodes(root)
               if n is not root and n.{f["value"]} is not None]
    places += [(name, list(ids)) for name, ids in {holders}]
    for place, ids in places:
        for i in ids:
            if i in where and not (place == where[i] == "the tree"):
                raise Broken("conservation", f"slot {{i}} is both {{where[i]}} and {{place}}")
            where[i] = place
    want = set(range({base}, {base} + {capacity}))
    lost, odd = sorted(want - set(where)), sorted(set(where) - want)
    if lost or odd:
        raise Broken("conservation", f"slots {{lost}} are neither free, in the tree nor held "
                     f"(leaked)" if lost else f"slots {{odd}} are not slots of the pool")''',
        call=f"check_conservation({uses})",
        words=f"every KV slot `{base}..{base}+{capacity}-1` is in exactly one place: `{free}`, "
              "a tree node, or a live request")}


def drained_check(fields: NodeFields, *, uses: str, root: str, free: str, capacity: str,
                  base: int) -> dict[str, Check]:
    """``quiescence``: after the drain (every request finished or aborted, everything
    evicted) only the root is left and every slot ``base .. base + capacity - 1`` is free."""
    f = _attrs(fields, "children")
    return {"quiescence": Check(
        code=f'''def check_drained({uses}):
    """Only the root is left, and every KV slot is back in the free list (once)."""
    left = len({root}.{f["children"]})
    free, want = list({free}), set(range({base}, {base} + {capacity}))
    if left or len(free) != len(set(free)) or set(free) != want:
        raise Broken("quiescence", f"after draining, {{left}} entries hang off the root and "
                     f"{{len(set(free) & want)}} of {{len(want)}} slots are free "
                     f"({{len(want - set(free))}} leaked)")''',
        call=f"check_drained({uses})",
        words=f"once every request is finished or aborted and everything evicted, only the "
              f"root is left and all `{capacity}` slots are in `{free}`")}
