"""``kvcheck fuzz``: fuzz one variant (every regime); print and save a failure."""

from __future__ import annotations

import os
import sys
import time

from state_machines.commands.common import (EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, UsageError,
                                            add_target_args, describe_regime, device_named,
                                            fault_named, format_table, known_findings_named,
                                            print_failure,
                                            regimes_from_args, target_named, variant_named,
                                            writable_dir)

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
    p.add_argument("--engine", choices=("hypothesis", "native"), default="hypothesis",
                   help="hypothesis (default): Hypothesis's stateful engine; native: seeded "
                   "swarm random walks from the same op generators, many more steps per "
                   "second, shrunk at the trace level")
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
    from state_machines.fuzz import fuzz

    spec = variant_named(args.variant)
    fault = fault_named(args.fault, spec.name, args.target)
    target_named(spec, args.target, args.src)
    args.known_findings = known_findings_named(args.known_findings, spec, args.target)
    if args.workers is not None and (args.engine != "native" or args.workers < 1):
        raise UsageError("--workers is for --engine native, and must be at least 1")
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
    budget = args.budget / len(regimes) if args.budget else None
    rows, failed = [], None
    throttle = Throttle(0 if sys.stderr.isatty() else PROGRESS_EVERY)
    for params in regimes:
        label = f"{spec.name} {describe_regime(params)}"
        print(f"fuzzing {label}" + (f" with fault {fault.id}" if fault else "")
              + (f" [{args.target}]" if args.target != "reference" else "")
              + f" on {device} ...", file=sys.stderr, flush=True)

        def progress(rec, label=label, end=time.monotonic() + (budget or 0)):
            if not throttle():
                return
            print(f"  {label}: {rec.examples} examples, {rec.steps} steps, "
                  f"{'1 failure' if rec.first_failure_at else '0 failures'}, "
                  f"{max(0, end - time.monotonic()):.0f}s left", file=sys.stderr, flush=True)

        if args.engine == "native":
            from state_machines.native import native_fuzz

            outcome = native_fuzz(spec, params, fault=fault.id if fault else None,
                                  target=args.target, device=device, budget=budget,
                                  max_walks=args.max_examples, seed=args.seed,
                                  workers=args.workers or os.cpu_count() or 1,
                                  out_dir=args.out, src=args.src,
                                  known_findings=args.known_findings, progress=progress)
        else:
            outcome = fuzz(spec, params, fault=fault.id if fault else None,
                           target=args.target, device=device, max_examples=args.max_examples,
                           budget=budget, seed=args.seed, out_dir=args.out,
                           progress=progress, src=args.src,
                           known_findings=args.known_findings)
        if outcome.error:
            print(f"error: the harness failed: {outcome.error}", file=sys.stderr)
            return EXIT_FAIL
        rate = outcome.steps / outcome.seconds if outcome.seconds else 0
        status = ("interrupted" if outcome.interrupted else
                  f"FAILED: {outcome.prop}" if outcome.failed else "clean")
        rows.append([spec.name, describe_regime(params), outcome.examples, outcome.steps,
                     f"{rate:,.0f}", f"{outcome.seconds:.1f}", status])
        if outcome.failed:
            failed = outcome
            break
        if outcome.interrupted:
            break
    print(format_table(rows, ["variant", "regime", "examples", "steps", "steps/s", "seconds",
                        "result"]))
    if failed is not None:
        print_failure(failed)
        return EXIT_FAIL
    return EXIT_INTERRUPTED if rows and rows[-1][-1] == "interrupted" else EXIT_OK
