"""Which sources identify each fitted number, and do they agree? Printed, not asserted.

    python benchmarks/identification.py

The fitted numbers (data/calibration/fitted.yaml: a sustained matmul fraction per GPU family) are
fitted on every usable dev row at once (`benchmarks/fit_overheads.py`). A number that only one
source's rows inform cannot be checked by leave-one-source-out: with that source left out, nothing
sets it and its fold keeps the optimiser's start (1.0, the bound). Numbers informed by several
sources can disagree, and the fit then settles between them, leaving each source's rows off by the
disagreement whatever else is modelled.

For each fitted number this prints the sources whose rows depend on it, and the value each of them
implies alone: the same optimiser and objective (`partita.fitting.step_time.fit`) on that source's
rows only (the numbers those rows inform are fitted together; the numbers they do not inform do not
matter to them). It prints the spread of the implied values (largest over smallest) and flags
numbers one source identifies alone.

Where a fraction's mechanism was measured on the device (a back-to-back 8192^3 bf16 matmul held for
20 s at the board's power cap, `benchmarks/bench_gpu_kernels.py`, `first.sustained` of
data/validation/gpu/h200_kernels.json), it prints that rate against the curve's plateau beside the
fitted number: what the fit holds beyond the power cap is work the model does not price. The README
quotes the result ("How good the predictions are").
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from partita.fitting.step_time import (  # noqa: E402
    SUSTAINED, Predictor, fit, fitted_families, overheads_from, params,
)
from partita.planner.catalog import load_catalog  # noqa: E402
from partita.planner.paths import VALIDATION_DIR  # noqa: E402
from partita.simulator.calibration import load_calibration  # noqa: E402
from partita.simulator.overheads import load_overheads  # noqa: E402
from partita.validation.crossval import dev_rows  # noqa: E402
from partita.validation.runner import load_split  # noqa: E402

# Device runs with a sustained-matmul record, and the catalog GPU each ran on.
SUSTAINED_RUNS = ((VALIDATION_DIR / "gpu" / "h200_kernels.json", "h200-141gb"),)
WARM_S = 0.1        # the first samples run at boost clock, before the power cap bites


def measured_sustained(path: Path, gpu_name: str, catalog) -> tuple[float, float, float]:
    """(median sustained TFLOP/s after the first WARM_S, the catalog's bf16 plateau in TFLOP/s,
    their ratio) of one device run's back-to-back matmul."""
    samples = json.loads(path.read_text())["first"]["sustained"]
    rate = statistics.median(x["tflops"] for x in samples if x["t_s"] > WARM_S)
    gpu = catalog.gpu(gpu_name)
    g = load_calibration().gpu(gpu_name)
    plateau = g.matmul_efficiency("bf16", 1.0, gpu.peak_is_measured("bf16")) * gpu.peak("bf16")
    plateau /= 1e12
    return rate, plateau, rate / plateau


def informs(m, family: str | None) -> set[str]:
    """The fitted numbers row `m` (on a GPU of `family`) depends on: its family's sustained
    fraction."""
    return {f"{SUSTAINED}.{family}"} if family else set()


def main() -> int:
    catalog = load_catalog()
    split = load_split()
    rows = [m for m in dev_rows() if m.row_id in split.fit]
    pred = Predictor(catalog)
    full = fit(rows, catalog, predictor=pred)
    families = full.families
    names = [p.name for p in params(families)]
    # A family fitted as another's copy (same chip) is informed through that family's number.
    alias = {f"{SUSTAINED}.{f}": f"{SUSTAINED}.{of}" for f, of in families.copies.items()}
    by_number: dict[str, dict[str, list]] = {n: {} for n in names}
    for m in rows:
        for n in informs(m, pred.gpu_family(m)):
            n = alias.get(n, n)
            if n in by_number:
                by_number[n].setdefault(m.source_key, []).append(m)
    base = load_overheads()
    print(f"{len(rows)} fit rows; full fit: "
          + ", ".join(f"{n.split('.', 1)[1]} {full.values[n]:.3f}" for n in names))
    print()
    print(f"{'number':42s} {'source':9s} {'rows':>4s} {'alone':>7s} {'full':>7s}")
    for n in names:
        sources = by_number[n]
        implied = {}
        for source, source_rows in sorted(sources.items()):
            # Fit on this source alone and read this number (the others its rows inform are
            # fitted with it; those they do not inform leave its rows unchanged).
            alone = fit(source_rows, catalog, predictor=pred,
                        base=overheads_from(full.values, families, base))
            implied[source] = alone.values[n]
            print(f"{n:42s} {source:9s} {len(source_rows):4d} {alone.values[n]:7.3f} "
                  f"{full.values[n]:7.3f}")
        if not implied:
            print(f"{n:42s} (no row depends on it)")
        elif len(implied) == 1:
            print(f"{'':42s} identified by one source only: leaving it out leaves the number "
                  f"unset (the optimiser's start, 1.0)")
        else:
            lo, hi = min(implied.values()), max(implied.values())
            print(f"{'':42s} {len(implied)} sources, implied {lo:.3f}-{hi:.3f} "
                  f"(largest / smallest {hi / lo:.2f})")
        print()
    for path, gpu_name in SUSTAINED_RUNS:
        rate, plateau, ratio = measured_sustained(path, gpu_name, catalog)
        family = catalog.gpu(gpu_name).family
        n = alias.get(f"{SUSTAINED}.{family}", f"{SUSTAINED}.{family}")
        print(f"measured ({path.name}, {gpu_name}): a bf16 8192^3 matmul held back to back runs "
              f"{rate:.1f} TFLOP/s at the power cap (median after {WARM_S} s), {ratio:.3f} of the "
              f"curve's plateau ({plateau:.1f}); fitted {n.split('.', 1)[1]} {full.values[n]:.3f}")
    return 0


if __name__ == "__main__":
    # No options: --help prints what the script prints; anything else is a usage error.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
