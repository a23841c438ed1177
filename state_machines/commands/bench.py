"""``kvcheck bench``: checked steps/s against bare cache ops/s."""

from __future__ import annotations


from state_machines.commands.common import (EXIT_OK, device_named, variant_named)


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="checked steps/s vs bare cache ops/s")
    p.add_argument("variant", nargs="?")
    p.add_argument("--examples", type=int, default=60)
    p.add_argument("--device")
    p.set_defaults(func=run)


def run(args) -> int:
    from state_machines.bench import bench, format_bench

    names = [args.variant] if args.variant else None
    if args.variant:
        variant_named(args.variant)
    results = bench(names, examples=args.examples, device=device_named(args.device))
    print(format_bench(results))
    return EXIT_OK
