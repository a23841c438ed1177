"""Where the engines' source snapshots (test data, never in the repo) are on this machine.

They sit next to the project as ``../shared/upstream/<name>``; a clone elsewhere (a CI runner's
temp dir) finds them through ``KVCHECK_SNAPSHOTS`` (a folder holding them) or the workspace's
``/work/shared/upstream``.  Tests that need one skip when none of these holds it."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _roots() -> list[Path]:
    roots = [os.environ.get("KVCHECK_SNAPSHOTS"), REPO.parent / "shared" / "upstream",
             "/work/shared/upstream"]
    return [Path(r) for r in roots if r]


def snapshot(name: str) -> Path:
    """The first root that holds ``name`` (else where it would be next to the project), with
    symlinks resolved: the loaders import a checkout from its real path."""
    for root in _roots():
        if (root / name).is_dir():
            return (root / name).resolve()
    return REPO.parent / "shared" / "upstream" / name


def located_src(src: str | None) -> str | None:
    """A trace's recorded ``src`` resolved as ``load_trace`` does (state_machines/snapshots.py),
    with the workspace's snapshots too; unchanged when nothing holds it."""
    from state_machines.snapshots import resolve_src

    return resolve_src(src, extra=_roots()) or src
