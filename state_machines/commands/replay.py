"""``kvcheck replay``: re-run a saved trace step by step on a fresh subject."""

from __future__ import annotations


from state_machines.commands.common import (EXIT_FAIL, EXIT_OK, UsageError, device_named, describe_regime)


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="replay a saved trace step by step")
    p.add_argument("file")
    p.add_argument("--verbose", "-v", action="store_true", help="show the tree after each step")
    p.add_argument("--html", metavar="OUT.html",
                   help="also write a self-contained HTML page with a drawing of each step")
    p.add_argument("--device")
    p.set_defaults(func=run)


def run(args) -> int:
    from state_machines.replay import replay
    from state_machines.trace import TraceError, load_trace

    try:
        trace = load_trace(args.file)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    device = device_named(args.device)
    print(f"replaying {args.file}: {trace.variant} {describe_regime(trace.params)}"
          + (f", fault {trace.fault}" if trace.fault else "") + f", {len(trace.ops)} steps")

    def show(rec, run):
        print(f"  {rec.index:>3}. {rec.words}  -> {rec.result}")
        if args.verbose:
            print("       " + "\n       ".join(run.subject.outline().splitlines()))
            print(f"       counters: {rec.counters}")

    with _reproducing_if_known_finding(trace, args.file):
        result = replay(trace, device=device, on_step=show)
        code = report(result, trace)
        if args.html:
            write_html(trace, args.file, args.html, device)
    return code


def _reproducing_if_known_finding(trace, path):
    """A known upstream finding's trace replays with the upstream subject's known-finding
    skips off (it is there to show the defect)."""
    from contextlib import nullcontext
    from pathlib import Path

    from state_machines.regressions import expects_failure

    if not expects_failure(trace, Path(path)):
        return nullcontext()
    from caches.adapters import reproducing_known_findings

    print("  (a known upstream finding: its ops are replayed, not declined)")
    return reproducing_known_findings()


def report(result, trace) -> int:
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


def write_html(trace, source: str, out: str, device) -> None:
    from pathlib import Path

    from state_machines.html import render_html

    page, _ = render_html(trace, source=str(source), device=device)
    try:
        Path(out).write_text(page)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc}") from None
    print(f"HTML written: {out}")
