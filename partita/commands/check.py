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


def _default_files() -> list[str]:
    from partita.planner.paths import SCENARIOS_DIR
    return sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml"))


def run(args: argparse.Namespace) -> int:
    if args.junit and Path(args.junit).resolve() == Path(args.baseline).resolve():
        raise PartitaError(f"--junit {args.junit} is the baseline file; give another path")
    if args.sweep is not None and not args.record:
        raise PartitaError("--sweep applies with --record (a check reuses the baseline's sweep)")
    catalog = catalog_from_args(args)
    if args.record:
        return _record(args, catalog)
    return _check(args, catalog)


def _record(args: argparse.Namespace, catalog) -> int:
    from partita.planner.scenario import load_scenario
    from partita.reports.regression import (DEFAULT_SWEEP, data_hashes, new_baseline,
                                            scenario_key, scenario_metrics, write_json_atomic)
    sweep = args.sweep or DEFAULT_SWEEP
    explicit = bool(args.files)
    entries, problems = {}, []
    for file in args.files or _default_files():
        print(f"check: recording {file}", file=sys.stderr, flush=True)
        try:
            scenario = load_scenario(file)
            if not explicit and scenario.cluster.system.lower() == "local":
                problems.append(f"skipped {file}: system local (this machine) is not portable "
                                "to a CI host; name it to record it")
                continue
            metrics = scenario_metrics(scenario, catalog, sweep)
        except PartitaError as exc:
            if explicit:
                raise
            problems.append(f"skipped {file}: {exc}")       # a shipped example this host can't run
            continue
        key = scenario_key(scenario, file)
        if key in entries:
            raise PartitaError(f"{file}: scenario name {key!r} given twice; names must be unique")
        entries[key] = {"file": file, "metrics": metrics}
    for line in problems:
        print(f"note: {line}", file=sys.stderr)
    if not entries:
        raise PartitaError("no scenario could be simulated; nothing recorded")
    doc = new_baseline(entries, sweep, data_hashes(catalog_file(args)))
    write_json_atomic(args.baseline, doc)
    if args.junit:
        _junit(args, [], {})
    print(f"recorded {len(entries)} scenario(s) in {args.baseline}")
    return 0


def _check(args: argparse.Namespace, catalog) -> int:
    from partita.planner.scenario import load_scenario
    from partita.reports.regression import compare, data_hashes, read_baseline, scenario_metrics
    base = read_baseline(args.baseline)
    scenarios = base["scenarios"]
    chosen = _chosen(args.files, scenarios, args.baseline)
    for line in _provenance(base, data_hashes(catalog_file(args))):
        print(f"note: {line}", file=sys.stderr)
    findings, errors = [], {}
    for name in chosen:
        entry = scenarios[name]
        print(f"check: {name}", file=sys.stderr, flush=True)
        try:
            metrics = scenario_metrics(load_scenario(entry["file"]), catalog,
                                       base["sweep_multipliers"])
        except PartitaError as exc:
            errors[name] = str(exc)
            continue
        findings += compare(name, entry["metrics"], metrics, args.tolerance)
    moved = [f for f in findings if f.moved]
    for f in moved:
        print(f"MOVED {f.scenario} {f.message}")
    for name, why in errors.items():
        print(f"FAILED {name}: {why}")
    print(f"{len(chosen)} scenario(s), {len(findings)} metric(s): {len(moved)} moved beyond "
          f"{100 * args.tolerance:g}%, {len(errors)} failed to simulate")
    if args.junit:
        _junit(args, findings, errors)
    return 1 if moved or errors else 0


def _chosen(files: list[str], scenarios: dict, baseline: str) -> list[str]:
    if not files:
        return list(scenarios)
    by_file = {entry["file"]: name for name, entry in scenarios.items()}
    chosen = []
    for f in files:
        name = f if f in scenarios else by_file.get(f) or by_file.get(Path(f).stem)
        if name is None:
            raise PartitaError(f"{f}: not in the baseline {baseline} (it has "
                               f"{', '.join(scenarios)}); record it with --record")
        chosen.append(name)
    return chosen


def _provenance(base: dict, hashes: dict[str, str]) -> list[str]:
    from partita import __version__
    out = []
    if base.get("partita_version") != __version__:
        out.append(f"baseline recorded with partita {base.get('partita_version')}, "
                   f"this is {__version__}")
    for key, what in (("catalog_sha256", "catalog"), ("calibration_sha256", "calibration data")):
        if base.get(key) != hashes[key]:
            out.append(f"the {what} differs from the baseline's ({key} "
                       f"{str(base.get(key))[:12]} -> {hashes[key][:12]})")
    return out


def _junit(args: argparse.Namespace, findings, errors) -> None:
    from partita.reports.regression import junit_xml
    try:
        Path(args.junit).write_text(junit_xml(findings, errors, tolerance=args.tolerance),
                                    encoding="utf-8")
    except OSError as exc:
        raise PartitaError(f"--junit {args.junit}: cannot write: {exc.strerror}") from None
