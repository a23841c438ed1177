"""Two paths of tokenspeed-scheduler 0.1.42 (the pinned wheel), each with the configuration that
reaches it and the controls that do not, through this target's subject
(``caches/adapters/tokenspeed/continuation_state.py``: TokenSpeed's runtime loop, every cache
op completed by the next iteration, kvcheck's checks after every op, then the drain and the
quiescence check).

    python3 tests/upstream_findings/tokenspeed_kv_probe.py

* **tokenspeed-F2** ("the tail's parent page has its KV event hash", ``scheduler.cpp:299``):
  with KV events and a snapshot pool on, memory pressure retracts a request whose first chunk
  stopped mid-page.  The run that reaches it throws; the controls run clean.
* **lightseekorg/tokenspeed #620's review** (a retraction write-back of a device snapshot the
  retracted request's table still borrows): with a host tier, the retraction's L2 leg (a
  ``WriteBackOp`` in the same plan as the ``SnapshotOp``) copies a page the victim's table held
  and another live request's table held too.  The probe counts those plans and shows that
  every check, the drain and quiescence stay clean.  On 0.1.42 the hazard has no form: the
  retraction releases the victim's tables and a restore rebuilds an empty one
  (``docs/engines/tokenspeed.md``).

Prints one line per run; exits 0 when each run ends as the table in the docs says, 1 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from caches.adapters.tokenspeed.continuation_state import TokenSpeedSubject  # noqa: E402
from caches.subjects.base import Skip  # noqa: E402


class Watched(TokenSpeedSubject):
    """Counts the plans whose retraction write-back copies a page two live requests held."""

    borrowed_write_backs = 0

    def _iterate(self):
        before = {rid: {p for ps in r.tables.values() for p in ps}
                  for rid, r in self.requests.items()}
        plans = []
        self.sched = _Tap(self.sched, plans)
        try:
            return super()._iterate()
        finally:
            self.sched = self.sched.inner
            for plan in plans:
                self._look(plan, before)

    def _look(self, plan, before) -> None:
        victims = [self._rid_of(s) for op in plan.cache if type(op).__name__ == "SnapshotOp"
                   for s in op.request_ids]
        copied = {p for op in plan.cache if type(op).__name__ == "WriteBackOp"
                  for pages in op.src_pages for p in pages}
        for v in victims:
            for p in copied & before.get(v, set()):
                if any(p in pages for o, pages in before.items() if o != v):
                    self.borrowed_write_backs += 1


class _Tap:
    def __init__(self, inner, plans):
        self.inner, self.plans = inner, plans

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def next_execution_plan(self):
        plan = self.inner.next_execution_plan()
        self.plans.append(plan)
        return plan


def run(ops, **config) -> tuple[str, int]:
    s = Watched(**config)
    try:
        for name, *args in ops:
            try:
                getattr(s, name)(*args)
            except Skip:
                pass
            s.check()
        s.drain()
        s.check_quiescent()
    except Exception as exc:  # noqa: BLE001  the engine's throw or a kvcheck property
        return f"{type(exc).__name__}: {str(exc)[:110]}", s.borrowed_write_backs
    return "clean", s.borrowed_write_backs


# F2: no prefix sharing, no forced retraction; memory pressure retracts r0 at token 7 of 14
F2 = [("enqueue", 1, [106], 8), ("enqueue", 0, [107] * 14, 0), ("enqueue", 2, [108], 8),
      ("step", 2), ("step", 1)]
F2_BASE = dict(pool_pages=8, snapshot_pages=16, retraction_interval=0, kv_events=True)
# #620: r0 publishes its prompt-end State checkpoint; r1 and r3 hit it; the forced retraction
# suspends r0 while its table still holds it; with a host tier the retraction writes it back
A1 = [("enqueue", 2, [0, 0, 1], 0), ("enqueue", 0, [0], 3), ("step", 2), ("step", 0),
      ("enqueue", 1, [0, 1], 8), ("enqueue", 3, [0, 0, 0], 1), ("step", 3),
      ("enqueue", 2, [0], 0), ("step", 0), ("step", 2)] + [("step", 1)] * 5
A_BASE = dict(pool_pages=8, snapshot_pages=16, retraction_interval=5, kv_events=False,
              host_pages=4)

RUNS = [  # (title, ops, config, expected outcome prefix, borrowed write-backs expected?)
    ("F2 reaches it: KV events on, pool 8, snapshot pool", F2, F2_BASE,
     "RuntimeError: the tail's parent page has its KV event hash", None),
    ("F2 control: KV events off", F2, {**F2_BASE, "kv_events": False}, "clean", None),
    ("F2 control: no snapshot pool", F2, {**F2_BASE, "snapshot_pages": 1}, "clean", None),
    ("F2 control: r1's prompt 2 tokens (r0's chunk ends on a page)",
     [("enqueue", 1, [106, 106], 8)] + F2[1:], F2_BASE, "clean", None),
    ("#620 situation: host tier 4, forced retraction", A1, A_BASE, "clean", True),
    ("#620 control: no host tier", A1, {**A_BASE, "host_pages": 0}, "clean", False),
]


def main() -> int:
    ok = True
    for title, ops, config, want, borrowed in RUNS:
        got, n = run(ops, **config)
        good = got.startswith(want) and (borrowed is None or (n > 0) == borrowed)
        ok &= good
        extra = "" if borrowed is None else f"; retraction write-backs of a shared page: {n}"
        print(f"{'ok ' if good else 'BAD'} {title}: {got}{extra}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
