"""``kvcheck report``: a finding as a stand-alone script over the engine's own classes.

The trace replays through the real subject (the one execution path, ``Run``) while the engine
objects the adapter built are instrumented (``state_machines/call_recorder.py``): every call and
attribute write the driver makes on them becomes a line of code.  The script is then

    the subject's preamble (import stand-ins), the engine imports,
    the checks of the trace's property in the engine's terms (``ReportSetup.checks``),
    the construction of the engine objects (as the adapter built them),
    per step: the recorded calls, then the check,

and it exits 1 with ``BROKEN at step N: <property>: ...`` while the defect is there (a crash:
the exception the engine raised), 0 when every step passes.  It imports nothing from kvcheck.
A short markdown says the versions, the steps and the broken property in the engine's terms.
"""

from __future__ import annotations

import shlex
from contextlib import contextmanager
from dataclasses import dataclass

from state_machines.call_recorder import CallRecorder, Line, ReportError

CRASH, QUIESCENCE = "crash", "quiescence"


@dataclass
class Report:
    name: str
    script: str
    markdown: str
    broke: str | None  # the property the replay broke (None: every step passed)


def build_report(trace, *, target: str | None = None, device: str | None = "cpu",
                 command: str = "", trace_path: str = "", src: str | None = None) -> Report:
    """Replay ``trace`` (on ``target``, default its own) recording the engine calls, and write
    the script and the markdown.  Raises ``ReportError`` when it cannot be written."""
    from invariants import Violation
    from state_machines.run import Run, target_identity
    from state_machines.variants import get_variant

    if trace.fault is not None:
        raise ReportError(f"the trace injects catalogued fault {trace.fault}: that is kvcheck's "
                          "mutation, not the engine's code, so there is nothing upstream to "
                          "reproduce")
    spec = get_variant(trace.variant)
    target = target or trace.target
    src = src if src is not None else trace.src
    run = Run(spec, trace.params, None, target, device, src=src,
              known_findings=trace.known_findings)
    hook = getattr(run.subject, "report_setup", None)
    setup = hook() if hook is not None else None
    if setup is None:
        raise ReportError(f"target {target!r} has no reporter for variant {trace.variant!r} "
                          "yet: its subject declares no report_setup() (docs/adapters.md, "
                          "\"Upstream-ready reproductions\"; kvcheck's own targets write "
                          f"scripts for: {', '.join(reporters())})")
    prop = (trace.violation or {}).get("property")
    if prop is not None and prop != CRASH and prop not in setup.checks:
        raise ReportError(f"no check of property {prop!r} in {setup.engine}'s terms for "
                          f"{setup.driven} yet (has: {', '.join(setup.checks) or 'none'})")
    rec = CallRecorder(setup.node_fields)
    construction = _construction(rec, setup)
    setup.built.recorder = rec

    @contextmanager
    def recording():
        rec.active = True
        try:
            yield
        finally:
            rec.active = False

    run.around_op = recording  # the op's engine calls are recorded, its checks are not
    checks = [setup.checks[prop]] if prop in setup.checks else []
    steps = []
    try:
        for i, op in enumerate(trace.ops, 1):
            words = spec.ops.describe(op)
            steps.append(words)
            rec.lines.append(f"STEP = {f'{i}. {words}'!r}")
            # quiescence holds after the drain only: its check follows that step alone
            after = checks if prop != QUIESCENCE or op.name == "quiesce" else []
            try:
                run.apply(op)
            except Violation as v:
                if v.prop != CRASH:  # the script checks after the breaking step too
                    rec.lines.extend(Line(c.call) for c in after)
                break
            rec.lines.extend(Line(c.call) for c in after)
    finally:
        rec.restore()
        setup.built.recorder = None
    broke = run.violation.prop if run.violation is not None else None
    if broke is not None and broke != prop:
        raise ReportError(f"replaying the trace broke {broke!r}, not the recorded {prop!r}: "
                          f"{run.violation.message}")
    identity = target_identity(spec, target, src)
    name = _name(trace_path, trace)
    ctx = dict(trace=trace, setup=setup, identity=identity, prop=prop, checks=checks,
               steps=steps, command=command, name=name, run=run, construction=construction,
               declared=spec.params_for(target))
    return Report(name, _script(rec, construction, ctx), _markdown(ctx), broke)


def _construction(rec: CallRecorder, setup) -> list[str]:
    """The engine objects as the adapter built them, as code; each is instrumented."""
    lines = []
    for step in setup.built.steps:
        if step[0] == "make":
            _, name, obj, cls, args, kwargs = step
            lines.append(f"{name} = {rec.constructor_call(cls, args, kwargs)}")
            rec.instrument(obj, name)
        else:
            _, obj, attr, value = step
            lines.append(f"{rec.code(obj)}.{attr} = {rec.code(value)}")
    for expr, obj in setup.anchors.items():
        rec.name(obj, expr)
    return lines


def reporters() -> list[str]:
    """Where reports can be written: ``target/variant`` pairs whose subjects have a hook."""
    return ["sglang/radix and sglang/streaming-session (0.5.12.post1)",
            "sglang-radixcache/radix (0.5.23)", "pymllm/radix (ref-balance, size-accounting)"]


def _name(trace_path: str, trace) -> str:
    from pathlib import Path

    return Path(trace_path).stem if trace_path else trace.name()


def _script(rec: CallRecorder, construction: list[str], ctx) -> str:
    setup, trace, identity = ctx["setup"], ctx["trace"], ctx["identity"]
    body = ["global STEP", "STEP = 'constructing the engine objects'", *construction]
    last = len(rec.lines) - 1
    for i, line in enumerate(rec.lines):
        if isinstance(line, str):
            body.append("")
            body.append(line)
        elif line.raised and not (i == last and ctx["run"].violation is not None):
            body += [f"try:  # the recorded run raised {line.raised} here and went on",
                     f"    {line.code}", f"except {line.raised} as exc:",
                     f"    print(f'  (step {{STEP}}: {line.raised}: {{exc}}, as in the recorded "
                     "run)')"]
        else:
            body.append(line.code)
    imports = []
    for module, names in sorted(rec.imports.items()):
        if module == "":
            imports += [f"import {n}" for n in sorted(names)]
        else:
            imports.append(f"from {module} import {', '.join(sorted(names))}")
    prop = ctx["prop"] or "(none recorded)"
    checks = "\n\n".join(c.code.strip() for c in ctx["checks"])
    header = [
        f'"""Reproduce kvcheck finding {ctx["name"]}: {trace.variant} on {setup.engine} '
        f'{setup.version} ({setup.driven}), property {prop}.',
        "",
        f"Generated by kvcheck for {identity.engine} {identity.version} ({identity.source})"
        if identity else f"Generated by kvcheck for {setup.engine} {setup.version}",
        f"with: {ctx['command']}" if ctx["command"] else "",
        "Imports nothing from kvcheck: only the engine and what it imports.",
        f"Run: {setup.interpreter} {ctx['name']}.py",
        "Exit status 1 and 'BROKEN at step N: <property>: ...' while the defect is there;",
        "0 when every step passes.",
        "",
        "Steps (kvcheck's words):",
        *[f"  {i}. {w}" for i, w in enumerate(ctx["steps"], 1)],
        '"""',
    ]
    parts = ["\n".join(h for h in header if h is not None),
             "import sys\nimport traceback",
             setup.preamble.strip(),
             "\n".join(imports),
             setup.after_import.strip(),
             f"ENGINE, VERSION = {setup.engine!r}, {setup.version!r}",
             "STEP = None",
             _BROKEN,
             checks,
             "def reproduce():\n" + "\n".join(("    " + b) if b else "" for b in body),
             _MAIN]
    return "\n\n\n".join(p for p in parts if p) + "\n"


_BROKEN = '''class Broken(Exception):
    """A property of the engine's state does not hold (its name, what is wrong)."""

    def __init__(self, prop, message):
        super().__init__(f"{prop}: {message}")
        self.prop = prop'''

_MAIN = '''def main():
    import importlib.metadata

    try:
        installed = importlib.metadata.version(ENGINE)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if VERSION and installed != VERSION:
        print(f"note: written for {ENGINE} {VERSION}; {installed or 'none'} is installed")
    try:
        reproduce()
    except Broken as exc:
        print(f"BROKEN at step {STEP}: {exc}")
        return 1
    except Exception as exc:
        traceback.print_exc()
        print(f"BROKEN at step {STEP}: crash: {type(exc).__name__}: {exc}")
        return 1
    print("not reproduced: every step ran and every checked property holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())'''


def _markdown(ctx) -> str:
    setup, trace, identity, run = ctx["setup"], ctx["trace"], ctx["identity"], ctx["run"]
    prop = ctx["prop"]
    v = trace.violation or {}
    lines = [f"# {ctx['name']}", "",
             f"* engine: {setup.engine} {setup.version}"
             + (f" (source {identity.source})" if identity else ""),
             f"* class: `{setup.driven}`",
             f"* kvcheck variant `{trace.variant}`, target `{run.target}`, params "
             + ", ".join(f"{k}={val}" for k, val in trace.params.items()),
             f"* reproduce: `{setup.interpreter} {ctx['name']}.py` (imports only "
             f"{setup.engine}; exit 1 while the defect is there)",
             ]
    if ctx["command"]:
        lines.append(f"* regenerate: `{ctx['command']}`")
    lines += ["", "## Engine configuration the finding needs", "",
              "Every option the target set (is your deployment configured this way?):", ""]
    declared = ctx["declared"]
    for k, val in trace.params.items():
        doc = declared[k].doc if k in declared else ""
        lines.append(f"* `{k}={val}`" + (f": {doc}" if doc else ""))
    lines += ["", "The engine objects, built as the script builds them:", "", "```python",
              *ctx["construction"], "```"]
    lines += ["", "## Steps", ""]
    lines += [f"{i}. {w}" for i, w in enumerate(ctx["steps"], 1)]
    lines += ["", "## Broken property", ""]
    if prop is None:
        lines.append("The trace records no broken property.")
    elif prop == CRASH:
        lines.append(f"`crash`: the engine itself raised at step {v.get('step')}: "
                     f"{v.get('message', '')}")
    else:
        lines.append(f"`{prop}`, in {setup.engine}'s terms: {setup.checks[prop].words}.")
        lines += ["", f"kvcheck reported at step {v.get('step')}: {v.get('message', '')}"]
    if run.violation is None:
        lines += ["", "Note: replaying the trace here broke nothing (the script exits 0)."]
    return "\n".join(lines) + "\n"


def command_line(trace_path: str, target: str | None, src: str | None) -> str:
    parts = ["kvcheck", "report", trace_path]
    if target:
        parts += ["--target", target]
    if src:
        parts += ["--src", src]
    return " ".join(shlex.quote(p) for p in parts)
