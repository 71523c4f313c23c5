"""The ``boltrl`` command line.

Commands are registered in a table (name → help, argument builder, handler). Core
registers its own; installed packages add theirs through the ``boltrl.cli`` entry-point
group (a callable taking the ``Commands`` table): the trainer adds ``train``, ``eval``,
``demo`` and ``model``. A plugin may replace a core command by registering its name.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Handler = Callable[[argparse.Namespace], int]


@dataclass
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Handler


class Commands:
    """The table of subcommands; plugins add or replace entries."""

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}

    def add(
        self,
        name: str,
        help: str,
        add_arguments: Callable[[argparse.ArgumentParser], None],
        run: Handler,
    ) -> None:
        self._commands[name] = Command(help, add_arguments, run)

    def items(self) -> list[tuple[str, Command]]:
        return sorted(self._commands.items())


_CORE_MODULES = (
    "boltrl.cli.store_cmd",
    "boltrl.cli.gateway_cmd",
    "boltrl.cli.runner_cmd",
    "boltrl.cli.dashboard_cmd",
    "boltrl.cli.export_cmd",
)


def build_commands() -> Commands:
    commands = Commands()
    for mod in _CORE_MODULES:
        importlib.import_module(mod).register(commands)
    for ep in importlib.metadata.entry_points(group="boltrl.cli"):
        try:
            ep.load()(commands)
        except Exception as e:  # a broken plugin must not take the whole CLI down
            print(f"boltrl: could not load commands from {ep.value}: {e}", file=sys.stderr)
    return commands


def build_parser(commands: Commands) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="boltrl",
        description="Train any AI agent with reinforcement learning without rewriting it.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in commands.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    commands = build_commands()
    parser = build_parser(commands)
    args = parser.parse_args(argv)
    # boltrl's own loggers at INFO, everyone else's at WARNING: at INFO, libraries (HTTP
    # clients, agent SDKs' event logs) print a line per request and drown what matters.
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        for ours in ("boltrl", "boltrl_trainer"):
            logging.getLogger(ours).setLevel(logging.INFO)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
