"""The serving lifecycle past the prefill on paged-bigpage (LightLLM's linear-attention paged
radix cache): decode, finish after decode, batch admission against LightLLM's router estimate
(``caches/admission.py`` ``PeakTokenBudget``) and the admission-sound property; faults L6, L7."""

from __future__ import annotations

import pytest

from caches.admission import PeakTokenBudget, lightllm_tuple_tokens
from caches.faults import get_fault
from caches.paged_bigpage import LinearAttPagedRadixCache, chained_hashes
from caches.subjects.base import NotDriven
from caches.subjects.paged_bigpage import PagedBigPageSubject
from invariants import Violation
from state_machines.paged_bigpage import SPEC


def subject(fault=None, **params):
    cls = get_fault(fault).cls if fault else LinearAttPagedRadixCache
    return PagedBigPageSubject(cls, device="cpu", **params)


def prefilled(s, rid, tokens):
    s.admit(rid=rid, tokens=tokens)
    while s.requests[rid].cur_kv_len < len(tokens):
        assert not s.prefill(rid=rid, n=64).startswith("waits")
    s.check()
    return s.requests[rid]


def test_decode_takes_a_slot_per_token_and_advances_the_request_state():
    s = subject()
    req = prefilled(s, 1, [0, 1, 1, 0, 1])
    free, slots = s.kv.available_size(), list(req.slots)
    assert s.decode(1, 3) == "decoded 3: 8 tokens computed, 3 output"
    s.check()
    assert (req.cur_kv_len, req.total_len, req.output, req.state_len) == (8, 8, 3, 8)
    assert s.kv.available_size() == free - 3 and req.slots[:5] == slots
    assert req.linear_att_cache_len == 4 and len(req.hashes) == 2  # the prompt's pages only
    s.verify_data(s.kv, req.slots, req.tokens, "decoded KV, ")  # each slot holds its token


def test_decode_stops_at_max_req_total_len():
    s = subject(max_req_total_len=6)
    prefilled(s, 1, [0, 1, 1, 0, 1])
    assert s.decode(1, 4) == "decoded 1: 6 tokens computed, 1 output"
    with pytest.raises(Exception, match="longest sequence"):
        s.decode(1, 1)


@pytest.mark.parametrize("params", [{}, {"big_page_num": 2}], ids=["small-pages", "big-pages"])
def test_finish_after_decode_caches_the_prompt_pages_and_frees_the_output(params):
    """LightLLM hashes the prompt only: finish inserts its hashed pages and frees every
    decoded slot with the unhashed tail (IB 172-176 / 202-205)."""
    s = subject(**params)
    prompt = [0, 1, 1, 0, 1, 0, 0]  # cache_len 6
    prefilled(s, 1, prompt)
    s.decode(1, 3)
    s.finish(1)
    s.check()
    c = s.cache
    assert c.tree_total_tokens_num == 6
    assert s.kv.available_size() == s.kv.num_pages - 6  # nothing of the output is held
    tokens = prompt + [9, 9]
    node, n, _ = c.match_prefix(tokens[:8], chained_hashes(tokens, 2, 4))
    assert n == 6  # a longer key hits the prompt's pages, nothing past them
    c.dec_node_ref_counter(node)
    s.quiesce()


def test_L6_leaks_the_decoded_slots_at_finish():
    s = subject("L6")
    prefilled(s, 1, [0, 1, 1, 0, 1])
    s.finish(1)  # no output: nothing to leak
    s.check()
    prefilled(s, 2, [1, 1, 1])
    s.decode(2, 2)
    s.finish(2)
    with pytest.raises(Violation) as exc:
        s.check()
    assert exc.value.prop == "conservation"


def test_schedule_admits_a_batch_then_prefills_and_decodes_each():
    s = subject(big_page_num=2)
    s.enqueue(1, [0, 0, 0, 0, 0, 1], 2)
    s.enqueue(2, [1, 1, 1], 2)
    got = s.schedule(3)
    s.check()
    assert got == "admitted r1, r2 of 2 waiting; prefilled, decoded one step"
    assert not s.waiting and s.reached_counts["batch-admitted"] == 1
    r1, r2 = s.requests[1], s.requests[2]
    assert (r1.cur_kv_len, r1.output, r2.cur_kv_len, r2.output) == (7, 1, 4, 1)
    assert list(r1.linear_att_len_to_big_page_id) == [4]  # the big boundary's buffer
    s.finish(1)
    s.check()
    s.enqueue(3, [0, 0, 0, 0, 0, 1, 1], 1)  # matched after admission: a big-page hit
    s.schedule(1)
    s.check()
    assert s.requests[3].shared_len() == 4 and s.reached_counts["big-page-hit"] == 1
    s.quiesce()


def hold_then_burst(s):
    """r1 holds 14 of the 24 KV slots mid-life; two 5-token requests then arrive together."""
    prefilled(s, 1, [0] * 14)
    s.enqueue(2, [1, 1, 1, 1, 1], 1)
    s.enqueue(3, [1, 0, 1, 0, 1], 1)
    return s.schedule(3)


def test_the_router_estimate_counts_the_running_batch():
    s = subject()
    assert hold_then_burst(s) == "admitted r2 of 2 waiting; prefilled, decoded one step"
    s.check()
    assert list(s.waiting) == [3] and s.reached_counts["admission-refused"] == 1


def test_planted_admission_bug_fails_on_admission_sound():
    """L7: the estimate over the candidates alone admits both; their prefill and first
    decode step need 12 slots where 10 can be had."""
    s = subject("L7")
    with pytest.raises(Violation) as exc:
        hold_then_burst(s)
    assert exc.value.prop == "admission-sound"


def test_peak_token_estimate_follows_lightllm():
    # a_len = total + 1; b_len = ceil(uncomputed / chunk) * 2 + max_new - output - 1 (+ pad)
    assert lightllm_tuple_tokens(5, 0, 0, 2, chunk=16, added_output_len=0) == (6, 3)
    assert lightllm_tuple_tokens(5, 0, 0, 2, chunk=16) == (6, 19)  # ADDED_OUTPUT_LEN 16
    assert lightllm_tuple_tokens(8, 8, 3, 4, chunk=16, added_output_len=0) == (9, 0)
    b = PeakTokenBudget(24, [(13, 3)], 4, lambda req: req)
    assert b.peak([(13, 3), (6, 2)]) == 23  # max(3*1 + 13, 2*2 + 13 + 6)
    assert b.fits(0, 0, (6, 2))
    b.reserve(0, 0, (6, 2))
    assert not b.fits(0, 0, (6, 2))  # 2*3 + 25 = 31
    assert not PeakTokenBudget(99, [(1, 0)] * 4, 4, lambda req: req).fits(0, 0, (1, 0))


def test_retract_is_not_an_op_here_and_says_why():
    assert {"decode", "enqueue", "schedule"} <= set(SPEC.ops.specs)
    assert "retract" not in SPEC.ops.specs
    s = subject()
    prefilled(s, 1, [0, 1, 1])
    with pytest.raises(NotDriven, match="pausing"):
        s.retract(1)
