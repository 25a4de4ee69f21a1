"""Which sources identify each fitted number, and do they agree? Printed, not asserted.

    python benchmarks/identification.py

The four fitted numbers (data/calibration/fitted.yaml: a sustained matmul fraction per GPU family
and DeepSpeed's ZeRO-3 collective fraction) are fitted on every usable dev row at once
(`benchmarks/fit_overheads.py`). A number that only one source's rows inform cannot be checked by
leave-one-source-out: with that source left out, nothing sets it and its fold keeps the optimiser's
start (1.0, the bound). Numbers informed by several sources can disagree, and the fit then settles
between them, leaving each source's rows off by the disagreement whatever else is modelled.

For each fitted number this prints the sources whose rows depend on it, and the value each of them
implies alone: the same optimiser and objective (`partita.fitting.step_time.fit`) on that source's
rows only (the numbers those rows inform are fitted together, e.g. NAR21's A100 fraction with its
ZeRO-3 fraction; the numbers they do not inform do not matter to them). It prints the spread of the
implied values (largest over smallest) and flags numbers one source identifies alone. The README
quotes the result ("How good the predictions are").
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from partita.fitting.step_time import (  # noqa: E402
    SUSTAINED, Predictor, fit, fitted_families, overheads_from, params,
)
from partita.planner.catalog import load_catalog  # noqa: E402
from partita.simulator.overheads import load_overheads  # noqa: E402
from partita.validation.crossval import dev_rows  # noqa: E402
from partita.validation.runner import load_split  # noqa: E402

ZERO3 = "zero3_collective_fraction.deepspeed"


def informs(m, family: str | None) -> set[str]:
    """The fitted numbers row `m` (on a GPU of `family`) depends on: its family's sustained
    fraction, and DeepSpeed's ZeRO-3 fraction where it runs ZeRO-3 under DeepSpeed."""
    out = {f"{SUSTAINED}.{family}"} if family else set()
    if m.scenario.parallel.zero >= 3 and m.scenario.training.framework == "deepspeed":
        out.add(ZERO3)
    return out


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
