"""Find the installed ``tokenspeed-scheduler`` (the compiled bindings from PyPI).

The scheduler is a nanobind extension; kvcheck only imports it -- nothing is patched (compiled
code cannot be), faults are injected at the event boundary (``faults.py``).  ``unavailable``
reports a missing install in one line with how to get it; ``identity`` names the version and a
content hash of the extension module that runs.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import metadata

DIST = "tokenspeed-scheduler"
PINNED = "0.1.42"
SETUP_HINT = (f"pip install 'kvcheck[tokenspeed]' (or pip install {DIST}=={PINNED}; "
              "cp311 manylinux x86_64 wheels only)")


def unavailable_reason(src=None) -> str | None:
    """Why the target cannot run here (a missing environment only), else None."""
    try:
        import tokenspeed_scheduler  # noqa: F401
    except ImportError as exc:
        return f"{DIST} is not installed ({exc.msg}); {SETUP_HINT}"
    return None


def version() -> str:
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return ""


@lru_cache(maxsize=1)
def module():
    import tokenspeed_scheduler

    return tokenspeed_scheduler


def extension_files() -> list[str]:
    import tokenspeed_scheduler.tokenspeed_scheduler_ext as ext

    return [ext.__file__]
