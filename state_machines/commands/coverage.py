"""``kvcheck coverage``: how often the machine reaches each declared ("sometimes") transition
and generates each op of the table; exits 1 if one was never reached / generated."""

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
    format_table,
    known_findings_named,
    regimes_from_args,
    target_named,
    variant_named,
)


def add_parser(sub) -> None:
    p = sub.add_parser("coverage", help="how often each declared interesting transition is "
                       "reached and each op generated; exit 1 if one never is")
    p.add_argument("variant", nargs="?", help="default: every variant that declares some")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--max-examples", type=int, metavar="N", help="per regime")
    g.add_argument("--budget", type=float, metavar="SECONDS", help="split over the regimes")
    p.add_argument("--seed", type=int)
    p.add_argument("--page-size", type=int)
    p.add_argument("--param", action="append", metavar="NAME=VALUE")
    p.add_argument("--json", action="store_true", help="one JSON object per variant")
    p.add_argument("--device")
    add_target_args(p)
    p.set_defaults(func=run, default_profile="ci")


def run(args) -> int:
    from state_machines.coverage import NotDeclared, declared, run_coverage
    from state_machines.variants import all_variants

    specs = [variant_named(args.variant)] if args.variant else list(all_variants().values())
    device = device_named(args.device)
    ok = True
    for spec in specs:
        try:
            declared(spec)
        except NotDeclared as exc:
            if args.variant:
                raise UsageError(str(exc)) from None
            print(f"skipped: {exc}", file=sys.stderr)
            continue
        if args.target not in spec.targets and not args.variant:
            continue  # a target covers only its own variants
        target_named(spec, args.target, args.src)
        known = known_findings_named(args.known_findings, spec, args.target)
        regimes = regimes_from_args(args, spec)
        on = f" [{args.target}]" if args.target != "reference" else ""
        print(f"coverage of {spec.name}{on} over {len(regimes)} regime(s) ...",
              file=sys.stderr, flush=True)
        res = run_coverage(spec, regimes, max_examples=args.max_examples, budget=args.budget,
                           seed=args.seed, device=device, target=args.target, src=args.src,
                           known_findings=known)
        ok &= res.ok
        if args.json:
            print(json.dumps(res.to_json()), flush=True)
            continue
        header = ["transition"] + [describe_regime(r.params) for r in res.regimes] + ["total",
                                                                                     ""]
        gone, gone_ops = res.declined_transitions, res.declined_ops
        rows = [[name] + [r.report[name] for r in res.regimes] + [count,
                ("declined: " + ", ".join(gone[name]) if name in gone else "NEVER REACHED")
                if count == 0 else ""] for name, count in res.report.items()]
        print(f"{spec.name}: "
              + "; ".join(f"{describe_regime(r.params)}: {r.examples} examples, {r.steps} "
                          f"steps, {r.seconds:.1f}s" for r in res.regimes))
        print(format_table(rows, header))
        header[0] = "op"
        rows = [[name] + [r.ops.get(name, 0) for r in res.regimes]
                + [count, ("declined" if name in gone_ops else "NEVER GENERATED")
                   if count == 0 else ""]
                for name, count in res.op_counts.items()]
        print(format_table(rows, header))
        for r in res.regimes:
            if r.undeclared:
                print(f"  reached but not declared ({describe_regime(r.params)}): "
                      + ", ".join(f"{k}={v}" for k, v in sorted(r.undeclared.items())))
            if r.error:
                print(f"  ERROR ({describe_regime(r.params)}): {r.error}")
        if res.missing:
            print(f"FAILED: {spec.name}: declared but never reached: {', '.join(res.missing)}")
        if res.ops_missing:
            print(f"FAILED: {spec.name}: ops of the table never generated: "
                  f"{', '.join(res.ops_missing)}")
        if res.victims_unreported:
            passes = sum(r.eviction_passes for r in res.regimes)
            print(f"NOTE: {spec.name}{on}: {passes} eviction passes freed tokens but the target "
                  "reported no victim, so the victim and over-eviction checks never ran on it "
                  "(declare an eviction observer: docs/adapters.md, section 2a)")
        if res.declined:
            print(f"NOTE: {spec.name}{on} declines "
                  + "; ".join(f"{op} ({why})" for op, why in res.declined.items())
                  + ": left out of the check, with what only they reach"
                  + (f" ({', '.join(gone)})" if gone else ""))
        if res.ok:
            left = len(gone) + len(gone_ops)
            print(f"ok: all {len(res.report) - len(gone)} declared transitions of {spec.name} "
                  f"reached, all {len(res.op_counts) - len(gone_ops)} ops generated"
                  + (f" ({left} declined by the target, left out)" if left else ""))
    return EXIT_OK if ok else EXIT_FAIL
