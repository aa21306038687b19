"""The ``pagedkv`` command: ``pagedkv <command> [options]`` (also ``python -m pagedkv``).

Subcommands live in :mod:`pagedkv.entrypoints.commands`, one module each; their heavy imports
(torch, the server) happen inside ``run`` so that ``pagedkv --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType
from typing import Optional, Sequence

from pagedkv.entrypoints import commands
from pagedkv.entrypoints.arg_types import CLIError, HelpFormatter


def _command_modules() -> list[ModuleType]:
    names = sorted(m.name for m in pkgutil.iter_modules(commands.__path__))
    return [importlib.import_module(f"{commands.__name__}.{n}") for n in names]


def build_parser() -> argparse.ArgumentParser:
    import pagedkv

    parser = argparse.ArgumentParser(
        prog="pagedkv",
        description="pagedkv: paged KV-cache serving core (vLLM-style engine and server).",
    )
    parser.add_argument("--version", action="version", version=f"pagedkv {pagedkv.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
        p = sub.add_parser(
            mod.NAME, help=mod.HELP, description=mod.HELP, formatter_class=HelpFormatter
        )
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _parser=p)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except CLIError as e:
        # A bad flag value found after parsing (or while the engine was set up): reported as
        # argparse reports one, usage + "error: argument --flag: ...", exit code 2.
        sub_parser: argparse.ArgumentParser = args._parser  # its usage line names the command
        sub_parser.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
