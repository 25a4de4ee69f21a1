"""One module per `partita` subcommand; each exposes `register(subparsers)`.

`register` adds the subparser and sets `func` (args -> exit code). Heavy imports (torch,
the simulator) happen inside `func`, so `partita --help` stays fast and torch-free.
"""
from __future__ import annotations



import argparse
import os


def add_catalog_option(parser: argparse.ArgumentParser) -> None:
    """`--catalog FILE`: a user catalog that extends or overrides the shipped one."""
    parser.add_argument("--catalog", metavar="FILE", default=None,
                        help="extra catalog file (YAML/JSON) that extends or overrides entries "
                             "(default: $PARTITA_CATALOG if set)")


def catalog_file(args: argparse.Namespace) -> str | None:
    """The extra catalog file a command names: --catalog FILE, else $PARTITA_CATALOG, else None."""
    return getattr(args, "catalog", None) or os.environ.get("PARTITA_CATALOG") or None


def catalog_from_args(args: argparse.Namespace):
    """The catalog for a command: shipped entries plus --catalog FILE (or $PARTITA_CATALOG)."""
    from partita.planner.catalog import load_catalog
    return load_catalog(catalog_file(args))
