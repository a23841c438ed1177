"""What ``kvcheck report`` needs from the SGLang radix adapters (``ReportSetup``): the import
stand-ins the loader installs, the logical clock it gives ``radix_cache``, and the radix
properties in ``RadixCache``'s own terms.

The stand-ins and the clock are the loader's own code (``loader.py``), written into the script
with ``inspect.getsource``: one implementation, so the script stands in for exactly what the
harness stands in for.
"""

from __future__ import annotations

import inspect

from caches.adapters.sglang import loader, versions
from caches.adapters.radix_report import radix_checks
from caches.reporting import Check, ReportSetup

_STAND_IN_CODE = (loader.StandInCalled, loader._Placeholder, loader._StandInModule,
                  loader._StandInFinder, loader.LogicalTime, loader._install_stand_ins)


def preamble() -> str:
    """The loader's two import stand-ins (``torchvision``, ``sgl_kernel``), installed before
    sglang is imported, as the loader does."""
    code = "\n\n\n".join(inspect.getsource(obj).rstrip() for obj in _STAND_IN_CODE)
    return (
        "# Two import stand-ins, as kvcheck's SGLang loader installs them on a CPU machine\n"
        "# (caches/adapters/sglang/loader.py): PyPI's torchvision is CUDA-linked and sgl_kernel\n"
        "# is GPU-only, but sglang imports both at module level.  Each is a placeholder module\n"
        "# whose attributes raise StandInCalled if called; no KV-cache path calls them.  Where\n"
        "# the real packages are importable they are used instead.\n"
        "import importlib\nimport importlib.abc\nimport importlib.machinery\n"
        "import importlib.util\nimport time\nimport types\nimport warnings\n\n"
        f"_STAND_INS = {loader._STAND_INS!r}\n"
        f"_TORCHVISION_VERSION = {loader._TORCHVISION_VERSION!r}\n\n\n"
        f"{code}\n\n\n_install_stand_ins()\nwarnings.simplefilter('ignore')")


AFTER_IMPORT = (
    "# RadixCache stamps nodes with time.monotonic(); as in kvcheck's loader, a logical clock\n"
    "# (one tick per call) makes the LRU order, and so every eviction, the recorded one.\n"
    "from sglang.srt.mem_cache import radix_cache as _radix_cache\n"
    "_radix_cache.time = LogicalTime(_radix_cache.time)")


RADIX_CHECKS = radix_checks("cache.evictable_size_", "cache.protected_size_")


def radix_setup(adapter) -> ReportSetup:
    """The plain ``RadixCache`` (0.5.12.post1's ``sglang`` target, 0.5.23's
    ``sglang-radixcache``): the allocator, request pool and cache the adapter built."""
    version = loader.load().version
    return ReportSetup(
        engine="sglang", version=version,
        driven=f"{type(adapter.tree).__module__}.{type(adapter.tree).__qualname__}",
        built=adapter.built, checks=RADIX_CHECKS, preamble=preamble(),
        after_import=AFTER_IMPORT, anchors={"cache.root_node": adapter.tree.root_node},
        interpreter=_interpreter(version))


STREAMING_CHECKS = {
    "session-prefix": Check(
        code='''def check_session_prefix(session, objects):
    """A streaming Session's latest request (Session.req_nodes) that is still queued -- retracted,
    not finished -- is still attached to its session (Req.session), so its retry resumes the
    session's slot in StreamingSession instead of running as a plain request."""
    for sess in [o for o in objects.values() if type(o).__name__ == "Session"]:
        slot = session.slots.get(sess.session_id)
        for node in sess.req_nodes.values():
            req = node.req
            if req.session is None and req.finished_reason is None and slot is not None \\
                    and slot.req_pool_idx is not None:
                raise Broken("session-prefix", f"Req {req.rid} (retracted "
                             f"{req.retraction_count}x, queued for retry) is the latest request "
                             f"of streaming Session {sess.session_id!r} but Req.session is None: "
                             f"StreamingSession will not resume its slot (row "
                             f"{slot.req_pool_idx}, kv_committed_len {slot.kv_committed_len}); "
                             "the retry runs as a plain request")''',
        call="check_session_prefix(session, locals())",
        words="a streaming `Session`'s latest request (`Session.req_nodes`) that is still "
              "queued for a retry (retracted, `finished_reason` None) keeps `Req.session`, so "
              "`StreamingSession.try_match_prefix` resumes the session's slot; a request "
              "retracted twice loses it (`Session.finish_req`, called from the retract's save "
              "path, detaches the previous request, which is itself) and its retry runs as a "
              "plain request next to its own slot"),
}


SERVER_ARGS = (
    "# Req.pop_committed_kv_cache reads the process-global ServerArgs the scheduler installs;\n"
    "# as kvcheck's loader does, install one holding every field's default (ServerArgs() itself\n"
    "# resolves a model and probes the hardware).\n"
    + inspect.getsource(loader.install_default_server_args).rstrip() + "\n\n\n"
    "from sglang.srt import server_args as _server_args\n"
    "install_default_server_args(_server_args)")


def streaming_session_setup(adapter) -> ReportSetup:
    """``StreamingSession`` over the plain ``RadixCache`` (0.5.12.post1): the allocator, the
    pools, the inner cache, the wrapper and its virtual node; sessions and requests are made
    during the steps and written where they are made."""
    version = loader.load().version
    return ReportSetup(
        engine="sglang", version=version,
        driven=f"{type(adapter.session).__module__}.{type(adapter.session).__qualname__}",
        built=adapter.built, checks=STREAMING_CHECKS, preamble=preamble(),
        after_import=AFTER_IMPORT + "\n\n\n" + SERVER_ARGS, anchors={"cache.root_node": adapter.tree.root_node},
        interpreter=_interpreter(version))


def _interpreter(version: str) -> str:
    return ".venv-upstream/bin/python" if version == versions.NEWEST else \
        f".venv-upstream-{version}/bin/python"
