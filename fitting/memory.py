"""The memory-reserve fit: the caching allocator's share and a framework's own buffers, fitted to
measured peak memory per GPU.

The measured peaks (data/validation/published_memory.csv, `peak_memory_GiB`) are what nvidia-smi
shows: the tensors the simulator counts (`MemoryEstimate.allocated_bytes`), plus the CUDA context
and communication buffers (kept at their sourced values, data/calibration/memory.yaml), plus what
the PyTorch caching allocator holds beyond the live tensors and the buffers a framework allocates
for itself. Those last two are fitted, on the rows data/validation/split_memory.yaml names:

    peak = allocated * (1 + fragmentation_fraction) + context + communication
           + framework_buffers_gib[framework]

Every fit row is a DeepSpeed run (BLOOM's topology search), so only DeepSpeed's buffers are fitted;
other frameworks keep none. `fit_memory` minimises the squared log(predicted / measured) with
scipy's bounded least squares; `fitted_file` is what data/calibration/fitted_memory.yaml holds.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from partita.fitting.writer import FittedFile
from partita.planner.paths import CALIBRATION_DIR
from partita.planner.units import GIB
from partita.simulator.calibration import Calibration
from partita.simulator.step import simulate

FITTED_FILE = CALIBRATION_DIR / "fitted_memory.yaml"
COMMAND = "python benchmarks/fit_memory.py --write"
OBJECTIVE = ("least squares of log(predicted / measured) peak memory per GPU over the rows below; "
             "scipy least_squares (trf) from fragmentation 0.05 and no buffers (fitting/memory.py)")
FITTED_FRAMEWORK = "deepspeed"
START = (0.05, 0.0)                   # fragmentation_fraction, framework_buffers_gib
BOUNDS = ((0.0, 0.0), (1.0, 40.0))


@dataclass(frozen=True, kw_only=True)
class MemoryRow:
    row_id: str
    framework: str
    allocated_gib: float       # what the simulator's tensors add up to at the peak rank
    measured_gib: float


@dataclass(frozen=True, kw_only=True)
class MemoryFit:
    fragmentation_fraction: float
    framework_buffers_gib: float      # of FITTED_FRAMEWORK
    rows: tuple[str, ...]
    loss: float                       # mean squared log(predicted / measured) at the optimum


def without_reserve(cal: Calibration) -> Calibration:
    """The calibration with no memory reserve: the simulator's peak is then the tensors alone."""
    return dataclasses.replace(cal, memory=dataclasses.replace(
        cal.memory, cuda_context_bytes=0.0, communication_buffers_bytes=0.0,
        fragmentation_fraction=0.0, framework_buffers_bytes={}))


def memory_rows(mapped: Iterable, catalog, cal: Calibration) -> list[MemoryRow]:
    """Every mapped row (`validation.rowmap.MappedRow`) with a measured peak, simulated once
    without any reserve."""
    bare = without_reserve(cal)
    out = []
    for m in mapped:
        if m.measured_peak_memory_gib is None:
            continue
        r = simulate(m.scenario, catalog, calibration=bare)
        out.append(MemoryRow(row_id=m.row_id, framework=m.scenario.training.framework,
                             allocated_gib=r.peak_memory_bytes / GIB,
                             measured_gib=m.measured_peak_memory_gib))
    return out


def predict(row: MemoryRow, fragmentation: float, buffers_gib: float, fixed_gib: float) -> float:
    own = buffers_gib if row.framework == FITTED_FRAMEWORK else 0.0
    return row.allocated_gib * (1.0 + fragmentation) + fixed_gib + own


def fixed_gib(cal: Calibration) -> float:
    """The reserve that is not fitted: the CUDA context and the communication buffers."""
    return (cal.memory.cuda_context_bytes + cal.memory.communication_buffers_bytes) / GIB


def fit_memory(rows: Sequence[MemoryRow], fixed: float) -> MemoryFit:
    if not rows:
        raise ValueError("fit_memory: no rows to fit on")

    def residuals(x):
        return np.array([math.log(predict(r, x[0], x[1], fixed) / r.measured_gib) for r in rows])

    res = least_squares(residuals, np.array(START), bounds=BOUNDS)
    return MemoryFit(fragmentation_fraction=float(res.x[0]), framework_buffers_gib=float(res.x[1]),
                     rows=tuple(r.row_id for r in rows), loss=float(np.mean(res.fun ** 2)))


def fitted_file(fit: MemoryFit) -> FittedFile:
    return FittedFile(
        title="The memory reserve fitted to measured peaks (data/validation/published_memory.csv): "
              "fitting/memory.py.",
        command=COMMAND, objective=OBJECTIVE, rows=fit.rows, loss=round(fit.loss, 6),
        values={"fragmentation_fraction": round(fit.fragmentation_fraction, 3),
                "framework_buffers_gib": {FITTED_FRAMEWORK: round(fit.framework_buffers_gib, 2)}},
        notes=("fragmentation_fraction: the PyTorch caching allocator's reserved minus allocated, "
               "per allocated byte;",
               f"framework_buffers_gib: buffers a framework allocates for itself (DeepSpeed's "
               f"gradient-reduction and all-gather buckets); frameworks without fit rows keep none."))
