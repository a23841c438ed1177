"""``kvcheck``: the command line.  One module per command in ``state_machines/commands/``.

Exit codes: 0 clean / trace now passes; 1 a property broke (or a fault was missed); 2 a bad
argument, file or name (one line, never a traceback); 3 interrupted (Ctrl-C / SIGTERM; whatever
was found before the signal is kept and reported; a second signal ends it at once); 4 kvcheck
itself failed, not the engine (a harness error: never reported as a property).
"""

from __future__ import annotations

import time

# a --budget is the whole command's wall time, counted from here: the process's first command
# counts its imports too; each later main() call (tests, a long-lived caller) from its own start
STARTED = time.monotonic()
_CALLS = [0]

import argparse  # noqa: E402
import importlib  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from state_machines.commands.common import (EXIT_HARNESS, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE,
                                            HARNESS_WORDS,
                                            UsageError)

# numeric options every command shares the meaning of: name -> (smallest allowed, what)
LIMITS = {"max_examples": (1, "a positive integer"), "budget": (None, "a positive, finite "
          "number of seconds"), "examples": (1, "a positive integer"),
          "seeds": (1, "a positive integer"), "max_states": (1, "a positive integer"),
          "workers": (1, "a positive integer"), "depth": (0, "an integer >= 0")}


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line and a hint, not the usage block."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"kvcheck: error: {message}\n"
                              f"  (see: {self.prog} --help)\n")


def _check_numbers(parser, args) -> None:
    for name, (low, what) in LIMITS.items():
        v = getattr(args, name, None)
        if v is None:
            continue
        flag = "--" + name.replace("_", "-")
        if low is None:  # seconds
            if not math.isfinite(v) or v <= 0:
                parser.error(f"{flag} must be {what}, got {v!r}")
        elif v < low:
            parser.error(f"{flag} must be {what}, got {v!r}")


def _op_deadline(text: str) -> float:
    from state_machines.deadline import parse_seconds

    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

# each module has add_parser(subparsers) and run(args)
COMMANDS = ("list", "fuzz", "replay", "faults", "bench", "check", "coverage", "nightly",
            "gate", "diff", "report", "shrink")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="kvcheck", description="Model-check LLM-serving KV caches.")
    p.add_argument("--profile", choices=("dev", "ci", "nightly"),
                   help="Hypothesis settings profile (default: $HYPOTHESIS_PROFILE or dev)")
    p.add_argument("--op-deadline", type=_op_deadline, metavar="SECONDS",
                   help="an op (with its checks) that runs longer is a 'hang' finding "
                        "(default: $KVCHECK_OP_DEADLINE or 10; 0: no deadline)")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = f"state_machines.commands.{name}"
        try:
            importlib.import_module(module).add_parser(sub)
        except ModuleNotFoundError as exc:  # a command still being written; nothing else
            if exc.name != module:
                raise
    return p


def main(argv=None) -> int:
    global STARTED
    if _CALLS[0]:
        STARTED = time.monotonic()
    _CALLS[0] += 1
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _check_numbers(parser, args)
    except SystemExit as exc:  # argparse: --help (0) or a bad argument (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.op_deadline is not None:
        from state_machines.deadline import ENV

        os.environ[ENV] = repr(args.op_deadline)  # nightly's workers inherit it
    from state_machines.stopping import stop_on_signals

    try:
        with stop_on_signals():
            return _run(args)
    except KeyboardInterrupt:  # a signal that landed between the command and its handlers
        print("kvcheck: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(args) -> int:
    try:
        from state_machines.profiles import load_profile

        load_profile(args.profile or getattr(args, "default_profile", None))
        return args.func(args)
    except UsageError as exc:
        print(f"kvcheck: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvcheck: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except (RecursionError, MemoryError, Exception) as exc:  # a harness bug: one line, exit 4
        if os.environ.get("KVCHECK_DEBUG"):
            raise
        print(f"kvcheck: internal error ({HARNESS_WORDS}): {type(exc).__name__}: {exc}"[:500]
              + "\n  (a kvcheck bug: please report it; KVCHECK_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return EXIT_HARNESS


if __name__ == "__main__":
    sys.exit(main())
