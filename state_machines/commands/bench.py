"""``kvcheck bench``: checked steps/s against bare cache ops/s, Hypothesis's ceiling, fault
detection time and shrunk length, xdist 1 vs 2 workers; ``--write`` renders markdown."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from state_machines.commands.common import EXIT_OK, device_named, variant_named


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="checked steps/s vs bare ops/s, fault detection, xdist")
    p.add_argument("variant", nargs="?")
    p.add_argument("--examples", type=int, default=60)
    p.add_argument("--seeds", type=int, default=5, help="seeds per fault (median over them)")
    p.add_argument("--no-faults", action="store_true", help="skip the per-fault timings")
    p.add_argument("--no-xdist", action="store_true", help="skip the xdist 1 vs 2 workers run")
    p.add_argument("--write", metavar="FILE", help="write the markdown report (docs/benchmarks.md)")
    p.add_argument("--device")
    p.set_defaults(func=run, default_profile="ci")


def run(args) -> int:
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
        variant_named(args.variant)
    device = device_named(args.device)
    if args.write:  # checked now, not after minutes of measuring
        from state_machines.commands.common import UsageError, writable_dir

        if Path(args.write).is_dir():
            raise UsageError(f"--write {args.write}: is a directory, expected a file name")
        writable_dir(Path(args.write).parent, "--write")
    print("bench: machines ...", file=sys.stderr, flush=True)
    results = bench(names, examples=args.examples, device=device)
    results["profile"] = args.profile or "ci"
    print(format_bench(results), flush=True)
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
