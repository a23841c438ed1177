"""continuation-state on TokenSpeed's scheduler as it was before lightseekorg/tokenspeed#864:
the ``PagedCacheGroupConfig`` bindings of the checkouts around TokenSpeed #460 (pre-fix
473124f2, fix 4b3b06de), built with ``--src`` (``build.py`` probes which API a build has).

The runtime's loop is the one ``continuation_state.py`` plays (``submit_requests``,
``next_execution_plan``, "execute" the ``FlatForwardOp`` batches, ``advance``); what differs:

* one allocator per cache group: a History group ``H`` (``FullHistory``, ``16 * pool_pages
  + 1`` pages) and a continuation-state group ``S`` (``family=State``, ``SlidingWindow`` of
  ``window`` tokens, four times as many pages), 2 tokens per page each, required by the
  prefix-cache adjunct with ``state_required`` (else only ``H`` is);
* no ``max_new_tokens`` in a ``RequestSpec``: the runtime's length stop is the ``Finish`` it
  sends (as the 0.1.38+ subject does too);
* no snapshot pool and no host tier here (``disable_l2_cache``): a request the scheduler
  cannot keep it aborts by itself ("Retract failed ... host capacity exhausted, aborting
  request") with no event to the runtime, so the pools are sized for it not to happen;
* no eviction call (``clear_cache`` came later): ``evict`` is a Skip, and quiescence is
  "no request left and no page held for one", not "every page free".

Checked after every op: page-conservation per pool, request-tokens, request-ledger, and
**owned-bounded** as these bindings can judge it (they show no tree).  At the last moment no
request was live, every ``S`` page in use was cached (``base``).  The ``S`` pages in use beyond
``base`` are then those of the requests submitted since: cached pages are only evicted since,
and only they commit.  Each needs its window (``ceil(window / 2)`` pages), the chunk being
written and one page for an unaligned cursor (one that has finished since leaves at most as
much cached); each one past the first may keep one more window alive on a path it shares with
another (the fix keeps a snapshot two requests pass).  More is a superseded continuation-state
snapshot still pinned -- TokenSpeed #460.
"""

from __future__ import annotations

from caches.adapters.tokenspeed.continuation_state import PAGE, TokenSpeedSubject, isolated
from caches.subjects.base import Skip, Subject
from invariants import fail
from invariants.scheduler import check_page_conservation


def _pages(tokens: int) -> int:
    return -(-tokens // PAGE)


class Pre864Subject(TokenSpeedSubject):
    variant = "continuation-state"
    target = "tokenspeed"
    reports_every_chunk = False

    def __init__(self, *, pool_pages: int = 10, window: int = 4, state_required: int = 0,
                 max_scheduled_tokens: int = 4, src: str | None = None, **_):
        Subject.__init__(self)
        from caches.adapters.tokenspeed.loader import module

        ts = self.ts = module(src)
        self.fault, self.kv_events = None, False
        self.window, self.chunk = window, max_scheduled_tokens
        # roomy pools: #460 needs no pressure (one request's chunks show it), and pressure
        # here ends in paths these bindings hide from the runtime -- the scheduler admits on
        # History pages alone, so with equal pools a few concurrent requests and the cached
        # snapshots exhaust S on the fixed commit too (Acquire fails), and a request it
        # cannot retract (no host tier) it aborts with no event the runtime sees
        pages = 16 * pool_pages + 1
        state_pages = 4 * pages
        cfg = ts.SchedulerConfig()
        cfg.page_size = PAGE
        cfg.max_scheduled_tokens = max_scheduled_tokens
        cfg.max_batch_size = 4
        cfg.num_device_pages = pages
        cfg.disable_l2_cache = True
        cfg.disable_prefix_cache = False

        def group(gid, total, retention, family, **kw):
            return ts.PagedCacheGroupConfig(group_id=gid, rows_per_page=PAGE,
                                            entry_stride_tokens=1, total_pages=total,
                                            retention=retention, family=family, **kw)

        cfg.paged_cache_groups = [
            group("H", pages, ts.PagedCacheRetention.FullHistory,
                  ts.PagedCacheGroupFamily.History),
            group("S", state_pages, ts.PagedCacheRetention.SlidingWindow,
                  ts.PagedCacheGroupFamily.State, sliding_window_tokens=window)]
        adjunct = ts.PrefixCacheAdjunctSpec()
        adjunct.required_groups = ["H", "S"] if state_required else ["H"]
        cfg.prefix_cache_adjunct = adjunct
        self.sched = ts.Scheduler(cfg)
        self._start_runtime()
        self.base = 0  # S pages in use when no request was last live (all of them cached)
        self.since_idle: list = []  # requests submitted since then

    # -- the pre-#864 bindings -------------------------------------------------------------
    def _spec(self, sid, tokens, max_new):
        spec = self.ts.RequestSpec()
        spec.request_id = sid
        spec.tokens = list(tokens)
        return spec

    def _submit(self, rid, tokens, max_new):
        out = super()._submit(rid, tokens, max_new)
        if rid in self.requests:
            self.since_idle.append(rid)
        return out

    def _plan_aborts(self, plan):
        return ()  # a pre-#864 plan carries no aborts (the module docstring says why none occur)

    def _forward_tables(self, fwd) -> dict:
        return {g: [list(row) for row in rows]
                for g, rows in dict(fwd.paged_cache_block_tables).items()}

    def _state_written(self, fwd, tables, j, rows) -> list:
        # a sliding table is compacted: its row k is logical page base + k
        base = dict(fwd.paged_cache_block_table_base_offsets).get("S", [0] * (j + 1))[j]
        row = tables.get("S", [[]])[j]
        return [row[k - base] for k in rows if 0 <= k - base < len(row) and row[k - base] > 0]

    def _token_size(self, sid: str) -> int:
        return self.sched.get_request_token_size(sid)

    def _live_tables(self) -> dict:
        # read from the scheduler: a commit may swap a page for a cached twin (the same
        # tokens), freeing it, after the batch that last carried the request
        return self._tables()

    def evict(self, n: int) -> str:
        raise Skip("the pre-#864 scheduler has no eviction call (clear_cache came later): it "
                   "evicts by itself when an allocation needs pages")

    # -- checks ------------------------------------------------------------------------------
    def _available(self) -> dict:
        return {g: self.sched.paged_cache_group_available_pages(g) for g in ("H", "S")}

    def _totals(self) -> dict:
        return {g: self.sched.paged_cache_group_total_pages(g) for g in ("H", "S")}

    def queues(self) -> dict:
        s = self.sched
        return {"waiting": s.waiting_size(), "prefilling": s.prefilling_size(),
                "decoding": s.decoding_size(), "retracted": s.retract_count()}

    def _tables(self) -> dict:
        return {f"r{rid}": {g: [p for p in self.sched.get_request_paged_cache_page_ids(
            self.sid(rid), g) if p > 0] for g in ("H", "S")} for rid in self.requests}

    def check(self) -> None:
        total, free = self._totals(), self._available()
        check_page_conservation(total, free, self._tables(), shared_arena=False)
        self._check_ledger()
        self._check_owned_bounded(total["S"] - 1 - free["S"])

    def _check_owned_bounded(self, in_use: int) -> None:
        """``in_use``: the S pages in use now (see the module's docstring)."""
        if not self.requests:
            self.base, self.since_idle = in_use, []
            return
        n = len(self.since_idle)
        held = in_use - self.base
        # each request: its window, the chunk being written and one page for an unaligned
        # cursor (a finished one: its terminal window, cached); each one past the first may
        # also keep one window alive on a path it shares with another (the fix keeps a
        # snapshot more than one request passes)
        window, chunk = _pages(self.window), _pages(self.chunk)
        bound = n * (window + chunk + 1) + (n - 1) * window
        if held > bound:
            who = ", ".join(f"r{rid} ({self.requests[rid].done} of "
                            f"{len(self.requests[rid].seq)} tokens computed)"
                            if rid in self.requests else f"r{rid} (gone)"
                            for rid in self.since_idle)
            fail("owned-bounded", f"{held} State page(s) are held for {who}, more than the "
                 f"{bound} their windows of {self.window} tokens ({window} pages each), the "
                 f"chunks being written ({chunk} each) and alignment can hold: since no request "
                 f"was last live, S pages in use went {self.base} -> {in_use} with "
                 "only these submitted (superseded continuation-state snapshots stay pinned)",
                 owner=f"r{self.since_idle[0]}", group="S", held=held, bound=bound,
                 base=self.base, window=self.window, live=list(self.since_idle))

    def _settled(self) -> bool:
        return not any(self.queues().values()) and not self.pending

    def _clear_cache(self) -> None:
        pass  # no eviction call in these bindings

    def check_quiescent(self) -> None:
        busy = {k: v for k, v in self.queues().items() if v}
        if busy or self.sched.active_kv_pages():
            fail("sched-quiescence", f"after the drain the scheduler still holds requests "
                 f"{busy} and {self.sched.active_kv_pages()} active KV page(s)", queues=busy,
                 active=self.sched.active_kv_pages())

    def counters(self) -> dict:
        out = {f"free_{g}": n for g, n in self._available().items()}
        out["live"] = len(self.requests)
        out.update(self.queues())
        return out

    def outline(self) -> str:
        lines = [f"free pages: {self._available()} of {self._totals()}; queues "
                 f"{self.queues()}; S in use when last idle: {self.base}"]
        tables = self._tables()
        for rid in self.live():
            r = self.requests[rid]
            lines.append(f"r{rid}: {r.done}/{len(r.seq)} computed, prompt {len(r.tokens)}, "
                         f"sampled {len(r.out)}; tables {tables[f'r{rid}']}")
        return "\n".join(lines)


def make_subject(params, *, fault=None, device=None, known_findings="decline",
                 boundary_fault=None, isolate=True, src=None, **kw):
    """The subject for ``params`` on a checkout with the pre-#864 bindings, in a forked child
    unless ``isolate`` is false; the boundary faults need the 0.1.38+ events and are refused."""
    from caches.adapters.tokenspeed.faults import boundary_fault_of

    bf = boundary_fault or boundary_fault_of(fault)
    if bf:
        raise ValueError(f"boundary fault {bf} needs the bindings of tokenspeed-scheduler "
                         "0.1.38 or later; the checkout has the pre-#864 ones")

    def build():
        return Pre864Subject(pool_pages=params.get("pool_pages", 10),
                             window=params.get("window", 4),
                             state_required=params.get("state_required", 0), src=src, **kw)

    return isolated(build, Pre864Subject, isolate)
