"""The clean reference caches pass their machines in every regime (no false alarms).

Each variant/regime is a Hypothesis ``TestCase`` collected by pytest, under the loaded profile
(``ci`` by default: derandomised, fixed budget).
"""

from state_machines.machine import machine_class
from state_machines.variants import all_variants

for _spec in all_variants().values():
    for _regime in _spec.regimes:
        _cls = machine_class(_spec, _regime)
        _cls.TestCase.__name__ = f"Test{_cls.__name__}"
        globals()[_cls.TestCase.__name__] = _cls.TestCase
del _spec, _regime, _cls
