"""Load our Hypothesis profile before any machine is imported, and keep it loaded.

With ``CI`` set Hypothesis would load its own built-in ``ci`` profile; a machine's
``TestCase.settings`` is frozen at first access, so this must run first.  Default: ``ci``
(derandomised, fixed budget), or ``$HYPOTHESIS_PROFILE``.  Tests that call the CLI's
``main()`` load the CLI's profile (``dev`` by default) process-wide; the fixture below puts
ours back after every test, so no test's budget depends on which tests ran before it on the
same xdist worker.
"""

import os

import pytest
from hypothesis import settings

from state_machines.profiles import load_profile

PROFILE = load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")

# The per-op deadline (state_machines/deadline.py) for the suite and the kvcheck processes it
# starts: the hang fault T1 costs a deadline per hanging run, and no legitimate op here comes
# within orders of magnitude of 2 s.
os.environ.setdefault("KVCHECK_OP_DEADLINE", "2")


@pytest.fixture(autouse=True)
def _keep_the_suite_profile():
    yield
    settings.load_profile(PROFILE)


# The longest tests (docs/benchmarks.md, "Where the test command's time goes"), run first: with
# ``-n 2`` pytest-xdist hands tests out in collection order, and a 100 s test handed out last
# leaves the other worker idle while it runs.  Only tests whose work does not depend on the
# wall clock: the budgeted nightly runs stay where they were, not side by side at the start.
LONGEST = (
    "tests/test_explore.py::test_tiny_radix_model_is_verified_completely",
    "tests/upstream/test_gating_recipes.py::test_recipe_gates_a_clean_copy_and_fails_a_planted",
    "tests/test_plugin.py::test_fuzz_replay_and_gate_catch_r1_through_the_plugin",
    "tests/test_plugin.py::test_fuzz_diff_and_coverage_run_tinyserve",
    "tests/upstream/test_pymllm_radix.py::test_cli_find_lists_every_distinct_finding",
    "tests/test_cli.py::test_faults_json_reports_every_fault",
)


def pytest_collection_modifyitems(config, items):
    """The engine suites (``tests/upstream/``) are slow: real engines, whole fuzz budgets.
    ``-m "not slow"`` (the quick loop, README "Tests") leaves them out with the rest.  The
    longest tests go first (``LONGEST``; otherwise collection order)."""
    for item in items:
        if "upstream" in item.path.relative_to(item.config.rootpath).parts[:2]:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST))
