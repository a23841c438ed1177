"""The pre-merge gate: replay the regression corpus, then a fixed, derandomised budget per
variant/regime/target, then one verdict table.

A corpus trace must pass now, unless it is a known upstream finding, which must still fail.
The fuzz part uses the ``ci`` profile (derandomised: the same examples on every run), so the
gate's verdict depends only on the code.

A gate cannot pass by accident: skipped checks are counted and shown, and a kind of check the
gate was asked to run (replaying the corpus; fuzzing) that ran none at all -- no traces, or every
one skipped -- is a failed check of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from state_machines.nightly import _takes_src, target_available
from state_machines.regressions import (REGRESSIONS, UPSTREAM_FINDINGS,
                                        replay_corpus)


def _other_release(trace, src=None) -> str | None:
    """Why a known finding recorded on another release of its engine is not judged here (None
    when the installed release is the recorded one, or either is unknown)."""
    if trace is None:
        return None
    engine, version = _recorded_release(trace)
    if not version:
        return None
    from state_machines.run import target_identity
    from state_machines.variants import all_variants

    try:
        now = target_identity(all_variants()[trace.variant], trace.target, src or trace.src)
    except Exception:  # noqa: BLE001  no identity to compare with: judge it as recorded
        return None
    if now is None or not now.version or now.version == version:
        return None
    return (f"recorded on {engine} {version}; it does not reproduce as recorded on the "
            f"installed {now.version} (another release: replay it in {version}'s own env)")


def shown_path(path: Path) -> str:
    """A corpus trace's name in the verdicts: relative to the working directory when under it
    (``tests/regressions/x.json`` in a checkout), else its folder and file (``regressions/x.json``
    from an installed corpus; ``corpus_note`` says where that is)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(Path(path.parent.name, path.name))


def corpus_note(dirs) -> str | None:
    """The line that says where the corpus replayed is, when it is outside the working
    directory (an installed kvcheck's own), else None."""
    outside = [str(Path(d).resolve()) for d in dirs
               if not Path(d).resolve().is_relative_to(Path.cwd().resolve())]
    return f"corpus: {', '.join(outside)}" if outside else None


def _recorded_release(trace) -> tuple[str, str]:
    """(engine, version) the trace was recorded on: its identity, else a hand-kept finding's
    ``meta.upstream`` (``sglang==0.5.12.post1``)."""
    if trace.identity is not None and trace.identity.version:
        return trace.identity.engine, trace.identity.version
    engine, _, version = str((trace.meta or {}).get("upstream", "")).partition("==")
    return engine, version.strip()


@dataclass
class Verdict:
    what: str
    detail: str
    ok: bool
    skipped: bool = False
    outcome: object = None  # a failing FuzzOutcome, to print
    harness: bool = False  # kvcheck itself failed here (never the engine's verdict)


class GateVerdicts(list):
    """The gate's verdicts (a list of ``Verdict``), and which engine code it gated:
    ``gated`` maps each engine target fuzzed at least once to its ``Identity``;
    ``not_gated`` each engine target skipped in every variant/regime to the first reason."""

    def __init__(self):
        super().__init__()
        self.gated: dict = {}
        self.not_gated: dict = {}


DEFAULT_BUDGET = 540.0  # seconds: the whole gate fits 10 minutes on 2 cores with room to spare
# a fuzz item's share goes to Hypothesis first, then to the native engine's walks (which find
# deep bugs sooner: docs/benchmarks.md), which keep part of theirs for shrinking
HYPOTHESIS_SHARE = 0.5
NATIVE_SHRINK_SHARE = 0.25
# the native engine's walks per Hypothesis example (--max-examples, else the profile's): the
# walks are bounded by count as well as by the share, so a gate with a long budget still ends
# when its examples are done, as it did with Hypothesis alone
NATIVE_WALKS_PER_EXAMPLE = 2


def fuzz_both(spec, params, *, target, max_examples, src, known_findings, seed, share,
              stop_on_first):
    """One gate item: Hypothesis (derandomised, the ``ci`` profile), then the native engine
    (seed 0, or ``seed``) within what is left of ``share`` seconds, shrinking included; one
    outcome with the distinct failures of both (``walks``: the native engine's walks)."""
    import time

    from hypothesis import settings

    from state_machines.failures import Ledger
    from state_machines.fuzz import fuzz
    from state_machines.native import native_fuzz

    started = time.monotonic()
    o = fuzz(spec, params, target=target, max_examples=max_examples, out_dir="kvcheck-traces",
             src=src, known_findings=known_findings, seed=seed,
             time_cap=None if share is None else share * HYPOTHESIS_SHARE,
             stop_on_first=stop_on_first)
    o.walks = 0
    if o.interrupted or o.error or (stop_on_first and o.failed):
        return o
    left = None if share is None else max(0.0, share - (time.monotonic() - started))
    if left is not None and left < 0.5:
        return o
    n = native_fuzz(spec, params, target=target, src=src, known_findings=known_findings,
                    seed=seed if seed is not None else 0, workers=1, out_dir="kvcheck-traces",
                    budget=None if left is None else left * (1 - NATIVE_SHRINK_SHARE),
                    shrink_budget=60.0 if left is None else left * NATIVE_SHRINK_SHARE,
                    max_walks=NATIVE_WALKS_PER_EXAMPLE * (max_examples
                                                          or settings.default.max_examples),
                    stop_on_first=stop_on_first)
    ledger = Ledger()
    for f in o.failures:
        ledger.failures[f.signature] = f
    mine, offset = Ledger(), time.monotonic() - started - n.seconds  # when the walks began
    for f in n.failures:
        f.first_seen += offset
        mine.failures[f.signature] = f
    ledger.merge(mine)
    o.failures = list(ledger)  # (each engine labelled its own known findings)
    o.walks, o.steps = n.examples, o.steps + n.steps
    o.interrupted = n.interrupted
    o.capped = o.capped or (left is not None and n.seconds >= left * 0.9)
    if o.failures and o.trace is None:
        o.trace, o.trace_path = o.failures[0].trace, o.failures[0].trace_path
    o.seconds = time.monotonic() - started
    return o


def _engine_of(target: str) -> str | None:
    from state_machines.targets import get_target

    try:
        return get_target(target).engine
    except Exception:  # noqa: BLE001  an unknown/broken target has no engine to share --src
        return None


def _substitute(spec, params, target, src) -> dict | None:
    """The regime ``target`` runs in place of ``params`` it cannot run here
    (``Target.params_substitute``: what ``kvcheck fuzz`` runs instead, saying so), when that
    one is available here; else None."""
    if target == "reference" or target in spec.extra_targets:
        return None
    from state_machines.targets import params_substitute

    alt = params_substitute(target, spec.name, params, src)
    if alt is None or target_available(spec, alt, target, src) is not None:
        return None
    return alt


def run_gate(*, variants=None, corpus_dirs=(REGRESSIONS, UPSTREAM_FINDINGS), fuzz_too=True,
             max_examples=None, progress=None, targets=None, src=None,
             known_findings="decline", budget=None, seed=None,
             stop_on_first=False, started=None) -> GateVerdicts:
    """Replay the corpus, then fuzz every variant x regime x target (``targets`` narrows the
    targets; each one asked for must be gated somewhere, else a failed check names it).
    ``src``: the engine checkout the targets that take one load, for the fuzz part and for
    replaying traces of the same engine.  ``budget`` (seconds) bounds the whole gate: each
    fuzz item gets the time left / the items left, and stops between examples when its share
    is spent.  ``seed``: Hypothesis's seed for every fuzz item (default: derandomised).
    ``started``: when the budget began (``time.monotonic()``; the CLI passes the command's
    start, so start-up counts too; default: now)."""
    import dataclasses
    import time

    from state_machines.run import target_identity
    from state_machines.variants import all_variants

    started = time.monotonic() if started is None else started
    specs = all_variants()
    verdicts = GateVerdicts()
    src_engines = {_engine_of(t) for t in targets or () if src and _takes_src(t)}

    def src_of(trace):
        """The gate's --src for a trace of the engine under review, else the trace's own."""
        if src and trace.target != "reference" and _engine_of(trace.target) in src_engines \
                and _takes_src(trace.target):
            return dataclasses.replace(trace, src=src)
        return trace

    def skip_target(target, trace_src=None):
        from state_machines.targets import unavailable_reason

        if target == "reference":
            return None
        if trace_src is not None and not Path(trace_src).is_dir():
            from state_machines.snapshots import missing_src

            return missing_src(trace_src)
        return unavailable_reason(target, trace_src)

    dirs = [Path(d) for d in corpus_dirs]
    replayed = 0
    entries = replay_corpus(*dirs, skip_target=skip_target, adjust=src_of)
    for entry in entries:
        name = shown_path(entry.path)
        if entry.error and entry.error.startswith("skipped"):
            verdicts.append(Verdict(f"replay {name}", entry.error, True, skipped=True))
            continue
        replayed += 1
        if entry.error:
            verdicts.append(Verdict(f"replay {name}", entry.error, False))
            continue
        r = entry.result
        if entry.expect_failure:
            want = (entry.trace.violation or {}).get("property") if entry.trace else None
            other = _other_release(entry.trace)
            step = (entry.trace.violation or {}).get("step") if entry.trace else None
            as_recorded = entry.ok and (step is None or r.failed_step == step)
            if not as_recorded and other and r.violation is not None and (
                    not entry.ok or (step is not None and r.failed_step < step)):
                # another release, and the engine breaks sooner or on another property: the
                # cache is still broken here, so it fails the gate (docs/gating.md)
                verdicts.append(Verdict(f"replay {name}", (
                    f"fails differently: recorded {want} at step {step}, now "
                    f"{r.violation.prop} at step {r.failed_step}: {r.violation.message}"),
                    False))
                if progress:
                    progress(verdicts[-1])
                continue
            if not as_recorded and other:
                # not this release's finding (it no longer fails here, or fails later on its
                # own property): its own env replays it (never a silent pass)
                verdicts.append(Verdict(f"replay {name}", f"skipped: {other}", True,
                                        skipped=True))
                continue
            if r.violation is None:
                detail = "known upstream finding no longer reproduces: upstream fixed it?"
            elif entry.ok:
                detail = f"still fails on {r.violation.prop} (known upstream finding)"
            else:
                detail = (f"known upstream finding now fails on {r.violation.prop}, not on its "
                          f"own property {want}: {r.violation.message}")
        else:
            detail = ("passes" if r.violation is None else
                      f"{r.violation.prop} at step {r.failed_step}: {r.violation.message}")
        verdicts.append(Verdict(f"replay {name}", detail, entry.ok))
        if progress:
            progress(verdicts[-1])
    if replayed == 0:
        why = (f"all {len(entries)} saved traces were skipped" if entries else
               "no saved traces in " + ", ".join(map(str, dirs)))
        verdicts.append(Verdict("replay corpus", f"nothing replayed: {why}", False))
        if progress:
            progress(verdicts[-1])
    if not fuzz_too:
        return verdicts
    # the plan: every item, and why each skipped one is skipped, before any runs (so the
    # budget is split over the items that run)
    items, skipped_why = [], {}
    for name in variants or list(specs):
        spec = specs[name]
        for params, target in spec.plan(spec.targets):
            if targets and target not in targets:
                continue
            label = f"fuzz {name} " + " ".join(f"{k}={v}" for k, v in params.items()) + (
                f" [{target}]" if target != "reference" else "")
            tsrc = src if target != "reference" and _takes_src(target) else None
            why = target_available(spec, params, target, tsrc)
            alt = _substitute(spec, params, target, tsrc) if why else None
            if alt is not None:
                # the regime the target runs in its place, as ``kvcheck fuzz`` does; the
                # verdict line says which parameter changed and why
                label += " (" + " ".join(f"{k}={params.get(k)} -> {alt[k]}" for k in alt
                                         if alt[k] != params.get(k)) + f": {why})"
                if any(it[1] == alt and it[2] == target and it[0] is spec for it in items):
                    verdicts.append(Verdict(label, "skipped: the same regime runs as another "
                                            "item already", True, skipped=True))
                    continue
                params, why = alt, None
            if why:
                verdicts.append(Verdict(label, f"skipped: {why}", True, skipped=True))
                if target != "reference" and target not in spec.extra_targets:
                    skipped_why.setdefault(target, why)
                continue
            items.append((spec, params, target, tsrc, label))
    fuzzed = 0
    for i, (spec, params, target, tsrc, label) in enumerate(items):
        share = None
        if budget is not None:
            share = max(0.0, budget - (time.monotonic() - started)) / (len(items) - i)
        fuzzed += 1
        o = fuzz_both(spec, params, target=target, max_examples=max_examples, src=tsrc,
                      known_findings=known_findings, seed=seed, share=share,
                      stop_on_first=stop_on_first)
        if o.interrupted:  # Ctrl-C: stop the gate (exit 3), never count it as clean
            raise KeyboardInterrupt
        if target != "reference" and target not in spec.extra_targets \
                and target not in verdicts.gated:
            verdicts.gated[target] = target_identity(spec, target, tsrc)
        capped = f" (its {share:.0f}s share of --budget ran out)" if o.capped else ""
        failing = [f for f in o.failures if f.counts]
        if o.error:
            verdicts.append(Verdict(label, f"harness error (kvcheck failed, not the engine): "
                                    f"{o.error}", False, harness=True))
        elif failing:
            verdicts.append(Verdict(label, ", ".join(
                f"{f.signature.prop}" + (f" (known {f.known})" if f.known else "")
                for f in failing) + f" ({o.examples} examples)", False, outcome=o))
        elif o.failures:  # known findings the run declined, met another way
            verdicts.append(Verdict(label, "clean but for known findings " + ", ".join(
                sorted({f.known for f in o.failures})) + f": {o.examples} examples, "
                f"{o.walks} walks{capped}", True, outcome=o))
        else:
            verdicts.append(Verdict(label, f"clean: {o.examples} examples, {o.walks} walks, "
                                    f"{o.steps} steps in {o.seconds:.1f}s{capped}", True))
        if progress:
            progress(verdicts[-1])
    verdicts.not_gated = {t: why for t, why in skipped_why.items() if t not in verdicts.gated}
    for target in targets or ():
        if target in verdicts.gated or target == "reference":
            continue
        why = verdicts.not_gated.get(target) or "no variant/regime asked for has it"
        verdicts.append(Verdict(f"gate {target}", f"target {target} was not gated: {why}",
                                False))
        if progress:
            progress(verdicts[-1])
    if fuzzed == 0:
        verdicts.append(Verdict("fuzz", "nothing fuzzed: every variant/regime/target was "
                                "skipped", False))
    return verdicts
