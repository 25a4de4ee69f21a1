"""Scaling report: throughput and scaling efficiency against node count, one curve per data-parallel
gradient reduction (the comparison the SageMaker data-parallel library draws between its parameter
server and ring all-reduce, here for any model).

Each point is the scenario with `cluster.nodes` set to the point's count, the data-parallel degree
filling the GPUs (tensor x pipeline x context unchanged) and `parallel.grad_reduce` set; by default
the batch per replica is kept (weak scaling: global batch = base global batch x data / base data),
with `fixed_batch` the global batch stays as written (strong scaling). Scaling efficiency of a point
is its tokens/s over (nodes / n0) x the tokens/s at n0, the smallest node count of the same curve
that simulated. A point the simulator refuses is kept as a row with its reason.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import pandas as pd
from matplotlib.ticker import FuncFormatter

from partita.planner.errors import PartitaError
from partita.reports.figures import SERIES, new_figure, png_bytes
from partita.reports.html import FigureItem, Report, Section, TableItem

DEFAULT_GRAD_REDUCE = ("ring", "parameter-server")
Progress = Callable[[str], None]
MARKERS = ("o", "s", "^", "D", "v", "P")


@dataclass(frozen=True, kw_only=True)
class ScalingPoint:
    grad_reduce: str
    nodes: int
    scenario: object | None        # the simulated Scenario (None when it could not be built)
    result: object | None          # SimResult, None when the simulator refused the point
    error: str = ""


def parse_nodes(text: str) -> tuple[int, ...]:
    """'1-64' -> powers of two from 1 to 64 (both ends kept); '1,3,8' -> those counts."""
    try:
        if "-" in text and "," not in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            if lo < 1 or hi < lo:
                raise ValueError
            out, n = {lo, hi}, 1
            while n <= hi:
                if n >= lo:
                    out.add(n)
                n *= 2
            return tuple(sorted(out))
        values = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
        if not values or values[0] < 1:
            raise ValueError
        return values
    except ValueError:
        raise PartitaError(f"--nodes {text!r}: expected a range A-B (powers of two between, "
                           "e.g. 1-64) or a list of counts >= 1 (e.g. 1,2,4,8)") from None


def point_scenario(scenario, catalog, nodes: int, grad_reduce: str, *, fixed_batch: bool = False):
    """The scenario at `nodes` nodes with reduction `grad_reduce` (raises PartitaError if impossible)."""
    p, t = scenario.parallel, scenario.training
    if p is None:
        raise PartitaError(f"{scenario.origin or 'scenario'}: no parallel section; the scaling "
                           "report sweeps the data-parallel degree of a given plan")
    cluster = replace(scenario.cluster, gpus=None, nodes=nodes)
    gpus = catalog.resolve_cluster(cluster, origin=scenario.origin).gpus
    model_parallel = p.tensor * p.pipeline * p.context
    if gpus % model_parallel:
        raise PartitaError(f"{gpus} GPUs on {nodes} node(s) do not hold whole copies of the "
                           f"{model_parallel}-GPU model-parallel group (TP {p.tensor} x PP "
                           f"{p.pipeline} x CP {p.context})")
    data = gpus // model_parallel
    batch = t.global_batch
    if not fixed_batch:
        batch = t.global_batch * data // p.data if (t.global_batch * data) % p.data == 0 else 0
        if batch == 0:
            raise PartitaError(f"global batch {t.global_batch} x {data}/{p.data} is not whole")
    if batch % (t.micro_batch * data):
        raise PartitaError(f"global batch {batch} is not a multiple of micro-batch "
                           f"{t.micro_batch} x data {data}")
    # A named all-reduce exists only without a sharded optimizer (ZeRO 1/2 reduce-scatter, ZeRO 3
    # per block): the comparison of algorithms runs at ZeRO 0; `auto` keeps the scenario's ZeRO.
    zero = p.zero if grad_reduce == "auto" else 0
    return replace(scenario, cluster=cluster, training=replace(t, global_batch=batch),
                   parallel=replace(p, data=data, grad_reduce=grad_reduce, zero=zero))


def sweep(scenario, catalog, nodes: Sequence[int], grad_reduce: Sequence[str], *,
          fixed_batch: bool = False, progress: Progress | None = None,
          simulate: Callable | None = None) -> list[ScalingPoint]:
    if simulate is None:
        from partita.simulator.step import simulate
    points, total = [], len(nodes) * len(grad_reduce)
    for g in grad_reduce:
        for n in nodes:
            if progress:
                progress(f"scaling {len(points) + 1}/{total}: {n} node(s), {g}")
            try:
                s = point_scenario(scenario, catalog, n, g, fixed_batch=fixed_batch)
            except PartitaError as exc:
                points.append(ScalingPoint(grad_reduce=g, nodes=n, scenario=None, result=None,
                                           error=str(exc)))
                continue
            try:
                points.append(ScalingPoint(grad_reduce=g, nodes=n, scenario=s,
                                           result=simulate(s, catalog)))
            except PartitaError as exc:
                points.append(ScalingPoint(grad_reduce=g, nodes=n, scenario=s, result=None,
                                           error=str(exc)))
    return points


def scaling_table(points: Sequence[ScalingPoint]) -> pd.DataFrame:
    rows, base = [], {}
    for pt in points:
        r = pt.result
        row = {"grad_reduce": pt.grad_reduce, "nodes": pt.nodes, "gpus": None, "data": None,
               "zero": None,
               "global_batch": None, "step_time_s": None, "tokens_per_s": None, "mfu": None,
               "pp_comm_s": None, "bubble_s": None, "dp_comm_s": None, "peak_memory_gib": None, "scaling_efficiency": None,
               "error": pt.error}
        if pt.scenario is not None:
            row.update(data=pt.scenario.parallel.data, zero=pt.scenario.parallel.zero,
                       global_batch=pt.scenario.training.global_batch)
        if r is not None:
            base.setdefault(pt.grad_reduce, (pt.nodes, r.tokens_per_s))
            n0, tps0 = base[pt.grad_reduce]
            row.update(gpus=r.gpus, step_time_s=r.step_time_s, tokens_per_s=r.tokens_per_s,
                       mfu=r.mfu, pp_comm_s=r.breakdown_s.get("pp_comm", 0.0),
                       bubble_s=r.breakdown_s.get("bubble", 0.0),
                       dp_comm_s=r.breakdown_s.get("dp_comm", 0.0),
                       peak_memory_gib=r.peak_memory_gib,
                       scaling_efficiency=r.tokens_per_s / (tps0 * pt.nodes / n0))
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.astype({"gpus": "Int64", "data": "Int64", "zero": "Int64",
                         "global_batch": "Int64"})


FORMATS = {"step_time_s": ".4f", "tokens_per_s": ".1f", "mfu": ".3f", "dp_comm_s": ".4f",
           "pp_comm_s": ".4f", "bubble_s": ".4f",
           "peak_memory_gib": ".2f", "scaling_efficiency": ".3f"}


def _count(value: float, _pos=None) -> str:
    """400000 -> '400k', 1.2e6 -> '1.2M'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= div:
            return f"{value / div:g}{unit}"
    return f"{value:g}"


def _plot(frame: pd.DataFrame, column: str, title: str, ylabel: str, ideal: bool) -> bytes:
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    ok = frame[frame["tokens_per_s"].notna()]
    for i, (g, part) in enumerate(ok.groupby("grad_reduce", sort=False)):
        ax.plot(part["nodes"], part[column], marker=MARKERS[i % len(MARKERS)], ms=7 - i,
                color=SERIES[i % len(SERIES)], label=g)
    if ideal and len(ok):
        first = ok.sort_values("nodes").iloc[0]
        xs = sorted(ok["nodes"].unique())
        if column == "tokens_per_s":
            ax.plot(xs, [first[column] * x / first["nodes"] for x in xs], "k--", lw=1,
                    label="linear from smallest")
        else:
            ax.axhline(1.0, color="k", ls="--", lw=1, label="linear scaling")
    ax.set_xscale("log", base=2)
    if column == "tokens_per_s":
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(_count))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: _count(v) if str(v)[0] in "25" else ""))
    ax.set_xticks(sorted(ok["nodes"].unique()) or [1])
    ax.get_xaxis().set_major_formatter("{x:.0f}")
    ax.set_xlabel("nodes (count)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(title="gradient reduction")
    return png_bytes(fig)


def scaling_report(scenario, points: Sequence[ScalingPoint], *, system: str,
                   fixed_batch: bool) -> Report:
    frame = scaling_table(points)
    name = scenario.name or scenario.origin
    mode = ("strong scaling: global batch fixed" if fixed_batch else
            "weak scaling: batch per data-parallel replica fixed")
    p = scenario.parallel
    figs = () if frame["tokens_per_s"].isna().all() else (
        FigureItem(name="scaling_throughput", title="Throughput vs nodes",
                   png=_plot(frame, "tokens_per_s", f"{name}: throughput", "throughput (tokens/s)",
                             True)),
        FigureItem(name="scaling_efficiency", title="Scaling efficiency vs nodes",
                   png=_plot(frame, "scaling_efficiency", f"{name}: scaling efficiency",
                             "scaling efficiency (fraction of linear)", True)),
    )
    text = [f"{name} on {system}: TP {p.tensor} x PP {p.pipeline} x CP {p.context} per model "
            f"copy, data parallelism filling the nodes ({mode}). Efficiency is each curve's tokens/s "
            "over linear scaling from its smallest simulated node count."]
    text += _findings(frame)
    if p.zero >= 1 and any(g != "auto" for g in frame["grad_reduce"]):
        text.append(f"The scenario shards its optimizer (ZeRO-{p.zero}), whose gradients are "
                    "reduce-scattered whatever all-reduce is named; the named reductions are "
                    "therefore compared at ZeRO 0 (column zero), where each is the algorithm "
                    "that runs, and `auto` keeps the scenario's ZeRO stage.")
    text.append("The table lists the pipeline-communication and bubble seconds of the critical "
                "rank: where the pipeline's stages land on different nodes their sends cross the "
                "inter-node network.")
    failed = frame[frame["error"] != ""]
    sections = [Section(heading="Throughput and efficiency", text=tuple(text), figures=figs,
                        side_by_side=True),
                Section(heading="Every point", tables=(TableItem(
                    name="scaling", title="Scaling sweep", frame=frame, formats=FORMATS),))]
    if len(failed):
        sections.append(Section(heading="Points not simulated", text=tuple(
            f"{r.grad_reduce}, {r.nodes} node(s): {r.error}" for r in failed.itertuples())))
    return Report(kind="scaling", title=f"Scaling: {name}", subtitle=f"{system}, nodes "
                  f"{', '.join(str(n) for n in sorted(frame['nodes'].unique()))}",
                  sections=tuple(sections))


def _findings(frame: pd.DataFrame) -> list[str]:
    ok = frame[frame["tokens_per_s"].notna()]
    if ok.empty:
        return ["No point simulated; see the reasons below."]
    out = []
    top = ok["nodes"].max()
    at_top = ok[ok["nodes"] == top].sort_values("tokens_per_s", ascending=False)
    best = at_top.iloc[0]
    out.append(f"At {top} node(s) {best.grad_reduce} is fastest: {best.tokens_per_s:.1f} tokens/s, "
               f"scaling efficiency {best.scaling_efficiency:.3f}.")
    for r in at_top.iloc[1:].itertuples():
        out.append(f"{r.grad_reduce} at {top} node(s): {r.tokens_per_s:.1f} tokens/s "
                   f"({100 * (r.tokens_per_s / best.tokens_per_s - 1):+.1f}%), efficiency "
                   f"{r.scaling_efficiency:.3f}.")
    return out
