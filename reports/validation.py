"""Validation report: the simulator's step times against published measurements.

From `validation.runner.run_validation` (the numbers `partita validate` prints): predicted vs
measured scatter with the 5% and 10% bands, the rows fitted on beside the held-back rows, the
signed error by source, the worst rows, and every row skipped or refused with its reason. Where
the command passes them, a section on runs the fit never saw: the leave-one-source-out errors
stored by `partita validate --cross-validate --write` (a figure and a table by source), how the
90% intervals hold when each source is left out of them too, and the summaries of the frozen test
sets (never a frozen row's own error: those are withheld, `validation.frozen`). And the effects of
one change: pairs of rows of one source that differ in one kind of setting, their predicted ratio of
step times against the measured one (`validation.effects`).
"""
from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from partita.reports.figures import SERIES, new_figure, png_bytes
from partita.reports.html import FigureItem, Report, Section, TableItem

GROUP_NAMES = {"fit": "fit (calibrated on)", "holdout": "held back"}
SCATTER_HEADINGS = {("fit", "holdout"): "Fit and held back, side by side",
                    ("fit",): "Predicted against published (every row a fit row)",
                    ("holdout",): "Predicted against published (every row held back)"}
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


def _present(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """The groups (fit, held back) with rows in `frame`, one panel each; fit alone when none has."""
    groups = [(g, label) for g, label in GROUP_NAMES.items() if (frame["group"] == g).any()]
    return groups or list(GROUP_NAMES.items())[:1]


def _scatter(frame: pd.DataFrame) -> bytes:
    """Top row: predicted vs published (log-log, the bands as wedges); bottom row: the same rows'
    signed error against published step time, where the 5% and 10% bands are readable."""
    ok = frame[frame["predicted_step_s"].notna()]
    groups = _present(ok)
    fig = new_figure(5.5 * len(groups), 8.6)
    axes = fig.subplots(2, len(groups), sharex=True, squeeze=False)
    lo = min(ok["measured_step_s"].min(), ok["predicted_step_s"].min()) * 0.7
    hi = max(ok["measured_step_s"].max(), ok["predicted_step_s"].max()) * 1.4
    xs = [lo, hi]
    span = max(12.0, float(ok["error_pct"].abs().max()) * 1.1)
    for col, ((group, label), colour) in enumerate(zip(groups, SERIES)):
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
    groups = _present(ok)
    fig = new_figure(5.5 * len(groups), 4.6)
    axes = fig.subplots(1, len(groups), sharex=True, sharey=True, squeeze=False)[0]
    lo = 0.0
    hi = max(ok["measured_peak_memory_gib"].max(), ok["predicted_peak_memory_gib"].max()) * 1.1
    xs = [lo, hi]
    for ax, (group, label), colour in zip(axes, groups, SERIES):
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


def loso_table(rows: list[dict]) -> pd.DataFrame:
    """Leave-one-source-out absolute errors (%) per source and over all, from crossval.json rows."""
    from partita.validation.runner import summarize
    out = []
    for source in sorted({r["source_key"] for r in rows}) + [None]:
        s = summarize(r["error_pct"] / 100.0 for r in rows if source in (None, r["source_key"]))
        out.append({"source": source or "all", "rows": s.count, "median_abs_pct": s.median_pct,
                    "p90_abs_pct": s.p90_pct, "max_abs_pct": s.max_pct,
                    "mean_signed_pct": s.bias_pct})
    return pd.DataFrame(out)


def loso_figure(rows: list[dict]) -> bytes:
    """Left: measured against predicted step time per row, each predicted by a fit that left its
    source out, coloured by source; right: the rows' signed errors by source."""
    fig = new_figure(13.0, 5.5)
    ax, bx = fig.subplots(1, 2)
    sources = sorted({r["source_key"] for r in rows})
    for i, source in enumerate(sources):
        mine = [r for r in rows if r["source_key"] == source]
        style = {"s": 22, "color": SERIES[i % len(SERIES)],
                 "marker": "o^sDv"[i // len(SERIES) % 5]}          # past 8 sources: a new marker
        ax.scatter([r["measured_step_s"] for r in mine], [r["predicted_step_s"] for r in mine],
                   label=source, **style)
        bx.scatter([i] * len(mine), [r["error_pct"] for r in mine], **style)
    lo = min(min(r["measured_step_s"], r["predicted_step_s"]) for r in rows) * 0.8
    hi = max(max(r["measured_step_s"], r["predicted_step_s"]) for r in rows) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    for f in (0.9, 1.1):
        ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.8, ls="--")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="measured step time (s)", ylabel="predicted, source left out of the fit (s)",
           title="Leave-one-source-out predictions (dashed: +-10%)")
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    bx.axhline(0, color="black", lw=1)
    for f in (-10, 10):
        bx.axhline(f, color="grey", lw=0.8, ls="--")
    bx.set_xticks(range(len(sources)), sources, rotation=45, ha="right", fontsize=8)
    bx.set(xlabel="left-out source", ylabel="error: predicted / measured - 1 (%)",
           title="Error per row, by left-out source")
    for a in (ax, bx):
        a.grid(True, which="both", alpha=0.2)
    return png_bytes(fig)


def effects_table(pairs) -> pd.DataFrame:
    """Per kind of change and over all pairs: |predicted ratio / measured ratio - 1| (%) and how
    often the faster run of a pair is predicted faster (`validation.effects`)."""
    from partita.validation.effects import KIND_TEXT, effect_summaries
    return pd.DataFrame([{"change": s.kind, "what changes": KIND_TEXT.get(s.kind, "any one kind"),
                          "pairs": s.pairs, "sources": s.sources, "median_abs_pct": s.median_pct,
                          "p90_abs_pct": s.p90_pct, "max_abs_pct": s.max_pct,
                          "mean_signed_pct": s.bias_pct,
                          "faster_run_named": f"{s.order_right} of {s.decisive}"}
                         for s in effect_summaries(pairs)])


def effects_figure(pairs) -> bytes:
    """Left: measured against predicted ratio of the two step times of each pair (the slower over
    the faster run, so measured >= 1), one colour per kind of change, with the +-10% band; below 1
    on the vertical axis the prediction names the other run faster. Right: each pair's ratio error
    by kind of change, where the crowd of small ratios near 1 comes apart."""
    from partita.validation.effects import KINDS
    fig = new_figure(13.0, 5.5)
    ax, bx = fig.subplots(1, 2)
    lo = min(min(p.measured_ratio, p.predicted_ratio) for p in pairs) * 0.9
    hi = max(max(p.measured_ratio, p.predicted_ratio) for p in pairs) * 1.1
    xs = [min(lo, 1.0), hi]
    ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="#E8E8E8",
                    label="within 10%")
    ax.plot(xs, xs, color="black", lw=0.8, label="predicted = measured")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--", label="below: the other run predicted faster")
    bx.axhspan(-10, 10, color="#E8E8E8", label="within 10%")
    bx.axhline(0, color="black", lw=0.8)
    kinds = [k for k in KINDS if any(p.kind == k for p in pairs)]
    for i, kind in enumerate(kinds):
        mine = [p for p in pairs if p.kind == kind]
        style = dict(s=22, color=SERIES[i % len(SERIES)], edgecolor="white", lw=0.4, zorder=3)
        ax.scatter([p.measured_ratio for p in mine], [p.predicted_ratio for p in mine],
                   label=f"{kind} ({len(mine)} pairs)", **style)
        spread = [i + 0.3 * ((j * 0.618) % 1.0 - 0.5) for j in range(len(mine))]
        bx.scatter(spread, [100.0 * p.error for p in mine], **style)
    ax.set(xscale="log", yscale="log", xlim=xs, ylim=(min(lo, 1.0), hi),
           xlabel="measured ratio of the two step times (slower / faster)",
           ylabel="predicted ratio of the same two runs",
           title="Effects of one change: pairs of runs of one source")
    ax.legend(fontsize=7, loc="upper left")
    bx.set_xticks(range(len(kinds)), kinds)
    bx.set(xlabel="kind of change", ylabel="predicted ratio / measured ratio - 1 (%)",
           title="Ratio error per pair")
    bx.legend(fontsize=7, loc="upper left")
    for a in (ax, bx):
        a.grid(True, which="both", alpha=0.2)
    return png_bytes(fig)


def frozen_table(frozen) -> pd.DataFrame:
    """One row per frozen test set, from (FrozenSet, its Report) pairs: the summary that
    `partita validate --frozen-test` prints, never a row's own error."""
    out = []
    for fs, rep in frozen:
        s = rep.summary()
        inside, total = rep.interval_coverage()
        out.append({"set": fs.name, "csv": fs.csv.name, "frozen": fs.frozen,
                    "simulated": s.count, "not_simulated": len(rep.skipped) + len(rep.failed()),
                    "median_abs_pct": s.median_pct, "p90_abs_pct": s.p90_pct,
                    "max_abs_pct": s.max_pct, "mean_signed_pct": s.bias_pct,
                    "inside_90pct_interval": f"{inside} of {total}"})
    return pd.DataFrame(out)


def skipped_table(report, frame: pd.DataFrame) -> pd.DataFrame:
    """Rows not compared: those the row map skipped and those the simulator refused, with why."""
    return pd.DataFrame([{"id": s.row_id, "model": s.model, "kind": s.kind, "reason": s.reason}
                         for s in report.skipped]
                        + [{"id": r.id, "model": r.model, "kind": "refused by the simulator",
                            "reason": r.failure} for r in frame[frame["failure"] != ""].itertuples()])


def validation_report(report, *, progress: Callable[[str], None] | None = None,
                      withheld: int = 0, loso_rows: list[dict] | None = None,
                      nested: tuple[int, int] | None = None, frozen=None) -> Report:
    """The page. `withheld`: rows of a frozen test set whose step times were withheld;
    `loso_rows`: crossval.json's rows; `nested`: (inside, rows) of the intervals with each source
    left out of them too; `frozen`: (FrozenSet, Report) pairs."""
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
    text = (f"{len(ok)} published runs simulated from {report.csv}; split: {report.split_rule}. "
            "Error = predicted / published - 1; the summary is of absolute errors.",)
    if withheld:
        text += (f"The predicted step times of {withheld} rows of a frozen test set are withheld: "
                 "`partita validate --frozen-test` reports that set, once per model change.",)
    drawn = len(ok) > 0
    sections = [
        Section(heading="Summary", text=text, tables=(TableItem(
            name="summary", title="Absolute error (%)", frame=summary, formats=sfmt),)),
        Section(heading=SCATTER_HEADINGS[tuple(g for g, _ in _present(ok))], figures=(FigureItem(
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
    from partita.validation.effects import KIND_TEXT, KINDS, one_change_pairs
    pairs = one_change_pairs((r.row, r.predicted_step_s) for r in report.results
                             if r.predicted_step_s is not None)
    if pairs:
        sections.insert(3, Section(
            heading="Effects of one change",
            text=("Two runs of one source that differ in one kind of setting ("
                  + "; ".join(KIND_TEXT[k] for k in KINDS) + "): how well is the ratio of their "
                  "step times predicted? A planner choosing between candidates needs this ratio, and "
                  "an error common to both runs cancels in it.",),
            figures=(FigureItem(name="validate_effects", title="Effects of one change",
                                png=effects_figure(pairs)),),
            tables=(TableItem(name="effects", title="Ratio error by kind of change (%)",
                              frame=effects_table(pairs), formats=sfmt),)))
    unseen = _unseen_section(loso_rows, nested, frozen, sfmt)
    if unseen is not None:
        sections.insert(1, unseen)
    if memory:
        sections.insert(3, Section(heading="Peak memory per GPU", figures=(FigureItem(
            name="validate_memory", title="Predicted vs published peak memory",
            png=_memory_figure(frame)),), tables=(TableItem(
                name="memory_summary", title="Peak memory, absolute error (%)",
                frame=summary_table(report, memory=True), formats=sfmt),)))
    return Report(kind="validate", title="Validation: predicted vs published", subtitle=report.csv,
                  sections=tuple(sections))


def _unseen_section(loso_rows, nested, frozen, sfmt) -> Section | None:
    """Runs the fit never saw: leave-one-source-out, interval coverage, the frozen sets."""
    if not loso_rows and not frozen:
        return None
    text, figures, tables = [], [], []
    if loso_rows:
        table = loso_table(loso_rows)
        every = table.iloc[-1]
        text.append(f"Leave-one-source-out ({every['rows']} rows): each source predicted by a fit "
                    f"that left it out, median {every['median_abs_pct']:.1f}%, p90 "
                    f"{every['p90_abs_pct']:.1f}%, max {every['max_abs_pct']:.1f}%, bias "
                    f"{every['mean_signed_pct']:+.1f}% (`partita validate --cross-validate`).")
        figures.append(FigureItem(name="validate_loso", title="Leave-one-source-out",
                                  png=loso_figure(loso_rows)))
        tables.append(TableItem(name="loso", title="Leave-one-source-out, absolute error (%)",
                                frame=table, formats=sfmt))
    if nested is not None:
        text.append(f"The 90% intervals, each row's drawn from the other sources' errors only: "
                    f"{nested[0]} of {nested[1]} measured steps inside.")
    if frozen:
        text.append("Frozen test sets: never fitted on, reported once per model change; their "
                    "rows' own errors are never shown.")
        tables.append(TableItem(name="frozen", title="Frozen test sets, absolute error (%)",
                                frame=frozen_table(frozen), formats=sfmt))
    return Section(heading="Runs the fit never saw", text=tuple(text), figures=tuple(figures),
                   tables=tuple(tables))
