"""``kvcheck shrink``: go on shrinking a saved failing trace (one a time budget cut short).

The shrink is the native engine's trace-level one (delta debugging over the saved ops, then
argument simplification, ``state_machines/native.py``): it needs nothing of the engine but
the trace's target, so a trace from any engine and either search engine shrinks the same way.
A candidate counts only if it breaks the same way -- the same property, at the same op, with
the same masked message (``failures.Signature``).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from state_machines.commands.common import (EXIT_FAIL, EXIT_OK, UsageError, device_named,
                                            print_failure, trace_file, writable_dir)

DEFAULT_BUDGET = 60.0


def add_parser(sub) -> None:
    p = sub.add_parser("shrink", help="go on shrinking a saved failing trace (e.g. one marked "
                       "partly shrunk)")
    p.add_argument("file", help="the trace file (e.g. kvcheck-traces/radix-*.json)")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help=f"the whole command's wall time (default: {DEFAULT_BUDGET:g})")
    p.add_argument("--out", help="where the shrunk trace goes (default: the trace's folder)")
    p.add_argument("--src", metavar="PATH",
                   help="the engine checkout to shrink against (default: the recorded one)")
    p.add_argument("--device")
    p.set_defaults(func=run)


def run(args) -> int:
    from state_machines.cli import STARTED

    trace = trace_file(args.file)
    device = device_named(args.device)
    out_dir = args.out or str(Path(args.file).parent)
    writable_dir(out_dir)
    if args.src is not None and not Path(args.src).is_dir():
        raise UsageError(f"--src {args.src}: not a directory (expected an engine checkout)")
    budget = args.budget if args.budget else DEFAULT_BUDGET
    return shrink_file(trace, budget - (time.monotonic() - STARTED), out_dir, device,
                       args.src)


def shrink_file(trace, budget: float, out_dir: str, device=None, src=None) -> int:
    from state_machines.failures import Signature
    from state_machines.shrinker import shrink_to_trace
    from state_machines.replay import replay
    from state_machines.variants import get_variant

    src = src if src is not None else trace.src
    first = replay(trace, device=device, src=src)
    if first.violation is None:
        print(f"the trace breaks no property now ({len(trace.ops)} steps): nothing to shrink")
        return EXIT_OK
    spec = get_variant(trace.variant)
    ops = list(first.run.ops)  # up to the failing step
    sig = Signature.of(first.violation.prop, ops[-1].name, first.violation.message)
    shrunk, whole = shrink_to_trace(spec, trace.params, ops, sig, budget=max(0.0, budget),
                                    fault=trace.fault, target=trace.target, device=device,
                                    src=src, known_findings=trace.known_findings)
    if shrunk is None:  # cannot normally happen: shrink keeps failing candidates
        raise RuntimeError("the shrunk ops no longer fail; the trace is left as it was")
    shrunk.meta = {**trace.meta, "shrunk": whole, "shrunk_from": len(trace.ops)}
    shrunk.meta.pop("note", None)
    if not whole:
        shrunk.meta["note"] = "partly shrunk: the time budget ran out while shrinking"
    path = shrunk.save(out_dir)
    print(f"{sig}\nshrunk from {len(trace.ops)} to {len(shrunk.ops)} steps"
          + ("" if whole else " (the budget ran out: run it again to go on)"))
    print_failure(SimpleNamespace(trace=shrunk, trace_path=path))
    return EXIT_FAIL
