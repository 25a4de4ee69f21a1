"""The `partita` command line: argparse subcommands, one module each in `partita.commands`.

Usage:
    partita simulate examples/gpt3-175b.yaml --json
    partita profile llama2-70b-h100 --json
    partita catalog list --gpus
    partita validate

Exit status: 0 ok; 1 bad or infeasible input (one line `error: ...` on stderr, no traceback);
2 usage error (argparse).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from partita import __version__
from partita.planner.errors import PartitaError

COMMANDS = ("catalog", "profile", "simulate", "validate", "plan", "run", "calibrate", "report",
            "check")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="partita", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"partita {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        modname = f"partita.commands.{name}"
        if importlib.util.find_spec(modname) is None:
            continue
        importlib.import_module(modname).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PartitaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
