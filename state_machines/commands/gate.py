"""``kvcheck gate``: the pre-merge gate -- replay the corpus, fuzz a fixed budget, verdict."""

from __future__ import annotations

import sys

from state_machines.commands.common import (EXIT_FAIL, EXIT_HARNESS, EXIT_OK, HARNESS_WORDS,
                                            UsageError, add_target_args,
                                            failure_table, failures_to_print, format_table,
                                            job_variants, known_findings_named, names_known,
                                            print_failure, variant_named)


def add_parser(sub) -> None:
    p = sub.add_parser("gate", help="pre-merge gate: replay saved traces, then a fixed budget")
    p.add_argument("--variant", action="append", help="only this variant (repeatable)")
    p.add_argument("--corpus", action="append", metavar="DIR",
                   help="trace folders to replay (default: the corpus kvcheck carries, its "
                        "tests/regressions and tests/upstream_findings, found from any "
                        "directory)")
    p.add_argument("--replay-only", action="store_true", help="skip the fuzz part")
    p.add_argument("--max-examples", type=int, metavar="N",
                   help="examples per variant/regime (default: the ci profile's)")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="bound the whole gate: each fuzz item gets the time left / the items "
                        "left and stops between examples when its share is spent (default: "
                        "540, which fits 10 minutes on 2 cores)")
    p.add_argument("--seed", type=int,
                   help="Hypothesis's seed for every fuzz item (default: derandomised, the "
                        "ci profile's)")
    add_target_args(p, default=None, repeatable=True,
                    help_target="gate this target (repeatable; default: every target usable "
                    "here); the gate fails naming a target asked for that was gated nowhere")
    p.add_argument("--stop-on-first", action="store_true",
                   help="a fuzz check stops at its first failure (otherwise it spends its "
                   "share and lists every distinct failure)")
    p.set_defaults(func=run, default_profile="ci")


def gate_targets(args) -> list | None:
    """``--target`` names (checked: known, with a variant asked for, taking ``--src`` when
    given), or None for every target.  Whether they are *usable* here is the gate's verdict,
    not a usage error: a target asked for that cannot run fails the gate (exit 1)."""
    from pathlib import Path

    from state_machines.targets import UnknownTarget, get_target

    if args.src is not None and not args.target:
        raise UsageError("--src needs --target (the target that loads the checkout)")
    if args.src is not None and not Path(args.src).is_dir():
        raise UsageError(f"--src {args.src}: not a directory (expected an engine checkout)")
    if not args.target:
        return None
    for name in args.target:
        try:
            target = get_target(name)
        except UnknownTarget as exc:
            raise UsageError(exc.args[0]) from None
        if args.src is not None and not target.takes_src and (
                name != "reference" or args.target == ["reference"]):
            raise UsageError(f"target {name!r} takes no --src (it loads an installed "
                             f"{target.engine})" if name != "reference" else
                             "target 'reference' takes no --src (kvcheck's own models)")
        if args.variant and not set(args.variant) & set(target.builders):
            raise UsageError(f"target {name!r} has none of the variants asked for "
                             f"({', '.join(args.variant)}); it has "
                             f"{', '.join(target.builders)}")
    return list(dict.fromkeys(args.target))


DETAIL_WIDTH = 100  # the verdict table's detail column wraps here (never cut)


def wrapped(text: str, indent: str = "  ") -> str:
    """``text`` whole, wrapped at the terminal-friendly width, continuation lines indented."""
    import textwrap

    return textwrap.fill(text, DETAIL_WIDTH + 40, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


def engine_summary(verdicts, targets) -> list[str]:
    """The summary's first lines: which engine targets were gated (with the code they ran)
    and which were not (with why); a gate that ran only kvcheck's own models says so."""
    gated, not_gated = verdicts.gated, dict(verdicts.not_gated)
    for t in targets or ():
        if t != "reference" and t not in gated:
            not_gated.setdefault(t, "not run")
    if gated:
        head = "engine code gated: " + "; ".join(
            f"{t} ({ident.describe() if ident else '?'})" for t, ident in gated.items())
    else:
        head = "no engine code was gated" + (
            " (only kvcheck's own reference models ran)"
            if not targets or "reference" in targets else "")
    lines = [head]
    if not_gated:
        lines.append(wrapped("engine targets not gated: " + "; ".join(
            f"{t} ({why})" for t, why in not_gated.items())))
    notes = dict.fromkeys(ident.note for ident in gated.values() if ident and ident.note)
    return lines + [f"note: {n}" for n in notes]


def _started() -> float:
    """When the gate's --budget began: the command's start, less what the final report
    needs (each failure is replayed to print it)."""
    from state_machines.cli import STARTED

    return STARTED - REPORT_RESERVE  # (as if the command had begun that much earlier)


REPORT_RESERVE = 1.0  # seconds


def run(args) -> int:
    from pathlib import Path

    names_known(args.variant)  # before the engines and torch are imported
    for target in args.target or []:
        names_known(target=target)
    from state_machines.gate import DEFAULT_BUDGET, corpus_note, run_gate
    from state_machines.regressions import REGRESSIONS, UPSTREAM_FINDINGS

    for name in args.variant or []:
        variant_named(name)
    targets = gate_targets(args)
    args.known_findings = known_findings_named(
        args.known_findings, job_variants(args.variant),
        args.target[0] if args.target and len(args.target) == 1 else None)
    for folder in args.corpus or []:
        if not Path(folder).is_dir():
            raise UsageError(f"--corpus {folder}: no such directory")
    if args.budget is not None and args.budget <= 0:
        raise UsageError("--budget must be a positive number of seconds")

    def progress(v):
        print(f"  {'ok  ' if v.ok else 'FAIL'} {v.what}: {v.detail}", file=sys.stderr,
              flush=True)

    verdicts = run_gate(variants=args.variant,
                        corpus_dirs=args.corpus or (REGRESSIONS, UPSTREAM_FINDINGS),
                        fuzz_too=not args.replay_only, max_examples=args.max_examples,
                        progress=progress,
                        targets=targets, src=args.src,
                        known_findings=args.known_findings,
                        budget=args.budget if args.budget is not None else DEFAULT_BUDGET,
                        seed=args.seed,
                        stop_on_first=args.stop_on_first, started=_started())
    rows = [[("skip" if v.skipped else "ok") if v.ok else "FAIL", v.what, v.detail]
            for v in verdicts]
    print(format_table(rows, ["verdict", "check", "detail"], wrap=DETAIL_WIDTH))
    failed = [v for v in verdicts if not v.ok]
    found = [f for v in verdicts if v.outcome is not None for f in v.outcome.failures]
    if found:
        print("\n" + failure_table(found))
    for v in failed:
        for f in failures_to_print(v.outcome.failures if v.outcome is not None else []):
            print_failure(f)
    skipped = [v for v in verdicts if v.ok and v.skipped]
    ran_ok = len(verdicts) - len(failed) - len(skipped)
    print()
    note = corpus_note(args.corpus or (REGRESSIONS, UPSTREAM_FINDINGS))
    if note:
        print(note)
    if not args.replay_only:
        print("\n".join(engine_summary(verdicts, targets)))
    print(f"gate: {'FAILED' if failed else 'passed'} -- {len(verdicts)} checks: {ran_ok} ok, "
          f"{len(skipped)} skipped, {len(failed)} failed")
    for v in failed:
        if v.what.startswith("gate "):
            print(f"  {v.detail}")
    if skipped:
        print(f"skipped ({len(skipped)}, not run here, so not verified):\n"
              + "\n".join(wrapped(f"  {v.what}: {v.detail}", "      ") for v in skipped))
    broke = [v for v in failed if not v.harness]
    if failed and not broke:
        print(f"gate: {HARNESS_WORDS} -- {len(failed)} check(s) hit a harness error (exit "
              f"{EXIT_HARNESS}); no property broke in what ran")
        return EXIT_HARNESS
    return EXIT_FAIL if failed else EXIT_OK
