"""Reachability ("sometimes") coverage: does the machine actually reach the interesting
transitions its variant declares?

A variant declares ``VariantSpec.sometimes`` (names); its subject calls
``self.reached(name)`` when that transition happens (``caches/subjects/base.py``; not counted
while ``quiesce`` drains).  The ``Recorder`` sums each example's counts, and this module runs
the Hypothesis machine in every regime for a budget and reports how often each fired.  A
declared transition is required over the regimes *combined* (e.g. a sub-page match only
exists at page_size > 1); one never reached is a failure (``kvcheck coverage`` exits 1, the
nightly job fails).

For the nightly job: ``coverage_report(spec, params, recorder)`` turns one run's recorder into
``{name: count}`` over the declared names; ``merge`` sums reports; ``missing(report)`` lists
the names never reached.

Per-op counts: besides transitions, every regime reports how many times each op of the
variant's table was generated (and applied) -- ``quiesce`` included, run by every example's
teardown.  An op of the table never generated over the regimes combined is a failure too:
its generator is missing or can never fire.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


from caches.target import DECLINE
from state_machines.fuzz import fuzz
from state_machines.lifecycle import declined_ops, unreachable
from state_machines.machine import Recorder

BATCH = 25  # examples per Hypothesis run when spending a time budget


class NotDeclared(ValueError):
    """The variant declares no ``sometimes`` transitions."""


def declared(spec) -> tuple:
    if getattr(spec, "sometimes", None) is None:
        raise NotDeclared(f"variant {spec.name!r} declares no 'sometimes' transitions "
                          "(VariantSpec.sometimes); see docs/model-checking.md")
    return tuple(spec.sometimes)


def coverage_report(spec, params: dict, recorder: Recorder) -> dict:
    """``{name: count}`` for every transition ``spec`` declares, from one run's recorder
    (``params`` is the regime it ran; kept for the report's callers)."""
    return {name: recorder.reached.get(name, 0) for name in declared(spec)}


def merge(*reports: dict) -> dict:
    out: Counter = Counter()
    for r in reports:
        out.update(r)
    names = list(dict.fromkeys(n for r in reports for n in r))
    return {n: out[n] for n in names}


def missing(report: dict) -> list[str]:
    """Declared transitions that never fired."""
    return [name for name, count in report.items() if count == 0]


@dataclass
class RegimeCoverage:
    params: dict
    report: dict
    undeclared: dict  # reached but not declared (a typo on either side, or a new transition)
    examples: int
    steps: int
    seconds: float
    error: str | None = None  # a property failed on the clean cache, or Hypothesis complained
    ops: dict = field(default_factory=dict)  # op of the table -> times generated
    # what the eviction observer saw (caches/subjects/radix.py): passes that freed something,
    # victims reported -- passes without a single victim: the victim checks never ran
    eviction_passes: int = 0
    victims: int = 0
    declined: dict = field(default_factory=dict)  # the target's lifecycle_declined: op -> why


@dataclass
class CoverageResult:
    variant: str
    regimes: list[RegimeCoverage] = field(default_factory=list)

    @property
    def report(self) -> dict:
        return merge(*(r.report for r in self.regimes))

    @property
    def declined(self) -> dict:
        """Lifecycle ops the target declines in every regime (``lifecycle_declined``): op ->
        why.  Neither they nor what only they reach count as missing; the report says so."""
        if not self.regimes:
            return {}
        common = set.intersection(*(set(r.declined) for r in self.regimes))
        return {op: self.regimes[0].declined[op] for op in sorted(common)}

    @property
    def declined_ops(self) -> dict:
        """Ops of the table the declined ones stand for (``schedule`` is enqueue too)."""
        return declined_ops(self.declined)

    @property
    def declined_transitions(self) -> dict:
        """Declared transitions only declined ops reach: name -> those ops."""
        return {k: v for k, v in unreachable(self.declined).items() if k in self.report}

    @property
    def missing(self) -> list[str]:
        return [n for n in missing(self.report) if n not in self.declined_transitions]

    @property
    def op_counts(self) -> dict:
        return merge(*(r.ops for r in self.regimes))

    @property
    def ops_missing(self) -> list[str]:
        """Ops of the table never generated in any regime (those the target declines left
        out)."""
        return [n for n in missing(self.op_counts) if n not in self.declined_ops]

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.regimes if r.error]

    @property
    def victims_unreported(self) -> bool:
        """The target evicted but reported no victim: ``victim`` and ``over-eviction`` never
        ran on it (it declares no eviction observer, docs/adapters.md section 2a)."""
        return sum(r.eviction_passes for r in self.regimes) > 0 and \
            sum(r.victims for r in self.regimes) == 0

    @property
    def ok(self) -> bool:
        return not self.missing and not self.ops_missing and not self.errors

    def to_json(self) -> dict:
        return {"variant": self.variant, "counts": self.report, "missing": self.missing,
                "op_counts": self.op_counts, "ops_missing": self.ops_missing,
                "errors": self.errors, "ok": self.ok,
                "victims_unreported": self.victims_unreported,
                "declined_ops": self.declined_ops,
                "declined_transitions": self.declined_transitions,
                "regimes": [{"params": r.params, "counts": r.report, "undeclared": r.undeclared,
                             "op_counts": r.ops, "examples": r.examples, "steps": r.steps,
                             "seconds": round(r.seconds, 3)} for r in self.regimes]}


def run_regime(spec, params: dict, *, max_examples: int | None = None,
               budget: float | None = None, seed: int | None = None,
               device: str | None = None, target: str = "reference",
               src: str | None = None, known_findings: str = DECLINE) -> RegimeCoverage:
    """Run the clean machine for ``max_examples`` (default: the profile's) or ``budget`` s."""
    params = spec.check_params(params, target)
    names = declared(spec)
    out = fuzz(spec, params, device=device, max_examples=max_examples, budget=budget,
               seed=seed, target=target, src=src, known_findings=known_findings)
    error = out.error
    if out.failed:  # a property broke on the clean cache
        error = f"{out.trace.violation['property']}: {out.trace.violation['message']}"
    reached = out.reached or {}
    report = {name: reached.get(name, 0) for name in names}
    from caches.subjects.radix import PASSES, VICTIMS

    undeclared = {k: v for k, v in reached.items() if k not in names
                  and k not in (PASSES, VICTIMS)}
    ops = {name: (out.op_counts or {}).get(name, 0) for name in spec.ops.names()}
    return RegimeCoverage(params, report, undeclared, out.examples, out.steps, out.seconds,
                          error, ops, reached.get(PASSES, 0), reached.get(VICTIMS, 0),
                          target_declines(spec, params, target, device, src, known_findings))


def target_declines(spec, params, target, device, src, known_findings) -> dict:
    """The lifecycle ops ``target``'s subject declines (``lifecycle_declined``): op -> why."""
    from state_machines.run import Run

    subject = Run(spec, params, None, target, device, src=src,
                  known_findings=known_findings).subject
    return dict(getattr(subject, "lifecycle_declined", None) or {})


def run_coverage(spec, regimes: list[dict] | None = None, *, max_examples: int | None = None,
                 budget: float | None = None, seed: int | None = None,
                 device: str | None = None, target: str = "reference",
                 src: str | None = None, known_findings: str = DECLINE) -> CoverageResult:
    """Every regime of ``spec`` (or ``regimes``); a ``budget`` is split evenly over them."""
    declared(spec)
    regimes = regimes or [spec.check_params(r, target) for r in spec.regimes_for(target)]
    per = budget / len(regimes) if budget is not None else None
    out = CoverageResult(spec.name)
    for params in regimes:
        out.regimes.append(run_regime(spec, params, max_examples=max_examples, budget=per,
                                      seed=seed, device=device, target=target, src=src,
                                      known_findings=known_findings))
    return out
