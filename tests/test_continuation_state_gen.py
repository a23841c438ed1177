"""continuation-state's generators: an admission rule is drawn only while a slot is free
(with every slot busy it was a no-op -- on TokenSpeed six admissions in ten)."""

from state_machines.continuation_state import OPS, SLOTS, FreeSlot
from state_machines.gen import Walk, rule_generators
from state_machines.variants import get_variant


def _walk():
    spec = get_variant("continuation-state")
    return Walk(spec, dict(spec.regimes[0]))


def test_admission_rules_wait_for_a_free_slot():
    w = _walk()
    admits = [g for g in rule_generators(OPS) if getattr(g, "op", None) == "admit"]
    assert {g.name for g in admits} == {"admit", "turn"}
    assert all(g.ready(w) for g in admits)
    for rid in range(1, SLOTS + 1):
        w.do("admit", rid=rid, tokens=[0, 1, 0], chunk=4)
    assert len(w.subject.requests) == SLOTS
    assert not any(g.ready(w) for g in admits)
    w.do("abort", rid=2)
    assert all(g.ready(w) for g in admits)
    assert FreeSlot().value(w, {"rid": 1}) == 2  # the nearest free slot


def test_share_still_admits_through_the_drawn_slot_when_all_are_busy():
    w = _walk()
    for rid in range(1, SLOTS + 1):
        w.do("admit", rid=rid, tokens=[0, 1, 0], chunk=4)
    assert FreeSlot().value(w, {"rid": 3}) == 3  # a no-op admission, as before
