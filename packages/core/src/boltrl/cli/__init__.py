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


PLUGIN_COMMANDS = {
    "train": "boltrl-trainer",
    "eval": "boltrl-trainer",
    "demo": "boltrl-trainer",
    "sft": "boltrl-trainer",
    "model": "boltrl-trainer",
    "export-model": "boltrl-trainer",
}
"""Subcommands that other boltrl distributions add, and which one: named in the error when
such a command is asked for and its package is not installed."""


def installed_versions() -> list[tuple[str, str]]:
    """``(distribution, version)`` of every installed boltrl distribution, sorted by name:
    ``boltrl`` itself, and any ``boltrl-*`` package (adapters, trainer, plugins)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == "boltrl" or name.startswith("boltrl-"):
            found.setdefault(name, dist.version)
    return sorted(found.items())


class _VersionAction(argparse.Action):
    """``--version``: one line per installed boltrl distribution (read only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show installed boltrl packages")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print("\n".join(f"{name} {version}" for name, version in installed_versions()))
        parser.exit()


def _missing_command_hint(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Exit with a hint when ``argv`` asks for a known plugin command that is not installed
    (argparse alone says only "invalid choice")."""
    command = next((a for a in argv if not a.startswith("-")), None)
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if command is None or sub is None or command in sub.choices:
        return
    package = PLUGIN_COMMANDS.get(command)
    if package is not None:
        parser.error(
            f"invalid choice: {command!r}: `boltrl {command}` comes from the {package} "
            f"package, which is not installed (or failed to load): pip install {package}"
        )


def build_parser(commands: Commands) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="boltrl",
        description="Train any AI agent with reinforcement learning without rewriting it.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in commands.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    commands = build_commands()
    parser = build_parser(commands)
    _missing_command_hint(parser, sys.argv[1:] if argv is None else argv)
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
