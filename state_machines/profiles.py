"""Hypothesis settings profiles: ``dev`` (fast), ``ci`` (derandomised, fixed budget),
``nightly`` (long, random, example database on).

Picked with ``HYPOTHESIS_PROFILE`` or the CLI's ``--profile``.  With ``CI`` set, Hypothesis
would silently load its own built-in ``ci`` profile (``database=None``); registering ours under
the same name and loading it before any machine is imported keeps our budget.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILES = ("dev", "ci", "nightly")
_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=False,
               report_multiple_bugs=False)
DEFAULT_DB = ".kvcheck/hypothesis-db"


def pin_constant_pool() -> None:
    """Make what Hypothesis generates depend on the code's behaviour only, not on where its
    files lie.

    Hypothesis (6.131 on) draws about one value in twenty from a pool of literal constants it
    collects from every imported module it deems *local* -- any file outside site-packages and
    the standard library (``hypothesis.internal.constants_ast.is_local_module_file``), read
    afresh whenever ``sys.modules`` grows.  So the same engine code installed from a wheel
    (site-packages: not local) and from a source checkout on the path (local: its constants
    join the pool) is fed different examples -- streaming-session on SGLang 0.5.23 ran 5,739
    steps from the wheel and 6,652 from a byte-identical checkout at the ``ci`` budget -- and
    even one process's earlier imports shift a later run's examples.  The pool is pinned to
    empty here (Hypothesis's global constants stay), so a derandomised run's verdict and
    counts depend on the code alone.  A no-op on a Hypothesis without the pool."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without the module
        return
    if not callable(getattr(providers, "_get_local_constants", None)) or \
            getattr(providers._get_local_constants, "kvcheck_pinned", False):
        return
    empty = providers.Constants()

    def no_local_constants():
        return empty

    no_local_constants.kvcheck_pinned = True
    no_local_constants.original = providers._get_local_constants
    providers._get_local_constants = no_local_constants
    providers.CONSTANTS_CACHE.cache.clear()


def register_profiles(database_dir: str | None = None) -> None:
    pin_constant_pool()
    settings.register_profile("dev", max_examples=40, stateful_step_count=30, database=None,
                              **_COMMON)
    settings.register_profile("ci", max_examples=150, stateful_step_count=40, derandomize=True,
                              database=None, **_COMMON)
    settings.register_profile(
        "nightly", max_examples=100_000, stateful_step_count=60,
        database=DirectoryBasedExampleDatabase(database_dir or DEFAULT_DB),
        phases=list(Phase), **_COMMON)


def without_shrink(base: settings) -> settings:
    """``base`` without Hypothesis's shrink phase (kvcheck shrinks a failure itself, or, where
    a failure is only reported, not at all)."""
    return settings(base, phases=[p for p in base.phases if p is not Phase.shrink])


def load_profile(name: str | None = None) -> str:
    """Register and load a profile (``name``, else ``$HYPOTHESIS_PROFILE``, else ``dev``)."""
    register_profiles()
    name = name or os.environ.get("HYPOTHESIS_PROFILE") or "dev"
    if name not in PROFILES:
        raise ValueError(f"unknown Hypothesis profile {name!r}; known: {', '.join(PROFILES)}")
    settings.load_profile(name)
    return name
