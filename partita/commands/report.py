"""`partita report KIND ... -o DIR`: a self-contained HTML page with its Markdown, PNG and CSV files.

    partita report scaling gpt2-xl-p3 --nodes 1-16 --grad-reduce ring,parameter-server -o out/
    partita report timeline llama2-70b-h100 -o out/
    partita report memory gpt3-175b-a100 -o out/
    partita report validate -o out/
    partita report run partita-run/tiny-gpt-pp2 -o out/
    partita report compare llama2-70b-h100 --systems p4d.24xlarge,p5.48xlarge -o out/

Progress of long reports goes to stderr; the written page's path to stdout.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from partita.commands import add_catalog_option, catalog_from_args
from partita.planner.enums import GRAD_REDUCE
from partita.planner.errors import PartitaError

PER_BILLION = 1e9           # compare's token budget when none is given: cost per billion tokens
KINDS = ("compare", "scaling", "timeline", "memory", "validate", "run")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="reports as HTML + Markdown + PNG + CSV",
                       description=__doc__.splitlines()[0])
    kinds = p.add_subparsers(dest="kind", metavar="KIND")
    kinds.required = True

    _register_scaling(kinds)

    t = _kind(kinds, "timeline", "the simulated step as a Gantt chart per pipeline rank")
    t.add_argument("file", metavar="FILE")
    t.add_argument("--stages", help="pipeline stages to draw, e.g. 0,7,15 (default: every stage)")
    t.set_defaults(func=_timeline)

    m = _kind(kinds, "memory", "per-stage memory against usable capacity")
    m.add_argument("file", metavar="FILE")
    m.set_defaults(func=_memory)

    v = _kind(kinds, "validate", "predicted vs published step times")
    v.add_argument("csv", nargs="?", metavar="CSV", help="default data/validation/published_dev.csv")
    v.add_argument("--memory", action="store_true",
                   help="the published peak-memory runs (published_memory.csv, split_memory.yaml)")
    v.add_argument("--split", metavar="FILE", help="fit/hold-out split (default: the CSV's own)")
    v.set_defaults(func=_validate)

    r = _kind(kinds, "run", "a measured run (partita run --out DIR) against its prediction")
    r.add_argument("run_dir", metavar="RUN_DIR")
    r.add_argument("--scenario", metavar="FILE",
                   help="the scenario that was run (default: the one result.json names)")
    r.set_defaults(func=_run)

    _register_compare(kinds)


def _register_scaling(kinds) -> None:
    s = _kind(kinds, "scaling", "throughput and scaling efficiency vs nodes, per gradient reduction")
    s.add_argument("file", metavar="FILE", help="scenario (with a parallel section) or shipped example")
    s.add_argument("--nodes", default="1-64", help="A-B (powers of two between) or a list (default 1-64)")
    s.add_argument("--grad-reduce", default="ring,parameter-server",
                   help="comma-separated reductions (ring, tree, hierarchical, parameter-server, auto)")
    s.add_argument("--fixed-batch", action="store_true",
                   help="keep the global batch (strong scaling); default keeps the batch per replica")
    s.set_defaults(func=_scaling)


def _register_compare(kinds) -> None:
    c = _kind(kinds, "compare", "instance comparison in time and dollars")
    c.add_argument("file", metavar="FILE", nargs="?",
                   help="scenario to plan for each system and size (needs the planner's search)")
    c.add_argument("--candidates", metavar="CSV",
                   help="render a candidates table already written by the planner instead")
    c.add_argument("--systems", help="comma-separated catalog systems")
    c.add_argument("--gpus", help="GPU counts, A-B or a list")
    c.add_argument("--nodes", help="node counts, A-B or a list")
    c.add_argument("--tokens", type=float, default=None,
                   help="token budget for days and dollars (default 1e9: cost per billion tokens)")
    c.add_argument("--objective", default="time", choices=("time", "cost", "memory"))
    c.add_argument("--deadline-days", type=float, help="the deadline the recommendation respects")
    c.set_defaults(func=_compare)


def _kind(kinds, name: str, help_text: str) -> argparse.ArgumentParser:
    p = kinds.add_parser(name, help=help_text, description=help_text)
    p.add_argument("-o", "--out", metavar="DIR", default=None,
                   help=f"output directory (default ./partita-report/{name})")
    add_catalog_option(p)
    return p


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _out(args: argparse.Namespace) -> Path:
    return Path(args.out) if args.out else Path("partita-report") / args.kind


def _finish(report, args: argparse.Namespace) -> int:
    from partita.reports.html import write_report
    out = _out(args)
    written = write_report(report, out)
    print(next(p for p in written if p.suffix == ".html"))
    return 0


def _load(file: str):
    from partita.planner.scenario import load_scenario
    return load_scenario(file)


def _scaling(args: argparse.Namespace) -> int:
    from partita.reports.scaling import parse_nodes, scaling_report, sweep
    nodes = parse_nodes(args.nodes)
    reductions = tuple(g.strip() for g in args.grad_reduce.split(",") if g.strip())
    for g in reductions:
        if g not in GRAD_REDUCE:
            raise PartitaError(f"--grad-reduce {g!r}: not one of {', '.join(GRAD_REDUCE)}")
    if not reductions:
        raise PartitaError(f"--grad-reduce is empty; give one or more of {', '.join(GRAD_REDUCE)}")
    scenario, catalog = _load(args.file), catalog_from_args(args)
    if scenario.parallel is None:         # the sweep keeps the plan's TP x PP x CP: it needs one
        raise PartitaError(f"{scenario.origin}: no parallel section; the scaling report keeps "
                           f"its TP x PP x CP and fills the nodes with data parallelism: run "
                           f"`partita plan {scenario.origin} -o planned.yaml` and report on that, "
                           "or add parallel: {tensor, pipeline, ...}")
    points = sweep(scenario, catalog, nodes, reductions, fixed_batch=args.fixed_batch,
                   progress=_progress)
    return _finish(scaling_report(scenario, points, system=scenario.cluster.system,
                                  fixed_batch=args.fixed_batch), args)


def _timeline(args: argparse.Namespace) -> int:
    from partita.reports.timeline import timeline_report
    from partita.simulator.step import simulate
    stages = None
    if args.stages:
        try:
            stages = [int(x) for x in args.stages.split(",") if x.strip()]
        except ValueError:
            raise PartitaError(f"--stages {args.stages!r}: expected stage indices such as 0,3") from None
    scenario = _load(args.file)
    result = simulate(scenario, catalog_from_args(args), trace=True)
    return _finish(timeline_report(scenario, result, stages=stages), args)


def _memory(args: argparse.Namespace) -> int:
    from partita.reports.memory import memory_report
    from partita.simulator.step import simulate
    scenario = _load(args.file)
    return _finish(memory_report(scenario, simulate(scenario, catalog_from_args(args))), args)


def _validate(args: argparse.Namespace) -> int:
    from partita.reports.validation import validation_report
    from partita.validation.runner import MEMORY_CSV, MEMORY_SPLIT, load_split, run_validation
    csv, split = args.csv, args.split
    if args.memory:
        csv = csv if csv is not None else MEMORY_CSV
        split = split if split is not None else MEMORY_SPLIT
    from partita.validation.rowmap import read_rows
    read_rows(csv)                  # a file it cannot read is its one error line, before progress
    _progress("validate: simulating every published row ...")
    from partita.validation.frozen import withhold_step_times
    catalog = catalog_from_args(args)
    report = run_validation(csv, split=load_split(split), catalog=catalog)
    report, withheld = withhold_step_times(report)
    unseen = _unseen(catalog) if csv is None else {}
    return _finish(validation_report(report, progress=_progress, withheld=withheld, **unseen), args)


def _unseen(catalog) -> dict:
    """For the dev CSV's page: the stored leave-one-source-out rows, the nested interval coverage
    and the frozen sets' reports (`reports.validation`)."""
    from partita.simulator.interval import nested_coverage
    from partita.validation.crossval import RESIDUALS_FILE, load_residuals
    from partita.validation.frozen import frozen_report, load_frozen_sets
    out: dict = {}
    if RESIDUALS_FILE.exists():
        rows = load_residuals()["rows"]
        out["loso_rows"] = rows
        out["nested"] = nested_coverage([(r["source_key"], r["error_pct"] / 100.0) for r in rows])
    _progress("validate: the frozen test sets ...")
    out["frozen"] = [(s, frozen_report(s, catalog)) for s in load_frozen_sets()]
    return out


def _run(args: argparse.Namespace) -> int:
    from partita.reports.run import load_run, run_report
    run = load_run(args.run_dir)
    return _finish(run_report(run, scenario_file=args.scenario, catalog=catalog_from_args(args)),
                   args)


def _compare(args: argparse.Namespace) -> int:
    if args.candidates:
        if args.file:
            raise PartitaError("give FILE (plan it) or --candidates CSV (render it), not both")
        return _compare_table(args)
    if not args.file or not args.systems:
        raise PartitaError("report compare needs FILE and --systems a,b,... (or --candidates CSV)")
    from partita.reports.compare import compare_report, plan_candidates
    from partita.reports.scaling import parse_nodes
    if args.nodes and args.gpus:
        raise PartitaError("report compare: give --nodes or --gpus, not both")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    tokens = PER_BILLION if args.tokens is None else args.tokens
    if not tokens > 0 or tokens == float("inf"):
        raise PartitaError(f"--tokens: expected a positive number, got {args.tokens}")
    if args.gpus:
        counts = parse_nodes(args.gpus)
        sizes = {"gpus": (min(counts), max(counts))}
    else:
        sizes = {"nodes": parse_nodes(args.nodes or "1-8")}
    frame = plan_candidates(args.file, catalog=catalog_from_args(args), systems=systems,
                            objective=args.objective, tokens=tokens,
                            progress=lambda msg: print(f"compare: {msg}", file=sys.stderr,
                                                       flush=True), **sizes)
    title = f"Instance comparison: {Path(args.file).stem}"
    report = compare_report(frame, title=title, objective=args.objective, tokens=tokens,
                            deadline_days=args.deadline_days)
    return _finish(report, args)


def _compare_table(args: argparse.Namespace) -> int:
    import pandas as pd

    from partita.reports.compare import check_candidates, compare_report
    path = Path(args.candidates)
    if not path.is_file():
        raise PartitaError(f"--candidates {path}: no such file")
    try:
        frame = pd.read_csv(path, keep_default_na=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise PartitaError(f"--candidates {path}: not a CSV table ({exc})") from None
    try:
        check_candidates(frame)
    except PartitaError as exc:
        raise PartitaError(f"--candidates {path}: {exc}") from None
    frame["error"] = frame["error"].fillna("")
    report = compare_report(frame, title=f"Instance comparison: {path.stem}",
                            objective=args.objective, tokens=args.tokens,
                            deadline_days=args.deadline_days)
    return _finish(report, args)
