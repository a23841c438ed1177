"""Find TokenSpeed's scheduler bindings: the installed ``tokenspeed-scheduler`` wheel (the
default), or the extension built from a checkout (``--src CHECKOUT``, ``build.py``).

The scheduler is a nanobind extension; kvcheck only imports it -- nothing is patched (compiled
code cannot be), faults are injected at the event boundary (``faults.py``).
``unavailable_reason(src)`` reports a missing install, a missing toolchain, a failed build or
bindings older than the adapter drives in one line; ``version``/``source`` say which code runs.
A checkout's module is imported only where the subject is built (its forked child,
``isolate.py``): this process never holds two builds of one module name.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from importlib import metadata

DIST = "tokenspeed-scheduler"
PINNED = "0.1.42"
SETUP_HINT = (f"pip install 'kvcheck[tokenspeed]' (or pip install {DIST}=={PINNED}; "
              "cp311 manylinux x86_64 wheels only)")
PACKAGE = "tokenspeed_scheduler"


def unavailable_reason(src=None) -> str | None:
    """Why the target cannot run here (a missing environment, toolchain or failed build of
    ``src``), else None.  With ``src`` this builds the checkout unless its build is cached."""
    if src is not None:
        from caches.adapters.tokenspeed.build import BuildUnavailable, package_root

        try:
            package_root(src)
        except BuildUnavailable as exc:
            return str(exc)
        return None
    try:
        import tokenspeed_scheduler  # noqa: F401
    except ImportError as exc:
        return f"{DIST} is not installed ({exc.msg}); {SETUP_HINT}"
    return None


def version(src=None) -> str:
    if src is not None:
        from caches.adapters.tokenspeed import build

        return build.declared_version(build.scheduler_dir(src))
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return ""


@lru_cache(maxsize=None)
def module(src=None):
    """The ``tokenspeed_scheduler`` package: the wheel's, or the one built from ``src``
    (imported from its build directory, which stays first on ``sys.path`` only for the
    import; whatever ``tokenspeed_scheduler`` was loaded before is set aside and restored)."""
    if src is None:
        import tokenspeed_scheduler

        return tokenspeed_scheduler
    from caches.adapters.tokenspeed.build import package_root

    import importlib

    root = str(package_root(src))
    saved = {k: sys.modules.pop(k) for k in list(sys.modules)
             if k == PACKAGE or k.startswith(PACKAGE + ".")}
    sys.path.insert(0, root)
    try:
        mod = importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(root)
        for k in [k for k in sys.modules if k == PACKAGE or k.startswith(PACKAGE + ".")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return mod


def extension_files(src=None) -> list[str]:
    if src is not None:
        from caches.adapters.tokenspeed.build import extension_file

        return [extension_file(src)]
    import tokenspeed_scheduler.tokenspeed_scheduler_ext as ext

    return [ext.__file__]
