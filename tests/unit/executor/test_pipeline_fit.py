"""executor/pipeline_fit.py: the work per pipeline action found through the simulator's own model."""
from __future__ import annotations

import pytest

from partita.executor.pipeline_fit import RANKS, action_seconds
from partita.planner.schedule import build
from partita.simulator.pipeline import PipelineCosts, simulate_pipeline


def _timing(schedule: str, per_rank: int, forward: float, backward: float, action: float,
            transfer: float) -> dict:
    """What hostbench would measure if the executor were the simulator's model with `action`."""
    costs = PipelineCosts.uniform(RANKS * per_rank, forward + action, backward + action,
                                  activation_s=transfer)
    steps = [simulate_pipeline(build(schedule, RANKS, m, per_rank), costs).makespan_s
             for m in (4, 16)]
    return {"stages_per_rank": per_rank, "microbatches": [4, 16], "step_s": steps,
            "forward_s": forward, "backward_s": backward}


@pytest.mark.parametrize("schedule, per_rank", [("1f1b", 1), ("interleaved-1f1b", 2),
                                                ("gpipe", 1)])
def test_the_fit_recovers_the_work_per_action_the_model_was_timed_with(schedule, per_rank):
    timing = _timing(schedule, per_rank, 3e-5, 6e-5, 4e-4, 8e-5)
    assert action_seconds(schedule, timing, 8e-5) == pytest.approx(4e-4, rel=1e-3)


def test_a_schedule_the_model_already_explains_gets_no_work_per_action():
    timing = _timing("1f1b", 1, 3e-5, 6e-5, 0.0, 8e-5)
    timing["step_s"] = [timing["step_s"][0], timing["step_s"][0] + 1e-6]   # grew less than that
    assert action_seconds("1f1b", timing, 8e-5) == 0.0


def test_the_message_chain_is_not_counted_as_work():
    """The same measured growth with slower transfers leaves less to the actions: what the
    schedule's order makes a rank wait for is the model's, not the host's."""
    for schedule, per_rank in (("1f1b", 1), ("interleaved-1f1b", 2)):
        timing = _timing(schedule, per_rank, 3e-5, 6e-5, 4e-4, 2e-4)
        assert action_seconds(schedule, timing, 1e-3) < action_seconds(schedule, timing, 1e-5)
