"""``kvcheck list``: variants, their params/regimes/ops, targets and faults."""

from __future__ import annotations


from state_machines.commands.common import (EXIT_OK, describe_regime)


def add_parser(sub) -> None:
    sub.add_parser("list", help="variants, targets, faults").set_defaults(func=run)


def run(args) -> int:
    from caches.faults import faults_of
    from state_machines.variants import all_variants

    print_targets()
    print()
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


def print_targets() -> None:
    """Every registered target: its variants, where it comes from, usable here or why not."""
    from state_machines.targets import registry

    print("targets (entry-point group kvcheck.targets):")
    for name, entry in registry().items():
        if entry.target is None:
            print(f"  {name:<12} BROKEN  from {entry.origin} ({entry.value}): {entry.error}")
            continue
        t = entry.target
        why = t.unavailable(None) if not t.takes_src else None
        state = "usable here" if not why else f"not usable here: {why}"
        if t.takes_src:
            state = "needs --src PATH (an engine checkout)"
        print(f"  {name:<12} {t.summary}")
        print(f"  {'':<12} variants: {', '.join(t.variants)}; from {entry.origin} "
              f"({entry.value}); {state}")
        if why and t.setup_hint and t.setup_hint.split(",")[0] not in why:
            print(f"  {'':<12} set it up with: {t.setup_hint}")
