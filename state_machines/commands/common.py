"""What every kvcheck command shares: exit codes, usage errors, name lookups, tables."""

from __future__ import annotations

import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 3


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


def variant_named(name):
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


def device_named(name):
    from caches.pools import resolve_device

    try:
        return str(resolve_device(name))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def describe_regime(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def format_table(rows: list[list], header: list[str]) -> str:
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
    if outcome.trace_path:
        print(f"\ntrace saved: {outcome.trace_path}\nreplay it:   kvcheck replay "
              f"{outcome.trace_path} --verbose", file=out)
