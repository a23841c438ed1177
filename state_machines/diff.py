"""Differential mode: every example runs on the reference subject and on an upstream one, in
lockstep, and the first step where what they report differs is a failure Hypothesis shrinks.

Where both subjects declare an ``abstract_state()`` (radix: the cached token paths with their
locks, the counters, the live requests), the comparison is on *state*, not words: after each
step the two states must agree on every field both report -- so a driver that follows its
engine's scheduler (and words its results its own way) is compared with the reference as is.
A difference the upstream target declares (``caches.seam.Difference`` in its
``policy.differences``: the ops where it may show, the fields that may differ, the reason) is
reported as "differs as declared", not as a failure; the two sides have then diverged as
declared in those fields, which the rest of that example no longer compares -- every other
field still is, step by step (each side's invariants still run).
Subjects without an abstract state are compared as before: per step the op's result (its words
carry what a caller sees: hit length, tokens allocated/evicted, out-of-memory, skipped or not)
and, after it, the counters both report (evictable, protected, free pages, live requests).  An invariant
broken on either side stops the run too, labelled with the side.  The shrunk trace is saved
with the upstream target (``kvcheck replay`` runs it on the upstream alone) and
``meta.differential``; ``replay_diff`` re-runs it on both and returns the step table.

An upstream subject may define ``prepare_for_diff()`` (e.g. to use the reference's allocation
policy, so the diff compares caches, not schedulers) -- skipped with ``same_driver=False``.
Ops an upstream subject declines as a ``KnownUpstreamFinding`` are skipped on both sides.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from caches.adapters import KnownUpstreamFinding
from caches.target import DECLINE
from caches.subjects.base import NotDriven, Skip, Subject
from invariants import Violation
from state_machines.fuzz import fuzz
from state_machines.ops import Op
from state_machines.run import Run, target_identity
from state_machines.trace import Trace
from state_machines.variants import get_variant

PROP = "divergence"


@dataclass
class DiffStep:
    index: int  # 1-based
    words: str
    reference: str
    upstream: str
    reference_counters: dict = field(default_factory=dict)  # the abstract state, or counters
    upstream_counters: dict = field(default_factory=dict)
    by_state: bool = False  # compared on abstract state (the words are shown, not compared)
    declared: str | None = None  # the declared difference this step showed, if any
    op: str | None = None

    @property
    def differs(self) -> bool:
        if self.declared:
            return False
        words = not self.by_state and self.reference != self.upstream
        return words or self.counter_diff() != {}

    def counter_diff(self) -> dict:
        common = self.reference_counters.keys() & self.upstream_counters.keys()
        return {k: (self.reference_counters[k], self.upstream_counters[k]) for k in sorted(common)
                if self.reference_counters[k] != self.upstream_counters[k]}


class PairSubject(Subject):
    """Two subjects driven as one: ops go to both, results and counters must agree."""

    def __init__(self, reference, upstream, target: str, describe=None,
                 against: str = "reference", declared_seen: Counter | None = None):
        self.reference, self.upstream, self.target = reference, upstream, target
        self.against = against  # the first side's label: the reference, or another target
        self.describe = describe or (lambda op: str(op.to_json()))
        self.variant = getattr(reference, "variant", "?")
        self.log: list[DiffStep] = []
        self._pending: DiffStep | None = None
        self.by_state = all(callable(getattr(s, "abstract_state", None))
                            for s in (reference, upstream))
        policy = getattr(upstream, "policy", None)
        self.declared = tuple(getattr(policy, "differences", ()) or ())
        self.accepted = None  # the declared difference this example first diverged by
        self.accepted_all: set = set()  # every declared difference it diverged by
        self.covered: set = set()  # the fields those declarations cover (no longer compared)
        self.declared_seen = declared_seen if declared_seen is not None else Counter()

    # the machine reads the ledger (live requests, held locks) from the reference side
    @property
    def requests(self):
        return self.reference.requests

    @property
    def locks(self):
        return self.reference.locks

    @property
    def reached_counts(self):
        return self.reference.reached_counts

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self.reference, name)
        if not callable(attr):
            return attr  # state a machine's preconditions read (e.g. the reference's cache)
        return lambda **args: self._apply(name, args)

    def _side(self, subject, label, name, args):
        try:
            return getattr(subject, name)(**args), None
        except KnownUpstreamFinding:
            raise
        except Skip as why:
            return f"skipped: {why}", why
        except Violation as v:
            raise _labelled(v, label) from v
        except Exception as exc:
            raise Violation("crash", f"[{label}] {type(exc).__name__} in the cache during "
                            f"{name}: {exc}", exception=type(exc).__name__, side=label) from exc

    def _apply(self, name: str, args: dict) -> str:
        up, up_skip = self._side(self.upstream, self.target, name, args)  # may decline first
        if isinstance(up_skip, NotDriven):  # an op the target cannot take: nothing to compare
            raise up_skip
        ref, ref_skip = self._side(self.reference, self.against, name, args)
        step = DiffStep(len(self.log) + 1, self.describe(Op(name, args)), ref, up,
                        by_state=self.by_state, op=name)
        self.log.append(step)
        self._pending = step
        if self.by_state and self.accepted is None and (ref_skip is None) != (up_skip is None):
            raise Violation(PROP, f"{name}: {self.against} says {ref!r}, {self.target} says "
                            f"{up!r}", op=name, reference=ref, upstream=up)
        if not self.by_state and ref != up:
            raise Violation(PROP, f"{name}: {self.against} says {ref!r}, {self.target} says {up!r}",
                            op=name, reference=ref, upstream=up)
        if ref_skip is not None:
            raise ref_skip
        return ref

    def check(self) -> None:
        for subject, label in ((self.reference, self.against), (self.upstream, self.target)):
            try:
                subject.check()
            except Violation as v:
                raise _labelled(v, label) from v
        self._compare_counters()

    def _compare_counters(self) -> None:
        step = self._pending or DiffStep(0, "the drain", "", "", by_state=self.by_state)
        read = (lambda s: s.abstract_state()) if self.by_state else (lambda s: s.counters())
        step.reference_counters = read(self.reference)
        step.upstream_counters = read(self.upstream)
        # once diverged as declared, the fields the declaration covers are no longer compared;
        # every other field still is, to the end of the example
        diff = {k: v for k, v in step.counter_diff().items() if k not in self.covered}
        if not diff:
            return
        for d in self.declared:
            if d.accepts(step.op, diff):
                step.declared = d.name
                self.accepted = self.accepted or d.name
                self.covered |= set(d.fields)
                if d.name not in self.accepted_all:
                    self.accepted_all.add(d.name)
                    self.declared_seen[d.name] += 1
                return
        what = ", ".join(f"{k} {_short(a)} vs {_short(b)}" for k, (a, b) in diff.items())
        kind = "state" if self.by_state else "counters"
        raise Violation(PROP, f"after {step.words}: {kind} differ ({self.against} vs "
                        f"{self.target}): {what}",
                        counters={k: [_short(a), _short(b)] for k, (a, b) in diff.items()})

    def quiesce(self) -> str:
        self._pending = None
        for subject, label in ((self.reference, self.against), (self.upstream, self.target)):
            try:
                subject.quiesce()
            except Violation as v:
                raise _labelled(v, label) from v
        return "drained both: only the root is left and every pool is full"

    def drain(self) -> None:
        self.reference.drain()
        self.upstream.drain()

    def check_quiescent(self) -> None:
        self.reference.check_quiescent()
        self.upstream.check_quiescent()

    def counters(self) -> dict:
        return self.reference.counters()

    def tree_view(self):
        return self.reference.tree_view()

    def outline(self) -> str:
        return (f"{self.against}:\n{self.reference.outline()}\n{self.target}:\n"
                f"{self.upstream.outline()}")


def _short(value, limit: int = 160):
    """A state field for a message: numbers as they are, anything long cut short."""
    if isinstance(value, (int, float, str)) and len(repr(value)) <= limit:
        return value
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _labelled(v: Violation, label: str) -> Violation:
    if v.message.startswith("["):
        return v
    out = Violation(v.prop, f"[{label}] {v.message}", **v.details, side=label)
    out.step = getattr(v, "step", None)
    return out


def pair_name(target: str, against: str = "reference") -> str:
    return f"{against}~{target}"


def pair_spec(spec, target: str, *, same_driver: bool = True, against: str = "reference",
              src: str | None = None, known_findings: str = DECLINE,
              declared_seen: Counter | None = None):
    """``spec`` with one more (unregistered) target, ``<against>~<target>``, whose subject is
    the pair: ``against`` (the reference, or another target: SGLang's two tree cores checked
    against each other) on the first side, ``target`` on the second.  ``declared_seen``
    counts the examples that diverged by a declared difference (per difference)."""
    if target == against or target not in spec.targets or against not in spec.targets:
        raise KeyError(f"cannot diff {target!r} against {against!r} for {spec.name}; its "
                       f"targets: {', '.join(spec.targets)}")

    def src_of(name):  # --src is the checkout of the side(s) that take one, not the reference
        return src if _takes_src(name) else None

    def make(params, fault, device):
        theirs = spec.params_for(against)  # the other side runs the parameters it knows
        ref = spec.make_subject({k: v for k, v in params.items() if k in theirs},
                                target=against, device=device, src=src_of(against),
                                known_findings=known_findings)
        up = spec.make_subject(params, target=target, device=device, src=src_of(target),
                               known_findings=known_findings)
        if same_driver and against == "reference" and hasattr(up, "prepare_for_diff"):
            up.prepare_for_diff()
        return PairSubject(ref, up, target, spec.ops.describe, against=against,
                           declared_seen=declared_seen)

    return dataclasses.replace(spec, extra_targets={**spec.extra_targets,
                                                    pair_name(target, against): make})


def _takes_src(name: str) -> bool:
    from state_machines.targets import get_target

    return get_target(name).takes_src


@dataclass
class DiffResult:
    variant: str
    target: str
    params: dict
    against: str = "reference"
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0
    trace: Trace | None = None  # the shrunk diverging (or failing) run, if any
    trace_path: Path | None = None
    table: list[DiffStep] = field(default_factory=list)  # the trace replayed on both
    error: str | None = None
    # declared differences seen: name -> (reason, examples that diverged by it)
    declared: dict = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        return self.trace is not None and self.trace.violation is not None

    @property
    def prop(self) -> str | None:
        return self.trace.violation["property"] if self.diverged else None


def run_diff(variant: str, target: str, params: dict | None = None, max_examples: int | None = None,
             seed: int | None = None, *, device: str | None = None, budget: float | None = None,
             out_dir: str | Path | None = None, same_driver: bool = True,
             against: str = "reference", src: str | None = None,
             known_findings: str = DECLINE) -> DiffResult:
    """Run ``variant``'s machine on ``against`` (the reference by default) and ``target``
    side by side (one regime)."""
    spec = get_variant(variant)
    params = spec.check_params(params or {}, target)
    seen: Counter = Counter()
    pspec = pair_spec(spec, target, same_driver=same_driver, against=against, src=src,
                      known_findings=known_findings, declared_seen=seen)
    out = fuzz(pspec, params, target=pair_name(target, against), device=device,
               max_examples=max_examples, budget=budget, seed=seed)
    res = DiffResult(spec.name, target, params, against, out.examples, out.steps,
                     out.seconds, error=out.error)
    if seen:
        up = spec.make_subject(params, target=target, device=device,
                               src=src if _takes_src(target) else None,
                               known_findings=known_findings)
        reasons = {d.name: d.reason for d in up.policy.differences}
        res.declared = {name: (reasons.get(name, ""), n) for name, n in sorted(seen.items())}
    if out.trace is not None:
        trace = out.trace
        trace.target, trace.src, trace.known_findings = target, src, known_findings
        trace.identity = target_identity(spec, target, src)
        trace.meta["differential"] = against
        res.trace = trace
        res.table = replay_diff(trace, device=device, same_driver=same_driver)[0]
        if out_dir is not None:
            res.trace_path = trace.save(out_dir)
    return res


def replay_diff(trace: Trace, *, device: str | None = None, same_driver: bool = True):
    """Re-run a trace on the reference and its upstream target side by side.

    Returns ``(steps, violation)``: one ``DiffStep`` per op applied, and the violation the run
    ended in (None if both sides agreed throughout)."""
    spec = get_variant(trace.variant)
    against = trace.meta.get("differential", "reference")
    if not isinstance(against, str):
        against = "reference"
    pspec = pair_spec(spec, trace.target, same_driver=same_driver, against=against,
                      src=trace.src, known_findings=trace.known_findings)
    run = Run(pspec, trace.params, None, pair_name(trace.target, against), device)
    try:
        for op in trace.ops:
            run.step(op)
    except Violation as v:
        return run.subject.log, v
    return run.subject.log, None


def format_diff(res: DiffResult, regime: str | None = None) -> str:
    """The outcome in words: agreement, or the steps up to the first difference, side by side."""
    from state_machines.commands.common import describe_regime

    regime = regime or describe_regime(res.params)
    head = (f"diff {res.variant} {regime}: {res.against} vs {res.target}, {res.examples} examples, "
            f"{res.steps} steps, {res.seconds:.1f}s")
    if res.error:
        return f"{head}: the harness failed: {res.error}"
    declared = "".join(f"\n  differs as declared: {name} ({n} example(s)): {reason}"
                       for name, (reason, n) in res.declared.items())
    if not res.diverged:
        return f"{head}: no difference" + (" beyond the declared" + declared if declared
                                           else "")
    v = res.trace.violation
    spec = get_variant(res.variant)
    lines = [head, ""]
    if v["property"] == PROP:
        lines.append(f"DIFFERS at step {v['step']}: {v['message']}")
    else:
        lines.append(f"FAILED at step {v['step']} on {v['property']}: {v['message']}")
    rows = [["step", "op", res.against, res.target]]
    for i, op in enumerate(res.trace.ops, 1):
        st = res.table[i - 1] if i <= len(res.table) else None
        ref, up = (st.reference, st.upstream) if st else ("", "")
        mark = "  <-- differs" if st is not None and st.differs else ""
        rows.append([str(i), spec.ops.describe(op), ref, up + mark])
    widths = [max(len(r[c]) for r in rows) for c in range(3)]
    for r in rows:
        lines.append("  " + "  ".join(r[c].ljust(widths[c]) for c in range(3)) + "  " + r[3])
    last = res.table[-1] if res.table else None
    if last is not None and last.counter_diff():
        lines.append(f"counters after the last step ({res.against} vs "
                     f"{res.target}): " + ", ".join(f"{k} {a} vs {b}" for k, (a, b)
                                                    in last.counter_diff().items()))
    if res.trace_path:
        lines.append(f"trace saved: {res.trace_path}")
    return "\n".join(lines) + declared
