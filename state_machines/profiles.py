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


def register_profiles(database_dir: str | None = None) -> None:
    settings.register_profile("dev", max_examples=40, stateful_step_count=30, database=None,
                              **_COMMON)
    settings.register_profile("ci", max_examples=150, stateful_step_count=40, derandomize=True,
                              database=None, **_COMMON)
    settings.register_profile(
        "nightly", max_examples=100_000, stateful_step_count=60,
        database=DirectoryBasedExampleDatabase(database_dir or DEFAULT_DB),
        phases=list(Phase), **_COMMON)


def load_profile(name: str | None = None) -> str:
    """Register and load a profile (``name``, else ``$HYPOTHESIS_PROFILE``, else ``dev``)."""
    register_profiles()
    name = name or os.environ.get("HYPOTHESIS_PROFILE") or "dev"
    if name not in PROFILES:
        raise ValueError(f"unknown Hypothesis profile {name!r}; known: {', '.join(PROFILES)}")
    settings.load_profile(name)
    return name
