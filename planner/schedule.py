"""The pipeline schedule as data: actions in torch's text form, generators, checks and CSV io.

    from partita.planner.schedule import build, validate, add_comms
    sched = build("1f1b", p=4, m=8)        # {rank: [Action("0F0"), ...]}
    validate(sched, p=4, m=8)               # PartitaError naming rank and step, or None
    add_comms(sched, p=4)                   # with 0SEND_F0 / 1RECV_F0 ... as torch lowers it

The planner, the simulator and the executor share this one vocabulary
(torch.distributed.pipelining's `_Action`), so a plan, its simulated timeline and its measured
timeline can be joined on (rank, "2F0"). The code lives in `planner.schedules.*`.
"""
from __future__ import annotations

from partita.planner.schedules.actions import (COMM_KINDS, COMPUTE_KINDS, Action, ComputationType,
                                       Schedule, format_actions, stage_rank)
from partita.planner.schedules.csvio import format_csv, from_csv, parse_csv, to_csv
from partita.planner.schedules.generators import (NAMES, build, gpipe, interleaved_1f1b, one_f_one_b,
                                          zero_bubble_h1)
from partita.planner.schedules.liveness import peak_inflight, peak_inflight_by_rank
from partita.planner.schedules.lowering import add_comms, compute_only
from partita.planner.schedules.validation import validate

__all__ = [
    "Action", "ComputationType", "Schedule", "COMPUTE_KINDS", "COMM_KINDS", "NAMES",
    "stage_rank", "format_actions",
    "gpipe", "one_f_one_b", "interleaved_1f1b", "zero_bubble_h1", "build",
    "add_comms", "compute_only", "validate", "peak_inflight", "peak_inflight_by_rank",
    "format_csv", "parse_csv", "to_csv", "from_csv",
]
