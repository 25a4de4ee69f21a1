"""The host work per pipeline action that makes the simulator's pipeline model reproduce the
executor's schedules as `partita calibrate` timed them (executor.hostbench `pipeline_timings`).

A schedule's step on a trivial layer is almost all the schedule's own work: bookkeeping, posting
and waiting on each activation's and gradient's send and receive, and the chain of messages the
schedule's order makes each action wait for. The simulator times that order itself
(simulator/pipeline.py, one transfer per stage boundary), so the work per action is not the
step's growth per action but the value `o` for which the simulated step, with `o` added to each
forward and backward and each transfer taking the measured small send's time, grows between the
two measured micro-batch counts as the measured one did. The growth is monotone in `o` (the model
is max-plus, see simulator/pipeline.py [Note: transfers]), so bisection finds it. A schedule whose
simulated growth already exceeds the measured one without any work per action gets 0.
"""
from __future__ import annotations

from partita.planner.schedule import build
from partita.simulator.pipeline import PipelineCosts, simulate_pipeline

RANKS = 2                       # hostbench times each schedule on a pair of ranks
TOLERANCE_S = 1e-7


def action_seconds(schedule: str, timing: dict, transfer_s: float) -> float:
    """Seconds of host work per forward or backward action of `schedule` (a scenario schedule
    name) from its `timing` (hostbench `pipeline_timings` entry), each stage-to-stage transfer
    taking `transfer_s`."""
    per_rank = int(timing["stages_per_rank"])
    (m1, m2), (t1, t2) = timing["microbatches"], timing["step_s"]
    forward, backward = timing["forward_s"], timing["backward_s"]
    plans = [build(schedule, RANKS, int(m), per_rank) for m in (m1, m2)]

    def growth(o: float) -> float:
        costs = PipelineCosts.uniform(RANKS * per_rank, forward + o, backward + o,
                                      activation_s=transfer_s)
        first, second = (simulate_pipeline(plan, costs).makespan_s for plan in plans)
        return second - first

    target = t2 - t1
    if growth(0.0) >= target:
        return 0.0
    high = max(target / (2 * per_rank * (m2 - m1)), TOLERANCE_S)
    while growth(high) < target:
        high *= 2.0
    low = 0.0
    while high - low > TOLERANCE_S:
        mid = (low + high) / 2
        low, high = (mid, high) if growth(mid) < target else (low, mid)
    return (low + high) / 2
