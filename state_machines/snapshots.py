"""Where the engine checkout a trace names (its ``src``) is found, wherever kvcheck runs from.

A trace recorded with ``--src PATH`` keeps ``PATH`` as it was given (often relative, e.g.
``../shared/upstream/mllm-b9c307020b`` from the project root).  Loading it resolves that path
the same way from any working directory and any clone:

1. the path itself, when it is a directory (absolute, or relative to the working directory);
2. relative to the root of this checkout (where kvcheck's own traces are recorded);
3. a folder of the same name in the snapshots' search path: the folders listed in
   ``$KVCHECK_SNAPSHOTS`` (``os.pathsep``-separated), then ``../shared/upstream`` next to
   this checkout.

An explicit ``--src`` on the command line wins over all of it.  When nothing holds the
checkout, ``missing_src`` says in one line what to pass.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "KVCHECK_SNAPSHOTS"
REPO = Path(__file__).resolve().parents[1]


def search_path(extra=()) -> list[Path]:
    """The folders searched for a checkout by name: ``$KVCHECK_SNAPSHOTS``, then
    ``../shared/upstream`` next to this checkout, then ``extra``."""
    listed = [p for p in os.environ.get(ENV, "").split(os.pathsep) if p]
    return [Path(p) for p in listed] + [REPO.parent / "shared" / "upstream"] + \
        [Path(p) for p in extra]


def resolve_src(src: str | None, extra=()) -> str | None:
    """The directory a recorded ``src`` names here (rules in the module docstring), or None
    when none holds it.  ``None`` in, ``None`` out."""
    if not src:
        return src
    path = Path(src)
    if path.is_dir():
        return src
    if not path.is_absolute() and (REPO / path).is_dir():
        return str((REPO / path).resolve())
    for root in search_path(extra):
        if (root / path.name).is_dir():
            return str((root / path.name).resolve())
    return None


def missing_src(src: str) -> str:
    """One line: the recorded checkout is not here, and what to pass instead."""
    name = Path(src).name
    return (f"the engine checkout it was recorded with ({src}) is not here: pass --src PATH "
            f"(a checkout of the same code), or set {ENV} to a folder holding {name!r} "
            f"(searched: {', '.join(str(p) for p in search_path())})")
