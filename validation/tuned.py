"""The micro-batch of a published run that does not state it: the one the run's owner would have
tuned to, taken as the fastest that fits among the powers of two that divide a data-parallel
rank's share of the global batch.

A benchmark table published by a framework's authors is a tuned run; where it leaves the
micro-batch out, a fixed guess (1) is one more hand-set number per row. This rule replaces the
guesses with one choice that looks only at predictions, never at the row's measurement: each
candidate is simulated with the fitted fractions left out (every `sustained_matmul_fraction` at
1.0, the fit's starting point, and no `zero3_collective_fraction`), so the choice does not depend on
which rows were fitted, and the fastest that fits in memory is kept (none fits: the smallest).
rowmap.yaml asks for it with `micro_batch: {value: fastest, why: ...}`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache

from partita.planner.errors import PartitaError
from partita.planner.scenario import Scenario

FASTEST = "fastest"
# Micro-batches tried, where they divide a rank's share: powers of two, as published launch
# scripts set them (a chosen set, not a measured one).
CANDIDATES = (1, 2, 4, 8)


@lru_cache(maxsize=1)
def _unfitted():
    from partita.simulator.overheads import load_overheads
    oh = load_overheads()
    return replace(oh, sustained_default=1.0, sustained_by_family={},
                   zero3_collective_fraction={})


@lru_cache(maxsize=1)
def _catalog():
    from partita.planner.catalog import load_catalog
    return load_catalog()


@lru_cache(maxsize=1024)
def _predict(scenario: Scenario) -> tuple[float, bool] | None:
    """(step seconds, fits in memory) of a candidate, or None where the simulator refuses it;
    kept per scenario, as every mapping of the rows asks again."""
    from partita.simulator.step import simulate
    try:
        result = simulate(scenario, _catalog(), overheads=_unfitted())
    except PartitaError:
        return None
    return result.step_time_s, result.fits_in_memory


def fastest_micro_batch(per_rank: int, build: Callable[[int], Scenario | None],
                        ) -> tuple[int, str]:
    """(micro-batch, how it was chosen) for a data-parallel rank's share of `per_rank` sequences;
    `build(mb)` gives the row's scenario at that micro-batch, or None where it is not one (an
    interleaved schedule whose micro-batch count the pipeline does not divide)."""
    tried = []
    for mb in (c for c in CANDIDATES if per_rank % c == 0):
        scenario = build(mb)
        predicted = _predict(scenario) if scenario is not None else None
        if predicted is not None:
            tried.append((mb, *predicted))
    if not tried:
        return 1, "no candidate simulates; 1"
    fitting = [t for t in tried if t[2]]
    listed = ", ".join(f"{mb}: {s:.3g} s{'' if fits else ' (does not fit)'}" for mb, s, fits in tried)
    if not fitting:
        return tried[0][0], f"the smallest, as none fits ({listed})"
    best = min(fitting, key=lambda t: (t[1], t[0]))
    return best[0], f"the fastest predicted that fits ({listed})"
