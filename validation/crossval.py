"""Leave-one-source-out cross-validation of the fitted framework numbers.

For every source (`source_key`) of the dev CSV with a simulable row, `cross_validate()` refits
`fitting.step_time.params` on the split's fit rows of the *other* sources, with the same objective
and optimiser as `benchmarks/fit_overheads.py`, and predicts every row of the left-out source with
that fit. Each row's error is so measured by a fit that never saw its source: the figure that says
how the simulator does on a source it has not seen. A source without fit rows is predicted by the
fit on all fit rows (which did not see it either).

The residuals are stored (data/validation/crossval.json, `write_residuals`) with the model inputs
they belong to; `simulator.interval` reads them for the prediction intervals, and the README's
figures are checked against them.
"""
from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partita.planner.paths import CALIBRATION_DIR, DATA_DIR, VALIDATION_DIR
from partita.fitting.step_time import FitResult, Predictor, fit
from partita.simulator.interval import RESIDUALS_FILE, scenario_regime
from partita.validation.rowmap import MappedRow, map_row, read_rows
from partita.validation.rowrules import load_rules
from partita.validation.runner import Split, Summary, load_split, summarize

# The files whose content the stored residuals depend on (model code aside): if one changes, the
# residuals are stale and `partita validate --cross-validate --write` must be run again.
INPUT_FILES = (VALIDATION_DIR / "published_dev.csv", VALIDATION_DIR / "split.yaml",
               VALIDATION_DIR / "rowmap.yaml", CALIBRATION_DIR / "training.yaml",
               CALIBRATION_DIR / "host.yaml", CALIBRATION_DIR / "compute.yaml",
               CALIBRATION_DIR / "network.yaml", CALIBRATION_DIR / "eager_kernels.yaml",
               DATA_DIR / "frameworks.yaml")


@dataclass(frozen=True)
class Residual:
    row_id: str
    source_key: str
    regime: str                      # see `regime`
    measured_step_s: float
    predicted_step_s: float

    @property
    def error(self) -> float:
        return self.predicted_step_s / self.measured_step_s - 1.0


@dataclass(frozen=True)
class CrossValidation:
    residuals: tuple[Residual, ...]
    folds: dict[str, dict[str, float]]      # left-out source -> its fit's values
    full: FitResult                          # the fit on every fit row (the shipped procedure)

    def summary(self, source: str | None = None) -> Summary:
        return summarize([r.error for r in self.residuals if source in (None, r.source_key)])

    def sources(self) -> list[str]:
        return sorted({r.source_key for r in self.residuals})

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary().to_json(),
                "sources": {s: self.summary(s).to_json() for s in self.sources()},
                "rows": [{"id": r.row_id, "source_key": r.source_key, "regime": r.regime,
                          "measured_step_s": r.measured_step_s,
                          "predicted_step_s": r.predicted_step_s,
                          "error_pct": 100.0 * r.error} for r in self.residuals],
                "folds": self.folds, "full_fit": self.full.values,
                "inputs_sha256": inputs_digest()}


def regime(m: MappedRow) -> str:
    """The class of run an interval is drawn from: the training framework, and whether the run
    spans one node or several (the host-bound and network-bound ends of the data)."""
    gpn = int(m.document.get("cluster", {}).get("gpus_per_node") or 8)
    return scenario_regime(m.scenario.training.framework, m.gpus, gpn)


def dev_rows(csv: str | Path | None = None) -> list[MappedRow]:
    rules = load_rules()
    mapped = [map_row(r, rules, origin=str(csv or "")) for r in read_rows(csv)]
    return [m for m in mapped if isinstance(m, MappedRow)]


def cross_validate(catalog, *, split: Split | None = None, csv: str | Path | None = None,
                   progress: Callable[[str], None] | None = None) -> CrossValidation:
    split = split if split is not None else load_split()
    rows = dev_rows(csv)
    pred = Predictor(catalog)
    fit_rows = [m for m in rows if m.row_id in split.fit]
    say = progress or (lambda text: None)
    say(f"fit on all {len(fit_rows)} fit rows")
    full = fit(fit_rows, catalog, predictor=pred)
    residuals, folds = [], {}
    for source in sorted({m.source_key for m in rows}):
        train = [m for m in fit_rows if m.source_key != source]
        if len(train) == len(fit_rows):
            result = full
        else:
            say(f"leave out {source}: fit on {len(train)} rows")
            result = fit(train, catalog, predictor=pred)
        folds[source] = result.values
        for m in rows:
            if m.source_key != source:
                continue
            step = pred.step_s(m, result.overheads)
            if step is not None:
                residuals.append(Residual(m.row_id, source, regime(m), m.measured_step_s, step))
    return CrossValidation(tuple(residuals), folds, full)


def inputs_digest() -> str:
    h = hashlib.sha256()
    for path in INPUT_FILES:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def write_residuals(cv: CrossValidation, path: Path = RESIDUALS_FILE, *,
                    effects: dict[str, Any] | None = None) -> None:
    """crossval.json: the residuals, the folds and, where given, the summary of the effects of one
    change by the same predictions (`validation.effects`; `simulator.interval.ratio_tolerance`)."""
    doc = {"_what": "leave-one-source-out residuals of the step time (validation.crossval); "
                    "written by `partita validate --cross-validate --write`",
           "_objective": "per fold: mean pseudo-Huber (delta 0.1) of log(predicted/measured) over "
                         "the split's fit rows of the other sources (fitting.step_time)"}
    doc |= cv.to_json()
    if effects is not None:
        doc["effects"] = effects
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def load_residuals(path: Path = RESIDUALS_FILE) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def stderr_progress(text: str) -> None:
    print(f"  cross-validate: {text}", file=sys.stderr, flush=True)
