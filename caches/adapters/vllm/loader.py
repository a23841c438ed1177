"""Find vLLM's KV cache manager in this Python (the pinned env ``.venv-vllm``).

Only the pure-Python modules of ``vllm/v1/core`` (and ``v1/request.py``, ``sampling_params.py``)
are imported; nothing compiled in the wheel is loaded.  ``unavailable_reason`` reports a missing
install in one line with how to get it; ``files`` names the modules that run (for the identity).

``use(src)`` makes a vLLM checkout (``--src CHECKOUT``: the folder holding ``vllm/``, a pull
request's branch) the vLLM this process drives instead of the installed one: the checkout goes
first on ``sys.path`` while ``vllm`` is imported and is taken off again (later ``vllm.*``
imports follow the package's ``__path__``); ``vllm`` modules imported from elsewhere before are
dropped from ``sys.modules`` first.  The KV cache manager is pure Python, so a checkout needs
no build; its third-party imports come from the env (``.venv-vllm``).
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata
from pathlib import Path

DIST, PINNED = "vllm", "0.33.0"
SETUP_HINT = ("bash ci/upstream/vllm-setup.sh  (then run with .venv-vllm/bin/python or "
              ".venv-vllm/bin/kvcheck)")
MODULES = ("v1/core/kv_cache_manager.py", "v1/core/block_pool.py", "v1/core/kv_cache_utils.py",
           "v1/core/kv_cache_coordinator.py", "v1/core/single_type_kv_cache_manager.py",
           "v1/request.py")


_ACTIVE: list = [None]  # the checkout vllm is imported from; None: the installed one


def use(src=None) -> str | None:
    """Make checkout ``src`` (None: the installed vllm) the vLLM this process drives; returns
    why it cannot be (no ``vllm/`` package there), else None."""
    key = None
    if src is not None:
        root = Path(src).expanduser().resolve()
        if not (root / "vllm" / "__init__.py").is_file():
            return f"--src {src}: no vLLM checkout there (expected vllm/__init__.py)"
        key = str(root)
    if key != _ACTIVE[0]:
        for name in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[name]
        _ACTIVE[0] = key
    return None


def _import_cache_modules() -> None:
    root = _ACTIVE[0]
    if root is not None:
        sys.path.insert(0, root)
        importlib.invalidate_caches()
    try:
        import vllm.v1.core.kv_cache_manager  # noqa: F401
        import vllm.v1.request  # noqa: F401
    finally:
        if root is not None and root in sys.path:
            sys.path.remove(root)
    import vllm

    if root is not None and Path(root) not in Path(vllm.__file__).resolve().parents:
        raise ImportError(f"vllm was imported from {Path(vllm.__file__).parent}, not from "
                          f"the checkout {root}")


def unavailable_reason(src=None) -> str | None:
    """Why the target cannot run here (a missing environment only), else None."""
    why = use(src)
    if why:
        return why
    try:
        _import_cache_modules()
    except ImportError as exc:
        where = f" from the checkout {src}" if src is not None else ""
        return f"vllm's KV cache manager does not import here{where} ({exc}); set it up " \
               f"with: {SETUP_HINT}"
    return None


def version() -> str:
    """The driven vLLM's declared version (a checkout's ``vllm.__version__``)."""
    if _ACTIVE[0] is not None:
        import vllm

        return str(getattr(vllm, "__version__", "") or "")
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return ""


def files() -> list[Path]:
    import vllm

    root = Path(vllm.__file__).parent
    return [root / m for m in MODULES]
