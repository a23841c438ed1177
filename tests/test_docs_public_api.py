"""The docs show plug-in authors public API only: every ``from caches/invariants/
state_machines ... import`` in a ```python block of README.md and docs/ names a public name
(no leading underscore) that exists, and no prose cites a private dotted name
(``caches.pools._DataTensor`` was in docs/adapters.md while the public name is
``DataTensor``)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
OURS = ("caches", "invariants", "state_machines")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
PRIVATE_CITED = re.compile(r"\b(?:caches|invariants|state_machines)(?:\.\w+)*\._[A-Za-z]\w*")


def kvcheck_imports(source: str) -> list[tuple[str, str]]:
    """``(module, name)`` for every ``from <ours> import name`` of a code block."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module \
                and node.module.split(".")[0] in OURS:
            out += [(node.module, a.name) for a in node.names]
    return out


def blocks():
    for doc in DOCS:
        for m in BLOCK.finditer(doc.read_text()):
            yield doc.relative_to(ROOT), m.group(1)


@pytest.mark.parametrize("doc, source", list(blocks()),
                         ids=lambda v: str(v) if isinstance(v, Path) else "")
def test_doc_code_imports_public_names_that_exist(doc, source):
    for module, name in kvcheck_imports(source):
        assert not name.startswith("_"), f"{doc}: imports private {module}.{name}"
        mod = importlib.import_module(module)
        assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), \
            f"{doc}: {module} has no {name}"


def test_no_doc_cites_a_private_name():
    cited = [(str(d.relative_to(ROOT)), m.group(0)) for d in DOCS
             for m in PRIVATE_CITED.finditer(d.read_text())]
    assert cited == []


def test_the_checks_see_a_private_import():
    assert kvcheck_imports("from caches.pools import _DataTensor, resolve_device\n") == [
        ("caches.pools", "_DataTensor"), ("caches.pools", "resolve_device")]
    assert PRIVATE_CITED.search("subclass `caches.pools._DataTensor`")
