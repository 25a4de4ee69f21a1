"""How many micro-batches' activations a schedule keeps alive at once, per stage and per rank.

A micro-batch's activations on a stage are held from its F until its last backward (B, or W when
the backward is split: W still reads the layer inputs). Because a rank runs its list in order, the
count changes only at its own actions, so the peaks follow from the order alone, without timing.
GPipe holds m on every stage; 1F1B at most p - r on rank r; ZB-H1 at most p.
The memory model multiplies these by the activation bytes of one micro-batch of the stage.
"""
from __future__ import annotations

from partita.planner.schedules.actions import B, F, W, Schedule


def peak_inflight(schedule: Schedule) -> dict[int, int]:
    """For each stage, the most micro-batches between F and last backward at any step."""
    peaks: dict[int, int] = {}
    for actions in schedule.values():
        live: dict[int, int] = {}
        for action in actions:
            if action is None:
                continue
            s, kind = action.stage, action.kind
            if kind == F:
                live[s] = live.get(s, 0) + 1
                peaks[s] = max(peaks.get(s, 0), live[s])
            elif kind == B or kind == W:
                live[s] = live.get(s, 0) - 1
    return dict(sorted(peaks.items()))


def peak_inflight_by_rank(schedule: Schedule) -> dict[int, int]:
    """For each rank, the most micro-batches alive at once summed over its chunks."""
    out: dict[int, int] = {}
    for r, actions in sorted(schedule.items()):
        live = peak = 0
        for action in actions:
            if action is None:
                continue
            if action.kind == F:
                live += 1
                peak = max(peak, live)
            elif action.kind == B or action.kind == W:
                live -= 1
        out[r] = peak
    return out
