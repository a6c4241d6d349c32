"""hicache-sim command line: parses arguments and turns user errors into one line.

Domain logic lives in ``sim``; each subcommand is a module in ``sim/commands``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sim import __version__
from sim.commands import COMMANDS
from sim.errors import DivergenceError, UserError, one_line


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (no usage dump) and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, dict]:
    """The parser and each command's handler. Given the command line, only the command
    it names gets its arguments: building another's can import what that command needs
    (a tree, a schema), start-up time every command would pay."""
    chosen = argv[0] if argv and not argv[0].startswith("-") else None
    parser = _Parser(
        prog="hicache-sim",
        description="Simulate SGLang HiCache (device + host KV tiers) across TP ranks.",
    )
    parser.add_argument("--version", action="version", version=f"hicache-sim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    handlers = {}
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"sim.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"sim.commands.{name}":
                continue  # a subcommand not built yet
            raise
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        if chosen is None or chosen == mod.NAME:
            mod.add_arguments(p)
        handlers[mod.NAME] = mod.run
    return parser, handlers


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, handlers = build_parser(argv)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(handlers[args.command](args) or 0)
    except UserError as err:
        print(one_line(f"hicache-sim {args.command}: error: {err}"), file=sys.stderr)
        return err.exit_code
    except DivergenceError as err:
        print(one_line(f"hicache-sim {args.command}: {err}"), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"hicache-sim {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as err:
        # The last guard for a path the user named that the OS refused (a read-only
        # folder, /proc, a full disk): one line, not a traceback. Paths are checked
        # where they are named; this only catches what slips past those checks.
        where = err.filename or "a file"
        print(one_line(f"hicache-sim {args.command}: error: {where}: cannot access "
                       f"({err.strerror or type(err).__name__}); expected a readable or writable "
                       "path"), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
