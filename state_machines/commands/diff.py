"""``kvcheck diff``: run each example on the reference and an upstream target side by side and
report the first step where what they show differs (hit length, evicted count, counters)."""

from __future__ import annotations

from state_machines.commands.common import (EXIT_FAIL, EXIT_OK, UsageError, add_target_args,
                                            device_named, known_findings_named,
                                            regimes_from_args, target_named,
                                            variant_named, writable_dir)


def add_parser(sub) -> None:
    p = sub.add_parser("diff", help="differential run: reference (or --against) vs a target")
    p.add_argument("variant")
    add_target_args(p, default=None, help_target="the target to check, e.g. sglang (required)")
    p.add_argument("--against", default="reference",
                   help="the side to compare with (default: the reference model; or another "
                   "target, e.g. two tree cores of one engine)")
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

    spec = variant_named(args.variant)
    if args.target is None:
        raise UsageError("diff needs --target (the target to check against "
                         f"{args.against}); targets for {spec.name}: {', '.join(spec.targets)}")
    if args.target == args.against:
        raise UsageError(f"--target and --against are both {args.target!r}: nothing to compare")
    target_named(spec, args.target, args.src)
    target_named(spec, args.against, args.src if args.against != "reference" else None)
    args.known_findings = known_findings_named(args.known_findings, spec, args.target)
    regimes = regimes_from_args(args, spec)
    device = device_named(args.device)
    writable_dir(args.out)
    budget = args.budget / len(regimes) if args.budget else None
    code = EXIT_OK
    for params in regimes:
        res = run_diff(spec.name, args.target, params, args.max_examples, args.seed,
                       device=device, budget=budget, out_dir=args.out,
                       same_driver=not args.scheduler_driver, against=args.against,
                       src=args.src, known_findings=args.known_findings)
        print(format_diff(res))  # (which ends with "trace saved: ..." when one was)
        if res.diverged or res.error:
            code = EXIT_FAIL
            break
    return code
