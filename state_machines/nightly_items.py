"""The nightly job's work items as pytest tests, so pytest-xdist spreads them over cores.

Collected with ``pytest --pyargs state_machines.nightly_items`` and the plan file named by
``$KVCHECK_NIGHTLY_PLAN`` (written by ``state_machines.nightly.run_nightly``).  Without a plan
nothing is collected.
"""

import json
import os
from pathlib import Path

import pytest

from state_machines.nightly import PLAN_ENV, Item, run_item

_PLAN = json.loads(Path(os.environ[PLAN_ENV]).read_text()) if os.environ.get(PLAN_ENV) else None
_ITEMS = [Item(**it) for it in _PLAN["items"]] if _PLAN else []


@pytest.mark.parametrize("item", _ITEMS, ids=[it.id for it in _ITEMS])
def test_nightly_item(item):
    result = run_item(item, Path(_PLAN["out"]), _PLAN["database"], _PLAN["github_artifact"],
                      _PLAN.get("deadline"), len(_ITEMS), _PLAN.get("workers"))
    if result["interrupted"]:  # fuzz() kept what it found; now let pytest stop as well
        raise KeyboardInterrupt
    assert result["error"] is None, result["error"]
    assert not result["failed"], (f"{result['label']}: {result['property']}: "
                                  f"{result['message']} (trace: {result['trace']})")
