"""The simulator's answer for one training step (`SimResult`) and its JSON form (the contract)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from partita.planner.layergraph import near_memory_capacity
from partita.planner.units import GIB


@dataclass(frozen=True)
class Span:
    """One interval of work on one lane of one rank (a Chrome-trace 'X' event)."""
    rank: int
    lane: str            # "compute" | "send" | "recv" | "tp" | "dp" | "optimizer" ...
    name: str            # "2F0", "1B3", "dp-allreduce", ...
    start_s: float
    end_s: float
    cat: str = ""        # forward | backward | backward-input | backward-weight | comm | ...




@dataclass(frozen=True)
class SimResult:
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    tflops_per_gpu: float          # model FLOPs (no recompute) per GPU per second / 1e12
    mfu: float
    peak_memory_bytes: int
    memory_capacity_bytes: int
    bubble_fraction: float
    breakdown_s: dict[str, float] = field(hash=False)
    memory_breakdown_bytes: dict[str, int] = field(hash=False)
    gpus: int = 0
    system: str = ""
    usd_per_hour: float | None = None
    spans: tuple[Span, ...] = field(default=(), hash=False, compare=False, repr=False)
    details: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    # Where the measured step would lie if this prediction errs as the cross-validated predictions
    # of its regime did (5th-95th percentile; simulator.interval); None without residuals.
    step_time_interval_s: tuple[float, float] | None = None   # 90%, split-conformal (interval.py)
    interval_rows: int = 0          # the cross-validated errors the interval was drawn from

    @property
    def peak_memory_gib(self) -> float:
        return self.peak_memory_bytes / GIB

    @property
    def fits_in_memory(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    @property
    def near_memory_capacity(self) -> bool:
        """Fits, but above MEMORY_PRESSURE_FRACTION of the GPU's memory (planner.layergraph)."""
        return near_memory_capacity(self.peak_memory_bytes, self.memory_capacity_bytes)

    @property
    def usd_per_step(self) -> float | None:
        if self.usd_per_hour is None:
            return None
        return self.usd_per_hour * self.step_time_s / 3600.0

    def to_json(self) -> dict[str, Any]:
        out = {
            "step_time_s": self.step_time_s,
            "step_time_interval_s": (list(self.step_time_interval_s)
                                     if self.step_time_interval_s is not None else None),
            "step_time_interval_rows": self.interval_rows or None,
            "tokens_per_s": self.tokens_per_s,
            "samples_per_s": self.samples_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "peak_memory_gib": self.peak_memory_gib,
            "fits_in_memory": self.fits_in_memory,
            "near_memory_capacity": self.near_memory_capacity,
            "bubble_fraction": self.bubble_fraction,
            "breakdown_s": dict(self.breakdown_s),
            "memory_gib": {k: v / GIB for k, v in self.memory_breakdown_bytes.items()},
            "memory_capacity_gib": self.memory_capacity_bytes / GIB,
            "gpus": self.gpus,
            "system": self.system,
            "usd_per_hour": self.usd_per_hour,
            "usd_per_step": self.usd_per_step,
        }
        out.update({k: v for k, v in self.details.items() if k not in out})
        return out
