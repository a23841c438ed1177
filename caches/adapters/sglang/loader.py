"""Load SGLang's real KV-cache classes on a CPU-only machine -- every shim lives here.

kvcheck drives ``sglang.srt.mem_cache`` classes from the PyPI release pinned in
``ci/upstream/sglang.txt`` (installed into a separate virtualenv by ``ci/upstream/setup.sh``).
Importing them on CPU needs exactly two stand-ins, and nothing else is patched:

* ``torchvision`` -- PyPI's torchvision is CUDA-linked, and installing it can silently swap the
  CPU torch for a CUDA build.  SGLang imports ``torchvision.io.decode_jpeg`` at module level
  (``sglang/srt/utils/common.py``), and transformers 5.6 only registers ``AutoImageProcessor``
  (which SGLang's config modules call at import time) when torchvision looks importable.  The
  stand-in is a package whose every attribute and submodule is a placeholder that raises
  ``StandInCalled`` when *called*: importing and registering work, decoding an image does not
  (no cache path decodes images).
* ``sgl_kernel`` -- imported unguarded by ``mem_cache/memory_pool_host.py``
  (``from sgl_kernel.kvcacheio import transfer_kv_...``); the same kind of stand-in.  The host
  (HiCache) transfer kernels are never called by the device-only caches we drive.

Both are installed only when the real package is not importable, and before ``transformers``
is first imported (it caches "is torchvision available" at import).  Triton is the real
package (stubbing it breaks ``torch._dynamo``); its allocation kernels do not run on CPU, so
the adapters use the allocators' plain ``alloc`` paths (see ``caches/adapters/sglang/radix.py``).

One more substitution, for reproducibility rather than importability: ``radix_cache.py`` stamps
nodes with ``time.monotonic()`` and evicts in that (LRU) order, and its eviction heap breaks
ties by set iteration order (memory addresses).  The loader points that module's ``time`` at
``LogicalTime``: ``monotonic()`` is a counter that increases by one per call (still strictly
monotonic, so the LRU order is the one wall time would give without ties), everything else is
the real ``time``.  A trace then replays to the same evictions every time.

``load()`` returns the classes (cached); ``unavailable_reason()`` says why they cannot be
loaded here (None when they can) -- the tests skip on it, the CLI prints it.

**Which SGLang.**  By default the installed one.  ``use(src)`` makes an SGLang checkout the one
this process drives (``--src CHECKOUT``, an engine pull request's branch): its ``python/``
goes first on ``sys.path`` while ``sglang`` is imported and is taken off again (every later
``sglang.*`` import follows the package's own ``__path__``, so it stays in the checkout); any
``sglang`` module imported from elsewhere before is dropped from ``sys.modules`` first.  One
SGLang per process at a time: switching drops the other's modules (``load()`` of the new one
re-imports).  The release a version runs on is ``versions.adapter_release``: a pinned one as
itself, one newer than the newest pinned (a dev build, a branch past the last tag) on the
newest adapter set with ``versions.newer_note``; an older unsupported one is refused.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import time
import types
import warnings
from functools import lru_cache
from pathlib import Path

from caches.adapters.sglang import versions

PINNED = versions.NEWEST  # the release ci/upstream/sglang.txt installs (versions.SUPPORTED: all)
SETUP_HINT = versions.setup_hint()
_STAND_INS = ("torchvision", "sgl_kernel")
_TORCHVISION_VERSION = "0.28.0"  # what transformers reads; the release paired with torch 2.13


class StandInCalled(RuntimeError):
    """A stand-in for a package kvcheck does not install was used for real."""


class _Placeholder:
    """Any attribute of a stand-in module: attribute access chains, calling raises."""

    def __init__(self, path: str):
        self._path = path

    def __getattr__(self, name: str) -> "_Placeholder":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._path}.{name}")

    def __call__(self, *args, **kwargs):
        raise StandInCalled(f"{self._path} belongs to a stand-in module (kvcheck's SGLang "
                            f"loader does not install {self._path.split('.')[0]}); no KV-cache "
                            f"path should call it")

    def __mro_entries__(self, bases):  # usable as a base class in a class statement
        return (object,)

    def __repr__(self) -> str:
        return f"<stand-in {self._path}>"


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``torchvision``/``sgl_kernel`` and any submodule of them as stand-in modules."""

    def __init__(self, roots):
        self.roots = tuple(roots)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StandInModule(spec.name)
        mod.__file__ = "<kvcheck stand-in>"
        mod.__path__ = []
        if spec.name == "torchvision":
            mod.__version__ = _TORCHVISION_VERSION
        return mod

    def exec_module(self, module):
        pass


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


def _install_stand_ins() -> list[str]:
    """Put the finder in front for each stand-in package that is not really importable."""
    missing = []
    for root in _STAND_INS:
        if root in sys.modules or importlib.util.find_spec(root) is not None:
            continue
        missing.append(root)
    if missing and not any(isinstance(f, _StandInFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StandInFinder(missing))
    return missing


_ACTIVE: list = [None]  # the checkout's python/ folder sglang is imported from; None: installed
RUST_CORE = "sglang.srt.mem_cache.rust_tree_core.mem_cache"  # the compiled Rust tree core


def checkout_root(src) -> Path | None:
    """The folder holding the ``sglang`` package of SGLang checkout ``src``: its ``python/``
    (the repository's layout), or ``src`` itself when the package lies there; None if neither."""
    base = Path(src).expanduser().resolve()
    for root in (base / "python", base):
        if (root / "sglang" / "__init__.py").is_file():
            return root
    return None


def _is_sglang(name: str) -> bool:
    return name == "sglang" or name.startswith("sglang.")


def use(src=None) -> str | None:
    """Make checkout ``src`` (None: the installed sglang) the SGLang this process drives;
    returns why it cannot be (no ``python/sglang`` there), else None."""
    if src is None:
        key = None
    else:
        root = checkout_root(src)
        if root is None:
            return f"--src {src}: no SGLang checkout there (expected python/sglang/__init__.py)"
        key = str(root)
    if key != _ACTIVE[0]:
        for name in [k for k in sys.modules if _is_sglang(k)]:
            del sys.modules[name]
        load.cache_clear()
        _ACTIVE[0] = key
    return None


def origin() -> str:
    """Where the driven SGLang comes from: ``checkout <path>`` or ``installed``."""
    if _ACTIVE[0] is None:
        return "installed"
    root = Path(_ACTIVE[0])
    return f"checkout {root.parent if root.name == 'python' else root}"


@lru_cache(maxsize=1)
def load() -> types.SimpleNamespace:
    """Import SGLang's cache classes (once) and return them; raises ImportError if missing.
    From the checkout ``use(src)`` named, if any: its ``python/`` is first on ``sys.path``
    while ``sglang`` is imported only."""
    root = _ACTIVE[0]
    if root is not None:
        sys.path.insert(0, root)
        importlib.invalidate_caches()
    try:
        ns = _import()
    finally:
        if root is not None and root in sys.path:
            sys.path.remove(root)
    where = Path(ns.sglang_file).resolve()
    if root is not None and Path(root) not in where.parents:
        raise ImportError(f"sglang was imported from {where.parent}, not from the checkout "
                          f"{root}")
    return ns


def _import() -> types.SimpleNamespace:
    if "transformers" in sys.modules and "torchvision" not in sys.modules:
        # transformers already decided torchvision is missing; its AutoImageProcessor is
        # then a dummy and SGLang's configs fail to import.  Be loud rather than mysterious.
        from transformers.utils import import_utils

        if not import_utils.is_torchvision_available() and \
                importlib.util.find_spec("torchvision") is None:
            raise ImportError("transformers was imported before kvcheck's SGLang loader; "
                              "import caches.adapters.sglang.loader first")
    stand_ins = _install_stand_ins()
    with warnings.catch_warnings():  # "Triton is not supported on current platform", AWQ, GGUF
        warnings.simplefilter("ignore")
        import sglang
        from sglang.srt.mem_cache import radix_cache
        from sglang.srt.mem_cache.allocator import (PagedTokenToKVPoolAllocator,
                                                    TokenToKVPoolAllocator)
        from sglang.srt.mem_cache.base_prefix_cache import (EvictParams, InsertParams,
                                                            MatchPrefixParams)
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey, TreeNode
    if not isinstance(radix_cache.time, LogicalTime):
        radix_cache.time = LogicalTime(radix_cache.time)
    extra = {}
    version = getattr(sglang, "__version__", "?")
    if versions.unified(version):
        extra = _load_unified()

    return types.SimpleNamespace(**extra,
        version=version, release=versions.adapter_release(version),
        note=versions.newer_note(version), sglang_file=sglang.__file__,
        stand_ins=tuple(stand_ins),
        RadixCache=RadixCache, RadixKey=RadixKey, TreeNode=TreeNode,
        radix_cache=radix_cache, CacheInitParams=CacheInitParams,
        MatchPrefixParams=MatchPrefixParams, InsertParams=InsertParams,
        EvictParams=EvictParams, ReqToTokenPool=ReqToTokenPool,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator)


def unavailable_reason() -> str | None:
    """Why SGLang's classes (the ones ``use`` chose) cannot be driven here, or None."""
    checkout = _ACTIVE[0] is not None
    if not checkout and importlib.util.find_spec("sglang") is None:
        return f"sglang is not installed in this Python ({sys.executable}); set it up with: " \
               f"{SETUP_HINT}"
    what = f"sglang from {origin()}" if checkout else "sglang is installed but"
    try:
        ns = load()
    except Exception as exc:  # an import error deep inside sglang: say which
        return f"{what} does not import here: {type(exc).__name__}: {exc}"
    if ns.release is None:
        return f"sglang {ns.version} is {'in ' + origin() if checkout else 'installed'}; " \
               f"kvcheck drives {', '.join(versions.SUPPORTED)} and versions newer than " \
               f"{versions.NEWEST} (ci/upstream/sglang*.txt): {SETUP_HINT}"
    return None


def rust_core_unavailable() -> str | None:
    """Why the Rust tree core cannot be driven (after ``unavailable_reason()`` is None): a
    checkout, or a build without it, has no compiled ``rust_tree_core/mem_cache`` extension --
    where SGLang's ``tree_core_registry`` would silently fall back to the Python core."""
    try:
        found = importlib.util.find_spec(RUST_CORE) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    return (f"SGLang's Rust tree core is not built in the sglang from {origin()} (no compiled "
            f"sglang/srt/mem_cache/rust_tree_core/mem_cache extension; a source checkout has "
            f"its Rust sources only): build it (pip install -e python in the checkout, with "
            f"cargo; the pinned wheel of bash ci/upstream/setup.sh has it built), or gate the "
            f"Python tree core with --target sglang")


def _load_unified() -> dict:
    """0.5.23 on: ``UnifiedRadixCache``, its components and the tree-core registry.  The
    Python tree core stamps nodes from a module-global counter (``get_and_increase_time_counter``,
    already logical); nothing to substitute."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.mem_cache import unified_radix_cache
        from sglang.srt.mem_cache.base_prefix_cache import DecLockRefParams
        from sglang.srt.mem_cache.unified_cache import tree_core_registry
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore
    return dict(unified_radix_cache=unified_radix_cache,
                UnifiedRadixCache=unified_radix_cache.UnifiedRadixCache,
                ComponentType=ComponentType, UnifiedTreeCore=UnifiedTreeCore,
                tree_core_registry=tree_core_registry, DecLockRefParams=DecLockRefParams)


def require_variant(target: str, variant: str, src=None):
    """``use(src)`` and ``require()``, and the release must be one ``target`` drives
    ``variant`` on (``versions.VARIANTS``); else ``TargetUnavailable`` with the env to build
    (for ``sglang-rust``, also when the Rust tree core is not built)."""
    from caches.target import TargetUnavailable

    reason = use(src) or unavailable_reason()
    if reason is None and target == "sglang-rust":
        reason = rust_core_unavailable()
    if reason is None:
        reason = versions.variant_unsupported(load().version, target, variant)
    if reason is not None:
        raise TargetUnavailable(reason)
    return load()


def require():
    """``load()``, or an ImportError carrying ``unavailable_reason()``."""
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    return load()


def install_server_args(**overrides):
    """Set SGLang's process-global ``ServerArgs`` (``get_global_server_args()``), which the mamba
    caches read at runtime (``MambaRadixCache`` match: ``mamba_cache_chunk_size``).

    ``ServerArgs(...)`` cannot be constructed here: its ``__post_init__`` resolves a model and
    probes the hardware.  The stand-in is a real ``ServerArgs`` instance holding every field's
    declared default (plus ``overrides``, e.g. ``page_size=1``) without running
    ``__post_init__``; properties such as ``mamba_cache_chunk_size`` work on it.  Returns it.
    """
    require()
    from sglang.srt import server_args as sa

    return install_default_server_args(sa, **overrides)


def install_default_server_args(sa, **overrides):
    """``install_server_args`` on SGLang's ``server_args`` module ``sa`` (no kvcheck name used:
    ``kvcheck report`` writes this function into its scripts)."""
    import dataclasses

    args = object.__new__(sa.ServerArgs)
    for f in dataclasses.fields(sa.ServerArgs):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(args, f.name, value)
    for name, value in overrides.items():
        object.__setattr__(args, name, value)
    sa.set_global_server_args_for_scheduler(args)
    return args


def load_streaming_session() -> types.SimpleNamespace:
    """The classes the streaming-session adapter drives (``session/streaming_session.py``,
    ``session/session_controller.py``, ``managers/schedule_batch.py``), after ``require()``.

    ``Req.pop_committed_kv_cache`` -- which ``StreamingSession`` calls when a turn is saved or
    aborted, and ``RadixCache.cache_finished_req`` for a plain request -- reads
    ``strip_thinking_cache`` from the process-global ``ServerArgs`` the scheduler installs at
    start-up; when none is installed yet, ``install_server_args()`` installs the defaults (an
    adapter that needs other settings installs its own; the defaults are all this one reads).
    """
    ns = require()
    if not versions.unified(ns.version):  # 0.5.23 retired the global ServerArgs; the session
        from sglang.srt import server_args as sa  # path driven there reads no config

        try:
            sa.get_global_server_args()
        except ValueError:
            install_server_args()
    cache_module, cache_class, controller_module = versions.streaming_modules(ns.version)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
        from sglang.srt.sampling.sampling_params import SamplingParams
        streaming_session = importlib.import_module(cache_module)
        Session = importlib.import_module(controller_module).Session
    return types.SimpleNamespace(
        base=ns, streaming_session=streaming_session,
        StreamingSession=getattr(streaming_session, cache_class),
        SessionSlot=streaming_session.SessionSlot, VirtualNode=streaming_session._VirtualNode,
        Session=Session, Req=Req, SamplingParams=SamplingParams, FINISH_ABORT=FINISH_ABORT,
        FINISH_LENGTH=FINISH_LENGTH)


def release_reason(release: str) -> str | None:
    """Why code written against SGLang ``release`` (a historical suite, a finding recorded
    there) cannot run in this Python: another release is installed (None when it can)."""
    installed = versions.installed()
    if installed is None or installed == release:
        return None
    return f"written against sglang {release}, and {installed} is installed here; run it with " \
           f"{versions.setup_hint(release)}"
