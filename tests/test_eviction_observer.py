"""The eviction observer (``caches/subjects/radix.py``) takes any engine's ``evict`` return
value: a count, a list or a tensor of freed slots, None.  A tensor's truth value is an error
when it holds several slots; an engine returning one must not crash the observer."""

from __future__ import annotations

import pytest
import torch

from caches.subjects.radix import PASSES, evicted_something
from state_machines.variants import all_variants


@pytest.mark.parametrize("got, said", [
    (None, False), (0, False), (3, True), ([], False), ([4, 5], True),
    (torch.tensor([], dtype=torch.int64), False), (torch.tensor([4]), True),
    (torch.tensor([4, 5, 6]), True), (torch.tensor(0), False), (object(), True),
])
def test_any_return_value_says_whether_something_was_freed(got, said):
    assert evicted_something(got) is said


def test_an_evict_returning_a_tensor_of_several_slots_is_counted():
    spec = all_variants()["radix"]
    s = spec.make_subject(spec.check_params(spec.regimes[0]))

    class Engine:
        def evict(self, num_tokens):
            return torch.tensor([7, 8, 9])  # the slots it freed, as an engine may return

    eng = Engine()
    s.observe_evictions(eng, passes=("evict",))
    before = s.reached_counts.get(PASSES, 0) if s.reached_counts else 0
    got = eng.evict(3)
    assert got.tolist() == [7, 8, 9]
    assert s.reached_counts[PASSES] == before + 1
