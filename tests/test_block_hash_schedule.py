"""block-hash batch admission (``enqueue`` + ``schedule``): vLLM's waiting loop over the
reference cache -- the token budget cuts chunks, the running cap and a refused
``allocate_slots`` end the pass, a refusal leaves the pool untouched, and an admitted chunk
has its slots (``admission-sound``); fault K8 on its property.  The same traces run on the
vLLM target in ``tests/upstream/test_vllm_block_hash.py``."""

import pytest

from caches.block_hash import BlockHashCache
from caches.subjects.block_hash import BlockHashSubject
from invariants import Violation
from state_machines.ops import Op
from tests.test_block_hash_cache import run

# r1 fills and caches blocks 1, 2 (its partial block 3 goes to the queue's front); r2 takes
# the five uncached-first blocks, leaving only r1's two cached blocks free; r3 hits both but
# needs two more blocks: allocate_slots refuses it
FULL_POOL = [("admit", {"rid": 1, "tokens": [0] * 5, "chunk": 8}), ("finish", {"rid": 1}),
             ("admit", {"rid": 2, "tokens": [1] * 10, "chunk": 10}),
             ("enqueue", {"rid": 3, "tokens": [0, 0, 0, 0, 0, 1, 1, 1], "max_new": 1}),
             ("schedule", {"n": 3})]
K8_TRACE = FULL_POOL


def test_a_batch_shares_the_token_budget():
    r, v = run([("enqueue", {"rid": 1, "tokens": [0] * 5, "max_new": 2}),
                ("enqueue", {"rid": 2, "tokens": [1] * 6, "max_new": 2}),
                ("schedule", {"n": 3})])
    assert v is None
    s = r.subject
    assert not s.waiting and s.requests[1].computed == 5 and s.requests[2].computed == 3
    assert s.max_num_scheduled_tokens == 8  # 5 + 3: the second chunk is cut to what is left
    assert len(s.table(2)) == 2 and s.reached_counts["batch-admitted"] == 1
    # r1 finished its prefill and sampled a token; r2 continues with its next chunk by step
    assert len(s.requests[1].tokens) == 6 and s.requests[2].running
    assert run([("enqueue", {"rid": 1, "tokens": [0] * 5, "max_new": 2}),
                ("enqueue", {"rid": 2, "tokens": [1] * 6, "max_new": 2}),
                ("schedule", {"n": 3}), ("step", {"rid": 2})])[0].subject.requests[2].computed == 6


def test_the_running_cap_and_a_spent_budget_end_the_pass():
    ops = [("admit", {"rid": i, "tokens": [i % 2], "chunk": 1}) for i in (1, 2, 3)]
    r, v = run(ops + [("enqueue", {"rid": 4, "tokens": [0, 1], "max_new": 1}),
                      ("schedule", {"n": 3})])
    assert v is None and list(r.subject.waiting) == [4] and r.subject.table(4) == []
    r, v = run([("enqueue", {"rid": 1, "tokens": [0] * 8, "max_new": 1}),
                ("enqueue", {"rid": 2, "tokens": [1], "max_new": 1}),
                ("schedule", {"n": 3})])
    assert v is None and list(r.subject.waiting) == [2] and r.subject.requests[1].computed == 8


def test_a_refused_admission_holds_nothing_and_is_admitted_later_with_its_hit():
    r, v = run(FULL_POOL)
    s = r.subject
    assert v is None and list(s.waiting) == [3] and s.table(3) == []
    assert s.reached_counts["admission-refused-hit"] == 1
    assert sorted(s.free_ids()) == [1, 2] and s.refs()[1] == 0  # the hit was not taken
    r.step(Op("finish", {"rid": 2}))
    r.step(Op("schedule", {"n": 1}))
    assert not s.waiting and s.table(3)[:2] == [1, 2] and s.requests[3].computed == 8


def test_fault_k8_breaks_admission_sound_and_the_trace_is_clean_without_it():
    _, v = run(K8_TRACE, "K8")
    assert v is not None and v.prop == "admission-sound", v
    assert "block refs" in str(v) and "r3" in str(v)
    assert run(K8_TRACE)[1] is None


class _ShortTable(BlockHashCache):
    """An allocate_slots that admits but hands out one block too few."""

    def allocate_slots(self, rid, tokens, num_computed, num_new_tokens, new_computed=()):
        out = super().allocate_slots(rid, tokens, num_computed, num_new_tokens, new_computed)
        if out:
            self.free(rid)
            return super().allocate_slots(rid, tokens, num_computed, num_new_tokens - 2,
                                          new_computed) if num_new_tokens > 2 else []
        return out


def test_an_admitted_chunk_without_its_slots_breaks_admission_sound():
    s = BlockHashSubject(_ShortTable)
    s.enqueue(1, [0] * 5, 1)
    with pytest.raises(Violation) as err:
        s.schedule(1)
    assert err.value.prop == "admission-sound" and "r1's chunk of 5 tokens" in str(err.value)
