"""Compare report: systems and sizes in time and dollars, from the planner's candidates table.

Input is the planner's table, one row per candidate plan (columns `CANDIDATE_COLUMNS`: the plan,
its predicted step time, tokens/s, MFU, peak memory against capacity, whether it fits, $/hour
on-demand and spot, days and dollars for the token budget, whether it is on the time-cost Pareto
front, and `error`, the reason a candidate could not be simulated). For each system and size the
report picks the best fitting plan by the objective (time: step time; cost: dollars; memory: peak
memory), computes its scaling efficiency against the system's smallest size (tokens/s per GPU over
that of the smallest), draws scaling efficiency and time against cost with the Pareto front, and
derives a recommendation from the numbers: cheapest, fastest, and cheapest within a deadline,
each with the days at the slow end of its step time's 90% interval where the table has them
(optional columns `days_high`, `usd_high`).
Candidates that failed or do not fit are listed with their reason, never dropped silently.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from partita.planner.errors import PartitaError
from partita.reports.figures import SERIES, new_figure, png_bytes
from partita.reports.html import FigureItem, Report, Section, TableItem

CANDIDATE_COLUMNS = ("system", "nodes", "gpus", "tensor", "pipeline", "context", "data",
                     "micro_batch", "schedule", "virtual_stages", "recompute", "zero",
                     "grad_reduce", "step_time_s", "tokens_per_s", "mfu", "peak_memory_gib",
                     "memory_capacity_gib", "fits", "usd_per_hour", "usd_per_hour_spot", "days",
                     "usd", "usd_spot", "pareto", "error")
OPTIONAL_COLUMNS = ("days_high", "usd_high")     # the slow end of the step's 90% interval
OBJECTIVES = {"time": "step_time_s", "cost": "usd", "memory": "peak_memory_gib"}
FORMATS = {"step_time_s": ".4f", "tokens_per_s": ".1f", "mfu": ".3f", "scaling_efficiency": ".3f",
           "usd_per_hour": ",.2f", "usd_per_hour_spot": ",.2f", "days": ".2f", "usd": ",.0f",
           "usd_spot": ",.0f", "peak_memory_gib": ".2f", "memory_capacity_gib": ".1f",
           "days_high": ".2f", "usd_high": ",.0f"}


def check_candidates(frame: pd.DataFrame) -> None:
    missing = [c for c in CANDIDATE_COLUMNS if c not in frame.columns]
    if missing:
        raise PartitaError(f"candidates table lacks column(s) {', '.join(missing)}; expected "
                           f"{', '.join(CANDIDATE_COLUMNS)}")


def plan_text(row) -> str:
    """'TP 8 x PP 4 x CP 1 x DP 2, interleaved-1f1b (v=5), mb 1, selective, ZeRO-1, ring'."""
    text = (f"TP {row['tensor']} x PP {row['pipeline']} x CP {row['context']} x DP {row['data']}, "
            f"{row['schedule']}")
    if int(row["virtual_stages"]) > 1:
        text += f" (v={row['virtual_stages']})"
    text += f", mb {row['micro_batch']}, recompute {row['recompute']}"
    layers = row.get("recompute_layers") if hasattr(row, "get") else None
    if layers is not None and not pd.isna(layers):       # an optional column (older tables lack it)
        text += f" ({int(layers)} blocks per chunk)"
    if int(row["zero"]):
        text += f", ZeRO-{row['zero']}"
        shard = row.get("data_shard") if hasattr(row, "get") else None
        if shard is not None and not pd.isna(shard):       # an optional column (older tables lack it)
            text += f" sharded by {int(shard)}"
    text += f", {row['grad_reduce']}"
    peak, cap = row.get("peak_memory_gib"), row.get("memory_capacity_gib")
    if peak is not None and cap is not None and not (pd.isna(peak) or pd.isna(cap)):
        from partita.planner.layergraph import near_memory_capacity
        if near_memory_capacity(peak, cap):                 # as `plan` and `simulate` flag it
            text += f", near capacity ({peak:.1f} of {cap:.0f} GiB)"
    return text


def _usable(frame: pd.DataFrame) -> pd.DataFrame:
    err = frame["error"].fillna("").astype(str)
    return frame[(err == "") & frame["fits"].astype(bool) & frame["step_time_s"].notna()]


def best_plans(frame: pd.DataFrame, objective: str = "time") -> pd.DataFrame:
    """Per (system, gpus): the best usable candidate by the objective, with scaling efficiency."""
    check_candidates(frame)
    if objective not in OBJECTIVES:
        raise PartitaError(f"objective {objective!r}: not one of {', '.join(OBJECTIVES)}")
    key = OBJECTIVES[objective]
    ok = _usable(frame)
    rows = []
    for (system, gpus), part in ok.groupby(["system", "gpus"], sort=True):
        best = part.sort_values([key, "step_time_s", "usd"], kind="mergesort").iloc[0]
        rows.append(best)
    cols = ["system", "nodes", "gpus", "plan", "step_time_s", "tokens_per_s", "mfu",
            "scaling_efficiency", "peak_memory_gib", "memory_capacity_gib", "usd_per_hour",
            "usd_per_hour_spot", "days", "usd", "usd_spot", "pareto"]
    if not rows:                  # every column the page reads, no row
        return pd.DataFrame(columns=cols)
    best = pd.DataFrame(rows).reset_index(drop=True)
    best.insert(3, "plan", [plan_text(r) for _, r in best.iterrows()])
    eff = []
    for _, r in best.iterrows():
        first = best[best["system"] == r["system"]].sort_values("gpus").iloc[0]
        per_gpu0 = first["tokens_per_s"] / first["gpus"]
        eff.append(r["tokens_per_s"] / r["gpus"] / per_gpu0)
    best["scaling_efficiency"] = eff
    cols += [c for c in OPTIONAL_COLUMNS if c in best.columns]
    return best[cols]


def recommendation(best: pd.DataFrame, deadline_days: float | None = None) -> list[str]:
    """Cheapest, fastest and cheapest within the deadline, each with its numbers."""
    priced = best[best["usd"].notna() & best["days"].notna()]
    if priced.empty:
        return ["No fitting candidate has a price and a duration; nothing to recommend."]
    def line(label: str, r) -> str:
        spot = (f", ${r['usd_spot']:,.0f} on spot" if pd.notna(r["usd_spot"]) else "")
        slow = r.get("days_high")
        upto = (f" (up to {slow:.2f} at the slow end of its 90% interval)"
                if slow is not None and pd.notna(slow) else "")
        return (f"{label}: {r['gpus']} GPUs on {r['nodes']} x {r['system']} ({r['plan']}): "
                f"{r['days']:.2f} days{upto}, ${r['usd']:,.0f} on demand{spot}, "
                f"{r['tokens_per_s']:,.0f} tokens/s.")
    cheapest = priced.sort_values(["usd", "days"]).iloc[0]
    fastest = priced.sort_values(["days", "usd"]).iloc[0]
    out = [line("Cheapest", cheapest), line("Fastest", fastest)]
    if fastest["usd"] > cheapest["usd"]:
        out.append(f"Fastest costs {fastest['usd'] / cheapest['usd']:.2f}x the cheapest for "
                   f"{cheapest['days'] / fastest['days']:.2f}x less time.")
    if deadline_days is not None:
        within = priced[priced["days"] <= deadline_days]
        if within.empty:
            out.append(f"No fitting plan finishes within {deadline_days:g} days; the fastest "
                       f"needs {fastest['days']:.2f}.")
        else:
            out.append(line(f"Cheapest within {deadline_days:g} days",
                            within.sort_values(["usd", "days"]).iloc[0]))
    return out


def problems_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Candidates not usable: simulator errors and plans that do not fit, with the reason."""
    err = frame["error"].fillna("").astype(str)
    rows = []
    for (_, r), e in zip(frame.iterrows(), err):
        if e:
            reason = e
        elif not bool(r["fits"]):
            reason = (f"does not fit: {r['peak_memory_gib']:.1f} GiB of "
                      f"{r['memory_capacity_gib']:.1f} GiB")
        else:
            continue
        gpus = "" if r["gpus"] is None or pd.isna(r["gpus"]) else int(r["gpus"])
        rows.append({"system": r["system"], "gpus": gpus, "plan": _plan_or_search(r),
                     "reason": reason})
    return pd.DataFrame(rows, columns=["system", "gpus", "plan", "reason"])


def _plan_or_search(row) -> str:
    """The candidate's plan, or, for a size the planner could not serve (`plan_candidates`: no
    plan, only the search's reason), the size that was searched."""
    if row["tensor"] is not None and not pd.isna(row["tensor"]):
        return plan_text(row)
    nodes = row.get("nodes") if hasattr(row, "get") else None
    if nodes is not None and not pd.isna(nodes):
        return f"no plan: the search on {int(nodes)} node{'s' if int(nodes) != 1 else ''}"
    return "no plan"


def _dollars(value: float, _pos=None) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"${value / div:g}{unit}"
    return f"${value:g}"


def _efficiency_figure(best: pd.DataFrame) -> bytes:
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    for i, (system, part) in enumerate(best.groupby("system", sort=True)):
        part = part.sort_values("gpus")
        ax.plot(part["gpus"], part["scaling_efficiency"], marker="o", color=SERIES[i % len(SERIES)],
                label=system)
    ax.axhline(1.0, color="black", ls="--", lw=1, label="linear scaling")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(best["gpus"].unique()))
    ax.get_xaxis().set_major_formatter("{x:.0f}")
    ax.set_xlabel("GPUs (count)")
    ax.set_ylabel("scaling efficiency (per-GPU tokens/s vs smallest size)")
    ax.set_title("Scaling efficiency of the best plan per size")
    ax.grid(True, alpha=0.3)
    ax.legend(title="system")
    return png_bytes(fig)


def _cost_figure(frame: pd.DataFrame, best: pd.DataFrame) -> bytes:
    fig = new_figure(6.8, 4.4)
    ax = fig.add_subplot()
    ok = _usable(frame)
    ok = ok[ok["usd"].notna() & ok["days"].notna()]
    ax.scatter(ok["days"], ok["usd"], s=10, color="#CCCCCC", label="every fitting candidate")
    for i, (system, part) in enumerate(best.groupby("system", sort=True)):
        ax.scatter(part["days"], part["usd"], s=36, color=SERIES[i % len(SERIES)],
                   label=f"{system} (best per size)", zorder=3)
        for _, r in part.iterrows():
            ax.annotate(f"{r['gpus']}", (r["days"], r["usd"]), textcoords="offset points",
                        xytext=(4, 3), fontsize=7)
    front = ok[ok["pareto"].astype(bool)].sort_values("days")
    if len(front):
        ax.step(front["days"], front["usd"], where="post", color="black", lw=1.2,
                label="Pareto front (time, cost)", zorder=2)
        ax.scatter(front["days"], front["usd"], s=70, facecolor="none", edgecolor="black",
                   zorder=4)
    # candidates far from the best (a deep pipeline on few GPUs, years to train) would squeeze the
    # best plans into a corner: an axis that spans more than a decade is logarithmic
    scales = []
    for axis, values, setter in ((ax.xaxis, ok["days"], ax.set_xscale),
                                 (ax.yaxis, ok["usd"], ax.set_yscale)):
        positive = values[values > 0]
        log = len(positive) > 1 and positive.max() > 10 * positive.min()
        if log:
            setter("log")
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_minor_formatter(NullFormatter())
        scales.append("log" if log else "linear")
    ax.yaxis.set_major_formatter(FuncFormatter(_dollars))
    if scales[0] == "log":
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos=None: f"{v:g}"))
    ax.set_xlabel("time to train the token budget (days)"
                  + (", log scale" if scales[0] == "log" else ""))
    ax.set_ylabel("cost on demand (USD)" + (", log scale" if scales[1] == "log" else ""))
    ax.set_title("Time vs cost (labels: GPUs)")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=8)
    return png_bytes(fig)


def plan_candidates(file, *, catalog, systems: Sequence[str], objective: str = "time",
                    tokens: float | None = None, nodes: Sequence[int] | None = None,
                    gpus: tuple[int, int] | None = None,
                    progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """The planner's candidates for every system at every size, as one table: one search per
    node count (`nodes`), or one search up to the largest GPU count of `gpus` = (low, high),
    keeping counts from `low` up. The scenario's model and training settings are kept; its
    cluster, parallel section and micro-batch are what the comparison searches, so they are
    released, so the file may leave them open as `partita plan` takes it. A size the planner
    cannot serve, and a system a search skipped whole (a GPU without the precision or the fp8
    recipe), becomes a row with its reason; a file it cannot read at all is an error."""
    from partita.planner.documents import load_document
    from partita.planner.planspec import read_spec
    from partita.planner.scenario import find_scenario_file
    from partita.planner.search import plan
    path = find_scenario_file(file)
    doc = load_document(path)
    if not isinstance(doc, dict):
        raise PartitaError(f"{path}: expected a mapping at the top level")
    for key in ("cluster", "parallel"):
        released = doc.pop(key, None)
        if released is not None and not isinstance(released, dict):
            raise PartitaError(f"{path}: {key}: expected a mapping, got {released!r}")
    if isinstance(doc.get("training"), dict):
        doc["training"].pop("micro_batch", None)
    searches = ([{"nodes": n} for n in nodes] if nodes is not None
                else [{"max_gpus": gpus[1]}])
    read_spec(doc, catalog=catalog, systems=list(systems), origin=str(path),   # the file's errors
              **searches[0])
    frames = []
    for i, size in enumerate(searches, 1):
        if progress is not None:
            progress(f"search {i}/{len(searches)}: "
                     + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in size.items()))
        try:
            result = plan(doc, catalog=catalog, systems=list(systems), objective=objective,
                          tokens=tokens, **size)
        except PartitaError as exc:
            row = dict.fromkeys(CANDIDATE_COLUMNS)
            row.update(system=",".join(systems), nodes=size.get("nodes"), pareto=False,
                       fits=False, error=str(exc))
            frames.append(pd.DataFrame([row]))
            continue
        frames.append(result.table())
        skipped = [n for n in result.notes                  # a system the search left out whole
                   if any(n.startswith(f"{s} skipped: ") for s in systems)]
        if skipped:
            rows = [dict.fromkeys(CANDIDATE_COLUMNS) | dict(
                system=n.split(" skipped: ", 1)[0], nodes=size.get("nodes"), pareto=False,
                fits=False, error=n.split(" skipped: ", 1)[1]) for n in skipped]
            frames.append(pd.DataFrame(rows))
    frame = pd.concat(frames, ignore_index=True)
    if gpus is not None:
        frame = frame[frame["gpus"].isna() | (frame["gpus"] >= gpus[0])]
    frame["error"] = frame["error"].fillna("")
    return frame.reset_index(drop=True)


def compare_report(candidates: pd.DataFrame, *, title: str = "Instance comparison",
                   objective: str = "time", tokens: float | None = None,
                   deadline_days: float | None = None) -> Report:
    best = best_plans(candidates, objective)
    problems = problems_table(candidates)
    budget = f" for {tokens:,.0f} tokens" if tokens else ""
    text = [f"Best plan per system and size by {objective}; days and dollars{budget}. "
            f"{len(candidates)} candidates, {len(_usable(candidates))} fitting, "
            f"{len(problems)} not usable (listed below)."]
    front = best[best["pareto"].astype(bool) & best["days"].notna()].sort_values("days")
    if len(front):
        text.append("On the time-cost Pareto front (no other plan both faster and cheaper): " +
                    "; ".join(f"{r['gpus']} x {r['system']} ({r['days']:.2f} days, "
                              f"${r['usd']:,.0f})" for _, r in front.iterrows()) + ".")
    sections = [Section(heading="Recommendation", text=tuple(
        recommendation(best, deadline_days)) if len(best) else ("No usable candidate.",))]
    if len(best):
        sections.append(Section(heading="Scaling and cost", text=tuple(text), figures=(
            FigureItem(name="compare_efficiency", title="Scaling efficiency",
                       png=_efficiency_figure(best)),
            FigureItem(name="compare_cost", title="Time vs cost",
                       png=_cost_figure(candidates, best))), side_by_side=True))
    sections.append(Section(heading="Best plan per system and size", tables=(TableItem(
        name="compare", title="Best plans", frame=best, formats=FORMATS),)))
    sections.append(Section(heading="Every candidate", tables=(
        TableItem(name="candidates", title="Planner candidates", frame=candidates,
                  formats=FORMATS),
        TableItem(name="not_usable", title="Candidates not usable, with the reason",
                  frame=problems))))
    return Report(kind="compare", title=title, subtitle=f"objective: {objective}{budget}",
                  sections=tuple(sections))

