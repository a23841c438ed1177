"""TokenSpeed PR #460 on the pre-#864 scheduler API (``PagedCacheGroupConfig``): how many State
pages one live request pins while its chunked prefill advances, built from a checkout.

Usage: ``python tokenspeed_460_probe.py BUILD_ROOT`` where BUILD_ROOT holds the
``tokenspeed_scheduler`` package built from a lightseekorg/tokenspeed checkout
(``caches/adapters/tokenspeed/build.py``).  Prints one JSON line: per scheduler iteration the
pages held in the History group ``H`` and the State group ``S`` (a continuation-state group:
``family=State``, ``SlidingWindow`` of 2 tokens, i.e. one page), for two turns of one
conversation (24 prompt tokens, then the conversation extended by 18 tokens), chunked 4 tokens
per iteration.  The State group needs one window per request; before the fix (473124f2) each
chunk's terminal snapshot stays pinned once it is superseded, so ``S`` grows with ``H``; after
it (4b3b06de) ``S`` stays bounded.  The runtime's protocol is played as in
``continuation_state.py``: no event for an intermediate prefill chunk (the FSM refuses one),
one sampled token when the prompt is computed, a length stop after two.
"""

import json
import sys

sys.path.insert(0, sys.argv[1])
import tokenspeed_scheduler as ts  # noqa: E402

TOTAL = 64
cfg = ts.SchedulerConfig()
cfg.page_size = 2
cfg.max_scheduled_tokens = 4
cfg.max_batch_size = 4
cfg.num_device_pages = TOTAL
cfg.disable_l2_cache = True
cfg.disable_prefix_cache = False
cfg.paged_cache_groups = [
    ts.PagedCacheGroupConfig(group_id="H", rows_per_page=2, entry_stride_tokens=1,
                             total_pages=TOTAL, retention=ts.PagedCacheRetention.FullHistory,
                             family=ts.PagedCacheGroupFamily.History),
    ts.PagedCacheGroupConfig(group_id="S", rows_per_page=2, entry_stride_tokens=1,
                             total_pages=TOTAL, retention=ts.PagedCacheRetention.SlidingWindow,
                             sliding_window_tokens=2, family=ts.PagedCacheGroupFamily.State)]
adjunct = ts.PrefixCacheAdjunctSpec()
adjunct.required_groups = ["H", "S"]
cfg.prefix_cache_adjunct = adjunct
sched = ts.Scheduler(cfg)
fed, prompt, rows = {}, {}, []


def submit(rid, tokens):
    spec = ts.RequestSpec()
    spec.request_id = rid
    spec.tokens = tokens
    prompt[rid] = len(tokens)
    sched.submit_requests([spec])


def iterate(tag):
    plan = sched.next_execution_plan()
    ev, n = ts.ExecutionEvent(), 0
    for op in plan.forward:
        for j, rid in enumerate(op.request_ids):
            fed[rid] = fed.get(rid, 0) + op.input_lengths[j]
            if fed[rid] < prompt[rid]:
                continue  # an intermediate prefill chunk reports nothing
            e = ts.ForwardEvent.ExtendResult()
            e.request_id, e.tokens = rid, [7]
            ev.add_event(e)
            n += 1
            if fed[rid] >= prompt[rid] + 2:
                f = ts.ForwardEvent.Finish()
                f.request_id = rid
                ev.add_event(f)
    if n:
        sched.advance(ev)
    rows.append([tag, TOTAL - 1 - sched.paged_cache_group_available_pages("H"),
                 TOTAL - 1 - sched.paged_cache_group_available_pages("S")])


submit("turn1", list(range(24)))
for i in range(9):
    iterate(f"turn1.{i}")
submit("turn2", list(range(24)) + [7, 7] + list(range(40, 56)))
for i in range(9):
    iterate(f"turn2.{i}")
print(json.dumps({"rows": rows}))
