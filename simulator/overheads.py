"""Framework effects no kernel microbenchmark shows, as data (data/calibration/training.yaml).

Three numbers, fitted end to end by benchmarks/fit_overheads.py on the fit rows of the validation
split only: the fraction of the best-shape matmul throughput a training run sustains, a fixed
cost per transformer block per micro-batch, and a fixed cost per optimizer step.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from planner.documents import Checker, load_document
from planner.paths import CALIBRATION_DIR

TRAINING_FILE = CALIBRATION_DIR / "training.yaml"
KEYS = ("sustained_matmul_fraction", "block_overhead_us", "step_overhead_s", "source")


@dataclass(frozen=True)
class Overheads:
    sustained_matmul_fraction: float = 1.0
    block_overhead_s: float = 0.0
    step_overhead_s: float = 0.0


@lru_cache(maxsize=4)
def _load(path: str, mtime: int) -> Overheads:
    c = Checker(load_document(path), "", path)
    c.only(KEYS)
    frac = c.number("sustained_matmul_fraction", 1.0)
    if frac > 1.0:
        raise c.error(f"must be in (0, 1], got {frac}", "sustained_matmul_fraction")
    return Overheads(frac, c.number("block_overhead_us", 0.0, positive=False) * 1e-6,
                     c.number("step_overhead_s", 0.0, positive=False))


def load_overheads(path: str | Path = TRAINING_FILE) -> Overheads:
    path = Path(path)
    return _load(str(path), path.stat().st_mtime_ns)
