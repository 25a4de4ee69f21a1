"""Figure of the leave-one-source-out predictions: measured against predicted step time per row,
coloured by source, from data/validation/crossval.json (`partita validate --cross-validate --write`).

    python benchmarks/plot_crossval.py [OUT.png]      # default: crossval.png here

Prints the summary it plots (the README's line) and where the figure went.
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from partita.commands.validate import loso_line  # noqa: E402
from partita.validation.crossval import load_residuals  # noqa: E402
from partita.validation.runner import summarize  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("crossval.png")
    rows = load_residuals()["rows"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.5))
    sources = sorted({r["source_key"] for r in rows})
    cmap = plt.get_cmap("tab10")
    for i, s in enumerate(sources):
        mine = [r for r in rows if r["source_key"] == s]
        style = {"s": 22, "color": cmap(i % 10), "marker": "o^sD"[i // 10 % 4]}   # >10 sources: new marker
        ax.scatter([r["measured_step_s"] for r in mine], [r["predicted_step_s"] for r in mine],
                   label=s, **style)
        bx.scatter([i] * len(mine), [r["error_pct"] for r in mine], **style)
    lo = min(min(r["measured_step_s"], r["predicted_step_s"]) for r in rows) * 0.8
    hi = max(max(r["measured_step_s"], r["predicted_step_s"]) for r in rows) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    for f in (0.9, 1.1):
        ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.8, ls="--")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="measured step time (s)", ylabel="predicted, source left out of the fit (s)",
           title="Leave-one-source-out predictions (dashed: +-10%)")
    ax.legend(fontsize=8, loc="upper left")
    bx.axhline(0, color="black", lw=1)
    for f in (-10, 10):
        bx.axhline(f, color="grey", lw=0.8, ls="--")
    bx.set_xticks(range(len(sources)), sources, rotation=45)
    bx.set(ylabel="error: predicted / measured - 1 (%)", title="Error per row, by left-out source")
    line = loso_line(summarize(r["error_pct"] / 100.0 for r in rows))
    fig.suptitle(line, fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(line)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
