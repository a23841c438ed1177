"""Which TokenSpeed source a ``--src CHECKOUT`` run gates: the checkout's own commit and a hash
of its uncommitted changes to the scheduler's sources.

Git is asked about the directory given only (its own ``.git``, never an enclosing
repository's): ``git:<commit>`` for a clean tree, ``git:<commit>+dirty.<hash>`` when files
under the scheduler directory differ from that commit (the hash covers each changed or
untracked file's path and bytes, so two different edits of one commit differ).  A directory
that is not a git checkout (an unpacked sdist, a copy), or no usable ``git``, is identified by
``sha256:`` over the scheduler's source files -- the same hash the build cache is keyed by.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from caches.adapters.tokenspeed.build import declared_version, scheduler_dir, source_hash


def _git(root: Path, *args: str) -> str | None:
    git = shutil.which("git")
    if git is None:
        return None
    try:
        out = subprocess.run([git, "-C", str(root), *args], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _dirty_hash(root: Path, rel: str) -> str | None:
    """A hash of the uncommitted changes under ``rel``, or None when there are none."""
    status = _git(root, "status", "--porcelain", "--untracked-files=all", "-z", "--", rel or ".")
    if not status:
        return None
    paths = sorted({entry[3:] for entry in status.split("\0") if len(entry) > 3})
    h = hashlib.sha256()
    for p in paths:
        f = root / p
        h.update(p.encode() + b"\0")
        h.update(f.read_bytes() if f.is_file() else b"<deleted>")
        h.update(b"\0")
    return h.hexdigest()[:12]


def source(src: str) -> str:
    """``git:<commit>[+dirty.<hash>]`` or ``sha256:<hash>`` for checkout ``src``."""
    root = Path(src).expanduser().resolve()
    sdir = scheduler_dir(src)
    if (root / ".git").exists():
        head = _git(root, "rev-parse", "HEAD")
        if head:
            rel = sdir.relative_to(root).as_posix() if sdir != root else ""
            dirty = _dirty_hash(root, rel)
            return f"git:{head.strip()}" + (f"+dirty.{dirty}" if dirty else "")
    return "sha256:" + source_hash(sdir)[:16]


def version(src: str) -> str:
    """The scheduler version the checkout declares (its ``pyproject.toml``)."""
    return declared_version(scheduler_dir(src))
