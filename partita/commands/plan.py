"""`partita plan FILE [options] [-o OUT.yaml] [--json]`: choose what a scenario leaves open.

Writes the completed scenario (with `parallel.stages`), which `partita simulate` and `partita run`
take unchanged, and prints a ranked table of the best candidates; `--json` prints the same as one
JSON object. Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from partita.commands import add_catalog_option, catalog_from_args
from partita.planner.errors import PartitaError

PROGRESS_AFTER_S = 2.0      # a search shorter than this prints no progress lines


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="choose the parallel plan (and system, GPU count) of a scenario",
                       description="Search systems, GPU counts, TP/PP/CP/DP, micro-batch, schedule, "
                                   "recompute, ZeRO and gradient reduction for what the scenario "
                                   "leaves open; split the layers with an ILP; write the completed "
                                   "scenario.")
    p.add_argument("file", metavar="FILE", help="scenario file (YAML/JSON) or a shipped example's name")
    p.add_argument("--objective", choices=("time", "cost", "memory"), default="time",
                   help="rank by step time (default), dollars, or peak memory per GPU")
    p.add_argument("--max-gpus", type=int, metavar="N", help="search GPU counts up to N")
    p.add_argument("--nodes", type=int, metavar="N", help="use N nodes of each system")
    p.add_argument("--systems", metavar="A,B", help="comma-separated catalog systems to compare")
    p.add_argument("--tokens", type=float, metavar="N", help="training budget in tokens: "
                   "days and dollars per plan")
    p.add_argument("--max-cost", type=float, metavar="USD", help="only plans costing at most USD "
                   "for --tokens (on-demand price)")
    p.add_argument("--max-days", type=float, metavar="D", help="only plans finishing --tokens "
                   "within D days")
    p.add_argument("--bound", choices=("predicted", "slow"), default="predicted",
                   help="check --max-cost / --max-days against the predicted step time (default) "
                        "or the slow end of its 90%% interval")
    p.add_argument("--headroom", type=float, default=0.0, metavar="F",
                   help="fraction of GPU memory a plan must leave free beyond the simulator's "
                        "reserve (default 0)")
    p.add_argument("--optimize", choices=("speed", "memory"), default=None,
                   help="the ILP layer split: fastest slowest stage (default) or least memory on "
                        "the fullest GPU (SageMaker's optimize)")
    p.add_argument("--executable", action="store_true",
                   help="only plans `partita run` executes (no context or sequence parallelism "
                        "for T5)")
    p.add_argument("--top", type=int, default=10, metavar="K", help="rows to print (default 10)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="stop timing layouts after about S seconds (most promising first)")
    p.add_argument("-o", "--output", metavar="OUT.yaml", help="write the completed scenario here "
                   "(.json for JSON); never the input file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_catalog_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from partita.planner.search import plan

    for name, value in (("--max-gpus", args.max_gpus), ("--nodes", args.nodes),
                        ("--top", args.top)):
        if value is not None and value < 1:
            raise PartitaError(f"{name}: expected a positive integer, got {value}")
    for name, value in (("--tokens", args.tokens), ("--max-cost", args.max_cost),
                        ("--max-days", args.max_days), ("--time-budget", args.time_budget)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise PartitaError(f"{name}: expected a positive number, got {value}")
    if (args.max_cost is not None or args.max_days is not None) and args.tokens is None:
        raise PartitaError("--max-cost / --max-days need --tokens N (the training budget)")
    out = _output_path(args)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()] if args.systems else None
    catalog = catalog_from_args(args)

    started = time.perf_counter()

    def progress(msg: str) -> None:          # only on searches that take a while
        if time.perf_counter() - started > PROGRESS_AFTER_S:
            print(f"plan: {msg}", file=sys.stderr, flush=True)

    result = plan(args.file, catalog=catalog, systems=systems, max_gpus=args.max_gpus,
                  nodes=args.nodes, objective=args.objective, tokens=args.tokens,
                  max_cost=args.max_cost, max_days=args.max_days, bound=args.bound,
                  progress=progress,
                  time_budget_s=args.time_budget, headroom=args.headroom,
                  optimize=args.optimize, executable=args.executable)
    if out is not None:
        _write(out, result.best)
    from partita.simulator.interval import ratio_tolerance
    tolerance = ratio_tolerance()
    if args.json:
        doc = result.to_json(top=args.top)
        doc["output"] = str(out) if out is not None else None
        doc["comparison"] = _comparison_json(result, tolerance)
        print(json.dumps(_finite(doc)))
    else:
        print(format_table(result, args.top))
        line = comparison_line(result, tolerance, args.top)
        if line:
            print(line)
        if out is not None:
            print(f"wrote {out}  (partita simulate {out})")
        else:
            import yaml
            print("\n# the completed scenario (write it with -o OUT.yaml):")
            print(yaml.safe_dump(result.best, sort_keys=False, default_flow_style=None), end="")
    return 0


def _output_path(args) -> Path | None:
    if not args.output:
        return None
    out = Path(args.output)
    src = Path(args.file)
    if src.exists() and out.exists() and out.resolve() == src.resolve():
        raise PartitaError(f"-o {args.output}: that is the input file; write the plan elsewhere")
    if out.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise PartitaError(f"-o {args.output}: expected a .yaml, .yml or .json file name")
    if out.exists() and out.is_dir():
        raise PartitaError(f"-o {args.output}: is a directory; give a file name")
    if not out.parent.exists():
        raise PartitaError(f"-o {args.output}: directory {out.parent} does not exist")
    return out


def _write(path: Path, doc: dict) -> None:
    """Write through a temporary file, so a failure leaves what was there."""
    import yaml
    text = (json.dumps(doc, indent=2) + "\n" if path.suffix.lower() == ".json"
            else "# written by `partita plan`\n" + yaml.safe_dump(doc, sort_keys=False,
                                                                  default_flow_style=None))
    tmp = path.with_name(f".{path.name}.partita-tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _money(x) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.2f}"


def format_table(result, top: int) -> str:
    rows = result.candidates[:top]
    lines = [f"partita plan: {result.evaluated} plans simulated, {result.pruned} pruned, "
             f"{result.seconds:.1f} s; objective {result.objective}"
             + (f"; split: {result.solver}" if result.solver else "")]
    lines += [f"  note: {n}" for n in result.notes]
    head = (f"{'#':>3} {'system':<18} {'gpus':>5} {'TP':>3} {'PP':>3} {'CP':>3} {'DP':>4} "
            f"{'mb':>3} {'schedule':<20} {'recomp':<12} {'Z':>4} {'reduce':<16} {'step s':>9} "
            f"{'90% interval':>15} {'tok/s':>10} {'MFU':>5} {'mem GiB':>13} {'$/h':>8}")
    if result.tokens:
        head += f" {'days':>7} {'slow':>7} {'$':>11} {'$ slow':>11} {'$ spot':>11}"
    lines.append(head)
    for i, c in enumerate(rows, 1):
        if c.error is not None:
            lines.append(f"{i:>3} {c.system:<18} {c.gpus:>5} {c.tensor:>3} {c.pipeline:>3} "
                         f"{c.context:>3} {c.data:>4} {c.micro_batch:>3} {c.schedule:<20} "
                         f"failed: {c.error}")
            continue
        sched = c.schedule + (f" v{c.virtual_stages}" if c.virtual_stages > 1 else "")
        recomp = c.recompute + (f" {c.recompute_layers}" if c.recompute_layers is not None else "")
        zero = f"{c.zero}" + (f"/{c.data_shard}" if c.data_shard is not None else "")
        mem = f"{c.peak_memory_gib:.1f}/{c.memory_capacity_gib:.0f}" + ("" if c.fits else "!")
        line = (f"{i:>3} {c.system:<18} {c.gpus:>5} {c.tensor:>3} {c.pipeline:>3} {c.context:>3} "
                f"{c.data:>4} {c.micro_batch:>3} {sched:<20} {recomp:<12} {zero:>4} "
                f"{c.grad_reduce:<16} {c.step_time_s:>9.3f} {_band(c):>15} {c.tokens_per_s:>10.0f} "
                f"{100 * c.mfu:>4.0f}% {mem:>13} {_money(c.usd_per_hour):>8}")
        if result.tokens:
            line += (f" {c.days:>7.1f} {_num(c.days_high, '.1f'):>7} {_money(c.usd):>11} "
                     f"{_money(c.usd_high):>11} {_money(c.usd_spot):>11}"
                     if c.days is not None else "")
        flags = ("  pareto" if c.pareto else "") + ("" if c.within_budget else "  over budget") + (
            "  near capacity" if c.near_memory_capacity else "") + (
            f"  split {c.split}" if c.split != "even" else "")
        lines.append(line + flags)
    if result.tokens:
        lines.append("  (slow: days and dollars at the slow end of the step time's 90% interval)")
    if any(c.error is None and c.near_memory_capacity for c in rows):
        from partita.planner.layergraph import MEMORY_PRESSURE_FRACTION
        lines.append(f"  (near capacity: above {100 * MEMORY_PRESSURE_FRACTION:.0f}% of the GPU's "
                     "memory, where allocator cache flushes can slow the step and the prediction "
                     "has no term for them; --headroom F keeps a fraction free)")
    return "\n".join(lines)


def within_tolerance(result, tolerance) -> list[int]:
    """1-based ranks of the usable plans whose ranked quantity (step time, or dollars for
    --objective cost: `planresult.objective_value`) is within `tolerance`
    (simulator.interval.RatioTolerance) of the best plan's: plans the simulator cannot tell apart
    from the best, since measured effects of one change missed their predicted ratio by that much
    or more one time in ten. Empty for the memory objective, without a tolerance, or without a
    usable plan."""
    from partita.planner.planresult import objective_value
    if tolerance is None or not result.candidates or not result.candidates[0].ok:
        return []
    best = objective_value(result.candidates[0], result.objective)
    if not best:
        return []
    out = []
    for i, c in enumerate(result.candidates, 1):
        value = objective_value(c, result.objective) if c.ok else None
        if value is not None and value <= best * (1.0 + tolerance.p90):
            out.append(i)
    return out


def comparison_line(result, tolerance, top: int) -> str:
    """The table's footer: which plans the best is not told apart from (`within_tolerance`)."""
    ranks = within_tolerance(result, tolerance)
    if len(ranks) < 2:
        return ""
    shown = [r for r in ranks if r <= top]
    more = len(ranks) - len(shown)
    listed = _ranges(shown) + (f" and {more} more" if more else "")
    what, best = ("step time", "fastest") if result.objective == "time" else ("cost", "cheapest")
    return (f"  plans {listed} are within {100 * tolerance.p90:.1f}% of plan 1's {what}, the p90 "
            f"error of a predicted ratio of two measured runs ({tolerance.pairs} pairs, "
            f"cross-validated): any of them may measure {best}; time a few steps of the top ones "
            "before committing")


def _ranges(ranks: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        start = r if start is None else start
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(f"{start}-{r}" if r > start else f"{r}")
            start = None
    return ", ".join(parts)


def _comparison_json(result, tolerance) -> dict | None:
    if tolerance is None:
        return None
    return {"ratio_error_p90": tolerance.p90, "pairs": tolerance.pairs,
            "within_of_best": within_tolerance(result, tolerance)}


def _band(c) -> str:
    """The step time's 90% interval, 'low-high' seconds, or '-'."""
    if c.step_time_low_s is None or c.step_time_high_s is None:
        return "-"
    return f"{c.step_time_low_s:.4g}-{c.step_time_high_s:.4g}"


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)
