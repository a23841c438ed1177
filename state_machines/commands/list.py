"""``kvcheck list``: variants, their params/regimes/ops, targets and faults."""

from __future__ import annotations


from state_machines.commands.common import (EXIT_OK, describe_regime)


def add_parser(sub) -> None:
    sub.add_parser("list", help="variants, targets, faults").set_defaults(func=run)


def run(args) -> int:
    from caches.faults import faults_of
    from state_machines.variants import all_variants

    for spec in all_variants().values():
        print(f"{spec.name}: {spec.summary}")
        print(f"  targets: {', '.join(spec.targets)}")
        print("  params:  " + ", ".join(f"{k} (default {p.default}: {p.doc})"
                                       for k, p in spec.params.items()))
        print("  regimes: " + "; ".join(describe_regime(spec.check_params(r)) for r in spec.regimes))
        print("  ops:     " + ", ".join(n for n in spec.ops.names()))
        for f in faults_of(spec.name):
            print(f"  fault {f.id:<3} {f.name}  [{f.upstream}]  reports {'/'.join(f.properties)}")
            print(f"            {f.summary}")
    return EXIT_OK
