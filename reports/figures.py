"""Figure helpers shared by every report: an Agg figure, PNG bytes, and one colour per kind of work.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas directly (no pyplot, no global
state, no display needed). Every report figure gets a title, axis labels with units and a legend;
`check_figure` refuses one that lacks them, so a report cannot ship an unlabelled plot.
"""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

# One colour per kind of work, the same in every figure (timeline, run, memory).
KIND_COLOURS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "backward-input": "#DD8452",
    "backward-weight": "#C44E52",
    "recompute": "#937860",
    "in-layer comm": "#8172B3",          # TP / CP / ZeRO-3 collectives inside a block
    "send": "#2E8B57",                   # pipeline send (the transfer)
    "recv": "#A8D5A2",                   # pipeline receive: the rank waits for its input
    "dp": "#DA8BC3",
    "optimizer": "#8C8C8C",
    "bubble": "#F2F2F2",
}
MEMORY_COLOURS = {
    "parameters": "#4C72B0", "gradients": "#DD8452", "optimizer": "#55A868",
    "activations": "#C44E52", "buffers": "#8172B3", "reserve": "#BDBDBD",
}
SERIES = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def new_figure(width_in: float = 8.0, height_in: float = 4.5) -> Figure:
    fig = Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def check_figure(fig: Figure) -> None:
    """Every axes has a title (or the figure a suptitle), both axis labels and a legend."""
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    has_legend = bool(fig.legends) or any(ax.get_legend() is not None for ax in fig.axes)
    for ax in fig.axes:
        if not (ax.get_title() or suptitle):
            raise ValueError("figure axes without a title")
        if not ax.get_xlabel() or not ax.get_ylabel():
            raise ValueError(f"figure {ax.get_title()!r}: an axis has no label")
    if not has_legend:
        raise ValueError(f"figure {suptitle or fig.axes[0].get_title()!r} has no legend")


def png_bytes(fig: Figure) -> bytes:
    check_figure(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def human_seconds(seconds: float) -> str:
    """'1.23 s', '45.6 ms', '789 us' for tick labels and captions."""
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def time_unit(span_s: float) -> tuple[float, str]:
    """(scale, unit) so that a time axis of length span_s reads in s, ms or us."""
    if span_s >= 2.0:
        return 1.0, "s"
    if span_s >= 2e-3:
        return 1e3, "ms"
    return 1e6, "us"
