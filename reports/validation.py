"""Validation report: the simulator's step times against published measurements.

From `validation.runner.run_validation` (the numbers `partita validate` prints): predicted vs
measured scatter with the 5% and 10% bands, the rows fitted on beside the held-back rows, the
signed error by source, the worst rows, and every row skipped or refused with its reason. Where
the simulator offers a leave-one-source-out refit (`partita validate --cross-validate`), its
summary sits beside the other two; where it does not, the page says so.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

import pandas as pd

from partita.reports.figures import SERIES, new_figure, png_bytes
from partita.reports.html import FigureItem, Report, Section, TableItem

GROUP_NAMES = {"fit": "fit (calibrated on)", "holdout": "held back"}
WORST = 10
ROW_COLUMNS = ("id", "source", "model", "gpus", "system", "group", "measured_step_s",
               "predicted_step_s", "error_pct", "measured_peak_memory_gib",
               "predicted_peak_memory_gib", "memory_error_pct", "failure")
MEMORY_COLUMNS = ("measured_peak_memory_gib", "predicted_peak_memory_gib", "memory_error_pct")


def rows_table(report) -> pd.DataFrame:
    rows = []
    for r in report.results:
        m = r.row
        rows.append({"id": m.row_id, "source": m.source_key, "model": m.model, "gpus": m.gpus,
                     "system": m.scenario.cluster.system, "group": r.group,
                     "measured_step_s": m.measured_step_s, "predicted_step_s": r.predicted_step_s,
                     "error_pct": None if r.error is None else 100.0 * r.error,
                     "measured_peak_memory_gib": m.measured_peak_memory_gib,
                     "predicted_peak_memory_gib": r.predicted_peak_memory_gib,
                     "memory_error_pct": None if r.memory_error is None else 100.0 * r.memory_error,
                     "failure": r.failure})
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


def summary_table(report, memory: bool = False) -> pd.DataFrame:
    """Absolute error (%) per group: step time, or with `memory` the peak memory per GPU."""
    rows = []
    for group, label in (("fit", "fit"), ("holdout", "held back"), (None, "all")):
        s = (report.memory_summary(group) if memory else report.summary(group)).to_json()
        rows.append({"rows": label, "count": s["count"], "median_abs_pct": s["median_abs_pct"],
                     "p90_abs_pct": s["p90_abs_pct"], "max_abs_pct": s["max_abs_pct"],
                     "mean_signed_pct": s["mean_signed_pct"]})
    return pd.DataFrame(rows)


def cross_validation() -> object | None:
    """The simulator's leave-one-source-out entry point, if this installation has one."""
    for modname in ("partita.validation.crossval", "partita.validation.runner"):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        fn = getattr(mod, "cross_validate", None)
        if callable(fn):
            return fn
    return None


def _scatter(frame: pd.DataFrame) -> bytes:
    """Top row: predicted vs published (log-log, the bands as wedges); bottom row: the same rows'
    signed error against published step time, where the 5% and 10% bands are readable."""
    ok = frame[frame["predicted_step_s"].notna()]
    fig = new_figure(11.0, 8.6)
    axes = fig.subplots(2, 2, sharex=True)
    lo = min(ok["measured_step_s"].min(), ok["predicted_step_s"].min()) * 0.7
    hi = max(ok["measured_step_s"].max(), ok["predicted_step_s"].max()) * 1.4
    xs = [lo, hi]
    span = max(12.0, float(ok["error_pct"].abs().max()) * 1.1)
    for col, ((group, label), colour) in enumerate(zip(GROUP_NAMES.items(), SERIES)):
        part = ok[ok["group"] == group]
        top, bottom = axes[0][col], axes[1][col]
        for band, shade in ((10, "#E8E8E8"), (5, "#C8C8C8")):
            top.fill_between(xs, [x * (1 - band / 100) for x in xs],
                             [x * (1 + band / 100) for x in xs], color=shade, label=f"within {band}%")
            bottom.axhspan(-band, band, color=shade, label=f"within {band}%")
        top.plot(xs, xs, color="black", lw=0.8, label="predicted = published")
        bottom.axhline(0, color="black", lw=0.8, label="predicted = published")
        kw = dict(s=18, color=colour, edgecolor="white", lw=0.4, zorder=3,
                  label=f"{label} ({len(part)} rows)")
        top.scatter(part["measured_step_s"], part["predicted_step_s"], **kw)
        bottom.scatter(part["measured_step_s"], part["error_pct"], **kw)
        top.set_xscale("log")
        top.set_yscale("log")
        top.set_xlim(lo, hi)
        top.set_ylim(lo, hi)
        bottom.set_ylim(-span, span)
        top.set_ylabel("predicted step time (s)")
        bottom.set_ylabel("error, predicted / published - 1 (%)")
        bottom.set_xlabel("published step time (s)")
        top.set_xlabel("published step time (s)")
        top.set_title(f"{label}: predicted vs published")
        bottom.set_title(f"{label}: error vs published step time")
        for ax in (top, bottom):
            ax.grid(True, which="both", alpha=0.2)
            ax.legend(loc="upper left", fontsize=7)
    return png_bytes(fig)


def _memory_figure(frame: pd.DataFrame) -> bytes:
    """Predicted against published peak memory per GPU, fit beside held back, with the bands."""
    ok = frame[frame["memory_error_pct"].notna()]
    fig = new_figure(11.0, 4.6)
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    lo = 0.0
    hi = max(ok["measured_peak_memory_gib"].max(), ok["predicted_peak_memory_gib"].max()) * 1.1
    xs = [lo, hi]
    for ax, (group, label), colour in zip(axes, GROUP_NAMES.items(), SERIES):
        part = ok[ok["group"] == group]
        for band, shade in ((10, "#E8E8E8"), (5, "#C8C8C8")):
            ax.fill_between(xs, [x * (1 - band / 100) for x in xs],
                            [x * (1 + band / 100) for x in xs], color=shade, label=f"within {band}%")
        ax.plot(xs, xs, color="black", lw=0.8, label="predicted = published")
        ax.scatter(part["measured_peak_memory_gib"], part["predicted_peak_memory_gib"], s=18,
                   color=colour, edgecolor="white", lw=0.4, zorder=3,
                   label=f"{label} ({len(part)} rows)")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("published peak memory per GPU (GiB)")
        ax.set_ylabel("predicted peak memory per GPU (GiB)")
        ax.set_title(f"{label}: peak memory")
        ax.grid(True, alpha=0.2)
        ax.legend(loc="upper left", fontsize=7)
    return png_bytes(fig)


def _by_source(frame: pd.DataFrame) -> bytes:
    ok = frame[frame["error_pct"].notna()]
    sources = sorted(ok["source"].unique())
    fig = new_figure(max(7.0, 0.45 * len(sources) + 2.5), 4.8)
    ax = fig.add_subplot()
    for band, shade in ((10, "#EEEEEE"), (5, "#D9D9D9")):
        ax.axhspan(-band, band, color=shade, label=f"within {band}%")
    ax.axhline(0, color="black", lw=0.8)
    for (group, label), colour, marker in zip(GROUP_NAMES.items(), SERIES, ("o", "s")):
        part = ok[ok["group"] == group]
        xs = [sources.index(s) + (-0.12 if group == "fit" else 0.12) for s in part["source"]]
        ax.scatter(xs, part["error_pct"], s=16, color=colour, marker=marker, label=label, zorder=3)
    ax.set_xticks(range(len(sources)), sources, rotation=60, ha="right", fontsize=8)
    ax.set_xlabel("source (publication)")
    ax.set_ylabel("error, predicted / published - 1 (%)")
    ax.set_title("Signed step-time error by source")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    return png_bytes(fig)


def skipped_table(report, frame: pd.DataFrame) -> pd.DataFrame:
    """Rows not compared: those the row map skipped and those the simulator refused, with why."""
    return pd.DataFrame([{"id": s.row_id, "model": s.model, "kind": s.kind, "reason": s.reason}
                         for s in report.skipped]
                        + [{"id": r.id, "model": r.model, "kind": "refused by the simulator",
                            "reason": r.failure} for r in frame[frame["failure"] != ""].itertuples()])


def validation_report(report, *, progress: Callable[[str], None] | None = None) -> Report:
    frame = rows_table(report)
    memory = frame["memory_error_pct"].notna().any()
    if not memory:
        frame = frame.drop(columns=list(MEMORY_COLUMNS))
    summary = summary_table(report)
    ok = frame[frame["error_pct"].notna()]
    worst = ok.reindex(ok["error_pct"].abs().sort_values(ascending=False).index).head(WORST)
    worst = worst.drop(columns=["failure"])
    skipped = skipped_table(report, frame)
    if progress:
        progress(f"validate: {len(ok)} rows compared, {len(skipped)} skipped; drawing")
    fmt = {"measured_step_s": ".4g", "predicted_step_s": ".4g", "error_pct": "+.1f",
           "measured_peak_memory_gib": ".1f", "predicted_peak_memory_gib": ".1f",
           "memory_error_pct": "+.1f"}
    sfmt = {c: ".1f" for c in ("median_abs_pct", "p90_abs_pct", "max_abs_pct")} | {
        "mean_signed_pct": "+.1f"}
    cv_text = ("Leave-one-source-out: this installation's simulator offers a cross-validation "
               "entry point; run `partita validate --cross-validate` for its summary."
               if cross_validation() is not None else
               "Leave-one-source-out: not available in this installation (the simulator has no "
               "`--cross-validate` refit yet), so only the fit and held-back figures are shown.")
    text = (f"{len(ok)} published runs simulated from {report.csv}; split: {report.split_rule}. "
            "Error = predicted / published - 1; the summary is of absolute errors.", cv_text)
    drawn = len(ok) > 0
    sections = [
        Section(heading="Summary", text=text, tables=(TableItem(
            name="summary", title="Absolute error (%)", frame=summary, formats=sfmt),)),
        Section(heading="Fit and held back, side by side", figures=(FigureItem(
            name="validate_scatter", title="Predicted vs published", png=_scatter(frame)),)
            if drawn else (), text=() if drawn else ("No row was simulated.",)),
        Section(heading="Error by source", figures=(FigureItem(
            name="validate_by_source", title="Error by source", png=_by_source(frame)),)
            if drawn else ()),
        Section(heading="Worst rows", tables=(TableItem(
            name="worst", title=f"The {WORST} largest errors", frame=worst, formats=fmt),)),
        Section(heading="Every row", tables=(
            TableItem(name="rows", title="Every simulated row", frame=frame, formats=fmt),
            TableItem(name="skipped", title="Rows not compared, with the reason",
                      frame=skipped)))]
    if memory:
        sections.insert(3, Section(heading="Peak memory per GPU", figures=(FigureItem(
            name="validate_memory", title="Predicted vs published peak memory",
            png=_memory_figure(frame)),), tables=(TableItem(
                name="memory_summary", title="Peak memory, absolute error (%)",
                frame=summary_table(report, memory=True), formats=sfmt),)))
    return Report(kind="validate", title="Validation: predicted vs published", subtitle=report.csv,
                  sections=tuple(sections))
