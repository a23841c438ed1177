"""continuation-state on TokenSpeed's real C++ ``Scheduler`` (``tokenspeed-scheduler``).

The subject plays TokenSpeed's runtime (``python/tokenspeed/runtime/engine/event_loop.py``,
``generation_output_processor.py``, ``scheduler_utils.py`` in lightseekorg/tokenspeed), in its
order: the completions of the last plan's cache ops in one ``advance`` of their own
(``_commit_cache_results``), then ``next_execution_plan()``, "execute" it (the forward batch:
one sampled token for a request whose prefill completes or that decodes, none for an
intermediate prefill chunk; every ``SnapshotOp``/``RestoreOp``/``WriteBackOp``/``LoadBackOp``
completes by the next iteration), then the forward's results in one ``advance``
(``advance_forward``) with a ``Finish`` beside the ``ExtendResult`` once a request has its
``max_new_tokens`` (the runtime's length stop); ``drain_kv_events()`` after each advance.
Nothing but the public bindings is read.

| op | scheduler calls |
|---|---|
| ``admit(rid, tokens, chunk)`` | ``submit_requests([RequestSpec])``; a spec over the capacity is refused (``ValueError``); ``chunk`` has no per-request meaning (the scheduler chunks by ``max_scheduled_tokens``) |
| ``step(rid)`` | one iteration as above (``rid`` only has to be live: the scheduler batches whom it wants) |
| ``finish(rid)`` | a request whose prompt is computed: ``ForwardEvent.Finish`` (an EOS) |
| ``abort(rid)`` | ``ForwardEvent.Abort`` -- before admission, while prefilling or decoding, or while retracted |
| ``retract`` / ``recover`` | Skip: the scheduler has no call for either; it retracts on its own (``debug_force_retraction_interval``, set here, and memory pressure) and restores by itself; both are observed as ``SnapshotOp``/``RestoreOp`` in plans |
| ``evict(n)`` | ``clear_cache()`` when ``can_clear_cache()`` (the only eviction call it has), else Skip |
| ``enqueue(rid, tokens, max_new)`` | ``submit_requests([RequestSpec])`` with ``max_new_tokens = max_new``: the request waits (``Submitted``) |
| ``schedule(n)`` | one iteration as ``step``: the scheduler's own round admits the waiting requests (``scheduleLocalPrefillWork``: pages secured per request, the first chunks cut to ``max_scheduled_tokens``); ``n`` has no meaning there (it takes whom its round fits) |

Checked after every op (``invariants/scheduler.py``): page-conservation, no-shared-write,
snapshot-balance, kv-event-balance (KV events on), request-tokens, and request-ledger
(the scheduler's waiting + prefilling + decoding counts equal the live requests it was given,
``retracted_size`` the retracted ones).  Quiescence after the drain: sched-quiescence.
``docs/engines/tokenspeed.md`` has the whole picture.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from caches.subjects.base import Skip, Subject
from invariants import NodeView, TreeView, fail
from invariants.scheduler import (apply_kv_events, check_no_shared_write,
                                  check_page_conservation, check_request_tokens,
                                  check_sched_quiescence, check_snapshot_balance)

PAGE = 2  # tokens per History page (and the prefix granularity, so L = 2)
GROUPS = ("H", "S")
MAX_NEW = 3  # sampled tokens per request before the runtime's length stop
SAMPLED = 7  # the token every "forward" samples (outside the machine's {0, 1} alphabet)


@dataclass
class Pos:
    depth: int


@dataclass
class TSReq:
    rid: int
    tokens: list  # the prompt
    max_new: int = MAX_NEW  # sampled tokens before the runtime's length stop
    out: list = field(default_factory=list)  # sampled tokens, in order
    done: int = 0  # tokens of prompt + out whose KV the scheduler has computed
    active: bool = True  # False: retracted (its image is in the snapshot pool)
    admitted: bool = False  # seen in a forward batch
    tables: dict = field(default_factory=dict)  # gid -> page ids of its last block table
    image: int = 0  # snapshot blocks its retraction image holds
    serial: int = 0  # admissions so far (the scheduler's id is r<rid>.<serial>)

    @property
    def seq(self) -> list:
        return self.tokens + self.out

    @property
    def computed(self) -> int:  # prompt tokens computed (what the machine's rules read)
        return min(self.done, len(self.tokens))

    @property
    def node(self) -> Pos:  # the L-aligned depth the request has reached in the prompt
        return Pos(self.computed // PAGE * PAGE)


class TokenSpeedSubject(Subject):
    variant = "continuation-state"
    target = "tokenspeed"
    # an intermediate prefill chunk is reported (an ExtendResult with no token); the pre-#864
    # FSM refuses that event while a request prefills, and that runtime sent none
    reports_every_chunk = True

    def __init__(self, *, pool_pages: int = 10, snapshot_pages: int = 16,
                 retraction_interval: int = 5, max_retracted: int = 2,
                 max_scheduled_tokens: int = 8, boundary_fault: str | None = None,
                 kv_events: bool = True, host_pages: int = 0, src: str | None = None):
        super().__init__()
        from caches.adapters.tokenspeed.loader import module

        ts = self.ts = module(src)  # the wheel's bindings, or those built from checkout src
        self.fault = boundary_fault
        self.kv_events = kv_events
        self.total_pages = 2 * pool_pages + 1  # one arena for both groups; page 0 is null
        cfg = ts.SchedulerConfig()
        cfg.prefix_granularity = PAGE
        cfg.num_device_pages = self.total_pages
        cfg.num_host_pages = host_pages  # > 0: the host (L2) tier, write-back / load-back
        cfg.disable_l2_cache = host_pages == 0
        cfg.enable_l3_storage = False
        cfg.disable_prefix_cache = False
        cfg.enable_kv_cache_events = kv_events
        cfg.max_scheduled_tokens = max_scheduled_tokens
        cfg.max_batch_size = 4
        cfg.num_snapshot_pages = snapshot_pages
        cfg.max_retracted_requests = max_retracted if snapshot_pages > 1 else 0
        cfg.debug_force_retraction_interval = retraction_interval
        cfg.cache_groups = [
            ts.CacheGroupConfig("H", PAGE, self.total_pages, ts.AttnKind.Full),
            ts.CacheGroupConfig("S", 0, self.total_pages, ts.AttnKind.State,
                                transfer_policy=ts.CacheTransferPolicy.LatestSnapshot),
        ]
        self.snapshot_capacity = snapshot_pages - 1  # page 0 of the pool is null too
        self.sched = ts.Scheduler(cfg)
        self._start_runtime()

    def _start_runtime(self) -> None:
        """The runtime's own bookkeeping, empty (what it knows of the requests it gave the
        scheduler)."""
        self.requests: dict[int, TSReq] = {}
        self.stored: dict = {}  # block hash -> stored now (the KV-event ledger)
        self.steps = 0
        # (done event, rid, scheduler id, "snapshot" / "restore" / None) for the next iteration
        self.pending: list = []
        # snapshot-pool blocks held per suspended request (scheduler id): from its SnapshotOp
        # until its RestoreDoneEvent is delivered -- or its abort, when no snapshot or restore
        # is in flight (else when that completes)
        self.images: dict = {}
        self.inflight: set = set()  # scheduler ids with a snapshot or restore in flight
        self.serial = 0
        self.carried: set = set()  # the requests the last plan's forward batch carried

    # -- helpers ---------------------------------------------------------------------------
    def sid(self, rid: int) -> str:
        """The scheduler's id of the request now in slot ``rid`` (unique per admission, as
        the runtime's: the scheduler refuses a reused id)."""
        return f"r{rid}.{self.requests[rid].serial}" if rid in self.requests else f"r{rid}.?"

    def _advance(self, *events) -> None:
        ev = self.ts.ExecutionEvent()
        for e in events:
            ev.add_event(e)
        self.sched.advance(ev)

    def _forward_event(self, kind: str, rid: int, tokens=None):
        e = getattr(self.ts.ForwardEvent, kind)()
        e.request_id = self.sid(rid)
        if tokens is not None:
            e.tokens = list(tokens)
        return e

    def _drain_kv(self) -> None:
        evs = []
        for k in self.sched.drain_kv_events():
            kind = "stored" if type(k).__name__ == "BlockStored" else "removed"
            evs.extend((kind, int(h)) for h in k.block_hashes)
        apply_kv_events(self.stored, evs)

    def _rid_of(self, sid: str) -> int:
        return int(sid[1:].split(".")[0])

    def _finished(self, rid: int) -> None:
        self._gone(rid)

    def _gone(self, rid: int) -> None:
        """``rid`` leaves the runtime (finish, abort, scheduler abort); its image is freed
        with it unless a restore is in flight."""
        sid = self.sid(rid)
        if sid not in self.inflight:
            self.images.pop(sid, None)
        self.requests.pop(rid, None)

    # -- serving operations ------------------------------------------------------------------
    def admit(self, rid: int, tokens: list[int], chunk: int) -> str:
        return self._submit(rid, tokens, MAX_NEW)  # the scheduler cuts its own chunks

    def _submit(self, rid: int, tokens: list[int], max_new: int) -> str:
        if rid in self.requests:
            raise Skip(f"r{rid} is already live")
        if not tokens:
            raise Skip("a request needs tokens")
        self.serial += 1
        spec = self._spec(f"r{rid}.{self.serial}", tokens, max_new)
        try:
            self.sched.submit_requests([spec])
        except ValueError as exc:  # the scheduler's own admission refusal (over capacity)
            self.reached("admission-refused")
            return f"refused: {exc}"
        self.requests[rid] = TSReq(rid, list(tokens), max_new, serial=self.serial)
        return f"submitted ({len(tokens)} tokens, up to {max_new} new)"

    def _spec(self, sid: str, tokens: list[int], max_new: int):
        spec = self.ts.RequestSpec()
        spec.request_id = sid
        spec.tokens = list(tokens)
        spec.max_new_tokens = max_new
        return spec

    def step(self, rid: int) -> str:
        self.req(rid)
        return self._iterate()

    # -- batch admission: the scheduler's own round ------------------------------------------
    @property
    def waiting(self) -> dict:
        """Submitted requests no forward batch has carried yet (the scheduler's waiting
        queue, as the runtime sees it)."""
        return {rid: r for rid, r in self.requests.items() if not r.admitted}

    def enqueue(self, rid: int, tokens: list[int], max_new: int) -> str:
        return self._submit(rid, tokens, max_new)

    def schedule(self, n: int) -> str:
        """One iteration: the plan's round admits what it fits (``n`` is the reference's cap;
        the scheduler takes whom its own round fits)."""
        waiting = set(self.waiting)
        if not waiting:
            raise Skip("nothing is waiting")
        out = self._iterate()
        taken = waiting & self.carried
        if len(taken) > 1:
            self.reached("batch-admitted")
        if len(taken) < len(waiting):
            self.reached("schedule-deferred")  # left waiting by this round
        return out

    def finish(self, rid: int) -> str:
        req = self.req(rid)
        if not req.active or req.done < len(req.tokens):
            raise Skip(f"r{rid} has not computed its prompt")
        self._advance(self._forward_event("Finish", rid))
        self._finished(rid)
        self._drain_kv()
        return f"finished after {len(req.out)} sampled token(s)"

    def abort(self, rid: int) -> str:
        req = self.req(rid)
        where = ("before admission" if not req.admitted else
                 "while retracted" if not req.active else
                 "while prefilling" if req.done < len(req.tokens) else "while decoding")
        if not req.admitted:
            self.reached("abort-before-admission")
        self._advance(self._forward_event("Abort", rid))
        self._gone(rid)
        self._drain_kv()
        return f"aborted {where}"

    def retract(self, rid: int) -> str:
        raise Skip("the scheduler has no retract call: it retracts by itself (forced every "
                   "debug_force_retraction_interval steps, or under memory pressure)")

    def recover(self, rid: int) -> str:
        raise Skip("the scheduler has no recover call: it restores a retracted request by "
                   "itself (a RestoreOp in a later plan)")

    def evict(self, n: int) -> str:
        if not self.sched.can_clear_cache():
            raise Skip("can_clear_cache() is false (requests are live)")
        ok = self.sched.clear_cache()
        self._drain_kv()
        self.reached("clear-cache")
        return "cache cleared" if ok else "clear_cache() declined"

    # -- one scheduler iteration -----------------------------------------------------------
    def _commit_cache_results(self) -> list:
        """The runtime's ``_commit_cache_results``: the completions of the cache ops the last
        plan issued, in one advance of their own, before the next plan; returns the restored
        request ids."""
        pending, self.pending = self.pending, []
        if not pending:
            return []
        self._advance(*(done for done, _, _, _ in pending))
        restored = []
        for _, rid, sid, kind in pending:
            if kind is None:
                continue
            self.inflight.discard(sid)
            live = rid in self.requests and self.sid(rid) == sid
            if kind == "snapshot":
                if not live:  # aborted while its image was being written: freed now
                    self.images.pop(sid, None)
                continue
            restored.append(rid)  # its RestoreDoneEvent went in: the image is back on device
            self.images.pop(sid, None)
            if live:
                self.requests[rid].active = True
                self.requests[rid].image = 0
        self._drain_kv()
        return restored

    def _iterate(self) -> str:
        ts = self.ts
        words = [f"restored r{rid}" for rid in self._commit_cache_results()]
        plan = self.sched.next_execution_plan()
        self.steps += 1
        self._drain_kv()
        events = []
        for a in self._plan_aborts(plan):
            rid = self._rid_of(a.request_id)
            words.append(f"scheduler aborted r{rid} ({a.reason.name}: {a.detail})")
            self._gone(rid)
        for op in plan.cache:
            name = type(op).__name__
            if name == "SnapshotOp":
                # one op id per request; dst_pages[k] are the snapshot-pool blocks its image
                # takes (its History and State pages, group_ids 0 / 1, copied there)
                for oid, sid, dst in zip(op.op_ids, op.request_ids, op.dst_pages):
                    rid = self._rid_of(sid)
                    req = self.requests[rid]
                    req.active = False
                    req.tables = {}
                    req.image = self.images[sid] = len([b for b in dst if b > 0])
                    self.reached("retract")
                    words.append(f"retracted r{rid}")
                    if self.fault == "B2":  # fault B2: the SnapshotDoneEvent is lost
                        continue
                    done = ts.Cache.SnapshotDoneEvent()
                    done.op_id = oid
                    self.inflight.add(sid)
                    self.pending.append((done, rid, sid, "snapshot"))
            elif name == "RestoreOp":
                for oid, sid in zip(op.op_ids, op.request_ids):
                    rid = self._rid_of(sid)
                    self.reached("recover")
                    words.append(f"restoring r{rid}")
                    done = ts.Cache.RestoreDoneEvent()
                    done.op_id = oid
                    self.inflight.add(sid)
                    self.pending.append((done, rid, sid, "restore"))
            elif name in ("WriteBackOp", "LoadBackOp"):
                self.reached("write-back" if name == "WriteBackOp" else "load-back")
                for oid in op.op_ids:
                    done = getattr(ts.Cache, name.replace("Op", "DoneEvent"))()
                    done.op_id = oid
                    self.pending.append((done, None, None, None))
            else:
                fail("crash", f"plan carries a cache op this target does not execute: {name}")
        fed_at = 0
        written = {}
        for fwd in plan.forward:
            rids = [self._rid_of(s) for s in fwd.request_ids]
            if not rids:
                continue
            tables = self._forward_tables(fwd)
            n_ext = fwd.num_extends()
            ids = list(fwd.input_ids)
            for j, rid in enumerate(rids):
                req = self.requests.get(rid)
                if req is None:
                    fail("crash", f"the plan schedules r{rid}, which is not live")
                if not req.active:
                    fail("request-ledger", f"the plan schedules r{rid}, retracted and never "
                         "restored", owner=f"r{rid}")
                req.admitted = True
                req.tables = {g: [p for p in tables[g][j] if p > 0] for g in tables}
                n = fwd.input_lengths[j]
                if j < n_ext:
                    start = fwd.extend_prefix_lens[j]
                    check_request_tokens(f"r{rid}", start, ids[fed_at:fed_at + n], req.seq)
                    fed_at += n
                    if start < req.done:
                        self.reached("recompute")
                    if start > req.done:
                        self.reached("prefix-hit")
                    req.done = start + n
                    rows = range(start // PAGE, (start + n - 1) // PAGE + 1)
                else:
                    rows = range(req.done // PAGE, (req.done + n - 1) // PAGE + 1)
                    req.done += n
                written[f"r{rid}"] = {"H": [req.tables.get("H", [])[k] for k in rows
                                            if k < len(req.tables.get("H", []))],
                                      "S": self._state_written(fwd, tables, j, rows)}
                sample = req.done >= len(req.seq)
                toks = [SAMPLED] if sample else []
                if self.fault == "B3" and sample and j < n_ext:
                    toks = [SAMPLED, SAMPLED]  # fault B3: the last chunk reports two tokens
                if toks or self.reports_every_chunk:
                    events.append(self._forward_event("ExtendResult", rid, toks))
                if sample:
                    req.out.append(SAMPLED)
                    if len(req.out) >= req.max_new:  # the runtime's length stop
                        events.append(self._forward_event("Finish", rid))
                        if self.fault == "B1":  # fault B1: the Finish is delivered twice
                            events.append(self._forward_event("Finish", rid))
                        self._finished(rid)
                        self.reached("length-finish")
                    else:
                        self.reached("sampled")
        live_tables = self._live_tables()
        check_no_shared_write({o: w for o, w in written.items() if o in live_tables},
                              live_tables)
        if events:  # the runtime's advance_forward: the forward's results, one advance
            self._advance(*events)
        self._drain_kv()
        sched = [r for f in plan.forward for r in map(self._rid_of, f.request_ids)]
        self.carried = set(sched)
        head = f"scheduled {', '.join(f'r{r}' for r in sched)}" if sched else "idle plan"
        return "; ".join([head] + words)

    # -- what differs between the scheduler's API generations (continuation_state_pre864.py) --
    def _plan_aborts(self, plan):
        return plan.aborts

    def _forward_tables(self, fwd) -> dict:
        return {g: [list(row) for row in rows] for g, rows in dict(fwd.block_tables).items()}

    def _state_written(self, fwd, tables: dict, j: int, rows) -> list:
        # a State row is (source, destination): the recurrent state is read from the first
        # slot (a cached snapshot on a prefix hit, shared) and written to the last
        return [row[-1] for row in [tables.get("S", [[]])[j]] if row and row[-1] > 0]

    def _token_size(self, sid: str) -> int:
        return self.sched.request_token_size(sid)

    def _live_tables(self) -> dict:
        """The active requests' block tables as this plan has them (from its batches)."""
        return {f"r{r}": q.tables for r, q in self.requests.items() if q.active}

    def bindings_file(self) -> str:
        """The extension module this subject drives (the wheel's, or a checkout's build)."""
        return self.ts.tokenspeed_scheduler_ext.__file__

    # -- checks ------------------------------------------------------------------------------
    def _available(self) -> dict:
        return {g: self.sched.cache_group_available_pages(g) for g in GROUPS}

    def _totals(self) -> dict:
        return {g: self.sched.cache_group_total_pages(g) for g in GROUPS}

    def queues(self) -> dict:
        s = self.sched
        return {"waiting": s.waiting_size(), "prefilling": s.prefilling_size(),
                "decoding": s.decoding_size(), "retracted": s.retracted_size()}

    def check(self) -> None:
        live = {f"r{r}": q.tables for r, q in self.requests.items() if q.active}
        check_page_conservation(self._totals(), self._available(), live)
        check_snapshot_balance(self.sched.snapshot_pool_free_blocks(), self.snapshot_capacity,
                               self.images)
        self._check_ledger()

    def _check_ledger(self) -> None:
        """request-tokens and request-ledger: the scheduler holds what the runtime gave it."""
        for rid, req in self.requests.items():
            n = self._token_size(self.sid(rid))
            if n != len(req.seq):
                fail("request-tokens", f"r{rid}: the scheduler holds {n} tokens for it, the "
                     f"runtime {len(req.seq)} (prompt {len(req.tokens)} + {len(req.out)} "
                     "sampled)", owner=f"r{rid}", scheduler=n, runtime=len(req.seq))
        q = self.queues()
        # waiting_size counts Retracted and Restoring too; retracted_size counts just those
        n_live = q["waiting"] + q["prefilling"] + q["decoding"]
        n_retracted = sum(1 for r in self.requests.values() if not r.active)
        if n_live != len(self.requests) or q["retracted"] != n_retracted:
            fail("request-ledger", f"the scheduler holds {n_live} request(s), {q['retracted']} "
                 f"retracted ({q}); the runtime gave it {len(self.requests)} still live, "
                 f"{n_retracted} retracted: {sorted(self.requests)}",
                 queues=q, live=sorted(self.requests))

    def drain(self) -> None:
        for rid in self.live():
            req = self.requests[rid]
            if req.active and req.done >= len(req.tokens):
                self.finish(rid)
            else:
                self.abort(rid)
        for _ in range(6):  # let the scheduler settle (restores, snapshots, write-backs)
            if self._settled():
                break
            self._iterate()
        self._clear_cache()
        self._drain_kv()

    def _settled(self) -> bool:
        return not any(self.queues().values()) and not self.pending \
            and self.sched.can_clear_cache()

    def _clear_cache(self) -> None:
        if self.sched.can_clear_cache():
            self.sched.clear_cache()

    def check_quiescent(self) -> None:
        check_sched_quiescence(self._totals(), self._available(),
                               self.sched.snapshot_pool_free_blocks(), self.snapshot_capacity,
                               self.sched.host_pool_pinned_blocks(), self.queues(),
                               self.stored)

    # -- ledger / reports -----------------------------------------------------------------
    def tree_view(self) -> TreeView:  # no tree is visible through the bindings
        return TreeView({0: NodeView(0, None, (), (), {}, {})}, 0, PAGE)

    def counters(self) -> dict:
        # not the reference's free_H / free_S: one arena for both groups, cached pages not
        # free -- a diff must not compare them as if they meant the same
        out = {"arena_free": self._available()["H"]}
        out["snapshot_free"] = self.sched.snapshot_pool_free_blocks()
        out["stored_blocks"] = sum(1 for on in self.stored.values() if on)
        out["live"] = len(self.requests)
        out.update(self.queues())
        return out

    def outline(self) -> str:
        lines = [f"free pages: {self._available()} of {self._totals()}; snapshot pool free "
                 f"{self.sched.snapshot_pool_free_blocks()}/{self.snapshot_capacity}; "
                 f"queues {self.queues()}; stored blocks "
                 f"{sum(1 for on in self.stored.values() if on)}"]
        for rid in self.live():
            r = self.requests[rid]
            state = "active" if r.active else "retracted"
            lines.append(f"r{rid} ({state}): {r.done}/{len(r.seq)} computed, prompt "
                         f"{len(r.tokens)}, sampled {len(r.out)}; tables {r.tables}")
        return "\n".join(lines)


def make_subject(params, *, fault=None, device=None, known_findings="decline",
                 boundary_fault=None, isolate=True, src=None, **kw):
    """The subject for ``params``; ``isolate`` (default) runs it in a forked child
    (``isolate.py``) so a scheduler that aborts the process is a reported ``crash``.  (A
    checkout with the pre-#864 bindings gets ``continuation_state_pre864.make_subject``: the
    target chooses.)"""
    from caches.adapters.tokenspeed.faults import boundary_fault_of

    bf = boundary_fault or boundary_fault_of(fault)

    def build():
        # tokenspeed-F1 aborts the process on ordinary steps once KV cache events are on and a
        # restored request waits for its forward, and tokenspeed-F2 throws when one is
        # retracted mid-page: no single op can be declined, so decline mode (the default)
        # runs with the KV-event stream off -- the only knob that avoids them -- and find
        # mode with it on (kv-event-balance is checked there)
        kw.setdefault("kv_events", known_findings == "find")
        return TokenSpeedSubject(pool_pages=params.get("pool_pages", 10), boundary_fault=bf,
                                 src=src, **kw)

    return isolated(build, TokenSpeedSubject, isolate)


def isolated(build, cls, isolate: bool = True):
    """``build()`` here, or (``isolate``) in a forked child behind a ``Forked`` proxy."""
    if not isolate:
        return build()
    from caches.adapters.tokenspeed.isolate import Forked

    return Forked(build, cls, label="TokenSpeed scheduler")
