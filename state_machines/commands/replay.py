"""``kvcheck replay``: re-run a saved trace step by step on a fresh subject."""

from __future__ import annotations

from pathlib import Path

from state_machines.commands.common import (EXIT_FAIL, EXIT_OK, UsageError,
                                            add_known_findings_arg, describe_regime,
                                            device_named, known_findings_named, target_named)


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="replay saved traces step by step")
    p.add_argument("file", nargs="+", help="one or more trace files (e.g. traces/radix-*.json)")
    p.add_argument("--verbose", "-v", action="store_true", help="show the tree after each step")
    p.add_argument("--html", metavar="OUT.html",
                   help="also write a self-contained HTML page with a drawing of each step "
                        "(several traces: OUT-<trace>.html each)")
    p.add_argument("--device")
    p.add_argument("--src", metavar="PATH",
                   help="the engine checkout to replay against (default: the one the trace "
                   "recorded, for a target that takes one)")
    add_known_findings_arg(p, help="override how known upstream findings are treated: "
                           "decline, find or find=ID[,ID...] (default: as the recorded run did)")
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
        code = max(code, replay_one(path, trace, args.verbose, page, device, args.src,
                                    args.known_findings))
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


def replay_one(path, trace, verbose, html, device, src=None, known=None) -> int:
    from state_machines.replay import replay
    from state_machines.variants import get_variant

    src = src if src is not None else trace.src
    if src is not None and src == trace.src and not Path(src).is_dir():
        from state_machines.snapshots import missing_src

        raise UsageError(f"{path}: {missing_src(src)}")
    try:
        target_named(get_variant(trace.variant), trace.target, src)
        known = known_findings_named(known, get_variant(trace.variant), trace.target)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None
    known = known or _known_findings_of(trace, path)
    print(f"replaying {path}: {trace.variant} {describe_regime(trace.params)}"
          + (f", fault {trace.fault}" if trace.fault else "")
          + (f", target {trace.target}" if trace.target != "reference" else "")
          + f", {len(trace.ops)} steps")
    _say_identity(trace, src)
    if trace.target != "reference" and known != trace.known_findings:
        print(f"  (known upstream findings: {known}; the recorded run used "
              f"{trace.known_findings})")

    def show(rec, run):
        print(f"  {rec.index:>3}. {rec.words}  -> {rec.result}")
        if verbose:
            print("       " + "\n       ".join(run.subject.outline().splitlines()))
            print(f"       counters: {rec.counters}")

    try:
        result = replay(trace, device=device, on_step=show, src=src, known_findings=known)
    except KeyError as exc:  # e.g. the target's adapter cannot inject the trace's fault
        raise UsageError(f"{path}: {exc.args[0] if exc.args else exc}") from None
    code = report(result, trace)
    if html:
        write_html(trace, path, html, device)
    return code


def _known_findings_of(trace, path) -> str:
    """As the recorded run did; a known upstream finding's trace always runs its ops (it is
    there to show the defect)."""
    from pathlib import Path

    from state_machines.regressions import expects_failure

    if expects_failure(trace, Path(path)):
        print("  (a known upstream finding: its ops are replayed, not declined)")
        return "find"
    return trace.known_findings


def _say_identity(trace, src) -> None:
    """Say when the code replayed is not the code the trace was recorded against."""
    if trace.target == "reference":
        return
    from state_machines.targets import get_target

    now = get_target(trace.target).identity(src)
    was = trace.identity
    if was is None:
        print(f"  (the trace does not say which {now.engine} it ran against; replaying "
              f"against {now.engine} {now.version} {now.source})")
    else:
        if (was.engine, was.version, was.source) != (now.engine, now.version, now.source):
            print(f"  NOTE: recorded against {was.engine} {was.version} {was.source}; "
                  f"replaying against {now.engine} {now.version} {now.source} -- a different "
                  "source")
        if was.adapter and now.adapter and was.adapter != now.adapter:
            print(f"  NOTE: kvcheck's adapter for {trace.target} changed since the trace was "
                  f"recorded ({was.adapter} -> {now.adapter}): a different result may be the "
                  "adapter's, not the engine's")
    if now.note:
        print(f"  note: {now.note}")


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
