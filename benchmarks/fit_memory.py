"""Fit the memory reserve (data/calibration/fitted_memory.yaml) on the FIT rows of the memory runs only.

    python benchmarks/fit_memory.py            # fit, print fit and hold-out errors
    python benchmarks/fit_memory.py --write    # ... and write fitted_memory.yaml

The model, the objective and the file's contents are `partita.fitting.memory`; the rows are
data/validation/published_memory.csv, split by data/validation/split_memory.yaml
(`partita.validation`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from partita.fitting import memory  # noqa: E402
from partita.fitting.writer import write_fitted_file  # noqa: E402
from partita.planner.catalog import load_catalog  # noqa: E402
from partita.simulator.calibration import load_calibration  # noqa: E402
from partita.validation.rowmap import MappedRow, map_row, read_rows  # noqa: E402
from partita.validation.rowrules import load_rules  # noqa: E402
from partita.validation.runner import MEMORY_CSV, MEMORY_SPLIT, load_split, summarize  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {memory.FITTED_FILE.name}")
    args = ap.parse_args()
    cal = load_calibration(include_local=False)
    rules = load_rules()
    mapped = [m for m in (map_row(r, rules) for r in read_rows(MEMORY_CSV))
              if isinstance(m, MappedRow)]
    rows = memory.memory_rows(mapped, load_catalog(), cal)
    fixed = memory.fixed_gib(cal)
    fit_ids = load_split(MEMORY_SPLIT).fit
    result = memory.fit_memory([r for r in rows if r.row_id in fit_ids], fixed)
    frag, buffers = result.fragmentation_fraction, result.framework_buffers_gib
    print(f"fitted on {len(result.rows)} rows: fragmentation_fraction {frag:.3f}, "
          f"framework_buffers_gib {memory.FITTED_FRAMEWORK} {buffers:.2f}")
    for group in ("fit", "holdout"):
        selected = [r for r in rows if (r.row_id in fit_ids) == (group == "fit")]
        s = summarize([memory.predict(r, frag, buffers, fixed) / r.measured_gib - 1 for r in selected])
        print(f"  {group:8s} rows {s.count:3d}  median {s.median_pct:5.1f}%  p90 {s.p90_pct:5.1f}%  "
              f"max {s.max_pct:5.1f}%  bias {s.bias_pct:+5.1f}%")
    if args.write:
        print(f"wrote {write_fitted_file(memory.FITTED_FILE, memory.fitted_file(result))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
