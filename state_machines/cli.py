"""``kvcheck``: list, fuzz, replay, faults, bench.

Exit codes: 0 clean / trace now passes; 1 a property broke (or a fault was missed); 2 a bad
argument, file or name (with a message, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


# -- argument helpers -------------------------------------------------------------------------
def _params(args, spec) -> list[dict]:
    """The regimes to run: the variant's own, narrowed/overridden by --page-size / --param."""
    over = {}
    for item in args.param or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--param expects NAME=VALUE, got {item!r}")
        try:
            over[name] = int(value)
        except ValueError:
            raise UsageError(f"--param {name}: {value!r} is not an integer") from None
    if getattr(args, "page_size", None) is not None:
        over["page_size"] = args.page_size
    regimes = [{**r, **over} for r in spec.regimes] if over else list(spec.regimes)
    out = []
    for r in regimes:
        try:
            p = spec.check_params(r)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if p not in out:
            out.append(p)
    return out


def _spec(name):
    from state_machines.variants import get_variant

    try:
        return get_variant(name)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None


def _fault(fid, variant):
    if fid is None:
        return None
    from caches.faults import get_fault

    try:
        f = get_fault(fid)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    if f.variant != variant:
        raise UsageError(f"fault {fid} belongs to variant {f.variant!r}, not {variant!r}")
    return f


def _device(name):
    from caches.pools import resolve_device

    try:
        return str(resolve_device(name))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _regime(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _table(rows: list[list], header: list[str]) -> str:
    cols = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in cols[1:]])


def print_failure(outcome, out=None) -> None:
    """The shrunk steps in plain words, the broken property, and where the trace is."""
    from state_machines.replay import replay

    out = out or sys.stdout
    trace = outcome.trace
    spec_name = trace.variant
    print(f"\nFAILED: {spec_name} {_regime(trace.params)}"
          + (f" with fault {trace.fault}" if trace.fault else "")
          + ("" if trace.meta.get("shrunk", True) else " (not shrunk: interrupted)"), file=out)
    result = replay(trace, device=None)
    for rec in result.steps:
        print(f"  {rec.index:>3}. {rec.words}  -> {rec.result}", file=out)
    if result.violation is not None:
        print(f"  {result.failed_step:>3}. {result.failed_op}  -> BROKE", file=out)
        print(f"\nproperty broken: {result.violation.prop}\n  {result.violation.message}",
              file=out)
    else:  # cannot normally happen: the trace was recorded from a failing run
        v = trace.violation
        print(f"\nproperty broken (recorded): {v['property']}\n  {v['message']}\n"
              "  (replaying the trace did not reproduce it: the failure is flaky)", file=out)
    if outcome.trace_path:
        print(f"\ntrace saved: {outcome.trace_path}\nreplay it:   kvcheck replay "
              f"{outcome.trace_path} --verbose", file=out)


# -- commands ---------------------------------------------------------------------------------
def cmd_list(args) -> int:
    from caches.faults import faults_of
    from state_machines.variants import all_variants

    for spec in all_variants().values():
        print(f"{spec.name}: {spec.summary}")
        print(f"  targets: {', '.join(spec.targets)}")
        print("  params:  " + ", ".join(f"{k} (default {p.default}: {p.doc})"
                                       for k, p in spec.params.items()))
        print("  regimes: " + "; ".join(_regime(spec.check_params(r)) for r in spec.regimes))
        print("  ops:     " + ", ".join(n for n in spec.ops.names()))
        for f in faults_of(spec.name):
            print(f"  fault {f.id:<3} {f.name}  [{f.upstream}]  reports {'/'.join(f.properties)}")
            print(f"            {f.summary}")
    return EXIT_OK


def cmd_fuzz(args) -> int:
    from state_machines.fuzz import fuzz

    spec = _spec(args.variant)
    fault = _fault(args.fault, spec.name)
    if args.target not in spec.targets:
        raise UsageError(f"unknown target {args.target!r} for {spec.name}; known: "
                         f"{', '.join(spec.targets)}")
    device = _device(args.device)
    regimes = _params(args, spec)
    if fault is not None and fault.params and args.page_size is None and not args.param:
        regimes = [spec.check_params({**regimes[0], **fault.params})]
    budget = args.budget / len(regimes) if args.budget else None
    rows, failed = [], None
    for params in regimes:
        label = f"{spec.name} {_regime(params)}"
        print(f"fuzzing {label}" + (f" with fault {fault.id}" if fault else "")
              + f" on {device} ...", file=sys.stderr, flush=True)

        def progress(rec, label=label, end=time.monotonic() + (budget or 0)):
            print(f"  {label}: {rec.examples} examples, {rec.steps} steps, "
                  f"{'1 failure' if rec.first_failure_at else '0 failures'}, "
                  f"{max(0, end - time.monotonic()):.0f}s left", file=sys.stderr, flush=True)

        outcome = fuzz(spec, params, fault=fault.id if fault else None, target=args.target,
                       device=device, max_examples=args.max_examples, budget=budget,
                       seed=args.seed, out_dir=args.out, progress=progress)
        if outcome.error:
            print(f"error: the harness failed: {outcome.error}", file=sys.stderr)
            return EXIT_FAIL
        rate = outcome.steps / outcome.seconds if outcome.seconds else 0
        status = ("interrupted" if outcome.interrupted else
                  f"FAILED: {outcome.prop}" if outcome.failed else "clean")
        rows.append([spec.name, _regime(params), outcome.examples, outcome.steps,
                     f"{rate:,.0f}", f"{outcome.seconds:.1f}", status])
        if outcome.failed:
            failed = outcome
            break
        if outcome.interrupted:
            break
    print(_table(rows, ["variant", "regime", "examples", "steps", "steps/s", "seconds",
                        "result"]))
    if failed is not None:
        print_failure(failed)
        return EXIT_FAIL
    return EXIT_FAIL if rows and rows[-1][-1] == "interrupted" else EXIT_OK


def cmd_replay(args) -> int:
    from state_machines.replay import replay
    from state_machines.trace import TraceError, load_trace

    try:
        trace = load_trace(args.file)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    device = _device(args.device)
    print(f"replaying {args.file}: {trace.variant} {_regime(trace.params)}"
          + (f", fault {trace.fault}" if trace.fault else "") + f", {len(trace.ops)} steps")

    def show(rec, run):
        print(f"  {rec.index:>3}. {rec.words}  -> {rec.result}")
        if args.verbose:
            print("       " + "\n       ".join(run.subject.outline().splitlines()))
            print(f"       counters: {rec.counters}")

    result = replay(trace, device=device, on_step=show)
    recorded = trace.violation
    if result.violation is None:
        print("all properties hold at every step"
              + (f" (the trace recorded {recorded['property']} at step {recorded.get('step')};"
                 " it no longer fails)" if recorded else ""))
        return EXIT_OK
    v = result.violation
    print(f"  {result.failed_step:>3}. {result.failed_op}  -> BROKE")
    print(f"\nproperty broken at step {result.failed_step}: {v.prop}\n  {v.message}")
    return EXIT_FAIL


def run_faults(variant_names, *, max_examples=None, seed=None, device=None):
    """Run the clean cache and every catalogued fault; yields one result dict per run."""
    from caches.faults import faults_of
    from state_machines.fuzz import fuzz

    for name in variant_names:
        spec = _spec(name)
        clean = [fuzz(spec, r, device=device, max_examples=max_examples, seed=seed)
                 for r in spec.regimes]
        bad = next((o for o in clean if o.failed or o.error), None)
        yield {"variant": spec.name, "fault": None, "caught": bad is not None,
               "property": bad.prop if bad else None,
               "seconds": round(sum(o.seconds for o in clean), 3),
               "steps": len(bad.trace.ops) if bad and bad.trace else None,
               "_outcome": bad, "_expected": ()}
        for f in faults_of(spec.name):
            params = spec.check_params({**spec.regimes[0], **f.params})
            o = fuzz(spec, params, fault=f.id, device=device, max_examples=max_examples,
                     seed=seed)
            yield {"variant": spec.name, "fault": f.id,
                   "caught": o.failed and o.prop in f.properties,
                   "property": o.prop,
                   "seconds": round(o.first_failure_seconds, 3)
                   if o.first_failure_seconds is not None else None,
                   "steps": len(o.trace.ops) if o.trace else None,
                   "_outcome": o, "_expected": f.properties}


def cmd_faults(args) -> int:
    from state_machines.variants import all_variants

    names = [args.variant] if args.variant else list(all_variants())
    if args.variant:
        _spec(args.variant)
    device = _device(args.device)
    rows, ok = [], True
    for r in run_faults(names, max_examples=args.max_examples, seed=args.seed, device=device):
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
    if not args.json:
        print(_table(rows, ["variant", "fault", "caught", "property", "seconds", "steps", ""]))
    return EXIT_OK if ok else EXIT_FAIL


def cmd_bench(args) -> int:
    from state_machines.bench import bench, format_bench

    names = [args.variant] if args.variant else None
    if args.variant:
        _spec(args.variant)
    results = bench(names, examples=args.examples, device=_device(args.device))
    print(format_bench(results))
    return EXIT_OK


# -- parser -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvcheck", description="Model-check LLM-serving KV caches.")
    p.add_argument("--profile", choices=("dev", "ci", "nightly"),
                   help="Hypothesis settings profile (default: $HYPOTHESIS_PROFILE or dev)")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="variants, targets, faults").set_defaults(func=cmd_list)

    f = sub.add_parser("fuzz", help="fuzz one variant; on failure print and save the trace")
    f.add_argument("variant")
    f.add_argument("--fault", help="switch on a catalogued fault (e.g. R1)")
    f.add_argument("--target", default="reference", help="reference (default) or an upstream")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--max-examples", type=int, metavar="N")
    g.add_argument("--budget", type=float, metavar="SECONDS")
    f.add_argument("--seed", type=int)
    f.add_argument("--page-size", type=int)
    f.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="override a variant parameter (repeatable)")
    f.add_argument("--device", help="cpu or cuda (default: cuda if available, else cpu)")
    f.add_argument("--out", default="kvcheck-traces", help="where failing traces go")
    f.set_defaults(func=cmd_fuzz)

    r = sub.add_parser("replay", help="replay a saved trace step by step")
    r.add_argument("file")
    r.add_argument("--verbose", "-v", action="store_true", help="show the tree after each step")
    r.add_argument("--device")
    r.set_defaults(func=cmd_replay)

    q = sub.add_parser("faults", help="is every catalogued fault caught on its property?")
    q.add_argument("--variant")
    q.add_argument("--json", action="store_true", help="one JSON object per line")
    q.add_argument("--max-examples", type=int, metavar="N")
    q.add_argument("--seed", type=int)
    q.add_argument("--device")
    q.set_defaults(func=cmd_faults)

    b = sub.add_parser("bench", help="checked steps/s vs bare cache ops/s")
    b.add_argument("variant", nargs="?")
    b.add_argument("--examples", type=int, default=60)
    b.add_argument("--device")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("max_examples", "budget", "examples"):
        v = getattr(args, name, None)
        if v is not None and v <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    try:
        from state_machines.profiles import load_profile

        load_profile(args.profile or ("ci" if args.command == "faults" else None))
        return args.func(args)
    except UsageError as exc:
        print(f"kvcheck: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvcheck: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
