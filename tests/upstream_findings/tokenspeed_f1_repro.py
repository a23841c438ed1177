"""Stand-alone reproduction of tokenspeed-F1 (only ``tokenspeed_scheduler`` needed).

A request is retracted (forced, ``debug_force_retraction_interval``), restored (its
``RestoreOp`` completes: ``RestoreDoneEvent``) and then finished (``ForwardEvent.Finish``)
before it is in a forward batch again.  With KV cache events enabled the scheduler ends the
process: ``Fatal check failed: cache mutation on a KV event boundary with no token
descriptor`` (``scheduler.cpp:323``, ``Scheduler::markKvEventBoundaryForReconcile``), then
``abort()`` -- exit status -6 / 134.  With ``enable_kv_cache_events = False`` the same run
finishes cleanly; an ``Abort`` instead of the ``Finish`` is fine too.

    python tests/upstream_findings/tokenspeed_f1_repro.py [--no-kv-events] [--abort]

Prints ``survived`` and exits 0 when the scheduler does not abort.
"""

import sys

import tokenspeed_scheduler as ts

KV_EVENTS = "--no-kv-events" not in sys.argv
END = ts.ForwardEvent.Abort if "--abort" in sys.argv else ts.ForwardEvent.Finish


def config():
    c = ts.SchedulerConfig()
    c.prefix_granularity = 2
    c.num_device_pages = 21
    c.num_host_pages = 0
    c.disable_l2_cache = True
    c.enable_l3_storage = False
    c.enable_kv_cache_events = KV_EVENTS
    c.max_scheduled_tokens = 8
    c.max_batch_size = 4
    c.num_snapshot_pages = 16
    c.max_retracted_requests = 2
    c.debug_force_retraction_interval = 5
    c.cache_groups = [
        ts.CacheGroupConfig("H", 2, 21, ts.AttnKind.Full),
        ts.CacheGroupConfig("S", 0, 21, ts.AttnKind.State,
                            transfer_policy=ts.CacheTransferPolicy.LatestSnapshot),
    ]
    return c


sched = ts.Scheduler(config())
seq, fed, out = {}, {}, {}


def submit(rid, tokens):
    spec = ts.RequestSpec()
    spec.request_id, spec.tokens, spec.max_new_tokens = rid, list(tokens), 3
    sched.submit_requests([spec])
    seq[rid], fed[rid], out[rid] = len(tokens), 0, 0


def iterate():
    """One runtime iteration: plan, 'execute' (one token per completed prefill / decode;
    cache ops complete at once), advance, drain KV events.  Returns restored request ids."""
    plan = sched.next_execution_plan()
    ev, restored = ts.ExecutionEvent(), []
    for op in plan.cache:
        kind = type(op).__name__
        for oid in op.op_ids:
            done = getattr(ts.Cache, kind.replace("Op", "DoneEvent"))()
            done.op_id = oid
            ev.add_event(done)
        if kind == "RestoreOp":
            restored += list(op.request_ids)
    for fwd in plan.forward:
        for j, rid in enumerate(fwd.request_ids):
            if j < fwd.num_extends():
                fed[rid] = fwd.extend_prefix_lens[j] + fwd.input_lengths[j]
            else:
                fed[rid] += fwd.input_lengths[j]
            r = ts.ForwardEvent.ExtendResult()
            r.request_id = rid
            r.tokens = [7] if fed[rid] >= seq[rid] else []
            ev.add_event(r)
            if r.tokens:
                seq[rid] += 1
                out[rid] += 1
                if out[rid] >= 3:  # the runtime's length stop
                    f = ts.ForwardEvent.Finish()
                    f.request_id = rid
                    ev.add_event(f)
    sched.advance(ev)
    sched.drain_kv_events()
    return restored


submit("a", [1])
submit("b", [0, 1, 1, 0, 1])
iterate()
iterate()
submit("c", [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0])
restored = []
for _ in range(4):
    restored += iterate()  # the 5th plan retracts "a", the 6th restores it
assert restored == ["a"], f"expected 'a' restored, got {restored} (a different release?)"
end = END()
end.request_id = "a"
ev = ts.ExecutionEvent()
ev.add_event(end)
sched.advance(ev)  # with KV events on: Fatal check failed ... abort()
print("survived")
