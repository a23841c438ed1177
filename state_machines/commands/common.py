"""What every kvcheck command shares: exit codes, usage errors, name lookups, tables."""

from __future__ import annotations

import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 3
EXIT_HARNESS = 4  # kvcheck itself failed: never an engine's verdict
HARNESS_WORDS = "kvcheck failed, not the engine"


class UsageError(Exception):
    pass


# -- argument helpers -------------------------------------------------------------------------
def param_overrides(args) -> dict:
    """``--param NAME=VALUE`` (repeatable) as a dict of ints."""
    over = {}
    for item in getattr(args, "param", None) or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--param expects NAME=VALUE, got {item!r}")
        try:
            over[name] = int(value)
        except ValueError:
            raise UsageError(f"--param {name}: {value!r} is not an integer") from None
    return over


def regimes_from_args(args, spec) -> list[dict]:
    """The regimes to run: the variant's own, narrowed/overridden by --page-size / --param."""
    over = param_overrides(args)
    if getattr(args, "page_size", None) is not None:
        over["page_size"] = args.page_size
    target = getattr(args, "target", None)
    own = spec.regimes_for(target)
    regimes = [{**r, **over} for r in own] if over else list(own)
    out = []
    for r in regimes:
        try:
            p = spec.check_params(r, target)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if p not in out:
            out.append(p)
    return _regimes_the_target_runs(args, spec, out, asked=set(over))


def _regimes_the_target_runs(args, spec, regimes: list[dict], asked: set) -> list[dict]:
    """Leave out the default regimes ``--target`` cannot run here (``params_unavailable``:
    its installed release lacks that part), saying so; a regime asked for is refused.  Where
    the target names a regime it can run instead (``params_substitute``) and that changes no
    parameter named by --param, that one runs in its place, saying so."""
    name = getattr(args, "target", None)
    if name in (None, "reference"):
        return regimes
    from state_machines.targets import params_substitute, params_unavailable_reason

    src = getattr(args, "src", None)
    out, told = [], set()
    for p in regimes:
        why = params_unavailable_reason(name, spec.name, p, src)
        alt = None if why is None else params_substitute(name, spec.name, p, src)
        if alt is not None and not {k for k in alt if alt[k] != p.get(k)} & asked \
                and params_unavailable_reason(name, spec.name, alt, src) is None:
            changed = " ".join(f"{k}={alt[k]}" for k in alt if alt[k] != p.get(k))
            print(f"running {spec.name} {describe_regime(p)} with {changed} [{name}]"
                  + ("" if why in told else f": {why}"), file=sys.stderr)
            told.add(why)
            if alt not in out:
                out.append(alt)
        elif why is None:
            if p not in out:
                out.append(p)
        elif asked:
            raise UsageError(f"target {name} cannot run {spec.name} {describe_regime(p)} "
                             f"here: {why}")
        else:
            print(f"skipping {spec.name} {describe_regime(p)} [{name}]: {why}",
                  file=sys.stderr)
    if not out:
        raise UsageError(f"target {name} can run none of {spec.name}'s regimes here")
    return out


def writable_dir(path, flag: str = "--out"):
    """``path`` as a folder this run can write into, checked *before* the run so that what it
    finds is not lost to a bad output path (nothing is created until there is something to
    write: a missing folder's nearest existing parent must be a writable directory)."""
    import os
    from pathlib import Path

    p = Path(path)
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    what = "" if probe == p else f" (its parent {probe} "
    if probe.exists() and not probe.is_dir():
        raise UsageError(f"{flag} {path}: " + (f"exists and is not a directory" if not what
                                               else f"cannot be created{what}is not a directory)"))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot write there" + (f"{what}is not writable)"
                                                                  if what else ""))
    return p


def created_dir(path, flag: str = "--out"):
    """``path`` created now (with its parents) and shown writable by writing a probe file --
    for a command that writes there whatever happens (``nightly``'s summary).  The access
    bits ``writable_dir`` reads do not bind root, and some file systems (``/proc``) refuse
    a folder whatever the bits say: only creating one tells."""
    import os
    import tempfile

    p = writable_dir(path, flag)
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".kvcheck-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None
    return p


def names_known(variants=(), target: str | None = None) -> None:
    """A ``UsageError`` for an unknown ``--variant`` or ``--target`` name, checked against the
    light name lists (no variant, target, engine or torch imported): bad names cost nothing."""
    from state_machines.targets import target_names
    from state_machines.variant_names import NAMES, unknown_variant

    for name in variants or ():
        if name not in NAMES:
            raise UsageError(unknown_variant(name))
    if target is not None:
        known = target_names()
        if target not in known:
            raise UsageError(f"unknown target {target!r}; known: {', '.join(known)} "
                             "(`kvcheck list` shows them)")


def variant_named(name):
    names_known([name])
    from state_machines.variants import get_variant

    try:
        return get_variant(name)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None


def fault_named(fid, variant, target="reference"):
    """The catalogued fault ``fid``; on the reference it must be ``variant``'s own, an upstream
    target's factory says itself which catalogue faults it can inject."""
    if fid is None:
        return None
    from caches.faults import get_fault

    try:
        f = get_fault(fid)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    if f.variant != variant and target == "reference":
        raise UsageError(f"fault {fid} belongs to variant {f.variant!r}, not {variant!r}")
    return f


def add_target_args(p, *, known_findings: bool = True, default: str | None = "reference",
                    help_target: str | None = None, repeatable: bool = False) -> None:
    """``--target`` (``repeatable``: a list), ``--src`` and (for commands that fuzz)
    ``--known-findings``."""
    from caches.target import DECLINE

    p.add_argument("--target", default=default, action="append" if repeatable else "store",
                   help=help_target or "reference (default) or a registered target; "
                   "`kvcheck list` shows them")
    p.add_argument("--src", metavar="PATH",
                   help="the engine checkout a target that takes one loads (e.g. lightllm)")
    if known_findings:
        add_known_findings_arg(p, default=DECLINE)


KNOWN_FINDINGS_HELP = (
    "decline (default): an upstream target skips the ops that would only re-find a recorded "
    "upstream finding; find: run them all; find=ID[,ID...]: run those of the named findings "
    "only (e.g. find=F1; `kvcheck list` shows each target's ids).  Recorded in the trace, so "
    "replay does the same")


def add_known_findings_arg(p, default=None, help: str = KNOWN_FINDINGS_HELP) -> None:
    p.add_argument("--known-findings", default=default, metavar="decline|find|find=ID,...",
                   help=help)


def known_findings_named(setting, spec, target: str | None):
    """``--known-findings`` checked (normal form; None stays None) for ``target``'s ``spec``
    variant -- or, for a job over several (``spec`` a list of variants, ``target`` None: every
    target of each), for all of them: a malformed setting, or an id that no target of the job
    declares, is a ``UsageError`` that lists the ids they have."""
    if setting is None:
        return None
    from caches.target import driven_findings, parse_known_findings
    from state_machines.targets import UnknownTarget, get_target

    try:
        setting = parse_known_findings(setting)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ids = driven_findings(setting)
    if not ids:
        return setting
    specs = spec if isinstance(spec, (list, tuple)) else [spec]
    pairs = [(s, t) for s in specs for t in ([target] if target else s.targets)
             if t not in s.extra_targets and t in s.targets]
    if len(pairs) == 1 and not isinstance(spec, (list, tuple)):
        try:
            return get_target(target).known_findings(spec.name, setting)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        except UnknownTarget as exc:
            raise UsageError(exc.args[0]) from None
    known = {}
    for s, t in pairs:
        try:
            for fid in get_target(t).findings.get(s.name, ()):
                known.setdefault(fid, []).append(f"{t} {s.name}")
        except UnknownTarget:
            continue
    unknown = sorted(ids - set(known))
    if unknown:
        have = "; ".join(f"{fid}: {', '.join(where)}" for fid, where in sorted(known.items()))
        raise UsageError(f"--known-findings {setting}: no target here has a known finding "
                         f"{', '.join(unknown)} (known: {have or 'none'})")
    return setting


def target_named(spec, name: str, src: str | None = None) -> str:
    """Check that target ``name`` has variant ``spec`` and can be used here (with ``src``);
    returns the name or raises a ``UsageError`` that says why not and how to fix it."""
    from pathlib import Path

    from state_machines.targets import UnknownTarget, get_target, unavailable_reason

    if name in spec.extra_targets:
        return name
    try:
        target = get_target(name)
    except UnknownTarget as exc:
        raise UsageError(exc.args[0]) from None
    if spec.name not in target.builders:
        raise UsageError(f"target {name!r} has no {spec.name} variant (it has "
                         f"{', '.join(target.builders) or 'none'}); targets for {spec.name}: "
                         f"{', '.join(spec.targets)}")
    if src is not None:
        if not target.takes_src:
            raise UsageError(f"target {name!r} takes no --src (it loads an installed "
                             f"{target.engine})")
        if not Path(src).is_dir():
            raise UsageError(f"--src {src}: not a directory (expected a {target.engine} "
                             "checkout)")
    why = unavailable_reason(name, src)
    if not why and target.variant_unavailable is not None:
        why = target.variant_unavailable(spec.name, src)
    if why:
        raise UsageError(f"target {name} cannot be used here: {why}")
    return name


def job_variants(names) -> list:
    """The variants a job over several runs: those named (``--variant``), else every one."""
    from state_machines.variants import all_variants

    return [variant_named(v) for v in names] if names else list(all_variants().values())


def targets_from_args(args):
    """A job's ``--target`` (with ``--variant`` and ``--src``) checked: ``[name]``, or None for
    every target usable here."""
    if args.target is None:
        if args.src is not None:
            raise UsageError("--src needs --target (the target that loads the checkout)")
        return None
    from state_machines.variants import all_variants

    specs = [variant_named(v) for v in args.variant] if args.variant else [
        s for s in all_variants().values() if args.target in s.targets]
    if not specs:
        raise UsageError(f"no variant has target {args.target!r}")
    for spec in specs:
        target_named(spec, args.target, args.src)
    return [args.target]


def identity_lines(spec, target: str, src: str | None = None) -> list[str]:
    """What a run against ``target`` drives, for its header: the identity (engine, declared
    version, source, adapter) and its note (a version newer than kvcheck was tested on)."""
    if target == "reference" or target in spec.extra_targets:
        return []
    from state_machines.run import target_identity

    ident = target_identity(spec, target, src)
    lines = [f"target {target}: {ident.describe()}"
             + (f" from --src {src}" if src is not None else "")]
    return lines + ([f"note: {ident.note}"] if ident.note else [])


def device_named(name):
    from caches.pools import resolve_device

    try:
        return str(resolve_device(name))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def describe_regime(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def format_table(rows: list[list], header: list[str], wrap: int | None = None) -> str:
    """Rows under a header, columns padded.  ``wrap``: the last column's cells are wrapped at
    that many characters, their continuation lines indented under the column -- a long cell
    (a skip reason with its advice) is printed whole, never cut."""
    import textwrap

    cols = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    if wrap is not None:
        widths[-1] = min(widths[-1], wrap)
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    lines = [fmt(header), fmt(["-" * w for w in widths])]
    indent = " " * (sum(widths[:-1]) + 2 * (len(widths) - 1))
    for r in cols[1:]:
        if wrap is None:
            lines.append(fmt(r))
            continue
        first, *rest = textwrap.wrap(r[-1], wrap, break_long_words=False,
                                     break_on_hyphens=False) or [""]
        lines += [fmt(r[:-1] + [first])] + [indent + part for part in rest]
    return "\n".join(lines)


def failure_groups(failures) -> list[list]:
    """``failures`` by root cause, in first-seen order: one group per known finding (every
    failure labelled with its id: the ones its fix model removes); new failures that broke
    the same property with the same (masked) message at different ops -- one defect met at a
    finish and at an abort -- share a group.  A group's first member is its shortest trace."""
    groups: dict = {}
    for f in failures:
        key = (("known", f.known) if f.known is not None else
               ("new", f.signature.prop, f.signature.message))
        groups.setdefault(key, []).append(f)
    steps = lambda f: len(f.trace.ops) if f.trace is not None else 10**9  # noqa: E731
    return [sorted(g, key=steps) for g in groups.values()]


def failure_table(failures) -> str:
    """The distinct failures of a run, one row per root cause (``failure_groups``): a known
    finding's row lists every signature it was met with below it."""
    rows, groups = [], failure_groups(failures)
    for i, group in enumerate(groups, 1):
        f, t = group[0], group[0].trace
        kind = ("new" if f.known is None else
                f"known {f.known}" + (" (asked for)" if f.driven else " (declined)"))
        rows.append([i, str(f.signature)[:70], describe_regime(t.params) if t else "-",
                     f.engine, f"{min(g.first_seen for g in group):.1f}s",
                     sum(g.count for g in group), len(t.ops) if t else "-", kind,
                     f.trace_path or "-"])
        for g in group[1:]:
            rows.append(["", "  also " + str(g.signature)[:70], "", g.engine,
                         f"{g.first_seen:.1f}s", g.count,
                         len(g.trace.ops) if g.trace else "-", "", g.trace_path or "-"])
    head = f"distinct failures: {len(failures)}"
    if len(groups) < len(failures):
        head += f", in {len(groups)} rows (one per root cause)"
    return head + "\n" + format_table(
        rows, ["#", "signature", "regime", "engine", "first seen", "count", "steps", "finding",
               "trace"])


def failures_to_print(failures) -> list:
    """Of the failures that make the run fail, one per root cause: its shortest trace."""
    return [g[0] for g in failure_groups([f for f in failures if f.counts])]


def print_failure(outcome, out=None) -> None:
    """The shrunk steps in plain words, the broken property, and where the trace is."""
    from state_machines.replay import replay

    out = out or sys.stdout
    trace = outcome.trace
    spec_name = trace.variant
    print(f"\nFAILED: {spec_name} {describe_regime(trace.params)}"
          + (f" with fault {trace.fault}" if trace.fault else "")
          + ("" if trace.meta.get("shrunk", True) else
             f" (not fully shrunk: {trace.meta.get('note') or 'interrupted'})"), file=out)
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
    differs = replays_differ(result, replay(trace, device=None))
    if differs:
        print(f"\nWARNING: this target's replays are not deterministic: the same trace "
              f"replayed twice gave {differs}.  Its traces may not reproduce and its failures "
              "may be labelled differently from run to run (an adapter iterating a set, a "
              "clock or a random source in the engine?)", file=out)
    if outcome.trace_path:
        print(f"\ntrace saved: {outcome.trace_path}\nreplay it:   kvcheck replay "
              f"{outcome.trace_path} --verbose", file=out)
        if not trace.meta.get("shrunk", True):
            print(f"shrink on:   kvcheck shrink {outcome.trace_path} --budget 60", file=out)


def replays_differ(a, b) -> str | None:
    """How two replays of one trace differ (the first differing step's results, or the
    property they broke), or None when they agree step for step."""
    for x, y in zip(a.steps, b.steps):
        if x.result != y.result:
            return f"{x.result!r} and then {y.result!r} at step {x.index} ({x.words})"
    if len(a.steps) != len(b.steps):
        return f"{len(a.steps)} and then {len(b.steps)} steps before the failure"
    from state_machines.signature import mask  # ids an engine numbers globally differ

    pa = (a.violation.prop, mask(a.violation.message)) if a.violation else None
    pb = (b.violation.prop, mask(b.violation.message)) if b.violation else None
    if pa != pb:
        return f"{pa or 'no failure'} and then {pb or 'no failure'} at the end"
    return None


def trace_file(path):
    """A trace file given on the command line, loaded and checked (a bad one: exit 2)."""
    from state_machines.trace import TraceError, load_trace

    try:
        return load_trace(path)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
