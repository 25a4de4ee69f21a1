"""Running the partition ILP: HiGHS through highspy, CBC as the fallback, status read first.

`run_solver(model, problem, pulp)` solves a PuLP model and returns (status text, solver name, MIP
gap): "optimal", or "time limit ..., best found" with HiGHS's gap when the limit stopped it with an
integer solution. An infeasible model raises the partitioner's explanation (which stage, its need,
the capacity, what would help); no solution within the limit raises naming the limit.
"""
from __future__ import annotations

import os
import sys
from functools import lru_cache

from partita.planner.errors import PartitaError
from partita.planner.partition_dp import infeasible


@lru_cache(maxsize=1)
def _highs_banner_shown() -> bool:
    """highspy prints its banner on stdout at the first `Highs()` of a process, which would
    corrupt `--json` output: create that first instance with stdout pointed at /dev/null."""
    try:
        import highspy
    except ImportError:
        return False
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return True


def _solver(problem, pulp):
    """HiGHS through highspy, else CBC; never silently: the name goes into the result."""
    tl = max(0.1, float(problem.time_limit_s))
    if problem.solver == "highs":
        highs = pulp.HiGHS(msg=False, timeLimit=tl, gapRel=1e-9)
        if highs.available() and _highs_banner_shown():
            return highs, "HiGHS"
    cbc = pulp.PULP_CBC_CMD(msg=False, timeLimit=tl, gapRel=1e-9)
    if not cbc.available():
        raise PartitaError("partition: neither HiGHS (pip install highspy) nor CBC is available")
    note = "" if problem.solver == "cbc" else " (HiGHS not available)"
    return cbc, "CBC" + note


def run_solver(model, problem, pulp) -> tuple[str, str, float]:
    solver, name = _solver(problem, pulp)
    model.solve(solver)
    status = pulp.LpStatus[model.status]
    sol = model.sol_status
    if status == "Infeasible" or sol == pulp.LpSolutionInfeasible:
        raise infeasible(problem)
    if sol not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        raise PartitaError(f"partition: {name} found no split within {problem.time_limit_s:g} s "
                           f"(status {status}); allow more time or fewer chunks")
    if sol == pulp.LpSolutionOptimal:
        return "optimal", name, 0.0
    gap = float("nan")
    if name == "HiGHS" and getattr(model, "solverModel", None) is not None:
        gap = float(model.solverModel.getInfo().mip_gap)
    return f"time limit {problem.time_limit_s:g} s, best found", name, gap
