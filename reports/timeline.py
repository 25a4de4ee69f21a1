"""Timeline report: the simulated step as a Gantt chart, one row group per pipeline rank.

Each rank gets three rows: compute (forward, backward, weight-gradient; the in-layer collectives,
TP / CP / ZeRO-3, drawn over the end of each compute bar as their share of the chunk's time per
micro-batch, since the simulator folds them into the block's kernels), point-to-point (the
pipeline's sends and receives) and the data-parallel gradient reduction with the optimizer. Idle
compute time before a rank's last backward is the pipeline bubble; gradient reduction after it is
the exposed data-parallel communication. Every rank of a data-parallel replica runs the same
pipeline, so one rank per stage is drawn: the ranks the simulator simulates.

`gantt()` draws any list of spans (simulated or measured), so the run report reuses it on the
same time axis.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import pandas as pd
from matplotlib.patches import Patch

from partita.planner.errors import PartitaError
from partita.reports.figures import KIND_COLOURS, new_figure, png_bytes, time_unit
from partita.reports.html import FigureItem, Report, Section, TableItem

_ACTION = re.compile(r"^(\d+)([A-Z_]+?)(\d+)$")
IN_LAYER_PARTS = ("tp_comm", "cp_comm", "fsdp_comm")
STEP_SYNC_PARTS = ("embedding_sync", "step_sync", "step_overhead")   # after the last reduction
ROWS = ("compute", "p2p", "dp / optimizer")
HALF_ROW = {"send": 0.42, "recv": 0.0}     # offset within the p2p row


def chunk_of(name: str) -> int | None:
    m = _ACTION.match(name)
    return int(m.group(1)) if m else None


def kind_of(span) -> str:
    """The colour key of a span: forward, backward, backward-weight, send, recv, dp, optimizer."""
    if span.lane == "compute":
        return span.cat if span.cat in KIND_COLOURS else "forward"
    if span.lane in ("send", "recv"):
        return span.lane
    if span.lane == "optimizer":
        return "optimizer"
    if span.lane in ("tp", "cp"):
        return "in-layer comm"
    return "dp"


def _row(span) -> int:
    if span.lane == "compute":
        return 0
    if span.lane in ("send", "recv"):
        return 1
    return 2


def in_layer_share(parts: dict[str, float]) -> float:
    total = sum(parts.values())
    return sum(parts.get(k, 0.0) for k in IN_LAYER_PARTS) / total if total > 0 else 0.0


def bubbles(spans: Sequence, rank: int) -> list[tuple[float, float]]:
    """Idle intervals of a rank's compute lane between 0 and its last compute action."""
    busy = sorted((s.start_s, s.end_s) for s in spans if s.rank == rank and s.lane == "compute")
    out, t = [], 0.0
    for a, b in busy:
        if a > t + 1e-12:
            out.append((t, a))
        t = max(t, b)
    return out


def gantt(ax, spans: Sequence, *, ranks: Sequence[int], end_s: float, start_s: float = 0.0,
          chunk_parts: Sequence[dict[str, float]] | None = None,
          label_prefix: str = "rank") -> set[str]:
    """Draw `spans` of `ranks` on `ax`: three rows per rank, time in a unit fit for `end_s`.
    Returns the kinds drawn, for `add_legend`."""
    scale, unit = time_unit(end_s)
    used: set[str] = set()
    ticks, labels = [], []
    for i, rank in enumerate(ranks):
        base = (len(ranks) - 1 - i) * (len(ROWS) + 1)
        used |= _draw_rank(ax, spans, rank, base, scale, chunk_parts)
        for row, name in enumerate(ROWS):
            ticks.append(base + (len(ROWS) - 1 - row) + 0.5)
            labels.append(f"{label_prefix} {rank} {name}" if row == 0 else name)
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_ylim(-0.5, len(ranks) * (len(ROWS) + 1) - 0.5)
    ax.set_xlim(start_s * scale, end_s * scale)
    ax.set_xlabel(f"time since step start ({unit})")
    ax.set_ylabel("pipeline rank / lane")
    ax.grid(True, axis="x", alpha=0.3)
    return used


def _draw_rank(ax, spans: Sequence, rank: int, base: float, scale: float,
               chunk_parts: Sequence[dict[str, float]] | None) -> set[str]:
    """One rank's three rows from y = base (dp / optimizer) to base + 2 (compute)."""
    used: set[str] = set()
    top = base + len(ROWS) - 1 + 0.1
    gaps = bubbles(spans, rank)
    if gaps:
        ax.broken_barh([(a * scale, (b - a) * scale) for a, b in gaps], (top, 0.8),
                       facecolor=KIND_COLOURS["bubble"], edgecolor="#BBBBBB", hatch="//", lw=0.3)
        used.add("bubble")
    by_kind: dict[tuple[int, str], list[tuple[float, float]]] = {}
    overlay: list[tuple[float, float]] = []
    for s in spans:
        if s.rank != rank:
            continue
        by_kind.setdefault((_row(s), kind_of(s)), []).append(
            (s.start_s * scale, (s.end_s - s.start_s) * scale))
        c = chunk_of(s.name)
        if s.lane == "compute" and chunk_parts and c is not None and c < len(chunk_parts):
            share = in_layer_share(chunk_parts[c]) * (s.end_s - s.start_s)
            if share > 0:
                overlay.append(((s.end_s - share) * scale, share * scale))
    for (row, k), bars in by_kind.items():
        y, height = base + (len(ROWS) - 1 - row) + 0.1, 0.8
        if k in HALF_ROW:                  # sends above receives: they overlap in time
            y, height = y + HALF_ROW[k], 0.38
        ax.broken_barh(bars, (y, height), facecolor=KIND_COLOURS[k], lw=0)
        used.add(k)
    if overlay:
        ax.broken_barh(overlay, (top, 0.8), facecolor=KIND_COLOURS["in-layer comm"], lw=0)
        used.add("in-layer comm")
    return used


def add_legend(fig, used: set[str]) -> None:
    """One legend below the figure for the kinds of work drawn."""
    order = [k for k in ("forward", "backward", "backward-input", "backward-weight",
                         "in-layer comm", "send", "recv", "dp", "optimizer", "bubble") if k in used]
    names = {"in-layer comm": "TP/CP/ZeRO-3 collectives (in-layer)", "dp": "DP gradient reduction",
             "send": "PP send", "recv": "PP receive (waiting for input)", "bubble": "bubble (idle)",
             "backward-weight": "weight gradient", "backward-input": "backward (input)"}
    handles = [Patch(facecolor=KIND_COLOURS[k], edgecolor="#999999" if k == "bubble" else None,
                     hatch="//" if k == "bubble" else None, label=names.get(k, k)) for k in order]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(5, len(handles)),
                     fontsize=8, frameon=False)


def rank_table(spans: Sequence, ranks: Sequence[int], step_s: float) -> pd.DataFrame:
    """Per rank: seconds of each kind of work from the spans, idle compute and exposed reduction."""
    rows = []
    for rank in ranks:
        mine = [s for s in spans if s.rank == rank]
        compute_end = max((s.end_s for s in mine if s.lane == "compute"), default=0.0)
        row = {"rank": rank}
        for k in ("forward", "backward", "backward-input", "backward-weight"):
            row[f"{k}_s"] = sum(s.end_s - s.start_s for s in mine
                                if s.lane == "compute" and s.cat == k)
        row["bubble_s"] = sum(b - a for a, b in bubbles(spans, rank))
        row["send_s"] = sum(s.end_s - s.start_s for s in mine if s.lane == "send")
        row["recv_wait_s"] = sum(s.end_s - s.start_s for s in mine if s.lane == "recv")
        dp_end = max((s.end_s for s in mine if s.lane == "dp"), default=compute_end)
        row["exposed_dp_s"] = max(0.0, dp_end - compute_end)
        row["compute_end_s"] = compute_end
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.loc[:, (frame != 0).any(axis=0) | (frame.columns == "rank")]


def breakdown_table(result) -> pd.DataFrame:
    total = result.step_time_s or 1.0
    return pd.DataFrame([{"part": k, "seconds": v, "percent": 100 * v / total}
                         for k, v in result.breakdown_s.items()])


def fill_window_s(spans: Sequence, ranks: Sequence[int]) -> float:
    """Where the pipeline's fill ends: 1.5 x the latest first-backward end over the ranks."""
    firsts = [min((s.end_s for s in spans if s.rank == r and s.lane == "compute"
                   and s.cat.startswith("backward")), default=0.0) for r in ranks]
    return 1.5 * max(firsts, default=0.0)


def _gantt_figure(spans, ranks, end: float, title: str, chunk_parts, start: float = 0.0) -> bytes:
    fig = new_figure(11.0, max(3.2, 0.34 * 4 * len(ranks) + 1.8))
    ax = fig.add_subplot()
    add_legend(fig, gantt(ax, spans, ranks=ranks, end_s=end, start_s=start,
                          chunk_parts=chunk_parts))
    ax.set_title(title)
    return png_bytes(fig)


def timeline_report(scenario, result, *, stages: Sequence[int] | None = None) -> Report:
    """The step's Gantt chart for `stages` (default every pipeline stage), and a close-up of the
    pipeline's fill when the whole step is too long to read it."""
    spans = list(result.spans)
    ranks = chosen_ranks(spans, stages)
    end = max((s.end_s for s in spans), default=result.step_time_s)
    p = scenario.parallel
    name = scenario.name or scenario.origin
    parts = result.details.get("chunk_parts_s")
    figures = [FigureItem(name="timeline", title="Simulated step per rank", png=_gantt_figure(
        spans, ranks, end, f"{name}: one simulated step, {p.schedule}, {p.pipeline} stage(s), "
        f"{result.details.get('microbatches', '?')} micro-batches", parts))]
    fill = fill_window_s(spans, ranks)
    if 0 < fill < 0.4 * end:
        figures.append(FigureItem(name="timeline_fill", title="The pipeline's fill, close up",
                                  png=_gantt_figure(spans, ranks, fill,
                                                    f"{name}: the first {fill:.3g} s (pipeline fill)",
                                                    parts)))
    fmt = {c: ".4f" for c in ("forward_s", "backward_s", "backward-input_s", "backward-weight_s",
                              "bubble_s", "send_s", "recv_wait_s", "exposed_dp_s", "compute_end_s")}
    return Report(kind="timeline", title=f"Timeline: {name}",
                  subtitle=f"{result.gpus} GPUs on {result.details.get('nodes', 1)} x "
                           f"{result.system}, TP {p.tensor} x PP {p.pipeline} x CP {p.context} x "
                           f"DP {p.data}",
                  sections=(Section(heading="The simulated step", text=summary_text(result),
                                    figures=tuple(figures)),
                            Section(heading="Where the time goes", tables=(
                                TableItem(name="breakdown", title="Critical rank (as simulate prints)",
                                          frame=breakdown_table(result),
                                          formats={"seconds": ".4f", "percent": ".1f"}),
                                TableItem(name="ranks", title="Per rank, from the spans",
                                          frame=rank_table(spans, ranks, result.step_time_s),
                                          formats=fmt)))))


def chosen_ranks(spans: Sequence, stages: Sequence[int] | None) -> list[int]:
    ranks = sorted({s.rank for s in spans})
    if stages is None:
        return ranks
    missing = [r for r in stages if r not in ranks]
    if missing:
        raise PartitaError(f"--stages {','.join(map(str, missing))}: the plan has pipeline "
                           f"stages 0-{len(ranks) - 1}")
    return sorted(set(stages))


def summary_text(result) -> tuple[str, str]:
    """The bubble and the exposed communication, named, in simulate's digits."""
    b = result.breakdown_s
    exposed = sum(b.get(k, 0.0) for k in ("pp_comm", "dp_comm"))
    return (f"Step {result.step_time_s:.4f} s on {result.gpus} GPUs ({result.system}). "
            f"Bubble (critical rank): {b.get('bubble', 0.0):.4f} s, "
            f"{100 * result.bubble_fraction:.1f}% of the pipeline. Exposed communication: "
            f"pipeline {b.get('pp_comm', 0.0):.4f} s, data-parallel {b.get('dp_comm', 0.0):.4f} s "
            f"({exposed:.4f} s together); in-layer TP/CP/ZeRO-3 collectives "
            f"{sum(b.get(k, 0.0) for k in IN_LAYER_PARTS):.4f} s.",
            f"The step's synchronisations ({sum(b.get(k, 0.0) for k in STEP_SYNC_PARTS):.4f} s: "
            "tied-embedding gradients, gradient norm, loss) and the optimizer "
            f"({b.get('optimizer', 0.0):.4f} s) follow the last reduction; the chart ends at the "
            "optimizer. Open the same step in Perfetto with `partita simulate FILE --trace "
            "OUT.json`.")
