"""Figure of the leave-one-source-out predictions: measured against predicted step time per row,
coloured by source, from data/validation/crossval.json (`partita validate --cross-validate --write`).

    python benchmarks/plot_crossval.py [OUT.png]      # default: crossval.png here

Prints the summary it plots (the README's line) and where the figure went.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from partita.commands.validate import loso_line
from partita.reports.validation import loso_figure
from partita.validation.crossval import load_residuals
from partita.validation.runner import summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Figure of the leave-one-source-out predictions.")
    parser.add_argument("out", nargs="?", default="crossval.png", type=Path,
                        help="where the PNG goes (default: crossval.png here)")
    out = parser.parse_args(argv).out
    rows = load_residuals()["rows"]
    out.write_bytes(loso_figure(rows))       # the figure `partita report validate` shows
    print(loso_line(summarize(r["error_pct"] / 100.0 for r in rows)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
