"""``kvcheck faults``: is every catalogued fault caught on its property?"""

from __future__ import annotations

import json

from state_machines.commands.common import (EXIT_FAIL, EXIT_OK, UsageError, device_named,
                                            format_table, variant_named)


def add_parser(sub) -> None:
    p = sub.add_parser("faults", help="is every catalogued fault caught on its property?")
    p.add_argument("--variant")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--max-examples", type=int, metavar="N")
    p.add_argument("--seed", type=int)
    p.add_argument("--device")
    p.add_argument("--engine", choices=("hypothesis", "native"), default="hypothesis",
                   help="the search that runs each fault: Hypothesis (default; --max-examples "
                        "per run) or the native engine (--budget seconds per run, stopping at "
                        "the first failure)")
    p.add_argument("--budget", type=float, metavar="S", default=NATIVE_BUDGET,
                   help=f"--engine native: seconds per clean regime and per fault "
                        f"(default {NATIVE_BUDGET:g})")
    p.add_argument("--corpus", metavar="DIR",
                   help="save each caught fault's shrunk trace, with the fault switched off, "
                        "as a regression trace (+ generated test) in DIR, e.g. tests/regressions")
    p.set_defaults(func=run, default_profile="ci")


NATIVE_BUDGET = 5.0
# Hypothesis: a fault's run stops at its first failure, so it may search further than a clean
# run (the profile's examples): up to this many examples.  A fault the derandomised ci examples
# reach late (C3, since they no longer draw on the code's own literals:
# state_machines/profiles.py) is still found; a caught fault costs only its own examples.
FAULT_EXAMPLES = 1000


def search(engine: str, *, max_examples=None, seed=None, budget: float = NATIVE_BUDGET):
    """``run(spec, params, fault=None, device=None)`` -> FuzzOutcome, by ``engine``: Hypothesis
    (``max_examples`` per run; else the profile's for a clean run, up to ``FAULT_EXAMPLES``
    for a fault's, which stops at its first failure) or the native engine (``budget`` seconds,
    one worker, stopping at the first failure; seed 0 unless ``seed``).  Either engine's failure is
    shrunk by kvcheck's own shrinker (``state_machines/shrinker.py``)."""
    if engine == "native":
        from state_machines.native import native_fuzz

        return lambda spec, params, **kw: native_fuzz(
            spec, params, budget=budget, seed=0 if seed is None else seed, workers=1,
            stop_on_first=True, **kw)
    from caches.faults import all_faults
    from state_machines.fuzz import fuzz

    def run(spec, params, fault=None, **kw):
        cap = max_examples if max_examples is not None or fault is None else FAULT_EXAMPLES
        out = fuzz(spec, params, fault=fault, max_examples=cap, seed=seed, **kw)
        if fault is None or not out.failed:
            return out
        # a fault can show first on another property than its own (H2's lock-ignoring cascade
        # can surface as a spurious OOM before any ref goes wrong): search on past that one
        # (it is tolerated from then on) for a failure on the fault's own
        wanted = all_faults()[fault].properties
        if out.prop in wanted:
            return out
        more = fuzz(spec, params, fault=fault, max_examples=cap, seed=seed,
                    stop_on_first=False, stop_on=wanted, **kw)
        own = next((f for f in more.failures if f.signature.prop in wanted), None)
        if own is not None:
            more.trace, more.trace_path = own.trace, own.trace_path
            more.first_failure_seconds = own.first_seen
        return more

    return run


def run_faults(variant_names, *, max_examples=None, seed=None, device=None,
               engine: str = "hypothesis", budget: float = NATIVE_BUDGET):
    """Run the clean cache and every catalogued fault; yields one result dict per run."""
    from caches.faults import faults_of

    fuzz = search(engine, max_examples=max_examples, seed=seed, budget=budget)
    for name in variant_names:
        spec = variant_named(name)
        clean = [fuzz(spec, r, device=device) for r in spec.regimes]
        bad = next((o for o in clean if o.failed or o.error), None)
        yield {"variant": spec.name, "fault": None, "caught": bad is not None,
               "property": bad.prop if bad else None,
               "seconds": round(sum(o.seconds for o in clean), 3),
               "steps": len(bad.trace.ops) if bad and bad.trace else None,
               "_outcome": bad, "_expected": ()}
        for f in faults_of(spec.name):
            params = spec.check_params({**spec.regimes[0], **f.params})
            o = fuzz(spec, params, fault=f.id, device=device)
            yield {"variant": spec.name, "fault": f.id,
                   "caught": o.failed and o.prop in f.properties,
                   "property": o.prop,
                   "seconds": round(o.first_failure_seconds, 3)
                   if o.first_failure_seconds is not None else None,
                   "steps": len(o.trace.ops) if o.trace else None,
                   "_outcome": o, "_expected": f.properties}


def run(args) -> int:
    from state_machines.variants import all_variants

    if args.corpus:
        from state_machines.commands.common import writable_dir

        writable_dir(args.corpus, "--corpus")
    names = [args.variant] if args.variant else list(all_variants())
    if args.variant:
        variant_named(args.variant)
    device = device_named(args.device)
    if args.engine == "native":
        import math

        if not (math.isfinite(args.budget) and args.budget > 0):
            raise UsageError(f"--budget {args.budget:g}: must be a positive number of seconds")
        if args.max_examples is not None:
            raise UsageError("--max-examples is Hypothesis's; the native engine runs for "
                             "--budget seconds")
    rows, ok = [], True
    for r in run_faults(names, max_examples=args.max_examples, seed=args.seed, device=device,
                        engine=args.engine, budget=args.budget):
        good = (not r["caught"]) if r["fault"] is None else r["caught"]
        ok &= good
        if args.json:
            print(json.dumps({k: r[k] for k in ("variant", "fault", "caught", "property",
                                                "seconds", "steps")}), flush=True)
        else:
            note = "" if good else (
                "  <- clean run failed" if r["fault"] is None else
                f"  <- MISSED (expected {'/'.join(r['_expected'])})")
            rows.append([r["variant"], r["fault"] or "(clean)", r["caught"],
                         r["property"] or "-", r["seconds"] if r["seconds"] is not None else "-",
                         r["steps"] or "-", note])
        if args.corpus and r["fault"] is not None and r["caught"]:
            save_regression(r["_outcome"].trace, r["fault"], args.corpus)
    if not args.json:
        print(format_table(rows, ["variant", "fault", "caught", "property", "seconds", "steps", ""]))
    return EXIT_OK if ok else EXIT_FAIL


def save_regression(trace, fault_id: str, corpus: str) -> None:
    """The ops that exposed ``fault_id`` become a regression trace for the clean cache."""
    import copy
    import tempfile
    from pathlib import Path

    from state_machines.regressions import export
    from state_machines.replay import replay

    clean = copy.deepcopy(trace)
    clean.fault = None
    clean.meta = {"from_fault": fault_id,
                  "note": f"the shrunk trace that exposed fault {fault_id}; passes on the "
                          "clean cache"}
    if not replay(clean).ok:  # cannot happen for a real fault: the clean cache is the fix
        print(f"not saved: {fault_id}'s trace also fails on the clean cache")
        return
    with tempfile.TemporaryDirectory() as tmp:
        export(clean.save(tmp), Path(corpus), f"the shrunk trace of fault {fault_id} "
               "(kvcheck faults --corpus)")
