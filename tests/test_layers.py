"""The three packages are layers and their modules form no import cycle.

What is checked, precisely (by reading the source with ``ast``, importing nothing):

* the graph: one node per module of ``invariants/``, ``caches/`` and ``state_machines/`` (a
  package's ``__init__.py`` is the package's node); one edge from a module to each of these
  modules it names in an ``import`` or ``from ... import`` statement **anywhere in the file** --
  at top level, inside a function or method, under ``if TYPE_CHECKING:`` or in a ``try:``.
  ``from P import x`` is an edge to ``P.x`` when that is a module, else to ``P``; relative
  imports are resolved against the importing module's package.  Importing ``a.b.c`` is an edge
  to ``a.b.c`` only, not to the packages ``a`` and ``a.b`` that Python also runs on the way.
  Imports of anything else (the standard library, hypothesis, torch, engines) are not edges.
* no cycles: the graph has no strongly connected component of two or more modules (a module
  importing itself is ignored); a failure names one cycle as its module path, ``a -> b -> a``.
* layers: ``invariants`` < ``caches`` < ``state_machines``; no edge goes from a package to a
  higher one (``caches/`` never imports ``state_machines/``, ``invariants/`` imports neither).

The same checker runs over small planted packages under ``tmp_path`` to show it reports a
cycle (top-level and function-local) and an upward import.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("invariants", "caches", "state_machines")  # lowest first


def modules(root: Path, packages=LAYERS) -> dict:
    """``{dotted name: (file, is_package)}`` for every ``.py`` file under ``packages``."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def import_graph(root: Path, packages=LAYERS) -> dict:
    """``{module: {imported module: first line}}`` between the modules of ``packages``."""
    mods = modules(root, packages)

    def resolve(name: str):
        while name:
            if name in mods:
                return name
            name = name.rpartition(".")[0]
        return None

    graph = {}
    for mod, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        edges = graph.setdefault(mod, {})
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [resolve(f"{base}.{a.name}") or resolve(base) for a in node.names]
            for t in targets:
                if t is not None and t != mod:
                    edges.setdefault(t, node.lineno)
    return graph


def cycles(graph: dict) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component of two or more modules."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        comps.append(set(comp))
    return [_path_in(graph, comp) for comp in comps]


def _path_in(graph: dict, comp: set) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first back to it)."""
    first = min(comp)
    prev, queue = {first: None}, [first]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w == first:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [first]
            if w in comp and w not in prev:
                prev[w] = v
                queue.append(w)
    raise AssertionError(f"no cycle through {first} in {sorted(comp)}")  # cannot happen


def upward(graph: dict, layers=LAYERS) -> list[str]:
    rank = {name: i for i, name in enumerate(layers)}
    return [f"{a} -> {b} (line {line})" for a, edges in graph.items() for b, line in edges.items()
            if rank[b.split(".")[0]] > rank[a.split(".")[0]]]


def problems(root: Path, layers=LAYERS) -> list[str]:
    graph = import_graph(root, layers)
    return ([" -> ".join(c) for c in cycles(graph)]
            + [f"upward import {u}" for u in upward(graph, layers)])


# -- kvcheck itself ---------------------------------------------------------------------------
def test_graph_is_not_empty():
    graph = import_graph(ROOT)
    assert len(graph) > 50
    assert "state_machines.run" in graph["state_machines.machine"]  # a known edge is seen


def test_no_import_cycles():
    found = cycles(import_graph(ROOT))
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_no_package_imports_a_higher_one():
    found = upward(import_graph(ROOT))
    assert not found, "imports going up a layer: " + "; ".join(found)


# -- the checker can fail ---------------------------------------------------------------------
def _plant(root: Path, files: dict) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_planted_cycle_is_reported(tmp_path):
    root = _plant(tmp_path, {
        "low/__init__.py": "",
        "high/__init__.py": "",
        "high/a.py": "from high.b import B\n",
        "high/b.py": "from . import c\nB = 1\n",
        "high/c.py": "def late():\n    import high.a\n",  # function-local closes the circle
        "high/d.py": "import os\nimport high.a\n",  # on the way in, not in the cycle
    })
    found = problems(root, ("low", "high"))
    assert found == ["high.a -> high.b -> high.c -> high.a"]


def test_planted_upward_import_is_reported(tmp_path):
    root = _plant(tmp_path, {
        "low/__init__.py": "",
        "low/x.py": "from high import y\n",
        "high/__init__.py": "",
        "high/y.py": "from low import x\n",
    })
    found = problems(root, ("low", "high"))
    assert "high.y -> low.x -> high.y" in found
    assert "upward import low.x -> high.y (line 1)" in found


def test_planted_clean_package_passes(tmp_path):
    root = _plant(tmp_path, {
        "low/__init__.py": "",
        "low/x.py": "import json\n",
        "high/__init__.py": "from .y import Y\n",
        "high/y.py": "from low.x import json\nY = 1\n",
    })
    assert problems(root, ("low", "high")) == []
