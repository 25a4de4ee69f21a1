"""Lowering a compute schedule to compute plus point-to-point sends and receives (`add_comms`).

The rule is torch's `_add_send_recv`, so the executor's program and this one agree: ranks take
turns in rank order, one step each; a rank places its next compute action once its input is
there (its own previous stage ran it, or a RECV for it has already been placed), follows it with
the SEND to the next (forward) or previous (backward) stage when that stage lives on another rank,
and the matching RECV is placed on the receiving rank at the same moment. Placing receives when
the sender sends, never ahead, keeps the send/recv order the same on both ends, so blocking
point-to-point calls cannot hang.
"""
from __future__ import annotations

from partita.planner.errors import PartitaError
from partita.planner.schedules.actions import (COMPUTE_KINDS, RECV_B, RECV_F, SEND_B, SEND_F, B, F, I,
                                       Action, Schedule, format_actions, stage_rank)


def compute_only(schedule: Schedule) -> Schedule:
    """The schedule without its communication (and other non-compute) actions; bubbles kept."""
    return {r: [a for a in acts if a is None or a.kind in COMPUTE_KINDS]
            for r, acts in sorted(schedule.items())}


def add_comms(schedule: Schedule, p: int, v: int = 1) -> dict[int, list[Action]]:
    """Compute actions plus SEND_F/RECV_F/SEND_B/RECV_B, per rank; bubbles dropped.

    Raises PartitaError when no rank can move (the compute order deadlocks).
    """
    num_stages = p * v
    lists = compute_only(schedule)
    out: dict[int, list[Action]] = {r: [] for r in lists}
    placed: dict[int, set[Action]] = {r: set() for r in lists}
    pos = {r: 0 for r in lists}
    active = [r for r in sorted(lists) if lists[r]]
    while active:
        moved = False
        for r in active:
            action = lists[r][pos[r]]
            if action is not None and not _ready(action, placed[r], num_stages):
                continue
            if action is not None:
                _place(action, r, out, placed, p, num_stages)
            pos[r] += 1
            moved = True
        if not moved:
            raise _stuck(active, lists, pos)
        active = [r for r in active if pos[r] < len(lists[r])]
    return out


def _ready(action: Action, placed: set[Action], num_stages: int) -> bool:
    s, kind, mb = action
    if kind == F and s != 0:
        return Action(s, RECV_F, mb) in placed or Action(s - 1, F, mb) in placed
    if kind in (B, I) and s != num_stages - 1:
        return (Action(s, RECV_B, mb) in placed or Action(s + 1, I, mb) in placed
                or Action(s + 1, B, mb) in placed)
    return True


def _place(action: Action, rank: int, out: dict[int, list[Action]],
           placed: dict[int, set[Action]], p: int, num_stages: int) -> None:
    out[rank].append(action)
    placed[rank].add(action)
    s, kind, mb = action
    if kind == F and s != num_stages - 1 and stage_rank(s + 1, p) != rank:
        send, recv = Action(s, SEND_F, mb), Action(s + 1, RECV_F, mb)
    elif kind in (B, I) and s != 0 and stage_rank(s - 1, p) != rank:
        send, recv = Action(s, SEND_B, mb), Action(s - 1, RECV_B, mb)
    else:
        return
    out[rank].append(send)
    placed[rank].add(send)
    peer = stage_rank(recv.stage, p)
    out[peer].append(recv)
    placed[peer].add(recv)


def _stuck(active: list[int], lists: dict[int, list[Action | None]],
           pos: dict[int, int]) -> PartitaError:
    r = active[0]
    heads = "; ".join(f"rank {q}, step {pos[q]}: {lists[q][pos[q]]}" for q in active[:4])
    return PartitaError(f"cannot place sends and receives, no rank can move ({heads}); "
                        f"rank {r} runs {format_actions(lists[r], pos[r])}")
