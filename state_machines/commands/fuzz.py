"""``kvcheck fuzz``: fuzz one variant (every regime); print and save a failure."""

from __future__ import annotations

import os
import sys
import time

from state_machines.commands.common import (EXIT_FAIL, EXIT_HARNESS, EXIT_INTERRUPTED, EXIT_OK,
                                            HARNESS_WORDS, UsageError,
                                            add_target_args, describe_regime, device_named,
                                            failure_table, failures_to_print, fault_named,
                                            format_table, identity_lines, known_findings_named,
                                            names_known, print_failure, regimes_from_args,
                                            target_named, variant_named, writable_dir)

from state_machines.failures import Ledger

# the engine mix when --engine is not given (measured: docs/benchmarks.md, "Time to find the
# known findings"): neither engine finds every finding first, so both run; --max-examples is
# Hypothesis's own notion of a budget, so it runs Hypothesis alone
def default_engine(args) -> str:
    return "hypothesis" if args.max_examples else "both"


# without --budget the whole command is still bounded (README, "Using it"): Hypothesis runs
# the profile's examples and the native engine NATIVE_WALKS_PER_EXAMPLE walks per example
# (a walk costs a fraction of an example), each item within its share of DEFAULT_BOUND
DEFAULT_BOUND = 300.0
NATIVE_WALKS_PER_EXAMPLE = 5
# of an item's share, what the native engine keeps for shrinking what its walks found
NATIVE_SHRINK_SHARE = 0.25
# seconds kept back from --budget for printing the failures at the end (each is replayed)
REPORT_RESERVE = 1.0
# every item runs, however little is left (start-up can eat a small budget): at least this
# long, within the 5 s a budget may run over
MIN_SHARE = 0.25

# progress lines: after every batch on a terminal; at most one per PROGRESS_EVERY seconds
# when stderr is a file or a CI log
PROGRESS_EVERY = 15.0


class Throttle:
    """True at most once per ``every`` seconds (always, with ``every`` 0)."""

    def __init__(self, every: float, clock=time.monotonic):
        self.every, self.clock, self.last = every, clock, None

    def __call__(self) -> bool:
        now = self.clock()
        if self.last is not None and now - self.last < self.every:
            return False
        self.last = now
        return True


def add_parser(sub) -> None:
    p = sub.add_parser("fuzz", help="fuzz one variant; on failure print and save the trace")
    p.add_argument("variant")
    p.add_argument("--fault", help="switch on a catalogued fault (e.g. R1)")
    add_target_args(p)
    p.add_argument("--engine", choices=("hypothesis", "native", "both"),
                   help="hypothesis: Hypothesis's stateful engine (example database; "
                   "--shrinker); native: seeded swarm random walks from the same op generators, "
                   "many more steps per second, shrunk at the trace level; both: each regime's "
                   "budget split between the two.  Default: both with --budget, hypothesis "
                   "otherwise (docs/benchmarks.md, \"Time to find the known findings\")")
    p.add_argument("--shrinker", choices=("kvcheck", "hypothesis"), default="kvcheck",
                   help="what shrinks a failure the Hypothesis engine found: kvcheck's own "
                   "shrinker (default: delta debugging over the ops, keeping the failure's "
                   "signature; the native engine's) or Hypothesis's (slower, as long or "
                   "longer: docs/benchmarks.md)")
    p.add_argument("--stop-on-first", action="store_true",
                   help="stop at the first failure (otherwise the whole budget is spent and "
                   "every distinct failure is shrunk, saved and listed; --fault implies it)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="native engine: processes to spread the walks over (default: all "
                   "cores)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--max-examples", type=int, metavar="N",
                   help="Hypothesis's budget of generated examples per regime; the examples "
                        "column counts every run of the machine, so it also counts Hypothesis's "
                        "replays of saved examples, discarded draws and shrinking (it can be "
                        "higher)")
    g.add_argument("--budget", type=float, metavar="SECONDS")
    p.add_argument("--seed", type=int)
    p.add_argument("--page-size", type=int)
    p.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="override a variant parameter (repeatable)")
    p.add_argument("--device", help="cpu or cuda (default: cuda if available, else cpu)")
    p.add_argument("--out", default="kvcheck-traces", help="where failing traces go")
    p.set_defaults(func=run)


def run(args) -> int:
    names_known([args.variant], args.target)  # before the engines and torch are imported
    from state_machines.fuzz import fuzz

    spec = variant_named(args.variant)
    fault = fault_named(args.fault, spec.name, args.target)
    target_named(spec, args.target, args.src)
    args.known_findings = known_findings_named(args.known_findings, spec, args.target)
    args.engine = args.engine or default_engine(args)
    if args.workers is not None and (args.engine == "hypothesis" or args.workers < 1):
        raise UsageError("--workers is for --engine native or both, and must be at least 1")
    device = device_named(args.device)
    writable_dir(args.out)
    regimes = regimes_from_args(args, spec)
    if args.target != "reference" and fault is not None:
        try:  # the target's adapter says which catalogued faults it can inject
            spec.make_subject(regimes[0], fault=fault.id, target=args.target, src=args.src)
        except KeyError as exc:
            raise UsageError(exc.args[0]) from None
    if fault is not None and fault.variant == spec.name and fault.params \
            and args.page_size is None and not args.param:
        regimes = [spec.check_params({**regimes[0], **fault.params})]
    if fault is not None:  # one catalogued defect switched on: its first failure is it
        args.stop_on_first = True
    engines = ENGINES[args.engine]
    from state_machines.cli import STARTED

    # --budget is the wall time of the whole command, start-up and shrinking included
    bound = args.budget if args.budget else DEFAULT_BOUND
    end = STARTED + bound - min(REPORT_RESERVE, bound * 0.05)
    items_left = len(regimes) * len(engines)
    for line in identity_lines(spec, args.target, args.src):
        print(line, file=sys.stderr)
    rows, ledger, started = [], Ledger(), time.monotonic()
    throttle = Throttle(0 if sys.stderr.isatty() else PROGRESS_EVERY)
    interrupted = False
    for params in regimes:
        label = f"{spec.name} {describe_regime(params)}"
        for engine in engines:
            print(f"fuzzing {label}" + (f" with fault {fault.id}" if fault else "")
                  + (f" [{args.target}]" if args.target != "reference" else "")
                  + (f" ({engine})" if len(engines) > 1 else "")
                  + f" on {device} ...", file=sys.stderr, flush=True)
            offset = time.monotonic() - started
            # with --budget each item gets its share of what is left; without it the
            # examples are the budget and the bound only a safety net: the whole remainder
            share = max(MIN_SHARE, max(0.0, end - time.monotonic())
                        / (items_left if args.budget else 1))
            items_left -= 1
            outcome = _fuzz_one(args, spec, params, fault, device, engine, share,
                                _progress(label, share, throttle))
            if outcome.error:
                print(f"error: {HARNESS_WORDS}: {outcome.error}", file=sys.stderr)
                return EXIT_HARNESS
            found = Ledger()
            for f in outcome.failures:
                f.first_seen += offset
                found.failures[f.signature] = f
            ledger.merge(found)
            rate = outcome.steps / outcome.seconds if outcome.seconds else 0
            rows.append([spec.name, describe_regime(params)]
                        + ([engine] if len(engines) > 1 else [])
                        + [outcome.examples, outcome.steps, f"{rate:,.0f}",
                           f"{outcome.seconds:.1f}", _status(outcome)])
            interrupted = outcome.interrupted
            if interrupted or (args.stop_on_first and outcome.failed):
                break
        if interrupted or (args.stop_on_first and ledger.failures):
            break
    print(format_table(rows, ["variant", "regime"] + (["engine"] if len(engines) > 1 else [])
                       + ["examples", "steps", "steps/s", "seconds", "result"]))
    failing = ledger.failing
    if ledger.failures and not args.stop_on_first:
        print("\n" + failure_table(list(ledger)))
    for f in failures_to_print(failing):
        print_failure(f)
    if failing:
        return EXIT_FAIL
    return EXIT_INTERRUPTED if interrupted else EXIT_OK


ENGINES = {"hypothesis": ("hypothesis",), "native": ("native",), "both": ("hypothesis", "native")}


def _progress(label, budget, throttle):
    end = time.monotonic() + (budget or 0)

    def progress(rec):
        if not throttle():
            return
        n = getattr(rec, "distinct", None)
        n = n if n is not None else int(rec.first_failure_at is not None)
        print(f"  {label}: {rec.examples} examples, {rec.steps} steps, "
              f"{n} failure{'s' if n != 1 else ''}, "
              f"{max(0, end - time.monotonic()):.0f}s left", file=sys.stderr, flush=True)
    return progress


def _fuzz_one(args, spec, params, fault, device, engine, share, progress):
    """One regime with one engine, within ``share`` seconds, shrinking included.  With
    --budget the share is spent; without it, the examples (walks) are the budget and the
    share only bounds them."""
    from hypothesis import settings

    common = {"fault": fault.id if fault else None, "target": args.target, "device": device,
              "seed": args.seed, "out_dir": args.out, "src": args.src,
              "known_findings": args.known_findings, "progress": progress,
              "stop_on_first": args.stop_on_first}
    if engine == "native":
        from state_machines.native import native_fuzz

        walks = args.max_examples
        if not args.budget and walks is None:
            walks = NATIVE_WALKS_PER_EXAMPLE * settings.default.max_examples
            if common["seed"] is None and settings.default.derandomize:
                common["seed"] = 0  # a derandomised profile: the same walks every run
        shrink = share * NATIVE_SHRINK_SHARE
        return native_fuzz(spec, params, budget=share - shrink, max_walks=walks,
                           shrink_budget=shrink,
                           workers=args.workers or os.cpu_count() or 1, **common)
    from state_machines.fuzz import fuzz

    common["shrinker"] = args.shrinker
    if args.budget:
        return fuzz(spec, params, max_examples=args.max_examples, budget=share, **common)
    return fuzz(spec, params, max_examples=args.max_examples, time_cap=share, **common)


def _status(outcome) -> str:
    if outcome.interrupted:
        return "interrupted"
    if not outcome.failures:
        return "clean"
    if len(outcome.failures) == 1:
        f = outcome.failures[0]
        return f"FAILED: {f.signature.prop}" + (f" (known {f.known})" if f.known else "")
    new = sum(f.new for f in outcome.failures)
    return f"FAILED: {len(outcome.failures)} distinct ({new} new)"
