"""Target ``tokenspeed``: TokenSpeed's real C++ ``Scheduler`` (PyPI ``tokenspeed-scheduler``,
pinned by the ``tokenspeed`` extra) driven the way TokenSpeed's runtime drives it.

| variant | TokenSpeed | adapter |
|---|---|---|
| continuation-state | ``tokenspeed_scheduler.Scheduler`` with a Full (History) and a State cache group | ``continuation_state.py`` (0.1.38+ bindings); ``continuation_state_pre864.py`` (a checkout with the pre-#864 ``PagedCacheGroupConfig`` bindings, e.g. TokenSpeed #460's commits; ``build.api``) |

By default the installed wheel is what runs (identity: its version and a content hash of the
extension module).  ``--src CHECKOUT`` builds the scheduler from a lightseekorg/tokenspeed
checkout with its own CMake build, cached by source hash (``build.py``); the identity is then
the version the checkout declares and its commit plus a hash of its uncommitted changes to
the scheduler's sources (``caches.target.source_identity``; ``sha256:`` of them for a
directory that is no git checkout, e.g. an unpacked sdist).  Faults are injected at the event boundary (``faults.py``); the
catalogued C1-C5 live inside the compiled cache and are refused.
"""

from __future__ import annotations

from functools import lru_cache

from caches.target import DECLINE, Identity, Target, content_hash, finds, source_identity


# both need the KV-event stream, which decline mode turns off (tests/upstream_findings/README.md)
FINDINGS = ("F1", "F2")


def _continuation_state(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    from caches.adapters.tokenspeed import build

    if src is not None and build.api(src) == build.API_PRE864:
        from caches.adapters.tokenspeed.continuation_state_pre864 import make_subject
    else:
        from caches.adapters.tokenspeed.continuation_state import make_subject

    return make_subject(params, fault=fault, device=device,
                        known_findings="find" if any(finds(known_findings, f)
                                                     for f in FINDINGS) else DECLINE,
                        src=src)


def _unavailable(src=None):
    from caches.adapters.tokenspeed import loader

    return loader.unavailable_reason(src)


def _identify(src=None) -> Identity:
    if src is not None:  # computed each time: the checkout's uncommitted changes may move
        from caches.adapters.tokenspeed import build

        try:
            sdir = build.scheduler_dir(src)
        except build.BuildUnavailable:  # not a checkout: the CLI has refused it already
            return Identity("tokenspeed", "", "unknown:")
        return Identity("tokenspeed", build.declared_version(sdir),
                        source_identity(src, build.source_files(sdir)))
    return _wheel_identity()


@lru_cache(maxsize=1)
def _wheel_identity() -> Identity:
    from caches.adapters.tokenspeed import loader

    if loader.unavailable_reason():
        return Identity("tokenspeed", "", "unknown:")
    return Identity("tokenspeed", loader.version(), content_hash(loader.extension_files()))


def _setup_hint() -> str:
    from caches.adapters.tokenspeed.loader import SETUP_HINT

    return SETUP_HINT


TARGET = Target(
    name="tokenspeed", engine="tokenspeed",
    summary="TokenSpeed's real C++ Scheduler (tokenspeed-scheduler) with History/State groups",
    builders={"continuation-state": _continuation_state},
    findings={"continuation-state": FINDINGS},
    unavailable=_unavailable, identify=_identify, takes_src=True, src_optional=True,
    setup_hint=("pip install 'kvcheck[tokenspeed]', or for --src CHECKOUT: "
                "bash ci/tokenspeed-src-setup.sh"))
