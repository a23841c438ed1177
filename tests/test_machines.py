"""The clean reference caches pass their machines in every regime (no false alarms) -- and the
machines really ran: each test checks that ops were applied, not just that nothing failed.

Each variant/regime is a Hypothesis ``TestCase`` collected by pytest, under the loaded profile
(``ci`` by default: derandomised, fixed budget).
"""

import pytest

from state_machines.machine import Recorder, machine_class
from state_machines.variants import all_variants

pytestmark = pytest.mark.slow  # every machine's whole ci budget


def _checked(machine, recorder):
    class Checked(machine.TestCase):
        def runTest(self):
            examples, steps = recorder.examples, recorder.steps
            super().runTest()
            examples, steps = recorder.examples - examples, recorder.steps - steps
            # every example drains once (one 'quiesce' step): a machine whose rules never
            # fire would take exactly one step per example
            assert examples > 0, "the machine ran no examples"
            assert steps > 2 * examples, (f"{machine.__name__}: {steps} steps in {examples} "
                                          "examples: the rules hardly ever ran")

    return Checked


for _spec in all_variants().values():
    for _regime in _spec.regimes:
        _rec = Recorder()
        _cls = machine_class(_spec, _regime, recorder=_rec)
        _test = _checked(_cls, _rec)
        _test.__name__ = _test.__qualname__ = f"Test{_cls.__name__}"
        globals()[_test.__name__] = _test
del _spec, _regime, _cls, _rec, _test
