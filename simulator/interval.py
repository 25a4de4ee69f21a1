"""Prediction intervals for the step time: split-conformal over the leave-one-source-out residuals.

`step_time_interval(prediction_s)` reads data/validation/crossval.json (written by `partita
validate --cross-validate --write`): every dev row's error e = predicted / measured - 1 under a fit
that never saw the row's source. With the n errors sorted, e_(1) <= ... <= e_(n), the 90% interval
takes the split-conformal ranks (Lei et al. 2018, "Distribution-free predictive inference for
regression", JASA 113(523), Sec. 2.2; one rank at each end):

    k_lo = floor((n + 1) alpha / 2),  k_hi = ceil((n + 1)(1 - alpha / 2)),  alpha = 0.10
    [prediction / (1 + e_(k_hi)),  prediction / (1 + e_(k_lo))]

so that a run from a source the fit has not seen falls inside with probability 1 - alpha when the
sources err alike (exchangeable). The errors are pooled over every source: intervals drawn from the
errors of the prediction's regime alone (framework, one node or several), the method this one
replaced, held 79 of the 108 dev rows when each row's own source was left out of the residuals
too, these 97 (`nested_coverage`, printed by `partita validate --cross-validate`): a regime's
errors come from a few sources, and a new source does not err as those few did.

`ratio_tolerance()` is the same file's word on comparisons: the p90 error of the predicted ratio of
two measured runs of one source that differ in one kind of setting (`validation.effects`, stored
beside the residuals by `--write`). An error the two runs share cancels in a ratio, so it is far
smaller than the interval; a planner's candidates closer than it may measure in either order.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from partita.planner.errors import PartitaError
from partita.planner.paths import VALIDATION_DIR

RESIDUALS_FILE = VALIDATION_DIR / "crossval.json"     # validation.crossval writes it

ALPHA = 0.10            # 90% intervals


@dataclass(frozen=True)
class Interval:
    low_s: float
    high_s: float
    rows: int              # the cross-validated errors it was drawn from


@lru_cache(maxsize=2)
def _read(path: str, mtime: int) -> tuple[tuple[float, ...], RatioTolerance | None]:
    """The file's errors and its ratio tolerance, read once per version of the file."""
    try:
        doc = json.loads(Path(path).read_text())
        errors = tuple(float(r["error_pct"]) / 100.0 for r in doc["rows"])
        every = doc.get("effects", {}).get("by_kind", {}).get("all")
        tolerance = (RatioTolerance(float(every["p90_pct"]) / 100.0, int(every["pairs"]))
                     if every is not None and every.get("pairs") else None)
        return errors, tolerance
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PartitaError(f"{path}: not a cross-validation residuals file ({exc}); rewrite it with "
                           "`partita validate --cross-validate --write`") from exc


def residuals(path: Path = RESIDUALS_FILE) -> tuple[float, ...] | None:
    """The cross-validated errors, or None where no residuals file has been written."""
    if not path.exists():
        return None
    return _read(str(path), path.stat().st_mtime_ns)[0]


def conformal_bounds(errors: Sequence[float], alpha: float = ALPHA) -> tuple[float, float] | None:
    """(e_(k_lo), e_(k_hi)) of the module docstring; None for fewer than two errors."""
    ordered = sorted(errors)
    n = len(ordered)
    if n < 2:
        return None
    k_lo = max(1, math.floor((n + 1) * alpha / 2))
    k_hi = min(n, math.ceil((n + 1) * (1 - alpha / 2)))
    return ordered[k_lo - 1], ordered[k_hi - 1]


def step_time_interval(prediction_s: float, path: Path = RESIDUALS_FILE) -> Interval | None:
    errs = residuals(path)
    bounds = conformal_bounds(errs) if errs is not None else None
    if bounds is None:
        return None
    lo, hi = bounds
    return Interval(prediction_s / (1.0 + hi), prediction_s / (1.0 + lo), len(errs))


@dataclass(frozen=True)
class RatioTolerance:
    p90: float             # of |predicted ratio / measured ratio - 1|, a fraction
    pairs: int             # the pairs of measured runs it was drawn from


def ratio_tolerance(path: Path = RESIDUALS_FILE) -> RatioTolerance | None:
    """The stored p90 ratio error over every kind of one-setting change, or None where the file or
    its `effects` entry is absent (a file written before effects were stored)."""
    if not path.exists():
        return None
    return _read(str(path), path.stat().st_mtime_ns)[1]


def nested_coverage(rows: Sequence[tuple[str, float]], alpha: float = ALPHA) -> tuple[int, int]:
    """(rows inside, rows) for `rows` of (source, error): each row's interval drawn, as above, from
    the errors of the other sources only: how often a new source's run falls inside."""
    inside = total = 0
    for source, error in rows:
        bounds = conformal_bounds([e for s, e in rows if s != source], alpha)
        if bounds is None:
            continue
        total += 1
        inside += bounds[0] <= error <= bounds[1]
    return inside, total


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def scenario_regime(framework: str, gpus: int, gpus_per_node: int) -> str:
    """The regime name of `validation.crossval.regime` (the residuals file's `regime` column)."""
    return f"{framework}/{'one-node' if gpus <= gpus_per_node else 'multi-node'}"
