"""``kvcheck diff`` past a declared difference (state_machines/diff.py, ``PairSubject``): once
the two sides diverged as a target declares, the fields the declaration covers are no longer
compared, and every other field still is, to the end of the example."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from caches.seam import Difference
from invariants import Violation
from state_machines.diff import PROP, DiffStep, PairSubject

STAMPS = Difference("stamps", "the engine stamps entries its own way", ops=("evict",),
                    fields=("tree", "free_pages"))


class Side:
    def __init__(self, **state):
        self.state = {"tree": (), "free_pages": 8, "live": 0, "waiting": 0, **state}
        self.policy = SimpleNamespace(differences=(STAMPS,))

    def abstract_state(self):
        return dict(self.state)

    def check(self):
        pass


def step(pair, op):
    """One step of ``op`` as ``PairSubject._apply`` logs it, then the check after it."""
    pair._pending = DiffStep(len(pair.log) + 1, op, "", "", by_state=True, op=op)
    pair.log.append(pair._pending)
    pair.check()


def test_fields_the_declaration_does_not_cover_are_still_compared():
    ref, up = Side(), Side()
    pair = PairSubject(ref, up, "engine")
    up.state.update(tree=("a",), free_pages=7)  # the declared divergence, at an evict
    step(pair, "evict")
    assert pair.accepted == "stamps" and pair.declared_seen["stamps"] == 1
    up.state["free_pages"] = 5  # covered fields may go on differing
    step(pair, "insert")
    up.state["live"] = 1  # an uncovered field: still compared after the divergence
    with pytest.raises(Violation) as v:
        step(pair, "admit")
    assert v.value.prop == PROP and "live" in v.value.message
    assert "free_pages" not in v.value.message and "tree" not in v.value.message


def test_an_undeclared_first_difference_is_still_a_divergence():
    ref, up = Side(), Side(live=1)
    pair = PairSubject(ref, up, "engine")
    with pytest.raises(Violation):
        step(pair, "evict")
