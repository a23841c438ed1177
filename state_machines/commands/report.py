"""``kvcheck report TRACE``: write a finding as a stand-alone script over the engine's own
classes (``<name>.py``, importing nothing from kvcheck) and a short ``<name>.md``."""

from __future__ import annotations

from state_machines.commands.common import (EXIT_OK, UsageError, target_named, variant_named,
                                            trace_file, writable_dir)


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="write an upstream-ready reproduction of a trace: a "
                       "script with the engine's own classes and no kvcheck import, and a "
                       "markdown summary")
    p.add_argument("file", metavar="TRACE", help="a trace file (e.g. tests/upstream_findings/"
                   "sglang-radix-F1-unmatched-unlock.json)")
    p.add_argument("--out", default=".", metavar="DIR",
                   help="where to write <name>.py and <name>.md (default: here)")
    p.add_argument("--target",
                   help="report against another target of the trace's variant (default: the "
                   "trace's own), e.g. sglang-radixcache on sglang 0.5.23")
    p.add_argument("--src", metavar="PATH",
                   help="the engine checkout to replay against (default: the one the trace "
                   "recorded, for a target that takes one)")
    p.set_defaults(func=run)


def run(args) -> int:
    from state_machines.call_recorder import ReportError
    from state_machines.report import build_report, command_line
    trace = trace_file(args.file)
    out = writable_dir(args.out)
    target = args.target or trace.target
    if target == "reference":
        raise UsageError(f"{args.file}: the trace runs kvcheck's reference cache; a report "
                         "reproduces a finding in an engine's code (pass --target)")
    src = args.src if args.src is not None else trace.src
    target_named(variant_named(trace.variant), target, src)
    command = command_line(args.file, args.target, args.src)
    try:
        report = build_report(trace, target=target, command=command, trace_path=args.file,
                              src=src)
    except ReportError as exc:
        raise UsageError(f"{args.file}: {exc}") from None
    except KeyError as exc:  # e.g. the target's adapter refuses the trace's params
        raise UsageError(f"{args.file}: {exc.args[0] if exc.args else exc}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        script, md = out / f"{report.name}.py", out / f"{report.name}.md"
        script.write_text(report.script)
        md.write_text(report.markdown)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot write there ({exc.strerror or exc})") \
            from None
    print(f"script:   {script}\nmarkdown: {md}")
    print(f"the replay broke: {report.broke}" if report.broke else
          "note: replaying the trace here broke nothing; the script exits 0")
    return EXIT_OK
