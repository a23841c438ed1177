"""``kvcheck replay``: re-run a saved trace step by step on a fresh subject."""

from __future__ import annotations


from state_machines.commands.common import (EXIT_FAIL, EXIT_OK, UsageError, device_named, describe_regime)


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="replay saved traces step by step")
    p.add_argument("file", nargs="+", help="one or more trace files (e.g. traces/radix-*.json)")
    p.add_argument("--verbose", "-v", action="store_true", help="show the tree after each step")
    p.add_argument("--html", metavar="OUT.html",
                   help="also write a self-contained HTML page with a drawing of each step "
                        "(several traces: OUT-<trace>.html each)")
    p.add_argument("--device")
    p.set_defaults(func=run)


def run(args) -> int:
    from state_machines.trace import TraceError, load_trace

    traces = []
    for path in args.file:  # every file is checked before anything runs
        try:
            traces.append((path, load_trace(path)))
        except TraceError as exc:
            raise UsageError(str(exc)) from None
    device = device_named(args.device)
    pages = _html_paths(args.html, [path for path, _ in traces])
    code = EXIT_OK
    for (path, trace), page in zip(traces, pages):
        if len(traces) > 1:
            print()
        code = max(code, replay_one(path, trace, args.verbose, page, device))
    if len(traces) > 1:
        print(f"\nreplayed {len(traces)} traces: "
              + ("every property holds in all of them" if code == EXIT_OK else
                 "at least one still breaks a property"))
    return code


def _html_paths(html, files) -> list:
    from pathlib import Path

    if not html:
        return [None] * len(files)
    out = Path(html)
    if out.is_dir():
        raise UsageError(f"--html {html}: is a directory, expected a file name")
    if not out.parent.is_dir():
        raise UsageError(f"cannot write {html}: no such directory {str(out.parent)!r}")
    if len(files) == 1:
        return [out]
    return [out.with_name(f"{out.stem}-{Path(f).stem}{out.suffix or '.html'}") for f in files]


def replay_one(path, trace, verbose, html, device) -> int:
    from state_machines.replay import replay

    print(f"replaying {path}: {trace.variant} {describe_regime(trace.params)}"
          + (f", fault {trace.fault}" if trace.fault else "")
          + (f", target {trace.target}" if trace.target != "reference" else "")
          + f", {len(trace.ops)} steps")

    def show(rec, run):
        print(f"  {rec.index:>3}. {rec.words}  -> {rec.result}")
        if verbose:
            print("       " + "\n       ".join(run.subject.outline().splitlines()))
            print(f"       counters: {rec.counters}")

    with _reproducing_if_known_finding(trace, path):
        try:
            result = replay(trace, device=device, on_step=show)
        except ImportError as exc:  # an upstream target whose environment is not here
            raise UsageError(f"{path}: target {trace.target} cannot be built here ({exc}); "
                             "set up its environment first (see docs/adapters.md)") from None
        except KeyError as exc:  # e.g. the target's adapter cannot inject the trace's fault
            raise UsageError(f"{path}: {exc.args[0] if exc.args else exc}") from None
        code = report(result, trace)
        if html:
            write_html(trace, path, html, device)
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
