"""What a plan search returns: frozen `Candidate` records, the `PlanResult` and its table.

`PlanResult.table()` is a pandas DataFrame with the `COLUMNS` below (the reports helper renders
it); `PlanResult.best` is the completed scenario document. Costs: the catalog's on-demand (else
SageMaker) and spot prices per node-hour times nodes; with a token budget, days and dollars, and
their slow end: the same at the slow end of the step time's 90% interval (`simulator.interval`).
The Pareto front is time vs cost over the usable plans of every system searched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from partita.planner.scenario import Scenario

@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One evaluated plan: its settings, the simulator's numbers, prices and budget."""
    system: str
    nodes: int
    gpus: int
    tensor: int
    pipeline: int
    context: int
    data: int
    micro_batch: int
    schedule: str
    virtual_stages: int
    recompute: str
    zero: int
    grad_reduce: str
    recompute_layers: int | None = None       # full recompute of only this many blocks per chunk
    data_shard: int | None = None             # ZeRO shard group (hybrid sharding); None: all of data
    stages: tuple[tuple[int, int], ...] | None = None
    split: str = "even"                       # even | balanced | ilp (solver, status)
    step_time_s: float | None = None
    step_time_low_s: float | None = None      # the step time's 90% interval (simulator.interval)
    step_time_high_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    bubble_fraction: float | None = None
    peak_memory_gib: float | None = None
    memory_capacity_gib: float | None = None
    fits: bool = False
    usd_per_hour: float | None = None
    usd_per_hour_spot: float | None = None
    days: float | None = None
    days_high: float | None = None            # days at the slow end of the step's interval
    usd: float | None = None
    usd_high: float | None = None             # dollars at the slow end
    usd_spot: float | None = None
    within_budget: bool = True
    pareto: bool = False
    error: str | None = None
    scenario: Scenario | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None and self.fits and self.within_budget

    @property
    def near_memory_capacity(self) -> bool:
        """Fits, but above MEMORY_PRESSURE_FRACTION of the GPU's memory, as `simulate` flags a
        step NEAR CAPACITY (`SimResult.near_memory_capacity`; planner.layergraph says why)."""
        from partita.planner.layergraph import near_memory_capacity
        return bool(self.fits and self.peak_memory_gib is not None and self.memory_capacity_gib
                    and near_memory_capacity(self.peak_memory_gib, self.memory_capacity_gib))


COLUMNS = ("system", "nodes", "gpus", "tensor", "pipeline", "context", "data", "micro_batch",
           "schedule", "virtual_stages", "recompute", "recompute_layers", "zero", "data_shard",
           "grad_reduce",
           "split", "step_time_s", "step_time_low_s", "step_time_high_s",
           "tokens_per_s", "mfu", "bubble_fraction", "peak_memory_gib", "memory_capacity_gib",
           "fits", "usd_per_hour", "usd_per_hour_spot", "days", "days_high", "usd", "usd_high",
           "usd_spot",
           "within_budget", "pareto", "error")


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    best: dict[str, Any]                       # the completed scenario document
    candidates: tuple[Candidate, ...]          # ranked: usable plans first, failures last
    objective: str = "time"
    tokens: float | None = None
    evaluated: int = 0                         # simulations run
    pruned: int = 0                            # layouts the memory floor or the rules rejected
    seconds: float = 0.0
    solver: str = ""                           # the ILP solver of the final split, and its status
    notes: tuple[str, ...] = ()

    @property
    def best_candidate(self) -> Candidate:
        return self.candidates[0]

    def table(self):
        import pandas as pd
        rows = [{k: getattr(c, k) for k in COLUMNS} for c in self.candidates]
        return pd.DataFrame(rows, columns=list(COLUMNS))

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        cands = self.candidates[:top] if top else self.candidates
        return {"objective": self.objective, "tokens": self.tokens, "evaluated": self.evaluated,
                "pruned": self.pruned, "seconds": self.seconds, "solver": self.solver,
                "notes": list(self.notes), "best": self.best,
                "candidates": [{k: getattr(c, k) for k in COLUMNS}
                               | {"near_memory_capacity": c.near_memory_capacity}
                               | {"stages": [list(s) for s in c.stages] if c.stages else None}
                               for c in cands]}


def _times(a: float | None, b: float) -> float | None:
    return None if a is None else a * b


def _objective_key(objective: str):
    def time_key(c):
        return (c.step_time_s, c.peak_memory_gib)

    def cost_key(c):
        per = c.usd if c.usd is not None else _times(c.usd_per_hour, c.step_time_s / 3600.0)
        return (math.inf if per is None else per, c.step_time_s)

    def memory_key(c):
        return (c.peak_memory_gib, c.step_time_s)
    return {"time": time_key, "cost": cost_key, "memory": memory_key}[objective]


def objective_value(c: Candidate, objective: str) -> float | None:
    """The quantity `objective` ranks by, where a ratio of two plans' values means something:
    seconds per step (time) or dollars (cost, per run with --tokens, else per step); None for the
    memory objective or a plan without a price."""
    if objective not in ("time", "cost"):
        return None
    value = _objective_key(objective)(c)[0]
    return None if value is None or not math.isfinite(value) else value


BOUNDS = ("predicted", "slow")     # what --max-cost / --max-days are checked against


def budget_values(c: Candidate, bound: str) -> tuple[float | None, float | None]:
    """(days, dollars) of `c` at `bound`: the prediction, or the slow end of its 90% interval."""
    return (c.days, c.usd) if bound == "predicted" else (c.days_high, c.usd_high)


def _budget(c: Candidate, max_cost, max_days, bound: str = "predicted") -> Candidate:
    if c.error is not None or (max_cost is None and max_days is None):
        return c
    days, usd = budget_values(c, bound)
    ok = True
    if max_cost is not None and (usd is None or usd > max_cost):
        ok = False
    if max_days is not None and (days is None or days > max_days):
        ok = False
    return replace(c, within_budget=ok)


def _mark_pareto(cands: list[Candidate]) -> list[Candidate]:
    """Time vs cost (the budget's dollars, else dollars per step) among the usable plans."""
    pts = []
    for i, c in enumerate(cands):
        if not c.ok or c.usd_per_hour is None:
            continue
        cost = c.usd if c.usd is not None else c.usd_per_hour * c.step_time_s / 3600.0
        pts.append((c.step_time_s, cost, i))
    front = set()
    for t, cost, i in pts:
        if not any((t2 <= t and c2 <= cost) and (t2 < t or c2 < cost) for t2, c2, _ in pts):
            front.add(i)
    return [replace(c, pareto=True) if i in front else c for i, c in enumerate(cands)]
