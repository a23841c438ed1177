"""``kvcheck bench``: checked steps/s against bare cache ops/s, Hypothesis's ceiling, fault
detection time and shrunk length, xdist 1 vs 2 workers; ``--write`` renders markdown."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from state_machines.commands.common import (EXIT_FAIL, EXIT_OK, UsageError, add_target_args,
                                            device_named,
                                            target_named, variant_named)


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="checked steps/s vs bare ops/s, fault detection, xdist")
    p.add_argument("variant", nargs="?")
    p.add_argument("--examples", type=int, default=60)
    p.add_argument("--seeds", type=int, default=5, help="seeds per fault (median over them)")
    p.add_argument("--no-faults", action="store_true", help="skip the per-fault timings")
    p.add_argument("--no-xdist", action="store_true", help="skip the xdist 1 vs 2 workers run")
    p.add_argument("--write", metavar="FILE", help="write the markdown report (docs/benchmarks.md)")
    p.add_argument("--device")
    add_target_args(p, known_findings=False)
    p.add_argument("--engine", choices=("hypothesis", "native"), default="hypothesis",
                   help="native: the native engine against the Hypothesis machines (speed "
                   "per variant, 1 vs 2 workers, faults by both engines)")
    p.add_argument("--json", action="store_true",
                   help="--engine native: one JSON object per line (variant/regime rows, then "
                   "the workers and fault rows)")
    p.add_argument("--seconds", type=float, default=3.0, metavar="S",
                   help="--engine native: seconds of walks per variant/regime (default 3)")
    p.add_argument("--findings", action="store_true",
                   help="time to find each known upstream finding usable here (and the "
                   "catalogued faults with the longest minimal traces): both engines, --seeds "
                   "cold runs each, found in k of N, median seconds and shrunk steps; with a "
                   "variant, only that variant's findings and faults")
    p.add_argument("--budget", type=float, default=20.0, metavar="S",
                   help="--findings: seconds per run (default 20)")
    p.set_defaults(func=run, default_profile="ci")


def run(args) -> int:
    if args.findings:
        return run_findings(args)
    if args.engine == "native":
        return run_native(args)
    from state_machines.bench import (
        bench,
        bench_faults,
        bench_xdist,
        format_bench,
        format_extra,
        markdown,
    )

    names = [args.variant] if args.variant else None
    if args.variant:
        target_named(variant_named(args.variant), args.target, args.src)
    elif args.target != "reference":
        from state_machines.variants import all_variants

        names = [n for n, s in all_variants().items() if args.target in s.targets]
        for n in names:
            target_named(variant_named(n), args.target, args.src)
    device = device_named(args.device)
    if args.write:  # checked now, not after minutes of measuring
        from state_machines.commands.common import UsageError, writable_dir

        if Path(args.write).is_dir():
            raise UsageError(f"--write {args.write}: is a directory, expected a file name")
        writable_dir(Path(args.write).parent, "--write")
    print("bench: machines ...", file=sys.stderr, flush=True)
    from state_machines.bench import BenchError

    try:
        results = bench(names, examples=args.examples, device=device, target=args.target,
                        src=args.src)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    results["profile"] = args.profile or "ci"
    print(format_bench(results), flush=True)
    if args.target != "reference":  # the fault and xdist phases measure the reference models
        args.no_faults = args.no_xdist = True
        print(f"bench: target {args.target}: machines only (fault and xdist phases are the "
              "reference's)", file=sys.stderr)
    if not args.no_faults:
        print(f"bench: faults x {args.seeds} seeds ...", file=sys.stderr, flush=True)
        results["faults"] = bench_faults(
            names, seeds=args.seeds, device=device,
            progress=lambda r: print(f"  {r['variant']} {r['fault']}: caught {r['caught']}/"
                                     f"{r['seeds']}", file=sys.stderr, flush=True))
    if not args.no_xdist:
        print("bench: pytest-xdist -n 1 / -n 2 ...", file=sys.stderr, flush=True)
        results["xdist"] = bench_xdist(
            names, profile=results["profile"],
            progress=lambda text: print(f"  {text}", file=sys.stderr, flush=True))
    extra = format_extra(results)
    if extra:
        print(extra)
    if args.write:
        argv = sys.argv[1:] if Path(sys.argv[0]).name in ("kvcheck", "__main__.py") else None
        command = "kvcheck " + (shlex.join(argv) if argv else "bench ...")
        Path(args.write).parent.mkdir(parents=True, exist_ok=True)
        Path(args.write).write_text(markdown(results, command) + "\n")
        print(f"written: {args.write}", file=sys.stderr)
    return EXIT_OK


def _words(key, value) -> str:
    """One field of a progress row as text (a nested mapping: ``key: k v, ...``)."""
    if isinstance(value, dict):
        return f"{key}: " + " ".join(_words(k, v) for k, v in value.items())
    return f"{key} {value:,.1f}" if isinstance(value, float) else f"{key} {value}"


def run_native(args) -> int:
    """``bench --engine native``: speed ratios, workers, and (unless --no-faults) faults."""
    import json
    import math

    from state_machines import bench_native

    if args.target != "reference":
        raise UsageError("--engine native benchmarks the reference models (no --target)")
    if not (math.isfinite(args.seconds) and args.seconds > 0) or args.seeds < 1 \
            or args.examples < 1:
        raise UsageError("--seconds, --seeds and --examples must be positive")
    names = [variant_named(args.variant).name] if args.variant else None
    device = device_named(args.device)

    def emit(row):
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print("  " + ", ".join(_words(k, v) for k, v in row.items()), file=sys.stderr,
                  flush=True)

    print("bench: native vs Hypothesis, steps/s per variant and regime ...", file=sys.stderr,
          flush=True)
    result = {"speed": bench_native.speed(names, examples=args.examples, seconds=args.seconds,
                                          device=device, progress=emit)}
    if not args.no_xdist:  # the native engine's own parallelism: 1 vs 2 worker processes
        print("bench: native engine, 1 vs 2 workers ...", file=sys.stderr, flush=True)
        result["workers"] = bench_native.workers((names or ["radix"])[0],
                                                 seconds=args.seconds * 2, device=device)
        emit(result["workers"])
    if not args.no_faults:
        print(f"bench: every fault, both engines, {args.seeds} seeds ...", file=sys.stderr,
              flush=True)
        result["faults"] = bench_native.faults(names, seeds=args.seeds, device=device,
                                               progress=emit)
    if not args.json:
        print(bench_native.markdown(result))
    if args.write:
        Path(args.write).parent.mkdir(parents=True, exist_ok=True)
        Path(args.write).write_text(bench_native.markdown(result) + "\n")
        print(f"written: {args.write}", file=sys.stderr)
    return EXIT_OK


def run_findings(args) -> int:
    """``bench --findings``: per usable known finding (and long fault), both engines."""
    import math

    from state_machines import bench_findings as bf

    if args.seeds < 1 or not (math.isfinite(args.budget) and args.budget > 0):
        raise UsageError("--seeds and --budget must be positive")
    if args.target != "reference":
        raise UsageError("--findings runs every finding of tests/upstream_findings usable "
                         "here (no --target; --src names a checkout for them; a variant "
                         "names whose findings and faults)")
    variant = variant_named(args.variant).name if args.variant else None
    if args.write:
        if Path(args.write).is_dir():
            raise UsageError(f"--write {args.write}: is a directory, expected a file name")
        from state_machines.commands.common import writable_dir

        writable_dir(Path(args.write).parent, "--write")

    def say(row):
        print(f"  {row['finding']}: " + ", ".join(
            f"{e} {row[e]['found']}/{row[e]['seeds']}" for e in bf.ENGINES if e in row),
            file=sys.stderr, flush=True)

    print(f"bench: known findings usable here, both engines x {args.seeds} seeds ...",
          file=sys.stderr, flush=True)
    result = bf.bench_findings(seeds=args.seeds, budget=args.budget, src=args.src,
                               progress=say, variant=variant)
    if not args.no_faults:
        print("bench: the catalogued faults with the longest minimal traces ...",
              file=sys.stderr, flush=True)
        result["faults"] = bf.bench_long_faults(seeds=args.seeds, budget=args.budget,
                                                progress=say, variant=variant)
    if not result["rows"]:
        print("error: no known finding is usable here (" + "; ".join(
            f"{s['finding']}: {s['why']}" for s in result["skipped"]) + ")", file=sys.stderr)
        return EXIT_FAIL
    if args.json:
        import json

        print(json.dumps(result))
    else:
        print(bf.table(result))
    if args.write:
        Path(args.write).write_text(bf.table(result, markdown=True) + "\n")
        print(f"written: {args.write}", file=sys.stderr)
    return EXIT_OK
