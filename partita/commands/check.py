"""`partita check BASELINE [FILES...] [--tolerance 2%] [--record] [--junit OUT.xml]`: CI regression.

    partita check baseline.json --record                  # every shipped example that simulates
    partita check baseline.json --record my-plan.yaml     # chosen scenarios
    partita check baseline.json --tolerance 1% --junit check.xml

With --record: simulate the scenarios (step time, tokens/s, peak memory, scaling efficiency over a
node sweep) and write BASELINE with the partita version and the catalog and calibration hashes.
Without: recompute the baseline's scenarios (or FILES among them) and exit 1 naming every scenario
and metric that moved beyond the tolerance, 0 otherwise.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from partita.commands import add_catalog_option, catalog_file, catalog_from_args
from partita.planner.errors import PartitaError


def tolerance(text: str) -> float:
    """'2%' or '2' (percent) -> 0.02; must be a finite number >= 0."""
    raw = text.strip()
    number = raw[:-1] if raw.endswith("%") else raw
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage such as 2%, got {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite percentage >= 0, got {text!r}")
    return value / 100.0


def multipliers(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers such as 1,2,4, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1, got {text!r}")
    return values if values[0] == 1 else (1,) + values


class _Intermixed(argparse.ArgumentParser):
    """Options may sit between the positionals (`check BASELINE --record A B`): plain argparse
    binds BASELINE and the empty FILE list together and then rejects A and B."""

    _inside = False

    def parse_known_args(self, args=None, namespace=None):
        if self._inside:
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


def register(sub: argparse._SubParsersAction) -> None:
    default_class, sub._parser_class = sub._parser_class, _Intermixed
    try:
        p = sub.add_parser("check", help="CI regression of predictions against a recorded baseline",
                           description=__doc__.splitlines()[0])
    finally:
        sub._parser_class = default_class
    p.add_argument("baseline", metavar="BASELINE", help="baseline JSON file")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="scenarios (default: record every shipped example; check the baseline's)")
    p.add_argument("--record", action="store_true", help="write BASELINE from the scenarios")
    p.add_argument("--tolerance", type=tolerance, default=0.02, metavar="PERCENT",
                   help="relative move allowed per metric, e.g. 2%% (the default) or 0.5%%")
    p.add_argument("--sweep", type=multipliers, default=None, metavar="K,K,...",
                   help="node-count multipliers of the scaling sweep (default 1,2,4; with --record)")
    p.add_argument("--junit", metavar="OUT.xml", help="also write the results as JUnit XML")
    add_catalog_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.junit and Path(args.junit).resolve() == Path(args.baseline).resolve():
        raise PartitaError(f"--junit {args.junit} is the baseline file; give another path")
    if args.sweep is not None and not args.record:
        raise PartitaError("--sweep applies with --record (a check reuses the baseline's sweep)")
    catalog = catalog_from_args(args)
    if args.record:
        return _record(args, catalog)
    return _check(args, catalog)


def _progress(message: str) -> None:
    print(f"check: {message}", file=sys.stderr, flush=True)


def _note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr)


def _record(args: argparse.Namespace, catalog) -> int:
    from partita.reports.regression import DEFAULT_SWEEP, record_baseline, write_json_atomic
    doc = record_baseline(args.files, catalog=catalog, sweep=args.sweep or DEFAULT_SWEEP,
                          extra_catalog=catalog_file(args), progress=_progress, note=_note)
    write_json_atomic(args.baseline, doc)
    if args.junit:
        _junit(args, [], {})
    print(f"recorded {len(doc['scenarios'])} scenario(s) in {args.baseline}")
    return 0


def _check(args: argparse.Namespace, catalog) -> int:
    from partita.reports.regression import check_baseline
    result = check_baseline(args.baseline, args.files, catalog=catalog, tolerance=args.tolerance,
                            extra_catalog=catalog_file(args), progress=_progress, note=_note)
    moved = result.moved
    for f in moved:
        print(f"MOVED {f.scenario} {f.message}")
    for name, why in result.errors.items():
        print(f"FAILED {name}: {why}")
    print(f"{len(result.scenarios)} scenario(s), {len(result.findings)} metric(s): {len(moved)} "
          f"moved beyond {100 * args.tolerance:g}%, {len(result.errors)} failed to simulate")
    if args.junit:
        _junit(args, result.findings, result.errors)
    return 1 if moved or result.errors else 0


def _junit(args: argparse.Namespace, findings, errors) -> None:
    from partita.reports.regression import junit_xml
    try:
        Path(args.junit).write_text(junit_xml(findings, errors, tolerance=args.tolerance),
                                    encoding="utf-8")
    except OSError as exc:
        raise PartitaError(f"--junit {args.junit}: cannot write: {exc.strerror}") from None
