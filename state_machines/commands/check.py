"""``kvcheck check``: exhaustive bounded search -- every op sequence up to ``--depth``."""

from __future__ import annotations

import json
import sys

from state_machines.commands.common import (
    EXIT_FAIL,
    EXIT_OK,
    UsageError,
    add_target_args,
    describe_regime,
    device_named,
    fault_named,
    format_table,
    param_overrides,
    print_failure,
    target_named,
    variant_named,
    writable_dir,
)


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="exhaustive breadth-first search up to a depth "
                       "(shortest counterexample)")
    p.add_argument("variant", nargs="?", help="default: every variant that opted in")
    p.add_argument("--depth", type=int, default=4, help="longest op sequence (default 4)")
    p.add_argument("--fault", help="switch on a catalogued fault (e.g. R1)")
    p.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="override a small-regime parameter (repeatable)")
    p.add_argument("--max-states", type=int, metavar="N",
                   help="stop after N distinct states (the result says 'truncated')")
    p.add_argument("--no-quiescence", action="store_true",
                   help="do not drain-and-check every new state")
    p.add_argument("--json", action="store_true", help="one JSON object per regime")
    p.add_argument("--device")
    p.add_argument("--out", default="kvcheck-traces", help="where a counterexample goes")
    add_target_args(p, known_findings=False)
    p.set_defaults(func=run)


def _regimes(args, spec, fault):
    from state_machines.explore import fault_params, small_regimes

    over = param_overrides(args)
    target = getattr(args, "target", None)
    out, narrowed = [], []
    for r in small_regimes(spec):
        try:
            p = spec.check_params({**r, **over}, target)
            if fault is not None and not over:
                p = fault_params(spec, p, fault.id)
        except ValueError as exc:
            if over or target in (None, "reference"):
                raise UsageError(str(exc)) from None
            narrowed.append(f"{describe_regime(r)} ({exc})")  # the target narrowed it away
            continue
        if p not in out:
            out.append(p)
    for why in narrowed:
        print(f"skipping {spec.name} {why} [{target}]", file=sys.stderr)
    if not out:
        raise UsageError(f"target {target} runs none of {spec.name}'s small regimes")
    return out


def run(args) -> int:
    from state_machines.explore import NotOptedIn, explore, opted_in
    from state_machines.variants import all_variants

    if args.depth < 0:
        raise UsageError("--depth must be >= 0")
    if args.variant:
        specs = [variant_named(args.variant)]
    else:
        if args.fault:
            raise UsageError("--fault needs a variant")
        specs = list(all_variants().values())
    device = device_named(args.device)
    writable_dir(args.out)
    rows, failed = [], None
    for spec in specs:
        try:
            opted_in(spec)
        except NotOptedIn as exc:
            if args.variant:
                raise UsageError(str(exc)) from None
            print(f"skipped: {exc}", file=sys.stderr)
            continue
        if args.target not in spec.targets and not args.variant:
            continue  # a target covers only its own variants
        target_named(spec, args.target, args.src)
        fault = fault_named(args.fault, spec.name, args.target)
        for params in _regimes(args, spec, fault):
            label = f"{spec.name} {describe_regime(params)}"
            print(f"checking {label}" + (f" with fault {fault.id}" if fault else "")
                  + f" up to depth {args.depth} ...", file=sys.stderr, flush=True)

            def progress(res, stats, label=label):
                print(f"  {label}: depth {stats.depth}: {stats.frontier:,} states expanded, "
                      f"{stats.new:,} new, {res.transitions:,} explored, "
                      f"{res.states_per_second:,.0f}/s", file=sys.stderr, flush=True)

            try:
                res = explore(spec, params, depth=args.depth,
                              fault=fault.id if fault else None, device=device,
                              out_dir=args.out, quiescence=not args.no_quiescence,
                              max_states=args.max_states, progress=progress,
                              target=args.target, src=args.src)
            except NotOptedIn as exc:
                raise UsageError(str(exc)) from None
            if args.json:
                print(json.dumps(res.to_json()), flush=True)
            if res.failed:
                verdict = f"VIOLATION: {res.prop} at depth {len(res.trace.ops)}"
            elif res.exhausted:
                verdict = (f"no violation: state space exhausted at depth "
                           f"{res.depth_reached}")
            elif res.truncated:
                verdict = (f"no violation up to depth {res.depth_reached} "
                           f"(truncated at {args.max_states:,} states)")
            else:
                verdict = f"no violation up to depth {res.depth_reached}"
            rows.append([spec.name, describe_regime(params), fault.id if fault else "-",
                         res.alphabet_size, res.depth_reached, f"{res.transitions:,}",
                         f"{res.distinct:,}", f"{res.states_per_second:,.0f}",
                         f"{res.seconds:.1f}", verdict])
            if res.failed:
                failed = res
                break
        if failed is not None:
            break
    if not args.json:
        print(format_table(rows, ["variant", "regime", "fault", "ops", "depth", "explored",
                                  "distinct", "states/s", "seconds", "result"]))
        if failed is not None:
            print_failure(failed)
    return EXIT_FAIL if failed is not None else EXIT_OK
