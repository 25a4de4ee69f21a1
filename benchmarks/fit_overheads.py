"""Fit the numbers of data/calibration/fitted.yaml on the FIT rows of data/validation/split.yaml.

    python benchmarks/fit_overheads.py            # fit, print the values and the fit / hold-out errors
    python benchmarks/fit_overheads.py --write    # ... and store them in fitted.yaml

The objective, the optimiser and the parameters are `partita.fitting.step_time` (the same code the
leave-one-source-out check, `partita validate --cross-validate`, runs once per left-out source).
Everything else the simulator reads is measured or published (training.yaml, host.yaml,
compute.yaml, network.yaml) and is not touched here.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from partita.planner.catalog import load_catalog  # noqa: E402
from partita.validation.crossval import dev_rows  # noqa: E402
from partita.fitting.step_time import Predictor, fit, write_fitted  # noqa: E402
from partita.validation.runner import load_split, summarize  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="store the fitted values in fitted.yaml")
    args = ap.parse_args()
    catalog = load_catalog()
    split = load_split()
    rows = dev_rows()
    fit_rows = [m for m in rows if m.row_id in split.fit]
    pred = Predictor(catalog)
    t0 = time.time()
    result = fit(fit_rows, catalog, predictor=pred)
    print(f"fitted {len(result.values)} numbers in {time.time() - t0:.0f} s ({result.evaluations} "
          f"evaluations over {len(fit_rows)} fit rows), loss {result.loss:.5f}")
    for name, value in result.values.items():
        print(f"  {name:40s} {value:.3f}")
    errs = pred.errors(rows, result.overheads)
    for group in ("fit", "holdout"):
        s = summarize([e for rid, e in errs.items() if (rid in split.fit) == (group == "fit")])
        if not s.count:
            continue
        print(f"  {group:8s} rows {s.count:3d}  median {s.median_pct:5.1f}%  p90 {s.p90_pct:5.1f}%"
              f"  max {s.max_pct:5.1f}%  bias {s.bias_pct:+5.1f}%")
    if args.write:
        path = write_fitted(result)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
