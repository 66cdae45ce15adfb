"""The `speedforge` command: one subcommand per module in speedforge.commands.

Each command module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. This file only assembles them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from speedforge import __version__
from speedforge.errors import UserError

# Command modules, in the order `--help` lists them. Add one line per new command module.
COMMAND_MODULES = (
    "speedforge.commands.tasks",
    "speedforge.commands.eval",
    "speedforge.commands.run",
    "speedforge.commands.evaluate",
    "speedforge.commands.stage",
    "speedforge.commands.s3",
    "speedforge.commands.optimize",
    "speedforge.commands.serve_policy",
    "speedforge.commands.ann",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speedforge",
        description="Make code faster by contrastive RL with measured speed as the reward.",
    )
    parser.add_argument("--version", action="version", version=f"speedforge {__version__}")
    parser.add_argument("--config", help="YAML config file (default: embedded defaults)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"speedforge {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
