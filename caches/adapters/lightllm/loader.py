"""Load LightLLM's ``LinearAttPagedRadixCache`` from a source checkout -- every shim lives here.

LightLLM publishes no current wheel (PyPI's ``lightllm`` is 0.0.1 from 2024), so its users run
from a checkout and the ``lightllm`` target takes ``--src PATH``.  From that checkout kvcheck
imports ``lightllm/server/router/dynamic_prompt/linear_att_radix_cache.py`` and the modules it
imports (``shared_arr``, ``radix_cache`` for ``time_gen``, ``common.linear_att_cache_manager``,
``utils.*``: 19 files at 87881ae7), with the real third-party packages they need (numpy,
sortedcontainers, easydict, psutil, filelock: ``pip install 'kvcheck[engines]'``) and exactly
two stand-ins:

* ``triton`` -- ``common/linear_att_cache_manager/config_objs.py`` imports it at module level
  for ``triton.cdiv`` (a shape helper of ``LinearAttCacheConfig``, which the cache never
  builds).  The stand-in is a module with ``cdiv`` only, used only when no real triton is
  importable, and only while the checkout is imported: afterwards ``sys.modules["triton"]``
  is removed again (``torch._dynamo`` and other targets probe for a real triton).
* ``lightllm.common.kv_cache_mem_manager`` -- ``LinearAttPagedRadixCache.__init__`` imports its
  ``MemoryManager`` for a type annotation only (the real module pulls in the GPU KV buffers
  and Triton kernels).  ``annotation_stand_in()`` puts a module holding a placeholder class
  in ``sys.modules`` for the duration of one constructor call and restores what was there.

Isolation: the checkout goes on ``sys.path`` only while it is imported; every ``lightllm*``
module is then taken out of ``sys.modules`` again (the loaded classes keep their own module
globals), and whatever was there before is put back.  So another ``--src`` (a fixed copy, a
second checkout) loads its own ``lightllm`` in the same process, and nothing of LightLLM is
importable by name for other targets.  Two process-wide traces remain and are harmless: the
``lightllm`` logger LightLLM configures at import (a stdout handler; the cache paths kvcheck
drives do not log), and ``multiprocessing``'s resource tracker process, which Python starts
the first time a shared-memory segment is created.

Operating-system resources: every cache makes two POSIX shared-memory segments
(``SharedArray`` for ``refed_tokens_num`` / ``tree_total_tokens_num``, named after the
``unique_name`` it is given) and a ``/tmp/<segment>.lock`` file each (``create_or_link_shm``'s
``FileLock``).  ``unique_name()`` gives every cache a name no other process or cache uses, and
``release_os_resources()`` unlinks both segments and removes both lock files right after the
constructor returns: the cache keeps its mappings (POSIX keeps an unlinked segment alive
while it is mapped), so nothing is left in ``/dev/shm`` or ``/tmp`` whether the subject ends
normally, raises, or the process is killed.

Time: ``radix_cache.time_gen`` (a counter, one tick per call) stamps the nodes; it is already
logical, so traces replay to the same LRU order without a substitute.

``load(src)`` returns the classes (cached per checkout); ``unavailable_reason(src)`` says why
they cannot be loaded (None when they can) -- the tests skip on it, the CLI prints it.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import importlib.util
import itertools
import os
import sys
import types
from functools import lru_cache
from pathlib import Path

MODULE = "lightllm.server.router.dynamic_prompt.linear_att_radix_cache"
MODULE_FILE = "lightllm/server/router/dynamic_prompt/linear_att_radix_cache.py"
DEPS = ("numpy", "sortedcontainers", "easydict", "psutil", "filelock")
SETUP_HINT = "pip install 'kvcheck[engines]' (numpy, sortedcontainers, easydict, psutil, filelock)"
NEEDS_SRC = "the lightllm target needs --src PATH to a LightLLM checkout"
_ANNOTATION_MODULE = "lightllm.common.kv_cache_mem_manager"
STAND_IN_FILE = "<kvcheck stand-in>"


def _is_lightllm(name: str) -> bool:
    return name == "lightllm" or name.startswith("lightllm.")


def _triton_stand_in() -> types.ModuleType:
    mod = types.ModuleType("triton", "kvcheck stand-in: cdiv only (LightLLM's config_objs)")
    mod.__file__ = STAND_IN_FILE

    def cdiv(a, b):
        return -(-a // b)

    mod.cdiv = cdiv
    return mod


class MemoryManagerStandIn:
    """What ``lightllm.common.kv_cache_mem_manager.MemoryManager`` is while a cache is built:
    a name for an annotation.  The cache gets kvcheck's own memory-manager stand-in object."""


@contextlib.contextmanager
def annotation_stand_in():
    """``lightllm.common.kv_cache_mem_manager`` importable for one constructor call."""
    mod = types.ModuleType(_ANNOTATION_MODULE, "kvcheck stand-in: MemoryManager annotation")
    mod.__file__ = STAND_IN_FILE
    mod.MemoryManager = MemoryManagerStandIn
    prior = sys.modules.get(_ANNOTATION_MODULE)
    sys.modules[_ANNOTATION_MODULE] = mod
    try:
        yield
    finally:
        if prior is None:
            sys.modules.pop(_ANNOTATION_MODULE, None)
        else:
            sys.modules[_ANNOTATION_MODULE] = prior


def _root(src) -> Path:
    return Path(src).expanduser().resolve()


@lru_cache(maxsize=None)
def _load(root: str) -> types.SimpleNamespace:
    prior = {k: sys.modules.pop(k) for k in list(sys.modules) if _is_lightllm(k)}
    stood_in = False
    if "triton" not in sys.modules and importlib.util.find_spec("triton") is None:
        sys.modules["triton"] = _triton_stand_in()
        stood_in = True
    sys.path.insert(0, root)
    loaded: dict = {}
    try:
        importlib.invalidate_caches()
        mod = importlib.import_module(MODULE)
        from sortedcontainers import SortedDict, SortedKeyList

        radix_cache = sys.modules[MODULE.rsplit(".", 1)[0] + ".radix_cache"]
        shared_arr = sys.modules[MODULE.rsplit(".", 1)[0] + ".shared_arr"]
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(root)
        sys.path_importer_cache.pop(root, None)
        loaded = {k: sys.modules.pop(k) for k in list(sys.modules) if _is_lightllm(k)}
        if stood_in and getattr(sys.modules.get("triton"), "__file__", None) == STAND_IN_FILE:
            del sys.modules["triton"]
        sys.modules.update(prior)
    origin = Path(mod.__file__).resolve()
    if not origin.is_relative_to(root):
        raise ImportError(f"{MODULE} was imported from {origin}, not from {root}")
    files = sorted({str(Path(m.__file__).resolve()) for m in loaded.values()
                    if getattr(m, "__file__", None) and
                    Path(m.__file__).resolve().is_relative_to(root)})
    return types.SimpleNamespace(
        src=root, module=mod, radix_cache=radix_cache, shared_arr=shared_arr,
        LinearAttPagedRadixCache=mod.LinearAttPagedRadixCache,
        LinearAttPagedTreeNode=mod.LinearAttPagedTreeNode,
        SortedDict=SortedDict, SortedKeyList=SortedKeyList, files=tuple(files),
        stand_ins=("triton",) if stood_in else ())


def load(src) -> types.SimpleNamespace:
    """Import the checkout's cache module (once per checkout) and return its classes; raises
    ImportError (or whatever the import raises) when it cannot."""
    return _load(str(_root(src)))


def unavailable_reason(src=None) -> str | None:
    """Why LightLLM's cache cannot be driven from ``src`` here (one line), or None."""
    if src is None:
        return NEEDS_SRC
    root = _root(src)
    if not root.is_dir():
        return f"--src {src}: not a directory (expected a LightLLM checkout)"
    if not (root / MODULE_FILE).is_file():
        return (f"--src {src} has no {MODULE_FILE} (not a LightLLM checkout, or one from "
                "before LinearAttPagedRadixCache)")
    missing = [d for d in DEPS if importlib.util.find_spec(d) is None]
    if missing:
        return (f"LightLLM's cache needs {', '.join(missing)}, not installed in this Python "
                f"({sys.executable}): {SETUP_HINT}")
    try:
        load(src)
    except Exception as exc:  # an import error deep inside the checkout: say which
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        return f"the LightLLM checkout at {src} does not import here: {msg}"
    return None


def require(src) -> types.SimpleNamespace:
    """``load(src)``, or an ImportError carrying ``unavailable_reason(src)``."""
    reason = unavailable_reason(src)
    if reason is not None:
        raise ImportError(reason)
    return load(src)


# -- the operating-system resources each cache makes ----------------------------------------------
_names = itertools.count(1)
SHM_DIR = "/dev/shm"
LOCK_DIR = "/tmp"


def unique_name() -> str:
    """A ``unique_name`` for one cache: this process, one counter (no collision with another
    process, another cache, or a LightLLM server on the same machine)."""
    return f"kvcheck_lightllm_{os.getpid()}_{next(_names)}"


def os_resources(name: str) -> list[str]:
    """The shared-memory segments and lock files named after ``name`` that exist now."""
    return sorted(glob.glob(f"{SHM_DIR}/{glob.escape(name)}_*") +
                  glob.glob(f"{LOCK_DIR}/{glob.escape(name)}_*.lock"))


def release_os_resources(cache, name: str) -> None:
    """Unlink the segments of every ``SharedArray`` on ``cache`` (it keeps its mapping) and
    remove the lock files; then sweep anything else named after ``name``."""
    from multiprocessing import resource_tracker, shared_memory

    for value in vars(cache).values():
        shm = getattr(value, "shm", None)
        if isinstance(shm, shared_memory.SharedMemory):
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{LOCK_DIR}/{shm.name.lstrip('/')}.lock")
    for path in os_resources(name):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if path.startswith(SHM_DIR + "/"):
            with contextlib.suppress(Exception):
                resource_tracker.unregister("/" + os.path.basename(path), "shared_memory")
