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


def pytest_collection_modifyitems(config, items):
    """The engine suites (``tests/upstream/``) are slow: real engines, whole fuzz budgets.
    ``-m "not slow"`` (the quick loop, README "Tests") leaves them out with the rest."""
    for item in items:
        if "upstream" in item.path.relative_to(item.config.rootpath).parts[:2]:
            item.add_marker(pytest.mark.slow)
