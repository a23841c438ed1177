"""Load pymllm's KV-cache modules from a source checkout of UbiquitousLearning/mllm (``--src``).

pymllm publishes no installable release with ``mem_cache`` (PyPI's ``pymllm`` is a macOS-only
wheel without it), so its users run from a checkout, and so does this target.  ``--src`` is the
checkout's root: the folder holding ``pymllm/`` and ``mllm-kernel/``.  Importing
``pymllm.mem_cache.{radix_cache, mamba_radix_cache, memory_pool}`` needs only torch with both
folders on ``sys.path``; nothing is stood in (``memory_pool`` imports
``mllm_kernel.cuda.jit.store_cache``, which compiles nothing until a CUDA ``KVPool`` is built,
and this target never builds a ``KVPool``: it drives the allocator and the request table).

Isolation: the two folders go on ``sys.path`` only while the import runs; afterwards every
``pymllm*`` / ``mllm_kernel*`` entry this load added to ``sys.modules`` is taken out again
(and any that were there before are put back), so nothing leaks into other targets and two
checkouts (the snapshot and a fixed copy, say) load side by side in one process, each with its
own module objects.  The loaded modules are kept alive by the namespace ``load`` returns.

One substitution, for reproducibility: ``radix_cache.py`` (and ``mamba_radix_cache.py``) stamp
nodes with ``time.monotonic()`` and evict in that (LRU) order; each loaded module's ``time`` is
pointed at a ``LogicalTime`` (one tick per call, strictly monotonic, everything else the real
``time``), so a trace replays to the same evictions every time.
"""

from __future__ import annotations

import importlib
import sys
import time
import types
from functools import lru_cache
from pathlib import Path

SETUP_HINT = ("pass --src PATH: a checkout of https://github.com/UbiquitousLearning/mllm "
              "(the folder holding pymllm/ and mllm-kernel/)")
_ROOTS = ("pymllm", "mllm_kernel")
# the files whose bytes identify the code a subject runs (content hash when src is no git checkout)
SOURCE_FILES = ("pymllm/mem_cache/radix_cache.py", "pymllm/mem_cache/mamba_radix_cache.py",
                "pymllm/mem_cache/base_prefix_cache.py", "pymllm/mem_cache/memory_pool.py")


class LogicalTime:
    """The ``time`` module with a logical ``monotonic()`` (one tick per call)."""

    def __init__(self, real=time):
        self._real = real
        self._now = 0

    def monotonic(self) -> float:
        self._now += 1
        return float(self._now)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _ours(name: str) -> bool:
    return name.split(".")[0] in _ROOTS


def _check_layout(src) -> str | None:
    """Why ``src`` is not an mllm checkout (None when it looks like one)."""
    if src is None:
        return "target pymllm needs --src PATH (an engine checkout)"
    p = Path(src)
    if not p.is_dir():
        return f"--src {src}: not a directory"
    if not (p / "pymllm" / "mem_cache" / "radix_cache.py").is_file():
        return (f"--src {src}: no pymllm/mem_cache/radix_cache.py there (expected a checkout "
                "of UbiquitousLearning/mllm)")
    if not (p / "mllm-kernel" / "mllm_kernel").is_dir():
        return f"--src {src}: no mllm-kernel/mllm_kernel there (pymllm's memory_pool imports it)"
    return None


@lru_cache(maxsize=8)
def _load(root: str) -> types.SimpleNamespace:
    before = {k: v for k, v in sys.modules.items() if _ours(k)}
    for k in before:
        del sys.modules[k]
    paths = [root, str(Path(root) / "mllm-kernel")]
    saved_path = list(sys.path)
    sys.path[:0] = paths
    try:
        importlib.invalidate_caches()
        base = importlib.import_module("pymllm.mem_cache.base_prefix_cache")
        radix = importlib.import_module("pymllm.mem_cache.radix_cache")
        mamba = importlib.import_module("pymllm.mem_cache.mamba_radix_cache")
        memory_pool = importlib.import_module("pymllm.mem_cache.memory_pool")
        loaded = {k: v for k, v in sys.modules.items() if _ours(k)}
    finally:
        sys.path[:] = saved_path
        for k in [k for k in sys.modules if _ours(k)]:
            del sys.modules[k]
        sys.modules.update(before)
    for mod in (radix, mamba):
        if not isinstance(mod.time, LogicalTime):
            mod.time = LogicalTime(mod.time)
    for mod, name in ((radix, "radix_cache"), (mamba, "mamba_radix_cache"),
                      (memory_pool, "memory_pool"), (base, "base_prefix_cache")):
        origin = Path(mod.__file__).resolve()
        if not origin.is_relative_to(Path(root)):
            raise ImportError(f"pymllm.mem_cache.{name} was imported from {origin}, not from "
                              f"--src {root}")
    return types.SimpleNamespace(
        root=root, modules=loaded, radix_cache=radix, mamba_radix_cache=mamba,
        memory_pool=memory_pool, base_prefix_cache=base,
        RadixCache=radix.RadixCache, TreeNode=radix.TreeNode, RadixKey=base.RadixKey,
        MambaRadixCache=mamba.MambaRadixCache,
        TokenToKVPoolAllocator=memory_pool.TokenToKVPoolAllocator,
        ReqToTokenPool=memory_pool.ReqToTokenPool)


def load(src) -> types.SimpleNamespace:
    """pymllm's cache classes from checkout ``src`` (cached per resolved path); raises
    ImportError with a one-line reason when they cannot be loaded."""
    why = _check_layout(src)
    if why:
        raise ImportError(why)
    return _load(str(Path(src).resolve()))


def unavailable_reason(src) -> str | None:
    """Why pymllm's classes cannot be driven from ``src`` here, or None when they can."""
    why = _check_layout(src)
    if why:
        return why
    try:
        load(src)
    except Exception as exc:  # an import error inside the checkout: say which, in one line
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        return f"--src {src}: pymllm's mem_cache does not import here: {text}"
    return None
