"""CLI subcommands: each module exposes register(subparsers)."""
