"""The serving lifecycle past the prefill (caches/subjects/lifecycle.py, caches/admission.py,
caches/lifecycle.py): decode, finish with output, speculative decode, retract, batch
admission and the admission-sound property, on the reference caches."""

from __future__ import annotations

import pytest

from caches.admission import PrefillBudget, UnroundedBudget
from caches.faults import get_fault
from caches.radix import RadixCache
from caches.subjects.himamba import mamba_fp
from caches.subjects.radix import RadixSubject
from invariants import Violation
from state_machines.ops import Op
from state_machines.variants import get_variant


def radix(page_size=1, pool_pages=16, cls=None):
    return RadixSubject(cls or RadixCache, page_size=page_size,
                        pool_pages=pool_pages, device="cpu")


def test_finish_after_decode_inserts_prompt_and_output():
    s = radix()
    s.enqueue(1, [0, 1], 4)
    s.schedule(1)  # prefill + the first decode step
    s.decode(1, 2)
    tokens = list(s.requests[1].tokens)
    assert len(tokens) == 5 and s.requests[1].output == 3
    s.check()
    s.finish(1)
    s.check()
    assert len(s.cache.match_prefix(tokens).indices) == 5  # the output is in the tree too


def test_decode_at_a_page_boundary_takes_a_fresh_page():
    s = radix(page_size=4, pool_pages=6)
    s.enqueue(1, [0, 0, 0], 4)
    s.schedule(1)  # 3 prompt tokens + 1 decoded: the first page is full
    row = s.requests[1].kv_indices
    assert len(row) == 4 and len({x // 4 for x in row}) == 1
    s.decode(1, 1)
    row = s.requests[1].kv_indices
    assert row[4] % 4 == 0 and row[4] // 4 != row[3] // 4  # a new page, its first slot
    s.check()


def test_spec_decode_frees_the_rejected_drafts():
    s = radix()
    s.enqueue(1, [0], 4)
    s.schedule(1)
    free = len(s.pool.free_pages)
    s.spec_decode(1, 3, 1)  # 4 slots allocated, 2 committed, 2 rejected and freed
    assert len(s.pool.free_pages) == free - 2 and len(s.requests[1].kv_indices) == 4
    s.check()


def test_retract_releases_requeues_and_readmits_the_same_request():
    s = radix()
    s.insert([0, 1])  # a prefix the re-admission will hit
    s.enqueue(1, [0, 1, 2], 4)
    s.schedule(1)
    s.decode(1, 1)
    tokens = list(s.requests[1].tokens)
    s.retract(1)
    s.check()
    assert 1 not in s.requests and s.waiting[1].tokens == tokens and s.waiting[1].retracted
    assert all(n.lock_ref == 0 for n in s.cache.root_node.children.values())  # lock dropped
    out = s.schedule(1)
    assert "admitted r1" in out and s.requests[1].tokens[:len(tokens)] == tokens
    assert s.reached_counts["retract-readmitted"] == 1
    s.check()


def test_retract_evicts_room_for_the_rest_of_the_batch_as_release_req_does():
    """SGLang's ``release_req`` evicts right after the release, until the decoding requests
    left could run 20 more steps each: an unlocked cached prefix goes; the held one stays."""
    s = radix()
    s.insert([2, 2])  # cached, unlocked: evictable
    s.enqueue(1, [0, 1], 4)
    s.enqueue(2, [1, 0], 4)
    s.schedule(2)
    evictable = s.cache.evictable_size_
    assert evictable >= 2
    out = s.retract(1)
    s.check()
    assert f"evicted {evictable} tokens" in out and s.cache.evictable_size_ == 0
    assert s.reached_counts["retract-evicts"] == 1 and 2 in s.requests
    s.retract(2)  # nothing left decoding: no room to make
    assert s.reached_counts["retract-evicts"] == 1
    s.check()


def test_the_budget_rounds_pages_and_charges_a_page_per_request():
    b = PrefillBudget(4, lambda: 32)
    assert b.cost(1, 2) == 1 + 2 + 4
    b.reserve(1, 2)
    assert b.total_offset == 4 + 4 + 2
    u = UnroundedBudget(4, lambda: 32)
    u.reserve(1, 2)
    assert u.total_offset == 3


def test_an_unsound_admission_is_a_violation_and_the_clean_budget_refuses_it():
    def run(cls):
        s = RadixSubject(cls, page_size=4, pool_pages=3, device="cpu")
        s.enqueue(1, [0, 0, 0, 0], 1)
        s.enqueue(2, [1, 1, 1, 1], 1)
        return s, s.schedule(3)

    s, out = run(RadixCache)  # the clean cache
    assert out.startswith("admitted r1 of 2")  # the second did not fit
    s.check()
    with pytest.raises(Violation) as v:
        run(get_fault("D4").cls)
    assert v.value.prop == "admission-sound"


def test_a_target_that_cannot_take_an_op_says_why():
    class Declining(RadixSubject):
        lifecycle_declined = {"retract": "no retract path here"}

    s = Declining(RadixCache, page_size=1, pool_pages=8, device="cpu")
    s.enqueue(1, [0], 2)
    s.schedule(1)
    assert get_variant("radix").ops.apply(s, _op("retract", rid=1)) == \
        "skipped: retract is not driven on this target: no retract path here"


def _op(name, **args):
    return Op(name, args)


def test_himamba_decode_advances_the_mamba_state_and_retract_frees_it():
    s = get_variant("himamba").make_subject({"host": 0, "kv_slots": 6, "mamba_slots": 6})
    s.enqueue(1, [0, 1], 2)
    s.schedule(1)
    s.decode(1, 1)
    s.check()
    req = s.requests[1]
    slot, free = req.mamba_slot, s.mamba.available_size()
    assert s.mamba.read([slot]) == [mamba_fp(req.tokens)]
    s.retract(1)
    s.check()
    assert s.mamba.available_size() == free + 1 and 1 in s.waiting


def test_an_engine_adder_plugs_in_through_admit_one_and_reports_admission_sound():
    """The public batch-admission seam: an engine whose adder matches, estimates and locks in
    one call overrides ``admit_one`` only (schedule keeps the waiting queue), and reports
    admitted work that cannot allocate with ``admission_unsound``."""
    calls = []

    class OneCallAdder(RadixSubject):
        def admit_one(self, req, budget, admitted):
            calls.append(req.rid)
            if len(req.tokens) > 2:  # the engine's own estimate refuses it
                return None
            return self._pin(req, admitted)  # match and lock in the same call

    s = OneCallAdder(RadixCache, page_size=1, pool_pages=16, device="cpu")
    s.enqueue(1, [0, 1], 1)
    s.enqueue(2, [0, 1, 2], 1)
    s.enqueue(3, [5], 1)
    out = s.schedule(3)
    assert calls == [1, 2]  # the refusal of r2 ended the pass
    assert out.startswith("admitted r1 of 3") and list(s.waiting) == [2, 3]
    s.check()

    with pytest.raises(Violation) as v:
        s.admission_unsound([(s.requests[1], None)], "r1's next step")
    assert v.value.prop == "admission-sound" and "r1's next step" in v.value.message
