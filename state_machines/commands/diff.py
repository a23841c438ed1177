"""``kvcheck diff``: run each example on the reference and an upstream target side by side and
report the first step where what they show differs (hit length, evicted count, counters)."""

from __future__ import annotations

from state_machines.commands.common import (EXIT_FAIL, EXIT_OK, UsageError, device_named,
                                            regimes_from_args, variant_named, writable_dir)


def add_parser(sub) -> None:
    p = sub.add_parser("diff", help="differential run: reference vs an upstream target")
    p.add_argument("variant")
    p.add_argument("--target", required=True, help="the upstream target, e.g. sglang")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--max-examples", type=int, metavar="N")
    g.add_argument("--budget", type=float, metavar="SECONDS")
    p.add_argument("--seed", type=int)
    p.add_argument("--page-size", type=int)
    p.add_argument("--param", action="append", metavar="NAME=VALUE")
    p.add_argument("--scheduler-driver", action="store_true",
                   help="let the upstream side keep its own scheduler policy (e.g. how much "
                        "it evicts) instead of the reference's: compares schedulers too")
    p.add_argument("--device")
    p.add_argument("--out", default="kvcheck-traces", help="where a diverging trace goes")
    p.set_defaults(func=run)


def run(args) -> int:
    from state_machines.diff import format_diff, run_diff
    from state_machines.nightly import target_available

    spec = variant_named(args.variant)
    if args.target == "reference" or args.target not in spec.targets:
        raise UsageError(f"{spec.name} has no upstream target {args.target!r}; known: "
                         f"{', '.join(t for t in spec.targets if t != 'reference') or 'none'}")
    regimes = regimes_from_args(args, spec)
    why = target_available(spec, regimes[0], args.target)
    if why:
        raise UsageError(f"target {args.target} cannot be built here ({why}); set up its "
                         "environment first (see docs/adapters.md)")
    device = device_named(args.device)
    writable_dir(args.out)
    budget = args.budget / len(regimes) if args.budget else None
    code = EXIT_OK
    for params in regimes:
        res = run_diff(spec.name, args.target, params, args.max_examples, args.seed,
                       device=device, budget=budget, out_dir=args.out,
                       same_driver=not args.scheduler_driver)
        print(format_diff(res))
        if res.trace_path:
            print(f"trace saved: {res.trace_path}")
        if res.diverged or res.error:
            code = EXIT_FAIL
            break
    return code
