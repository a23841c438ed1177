"""Find vLLM's KV cache manager in this Python (the pinned env ``.venv-vllm``).

Only the pure-Python modules of ``vllm/v1/core`` (and ``v1/request.py``, ``sampling_params.py``)
are imported; nothing compiled in the wheel is loaded.  ``unavailable_reason`` reports a missing
install in one line with how to get it; ``files`` names the modules that run (for the identity).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

DIST, PINNED = "vllm", "0.33.0"
SETUP_HINT = ("bash ci/upstream/vllm-setup.sh  (then run with .venv-vllm/bin/python or "
              ".venv-vllm/bin/kvcheck)")
MODULES = ("v1/core/kv_cache_manager.py", "v1/core/block_pool.py", "v1/core/kv_cache_utils.py",
           "v1/core/kv_cache_coordinator.py", "v1/core/single_type_kv_cache_manager.py",
           "v1/request.py")


def unavailable_reason(src=None) -> str | None:
    """Why the target cannot run here (a missing environment only), else None."""
    try:
        import vllm.v1.core.kv_cache_manager  # noqa: F401
        import vllm.v1.request  # noqa: F401
    except ImportError as exc:
        return f"vllm's KV cache manager does not import here ({exc}); set it up with: " \
               f"{SETUP_HINT}"
    return None


def version() -> str:
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return ""


def files() -> list[Path]:
    import vllm

    root = Path(vllm.__file__).parent
    return [root / m for m in MODULES]
