"""The `speedforge` command: one subcommand per module in speedforge.commands.

Each command module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. This file only assembles them, loads and checks the config before any
command runs, and turns user errors and interrupts into one line and an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys

from speedforge import __version__
from speedforge.config import load_config
from speedforge.errors import Terminated, UserError, interrupt_on_sigterm, sigterm_received

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
    "speedforge.commands.train",
    "speedforge.commands.portability",
    "speedforge.commands.report",
    "speedforge.commands.pipeline",
    "speedforge.commands.models",
)
# Ray warns on every local start that it enabled token authentication (its secure default,
# which we keep); the warning comes from this logger and says nothing a user has to act on.
RAY_TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
USER_ERROR_EXIT, SIGINT_EXIT, SIGTERM_EXIT = 2, 130, 143


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
    for command in subparsers.choices.values():
        _add_config_option(command)
    return parser


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    """`--config` after the (sub)command too: `speedforge tasks list --config c.yaml`."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for sub in actions:
        for child in sub.choices.values():
            _add_config_option(child)
    if not actions:
        parser.add_argument("--config", default=argparse.SUPPRESS, help="YAML config file (as before the command)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return USER_ERROR_EXIT
    logging.getLogger(RAY_TOKEN_AUTH_LOGGER).setLevel(logging.ERROR)
    previous_sigterm = interrupt_on_sigterm()
    try:
        load_config(args.config)  # a bad config fails every command at once, before any work
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"speedforge {args.command}: error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr)
        return SIGTERM_EXIT if isinstance(exc, Terminated) or sigterm_received() else SIGINT_EXIT
    finally:
        if previous_sigterm is not None:  # main() called in-process (tests) leaves no handler behind
            signal.signal(signal.SIGTERM, previous_sigterm)


if __name__ == "__main__":
    sys.exit(main())
