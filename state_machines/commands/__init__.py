"""One module per kvcheck subcommand: ``add_parser(subparsers)`` and ``run(args)``."""
