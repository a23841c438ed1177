"""Stand-alone reproduction of tokenspeed-F1 (only ``tokenspeed_scheduler`` needed).

A minimal runtime loop in TokenSpeed's own order (``event_loop.py``: the completions of the
last plan's cache ops in one ``advance``, then ``next_execution_plan()``, then the forward's
results in one ``advance``, KV events drained after each) with KV cache events on and forced
retraction.  A request is retracted (``SnapshotOp``) and restored (``RestoreOp``, its
``RestoreDoneEvent`` delivered at the start of the next iteration); while it waits for its
next forward, the scheduler ends the process: ``Fatal check failed: cache mutation on a KV
event boundary with no token descriptor`` (``scheduler.cpp:323``,
``Scheduler::markKvEventBoundaryForReconcile``), then ``abort()`` -- exit status -6 / 134.
With ``enable_kv_cache_events = False`` the same run survives.

    python tests/upstream_findings/tokenspeed_f1_repro.py [--steps-only] [--no-kv-events]

``OPS`` is the machine's shrunk trace (``tokenspeed-continuation-state-F1-*.json``) in plain
terms: ``admit`` = submit, ``step`` = one iteration, ``abort`` = ``ForwardEvent.Abort``,
``finish`` = ``ForwardEvent.Finish``.  Prints ``survived`` and exits 0 when the scheduler does
not abort.
"""

import json
import sys
from pathlib import Path

import tokenspeed_scheduler as ts

KV_EVENTS = "--no-kv-events" not in sys.argv
TRACE = sorted(Path(__file__).parent.glob("tokenspeed-continuation-state-F1-*.json"))


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
seq, fed, out, slot, prompt = {}, {}, {}, {}, {}
retracted = set()
pending = []  # completions of the last plan's cache ops
serial = 0


def advance(events):
    if events:
        ev = ts.ExecutionEvent()
        for e in events:
            ev.add_event(e)
        sched.advance(ev)
    sched.drain_kv_events()


def forward_event(kind, rid):
    e = getattr(ts.ForwardEvent, kind)()
    e.request_id = rid
    return e


def iterate():
    global pending
    advance([e for e, _ in pending])  # the runtime's _commit_cache_results
    retracted.difference_update(rid for _, rid in pending if rid)
    pending = []
    plan = sched.next_execution_plan()
    sched.drain_kv_events()
    for op in plan.cache:
        kind = type(op).__name__
        if kind == "SnapshotOp":
            retracted.update(op.request_ids)
        rids = list(op.request_ids) if kind == "RestoreOp" else [None] * len(op.op_ids)
        for oid, rid in zip(op.op_ids, rids):
            done = getattr(ts.Cache, kind.replace("Op", "DoneEvent"))()
            done.op_id = oid
            pending.append((done, rid))
    events = []
    for fwd in plan.forward:
        for j, rid in enumerate(fwd.request_ids):
            if j < fwd.num_extends():
                fed[rid] = fwd.extend_prefix_lens[j] + fwd.input_lengths[j]
            else:
                fed[rid] += fwd.input_lengths[j]
            r = forward_event("ExtendResult", rid)
            r.tokens = [7] if fed[rid] >= seq[rid] else []
            events.append(r)
            if r.tokens:
                seq[rid] += 1
                out[rid] += 1
                if out[rid] >= 3:  # the runtime's length stop
                    events.append(forward_event("Finish", rid))
                    slot.pop(next(k for k, v in slot.items() if v == rid), None)
    advance(events)  # the runtime's advance_forward


def run(ops):
    global serial
    for name, args in ops:
        rid = slot.get(args.get("rid"))
        if name == "admit" and rid is None:
            serial += 1
            rid = slot[args["rid"]] = f"r{args['rid']}.{serial}"
            spec = ts.RequestSpec()
            spec.request_id, spec.tokens, spec.max_new_tokens = rid, list(args["tokens"]), 3
            try:
                sched.submit_requests([spec])
            except ValueError:  # over the capacity: refused
                del slot[args["rid"]]
                continue
            seq[rid], fed[rid], out[rid] = len(args["tokens"]), 0, 0
            prompt[rid] = len(args["tokens"])
        elif name == "step" and rid is not None:
            iterate()
        elif name == "abort" and rid is not None or name == "finish" and rid is not None \
                and fed[rid] >= prompt[rid] and rid not in retracted:
            advance([forward_event(name.capitalize(), rid)])
            del slot[args["rid"]]
    print(f"{len(ops)} ops done, draining", flush=True)
    for rid in list(slot.values()):  # kvcheck's drain: finish a request that computed its
        done = fed[rid] >= prompt[rid] and rid not in retracted  # prompt, abort the rest
        advance([forward_event("Finish" if done else "Abort", rid)])
    slot.clear()
    for _ in range(6):
        iterate()


# a second form, delta-debugged from a random 300-op run: the process ends during a plain
# iteration (step 21), no Finish of the restored request involved
STEPS_ONLY = json.loads('''[["admit", {"rid": 2, "tokens": [1, 1, 1, 0], "chunk": 4}], ["admit", {"rid": 3, "tokens": [0, 1, 1, 1, 0, 1], "chunk": 4}], ["step", {"rid": 2}], ["step", {"rid": 3}], ["step", {"rid": 2}], ["step", {"rid": 3}], ["admit", {"rid": 3, "tokens": [0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 1, 1], "chunk": 4}], ["step", {"rid": 3}], ["admit", {"rid": 1, "tokens": [1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1], "chunk": 4}], ["step", {"rid": 3}], ["abort", {"rid": 3}], ["step", {"rid": 1}], ["step", {"rid": 1}], ["step", {"rid": 1}], ["step", {"rid": 1}], ["step", {"rid": 1}], ["admit", {"rid": 2, "tokens": [1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1], "chunk": 4}], ["step", {"rid": 1}], ["step", {"rid": 1}], ["step", {"rid": 2}], ["step", {"rid": 1}]]''')

if __name__ == "__main__":
    if "--steps-only" in sys.argv:
        ops = [(name, args) for name, args in STEPS_ONLY]
    else:
        trace = json.loads(TRACE[0].read_text())
        ops = [(op["op"], {k: v for k, v in op.items() if k != "op"}) for op in trace["ops"]]
    run(ops)
    print("survived")
