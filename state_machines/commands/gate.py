"""``kvcheck gate``: the pre-merge gate -- replay the corpus, fuzz a fixed budget, verdict."""

from __future__ import annotations

import sys

from state_machines.commands.common import (EXIT_FAIL, EXIT_OK, UsageError, add_target_args,
                                            failure_table, format_table, job_variants, known_findings_named,
                                            print_failure, targets_from_args, variant_named)


def add_parser(sub) -> None:
    p = sub.add_parser("gate", help="pre-merge gate: replay saved traces, then a fixed budget")
    p.add_argument("--variant", action="append", help="only this variant (repeatable)")
    p.add_argument("--corpus", action="append", metavar="DIR",
                   help="trace folders to replay (default: tests/regressions and "
                        "tests/upstream_findings)")
    p.add_argument("--replay-only", action="store_true", help="skip the fuzz part")
    p.add_argument("--max-examples", type=int, metavar="N",
                   help="examples per variant/regime (default: the ci profile's)")
    p.add_argument("--stop-on-first", action="store_true",
                   help="a fuzz check stops at its first failure (otherwise it spends its "
                   "budget and lists every distinct failure)")
    add_target_args(p, default=None, help_target="only this target in the fuzz part "
                    "(default: every target usable here)")
    p.set_defaults(func=run, default_profile="ci")


def run(args) -> int:
    from state_machines.gate import run_gate
    from state_machines.regressions import REGRESSIONS, UPSTREAM_FINDINGS

    from pathlib import Path

    for name in args.variant or []:
        variant_named(name)
    targets = targets_from_args(args)
    args.known_findings = known_findings_named(args.known_findings, job_variants(args.variant),
                                               args.target)
    for folder in args.corpus or []:
        if not Path(folder).is_dir():
            raise UsageError(f"--corpus {folder}: no such directory")

    def progress(v):
        print(f"  {'ok  ' if v.ok else 'FAIL'} {v.what}: {v.detail}", file=sys.stderr,
              flush=True)

    verdicts = run_gate(variants=args.variant,
                        corpus_dirs=args.corpus or (REGRESSIONS, UPSTREAM_FINDINGS),
                        fuzz_too=not args.replay_only, max_examples=args.max_examples,
                        progress=progress,
                        targets=targets, src=args.src,
                        known_findings=args.known_findings,
                        stop_on_first=args.stop_on_first)
    rows = [[("skip" if v.skipped else "ok") if v.ok else "FAIL", v.what, v.detail[:100]]
            for v in verdicts]
    print(format_table(rows, ["verdict", "check", "detail"]))
    failed = [v for v in verdicts if not v.ok]
    found = [f for v in verdicts if v.outcome is not None for f in v.outcome.failures]
    if found:
        print("\n" + failure_table(found))
    for v in failed:
        for f in (v.outcome.failures if v.outcome is not None else []):
            if f.counts:
                print_failure(f)
    skipped = [v for v in verdicts if v.ok and v.skipped]
    ran_ok = len(verdicts) - len(failed) - len(skipped)
    print(f"\ngate: {'FAILED' if failed else 'passed'} -- {len(verdicts)} checks: {ran_ok} ok, "
          f"{len(skipped)} skipped, {len(failed)} failed")
    if skipped:
        print(f"skipped ({len(skipped)}, not run here, so not verified):\n"
              + "\n".join(f"  {v.what}: {v.detail[:100]}" for v in skipped))
    return EXIT_FAIL if failed else EXIT_OK
