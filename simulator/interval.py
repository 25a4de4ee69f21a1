"""Prediction intervals for the step time, from the leave-one-source-out residuals of its regime.

`step_time_interval(prediction_s, scenario_regime)` reads data/validation/crossval.json (written
by `partita validate --cross-validate --write`): every dev row's error predicted / measured - 1
under a fit that never saw the row's source. The interval is where the measured step would lie
if the prediction errs as the central 90% of those errors did (5th and 95th percentiles, linear
interpolation): [prediction / (1 + e95), prediction / (1 + e5)]. The errors are those of the
prediction's regime (`validation.crossval.regime`: framework, one node or several) when it holds at
least MIN_ROWS rows, else of all rows (`pooled`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from partita.planner.errors import PartitaError
from partita.planner.paths import VALIDATION_DIR

RESIDUALS_FILE = VALIDATION_DIR / "crossval.json"     # validation.crossval writes it

MIN_ROWS = 8
COVERAGE = (5.0, 95.0)


@dataclass(frozen=True)
class Interval:
    low_s: float
    high_s: float
    regime: str            # the regime whose residuals gave it, or "pooled"
    rows: int              # how many residuals


@lru_cache(maxsize=2)
def _errors(path: str, mtime: int) -> dict[str, list[float]]:
    try:
        doc = json.loads(Path(path).read_text())
        rows = doc["rows"]
        by: dict[str, list[float]] = {"pooled": []}
        for r in rows:
            e = float(r["error_pct"]) / 100.0
            by.setdefault(str(r["regime"]), []).append(e)
            by["pooled"].append(e)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PartitaError(f"{path}: not a cross-validation residuals file ({exc}); rewrite it with "
                           "`partita validate --cross-validate --write`") from exc
    return by


def residuals(path: Path = RESIDUALS_FILE) -> dict[str, list[float]] | None:
    """Errors by regime, or None where no residuals file has been written."""
    if not path.exists():
        return None
    return _errors(str(path), path.stat().st_mtime_ns)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def step_time_interval(prediction_s: float, regime: str,
                       path: Path = RESIDUALS_FILE) -> Interval | None:
    by = residuals(path)
    if by is None:
        return None
    name = regime if len(by.get(regime, ())) >= MIN_ROWS else "pooled"
    errs = by[name]
    if not errs:
        return None
    lo, hi = (percentile(errs, q) for q in COVERAGE)
    return Interval(prediction_s / (1.0 + hi), prediction_s / (1.0 + lo), name, len(errs))


def scenario_regime(framework: str, gpus: int, gpus_per_node: int) -> str:
    """The regime name of `validation.crossval.regime` for a scenario being simulated."""
    return f"{framework}/{'one-node' if gpus <= gpus_per_node else 'multi-node'}"
