"""Fit the memory reserve of data/calibration/memory.yaml on the FIT rows of the memory runs only.

    python benchmarks/fit_memory.py            # fit, print fit and hold-out errors
    python benchmarks/fit_memory.py --write    # ... and store the values in memory.yaml

The measured peaks (data/validation/published_memory.csv, `peak_memory_GiB`) are what nvidia-smi
shows: the tensors the simulator counts (`MemoryEstimate.allocated_bytes`), plus the CUDA context
and communication buffers (kept at their sourced values), plus what the PyTorch caching allocator
holds beyond the live tensors and the buffers a framework allocates for itself. Those last two are
fitted, on the rows data/validation/split_memory.yaml names and no others:
    peak = allocated * (1 + fragmentation_fraction) + context + communication
           + framework_buffers_gib[framework]
Every fit row is a DeepSpeed run (BLOOM's topology search), so only DeepSpeed's buffers are fitted;
other frameworks keep none. Objective: least squares of log(predicted / measured).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from partita.planner.catalog import load_catalog  # noqa: E402
from partita.planner.paths import CALIBRATION_DIR  # noqa: E402
from partita.simulator.calibration import load_calibration  # noqa: E402
from partita.validation.rowmap import MappedRow, load_rules, map_row, read_rows  # noqa: E402
from partita.simulator.step import simulate  # noqa: E402
from partita.validation.runner import MEMORY_CSV, MEMORY_SPLIT, load_split, summarize  # noqa: E402

MEMORY_FILE = CALIBRATION_DIR / "memory.yaml"
GIB = 2.0 ** 30
FITTED_FRAMEWORK = "deepspeed"


@dataclasses.dataclass(frozen=True)
class Row:
    row_id: str
    framework: str
    allocated_gib: float       # what the simulator's tensors add up to at the peak rank
    measured_gib: float


def rows_with_memory(csv: Path = MEMORY_CSV) -> list[Row]:
    """Every mapped row with a measured peak, simulated once without any reserve."""
    catalog, rules = load_catalog(), load_rules()
    cal = load_calibration(include_local=False)
    bare = dataclasses.replace(cal, memory=dataclasses.replace(
        cal.memory, cuda_context_bytes=0.0, communication_buffers_bytes=0.0,
        fragmentation_fraction=0.0, framework_buffers_bytes={}))
    out = []
    for raw in read_rows(csv):
        m = map_row(raw, rules)
        if not isinstance(m, MappedRow) or m.measured_peak_memory_gib is None:
            continue
        r = simulate(m.scenario, catalog, calibration=bare)
        out.append(Row(m.row_id, m.scenario.training.framework, r.peak_memory_bytes / GIB,
                       m.measured_peak_memory_gib))
    return out


def predict(row: Row, fragmentation: float, buffers_gib: float, fixed_gib: float) -> float:
    own = buffers_gib if row.framework == FITTED_FRAMEWORK else 0.0
    return row.allocated_gib * (1.0 + fragmentation) + fixed_gib + own


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="store the fitted values in memory.yaml")
    args = ap.parse_args()
    cal = load_calibration(include_local=False).memory
    fixed = (cal.cuda_context_bytes + cal.communication_buffers_bytes) / GIB
    rows = rows_with_memory()
    fit_ids = load_split(MEMORY_SPLIT).fit
    fit = [r for r in rows if r.row_id in fit_ids]

    def residuals(x):
        return np.array([math.log(predict(r, x[0], x[1], fixed) / r.measured_gib) for r in fit])

    res = least_squares(residuals, np.array([0.05, 0.0]), bounds=([0.0, 0.0], [1.0, 40.0]))
    frag, buffers = float(res.x[0]), float(res.x[1])
    print(f"fitted on {len(fit)} rows: fragmentation_fraction {frag:.3f}, "
          f"framework_buffers_gib {FITTED_FRAMEWORK} {buffers:.2f}")
    for group, selected in (("fit", fit), ("holdout", [r for r in rows if r.row_id not in fit_ids])):
        s = summarize([predict(r, frag, buffers, fixed) / r.measured_gib - 1 for r in selected])
        print(f"  {group:8s} rows {s.count:3d}  median {s.median_pct:5.1f}%  p90 {s.p90_pct:5.1f}%  "
              f"max {s.max_pct:5.1f}%  bias {s.bias_pct:+5.1f}%")
    if args.write:
        text = MEMORY_FILE.read_text()
        text = re.sub(r"^fragmentation_fraction: [0-9.]+", f"fragmentation_fraction: {frag:.3f}",
                      text, flags=re.M)
        text = re.sub(rf"^  {FITTED_FRAMEWORK}: [0-9.]+", f"  {FITTED_FRAMEWORK}: {buffers:.2f}",
                      text, flags=re.M)
        MEMORY_FILE.write_text(text)
        print(f"wrote {MEMORY_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
