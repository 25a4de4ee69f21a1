"""`partita catalog numbers [--kind measured|fitted|chosen] [--json]`: every number of the shipped
calibration data that is not a fact, with its kind, unit, file, key and source.

The data files of data/calibration/ hold their numbers in provenance sections (facts, measured,
fitted, chosen; planner/provenance.py); this lists the last three, file by file, and counts them.
A fitted number's source is the command that wrote it (with the number of rows it was fitted on).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

from partita.planner.paths import CALIBRATION_DIR
from partita.planner.provenance import KINDS, Number, numbers

# Files of data/calibration/ that no loader reads: measured sweeps the benchmarks compare with.
REFERENCE_ONLY = ("collective_sweeps.yaml",)


def register_action(actions) -> None:
    p = actions.add_parser("numbers", help="every calibration number that is not a fact "
                                           "(measured, fitted, chosen) with its source",
                           description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=KINDS[1:], action="append", default=None,
                   help="only this kind (repeatable; default: all three)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def data_files(folder: Path = CALIBRATION_DIR) -> list[Path]:
    return [p for p in sorted(folder.glob("*.yaml")) if p.name not in REFERENCE_ONLY]


def non_facts(folder: Path = CALIBRATION_DIR) -> list[Number]:
    return [n for path in data_files(folder) for n in numbers(path)]


def run(args: argparse.Namespace) -> int:
    kinds = args.kind or list(KINDS[1:])
    found = [replace(n, file=_relative(n.file)) for n in non_facts() if n.kind in kinds]
    if args.json:
        print(json.dumps([asdict(n) for n in found], indent=1))
        return 0
    current = None
    for n in found:
        if n.file != current:
            current = n.file
            print(f"{current}:")
        print(f"  {n.kind:8s} {n.key} = {_value(n.value)} {n.unit}")
        print(f"           source: {n.source}")
    counts = ", ".join(f"{kind} {sum(n.kind == kind for n in found)}" for kind in kinds)
    print(f"{len(found)} numbers that are not facts ({counts})")
    return 0


def _relative(path: str) -> str:
    p = Path(path)
    return f"data/calibration/{p.name}" if p.parent == CALIBRATION_DIR else str(p)


def _value(value) -> str:
    if isinstance(value, list) and value and isinstance(value[0], list):
        return f"[{len(value)} points: {value[0]} ... {value[-1]}]"
    return str(value)
