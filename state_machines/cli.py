"""``kvcheck``: the command line.  One module per command in ``state_machines/commands/``.

Exit codes: 0 clean / trace now passes; 1 a property broke (or a fault was missed); 2 a bad
argument, file or name (with a message, never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from state_machines.commands.common import EXIT_OK, EXIT_USAGE, UsageError

# each module has add_parser(subparsers) and run(args)
COMMANDS = ("list", "fuzz", "replay", "faults", "bench", "check", "coverage", "nightly",
            "gate", "diff")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvcheck", description="Model-check LLM-serving KV caches.")
    p.add_argument("--profile", choices=("dev", "ci", "nightly"),
                   help="Hypothesis settings profile (default: $HYPOTHESIS_PROFILE or dev)")
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
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("max_examples", "budget", "examples"):
        v = getattr(args, name, None)
        if v is not None and v <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    try:
        from state_machines.profiles import load_profile

        load_profile(args.profile or getattr(args, "default_profile", None))
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
