"""``kvcheck nightly``: spend a time budget across every variant/regime/target in parallel."""

from __future__ import annotations

from pathlib import Path

from state_machines.commands.common import (UsageError, add_target_args, created_dir,
                                            fault_named, job_variants, known_findings_named,
                                            names_known, targets_from_args, variant_named,
                                            writable_dir)


def add_parser(sub) -> None:
    p = sub.add_parser("nightly", help="the nightly fuzz job (all variants, all cores)")
    p.add_argument("--budget", type=float, default=1800, metavar="SECONDS",
                   help="wall-clock budget (default 1800 = 30 minutes)")
    p.add_argument("--workers", type=int,
                   help="parallel workers (default: all cores; never more than the items)")
    p.add_argument("--variant", action="append", help="only this variant (repeatable)")
    p.add_argument("--out", default="kvcheck-nightly", help="summary, JUnit XML, traces")
    p.add_argument("--database", default=".kvcheck/hypothesis-db",
                   help="example database: a directory (persist it between nights) or "
                        "redis://host:port/db")
    p.add_argument("--github-artifact", metavar="OWNER/REPO[:ARTIFACT]",
                   help="also read (never write) the last nightly's database artifact")
    p.add_argument("--seed", type=int)
    p.add_argument("--fault", help="switch a catalogued fault on (its variant only): checks the "
                   "job end to end")
    p.add_argument("--engine", choices=("hypothesis", "native", "both"), default="hypothesis",
                   help="search engine per item: Hypothesis (shrinking, the example database), "
                        "native (seeded swarm walks, several times the steps), or both (each "
                        "gets half the budget); default hypothesis")
    p.add_argument("--stop-on-first", action="store_true",
                   help="each item stops at its first failure (otherwise it spends its share "
                   "and keeps every distinct failure; --fault implies it)")
    p.add_argument("--shard", metavar="I/N",
                   help="run shard I of N (1-based): a deterministic share of the items, the "
                   "same split on every machine (pass the same --seed); combine the shards' "
                   "output folders with `kvcheck nightly merge`")
    add_target_args(p, default=None, help_target="only this target (default: "
                    "every target usable here)")
    p.set_defaults(func=run)
    sub2 = p.add_subparsers(dest="nightly_command", metavar="merge")
    m = sub2.add_parser("merge", help="combine the output folders of nightly shards: one "
                        "summary, JUnit XML and traces folder, findings deduped by signature")
    m.add_argument("dirs", nargs="+", metavar="DIR", help="a shard's --out folder")
    m.add_argument("--out", dest="merge_out", default="kvcheck-nightly",
                   help="where the merged summary, junit.xml and traces go")
    m.set_defaults(func=run_merge)


def shard_named(text):
    """``--shard I/N`` -> ``(I, N)``, 1 <= I <= N; a ``UsageError`` otherwise."""
    if text is None:
        return None
    i, sep, n = text.partition("/")
    if not sep or not i.strip().isdigit() or not n.strip().isdigit() \
            or not 1 <= int(i) <= int(n):
        raise UsageError(f"--shard {text}: expected I/N with 1 <= I <= N (e.g. 2/3)")
    return int(i), int(n)


def run_merge(args) -> int:
    from state_machines.nightly_merge import MergeError, merge

    for d in args.dirs:
        if not (Path(d) / "plan.json").is_file():
            raise UsageError(f"{d}: not a nightly output folder (no plan.json)")
    writable_dir(args.merge_out, "--out")
    try:
        return merge([Path(d) for d in args.dirs], Path(args.merge_out))
    except MergeError as exc:
        raise UsageError(str(exc)) from None


def run(args) -> int:
    if args.budget <= 0 or (args.workers is not None and args.workers < 1):
        raise UsageError("--budget and --workers must be positive")
    names_known(args.variant, args.target)  # before the engines and torch are imported
    for name in args.variant or []:
        variant_named(name)
    if args.fault:
        fault_named(args.fault, None, target="any")
        if args.variant:
            raise UsageError("--fault picks its own variant; leave out --variant")
    shard = shard_named(args.shard)
    from state_machines.databases import DatabaseError, open_database

    try:  # fail early (in the parent, before the variants load) on a database it cannot open
        open_database(args.database, args.github_artifact)
    except DatabaseError as exc:
        raise UsageError(str(exc)) from None
    targets = targets_from_args(args)
    args.known_findings = known_findings_named(args.known_findings, job_variants(args.variant),
                                               args.target)
    created_dir(args.out)  # last: a bad argument leaves no folder behind
    from state_machines.nightly import run_nightly

    return run_nightly(args.budget, Path(args.out), workers=args.workers,
                       variants=args.variant, database=args.database,
                       github_artifact=args.github_artifact, seed=args.seed, fault=args.fault,
                       targets=targets, src=args.src, known_findings=args.known_findings,
                       engine=args.engine, stop_on_first=args.stop_on_first, shard=shard)
