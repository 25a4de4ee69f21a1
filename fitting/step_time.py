"""Fit the numbers of data/calibration/fitted.yaml to measured step times.

`fit(rows)` minimises the mean pseudo-Huber loss DELTA^2 (sqrt(1 + (x / DELTA)^2) - 1) of
x = log(predicted / measured) of the step time over the given `MappedRow`s: quadratic near zero,
linear beyond DELTA, so rows the physics does not cover pull the shared numbers less than a squared
loss would. Minimised by scipy's bounded trust-region least squares with the soft-L1 loss (the same
pseudo-Huber, f_scale = DELTA) from the physical starting point (every fraction 1.0, every cost 0).
`benchmarks/fit_overheads.py` runs it on the split's fit rows and stores the result; the
leave-one-source-out check (`validation.crossval`) runs the same function once per left-out source.

The fitted parameters are `params(families)`: one sustained matmul fraction per GPU family (the
catalog's `gpus[].family`, `fitted_families`); every other number the simulator reads is measured,
published or chosen and is read from the file as it stands (DeepSpeed's ZeRO-3 collective fraction
is no longer fitted: `simulator.overheads` says why). A row only reads the parameters of its GPU
family, precision and framework, so its prediction is cached on those values: a finite-difference
column for the V100 fraction re-simulates the V100 rows only.

A family gets a number of its own only where rows of at least `MIN_FAMILY_SOURCES` sources run on
it: one source's rows cannot tell the family's matmul rate from that source's own conditions (its
code, its cluster, how it timed the step), and a leave-one-source-out fold could not test it. A
family with rows of one source takes the median of the families fitted, as a family without rows
does, and its rows do not enter the objective (#16: the V100 fraction, fitted on DLEBERT alone
with SHO19 left out, gave SHO19's rows -12 to -17%). Rows of one source only (a user's file) fit
every family they run on.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import least_squares

from partita.fitting.writer import FittedFile, write_fitted_file
from partita.planner.catalog import load_catalog
from partita.planner.errors import PartitaError
from partita.simulator.overheads import FITTED_FILE, Overheads, load_overheads

if TYPE_CHECKING:        # the rows come from partita.validation, which imports this package
    from partita.validation.rowmap import MappedRow

DELTA = 0.1
MIN_FAMILY_SOURCES = 2     # sources whose rows must run on a GPU family for it to get a number
SUSTAINED = "sustained_matmul_fraction"


@dataclass(frozen=True)
class Param:
    name: str
    start: float
    low: float
    high: float


@dataclass(frozen=True, kw_only=True)
class Families:
    """The GPU families a fit gives a sustained fraction: `fitted` each its own parameter, `copies`
    (family -> fitted family) the number of a family on the same chip."""

    fitted: tuple[str, ...]
    copies: dict[str, str] = field(default_factory=dict, hash=False)


def _chip(gpu) -> tuple:
    """What the sustained matmul fraction is a property of: the architecture, its SMs and their
    clocks (the dense peak FLOP/s per precision); memory size and bandwidth are not part of it."""
    return gpu.extra.get("arch"), gpu.extra.get("sm_count"), tuple(sorted(gpu.peak_flops.items()))


def fitted_families(catalog, rows_families: Iterable[str | None], stored: Iterable[str]) -> Families:
    """The catalog's GPU families (catalog order) that a fit row runs on or the fitted file already
    holds (`stored`), so every fit, leave-one-source-out folds included, has the same parameters.
    A family whose GPUs are the same chip (`_chip`) as an earlier family's copies that family's
    number (H200: the H100's GH100 chip and clocks with more, faster memory)."""
    wanted = set(rows_families) | set(stored)
    gpus = [catalog.gpu(n) for n in catalog.gpu_names()]
    chips: dict[tuple, str] = {}
    fitted, copies = [], {}
    for family in catalog.gpu_families():
        if family not in wanted:
            continue
        chip = {_chip(g) for g in gpus if g.family == family}
        first = chips.get(next(iter(chip))) if len(chip) == 1 else None
        if first is not None:
            copies[family] = first
            continue
        fitted.append(family)
        chips.update((c, family) for c in chip)
    return Families(fitted=tuple(fitted), copies=copies)


def params(families: Families) -> tuple[Param, ...]:
    """The fitted numbers, in the order of the optimiser's vector (units in the names)."""
    return tuple(Param(f"{SUSTAINED}.{f}", 1.0, 0.3, 1.0) for f in families.fitted)


@dataclass(frozen=True)
class FitResult:
    values: dict[str, float]          # params(families) name -> fitted value
    families: Families
    overheads: Overheads
    rows: tuple[str, ...]             # the row ids fitted on
    evaluations: int
    loss: float                       # mean pseudo-Huber loss at the optimum


def overheads_from(values: dict[str, float], families: Families,
                   base: Overheads | None = None) -> Overheads:
    """training.yaml's stored overheads with the fitted numbers replaced by `values`."""
    base = base if base is not None else load_overheads()
    fam = {f: values[f"{SUSTAINED}.{f}"] for f in families.fitted}
    fam |= {f: fam[of] for f, of in families.copies.items()}
    return replace(
        base, sustained_default=(float(np.median([fam[f] for f in families.fitted]))
                                 if families.fitted else base.sustained_default),
        sustained_by_family=fam)


class Predictor:
    """Step-time predictions of mapped rows under given overheads, cached per row key."""

    def __init__(self, catalog) -> None:
        from partita.simulator.step import simulate
        self._simulate = simulate
        self._catalog = catalog
        self._cache: dict[tuple, float | None] = {}
        self._gpu: dict[str, str | None] = {}

    def gpu_family(self, m: MappedRow) -> str | None:
        if m.row_id not in self._gpu:
            from partita.simulator.context import resolve
            self._gpu[m.row_id] = resolve(m.scenario, self._catalog).system.gpu.family
        return self._gpu[m.row_id]

    def key(self, m: MappedRow, oh: Overheads) -> tuple:
        t, p = m.scenario.training, m.scenario.parallel
        fw = t.framework
        return (m.row_id, oh.sustained(self.gpu_family(m)), oh.attention_fraction,
                oh.fp8_matmul_fraction if t.precision == "fp8" else None, oh.framework(fw),
                oh.zero3_collectives(fw) if p.zero >= 3 else None)

    def step_s(self, m: MappedRow, oh: Overheads) -> float | None:
        """Predicted seconds per step, or None where the simulator refuses the scenario."""
        try:
            key = self.key(m, oh)
        except PartitaError:
            return None                       # the scenario does not resolve (refused)
        if key not in self._cache:
            try:
                self._cache[key] = self._simulate(m.scenario, self._catalog,
                                                  overheads=oh).step_time_s
            except PartitaError:
                self._cache[key] = None
        return self._cache[key]

    def errors(self, rows: Iterable[MappedRow], oh: Overheads) -> dict[str, float]:
        """predicted / measured - 1 per simulable row."""
        out = {}
        for m in rows:
            step = self.step_s(m, oh)
            if step is not None:
                out[m.row_id] = step / m.measured_step_s - 1.0
        return out


def fit(rows: Sequence[MappedRow], catalog, *, predictor: Predictor | None = None,
        base: Overheads | None = None, max_nfev: int = 200) -> FitResult:
    """Fit `params` to `rows` (see the module docstring for the objective and the optimiser)."""
    if not rows:
        raise ValueError("fit: no rows to fit on")
    base = base if base is not None else load_overheads()
    pred = predictor if predictor is not None else Predictor(catalog)
    families = fitted_families(catalog if catalog is not None else load_catalog(),
                               (pred.gpu_family(m) for m in rows), base.sustained_by_family)
    every = params(families)
    # A GPU family that no row, or the rows of one source only, run on is not fitted: it gets the
    # median of the fitted families, as the simulator gives a family without rows
    # (`Overheads.sustained_default`), and its rows stay out of the objective.
    def family(m: MappedRow) -> str | None:          # a same-chip family's rows count for its chip
        f = pred.gpu_family(m)
        return families.copies.get(f, f)

    sources: dict[str | None, set[str]] = {}
    for m in rows:
        sources.setdefault(family(m), set()).add(m.source_key)
    seen = {f for f in families.fitted if len(sources.get(f, ())) >= MIN_FAMILY_SOURCES}
    if not seen:                 # rows of one source only (a user's file): each family it runs on
        seen = {f for f in families.fitted if f in sources}
    unseen = [f"{SUSTAINED}.{f}" for f in families.fitted if f not in seen]
    rows = [m for m in rows if family(m) in seen or family(m) not in families.fitted]
    free = [p for p in every if p.name not in unseen]
    start = np.array([p.start for p in free])
    low = np.array([p.low for p in free])
    high = np.array([p.high for p in free])

    def values(x) -> dict[str, float]:
        out = {p.name: float(np.clip(v, p.low, p.high)) for p, v in zip(free, x)}
        fitted = [out[f"{SUSTAINED}.{f}"] for f in families.fitted if f in seen]
        for name in unseen:
            out[name] = float(np.median(fitted)) if fitted else 1.0
        return {p.name: out[p.name] for p in every}

    def residuals(x):
        errs = pred.errors(rows, overheads_from(values(x), families, base))
        return np.array([math.log1p(errs[k]) for k in sorted(errs)])

    # Finite differences step by 1e-3 of each value; a physical start at its upper bound steps in.
    x0 = start - 1e-3 * (start == high)
    res = least_squares(residuals, x0, bounds=(low, high), loss="soft_l1", f_scale=DELTA,
                        diff_step=1e-3, xtol=1e-4, max_nfev=max_nfev)
    best = values(res.x)
    loss = float(np.mean(DELTA ** 2 * (np.sqrt(1.0 + (res.fun / DELTA) ** 2) - 1.0)))
    return FitResult(values=best, families=families, overheads=overheads_from(best, families, base),
                     rows=tuple(m.row_id for m in rows), evaluations=int(res.nfev), loss=loss)


def fitted_file(result: FitResult) -> FittedFile:
    """What data/calibration/fitted.yaml holds for a fit: the values with the rows, objective and
    command behind them."""
    v, families = result.values, result.families
    fam = {f: round(v[f"{SUSTAINED}.{f}"], 3) for f in families.fitted}
    sustained = {"default": round(float(np.median(list(fam.values()))), 3), **fam,
                 **{f: fam[of] for f, of in families.copies.items()}}
    copies = "".join(f"; {f} = {of}" for f, of in families.copies.items())
    return FittedFile(
        title="The numbers fitted to measured step times (fitting/step_time.py); "
              "facts are in training.yaml, host.yaml, compute.yaml, network.yaml.",
        command=COMMAND, objective=OBJECTIVE, rows=result.rows, loss=round(result.loss, 6),
        values={SUSTAINED: sustained},
        notes=("sustained_matmul_fraction: in-training matmul throughput / best-shape sweep, per "
               f"GPU family; default: the median, for families without rows{copies} (the same "
               "chip: architecture, SMs and peak FLOP/s in the catalog).",))


def write_fitted(result: FitResult, path: str | Path | None = None) -> Path:
    """Store a fit in data/calibration/fitted.yaml (fitting/writer.py)."""
    return write_fitted_file(path if path is not None else FITTED_FILE, fitted_file(result))


COMMAND = "python benchmarks/fit_overheads.py --write"
OBJECTIVE = ("mean pseudo-Huber (delta 0.1) of log(predicted / measured) step time over the rows "
             "below; scipy least_squares (trf, soft_l1, f_scale 0.1) from every fraction 1.0 "
             "(fitting/step_time.py)")
