"""Checking a schedule before anyone runs it: `validate(schedule, p, m, v)`.

Three passes, each linear in the number of actions (the 1T-parameter case, p = 64 and m = 512,
has 65,536 of them):

1. every action names a stage of this rank (looped placement), a micro-batch below m, and comes
   in a legal order on its rank: F before B or I, I before W, nothing twice;
2. every (stage, micro-batch) has its F and one backward (B, or I and W);
3. a dry run in which each rank advances whenever the input of its next action exists (the previous
   stage's F, the next stage's B or I): if some rank never finishes, the per-rank orders deadlock.

Communication actions (SEND/RECV, torch's UNSHARD/RESHARD/REDUCE_GRAD) are derived from the compute
actions and are skipped. Errors name the rank and step (the index in the rank's list, counting
bubbles, i.e. the CSV column) and show the rank's list around it:
"rank 1, step 3: 1B2 before 1F2; rank 1 runs 1F0,1F1,1B0,[1B2],1F2,...".
"""
from __future__ import annotations

from partita.planner.errors import PartitaError
from partita.planner.schedules.actions import (COMPUTE_KINDS, B, F, I, W, Action, Schedule,
                                       format_actions, stage_rank)

_KIND_BIT = {F: 1, B: 2, I: 4, W: 8}


def validate(schedule: Schedule, p: int, m: int, v: int = 1) -> None:
    """Raise PartitaError describing the first problem; return None for a runnable schedule."""
    _check_ranks(schedule, p)
    num_stages = p * v
    state = bytearray(num_stages * m)           # bit set of kinds seen per (stage, micro-batch)
    for r in range(p):
        _check_rank(schedule[r], r, p, m, num_stages, state)
    _check_complete(schedule, p, m, num_stages, state)
    _check_progress(schedule, p, m, num_stages)


def _check_ranks(schedule: Schedule, p: int) -> None:
    if sorted(schedule) != list(range(p)):
        raise PartitaError(f"schedule has ranks {sorted(schedule)}, expected 0..{p - 1} "
                           f"(pipeline size {p})")


def _fail(actions: list[Action | None], r: int, step: int, msg: str) -> PartitaError:
    return PartitaError(f"rank {r}, step {step}: {msg}; rank {r} runs {format_actions(actions, step)}")


def _check_rank(actions: list[Action | None], r: int, p: int, m: int, num_stages: int,
                state: bytearray) -> None:
    for step, action in enumerate(actions):
        if action is None:
            continue
        if not isinstance(action, Action):
            raise _fail(actions, r, step, f"{action!r} is not an Action")
        if action.kind not in COMPUTE_KINDS:
            continue
        s, kind, mb = action
        if not 0 <= s < num_stages:
            raise _fail(actions, r, step, f"{action}: stage {s} out of range "
                                          f"(the schedule has {num_stages} stages)")
        if stage_rank(s, p) != r:
            raise _fail(actions, r, step, f"{action}: stage {s} runs on rank {stage_rank(s, p)} "
                                          f"(stage % {p}), not rank {r}")
        if mb is None or not 0 <= mb < m:
            raise _fail(actions, r, step, f"{action}: micro-batch {mb} out of range 0..{m - 1}")
        problem = _order_problem(state[s * m + mb], action)
        if problem:
            raise _fail(actions, r, step, problem)
        state[s * m + mb] |= _KIND_BIT[kind]


def _order_problem(seen: int, action: Action) -> str:
    s, kind, mb = action
    if seen & _KIND_BIT[kind]:
        return f"{action} appears twice"
    if kind in (B, I) and not seen & _KIND_BIT[F]:
        return f"{action} before {Action(s, F, mb)}"
    if kind == W and not seen & _KIND_BIT[I]:
        return f"{action} before {Action(s, I, mb)}"
    if kind == B and seen & (_KIND_BIT[I] | _KIND_BIT[W]):
        return f"{action} after {Action(s, I, mb)} (a backward is either B or I then W)"
    if kind == I and seen & _KIND_BIT[B]:
        return f"{action} after {Action(s, B, mb)} (a backward is either B or I then W)"
    return ""


def _check_complete(schedule: Schedule, p: int, m: int, num_stages: int, state: bytearray) -> None:
    full = _KIND_BIT[F] | _KIND_BIT[B]
    split = _KIND_BIT[F] | _KIND_BIT[I] | _KIND_BIT[W]
    for key, seen in enumerate(state):
        if seen == full or seen == split:
            continue
        s, mb = divmod(key, m)
        r = stage_rank(s, p)
        missing = (f"no {Action(s, F, mb)}" if not seen & _KIND_BIT[F]
                   else f"no {Action(s, W, mb)} after {Action(s, I, mb)}" if seen & _KIND_BIT[I]
                   else f"no backward ({Action(s, B, mb)}, or {Action(s, I, mb)} "
                        f"and {Action(s, W, mb)})")
        raise PartitaError(f"stage {s}, micro-batch {mb}: {missing} on rank {r}; rank {r} runs "
                           f"{format_actions(schedule[r], None if len(schedule[r]) < 13 else 0)}")


def _check_progress(schedule: Schedule, p: int, m: int, num_stages: int) -> None:
    """Dry run: advance each rank while the input of its next action exists (a worklist)."""
    lists = [[a for a in schedule[r] if a is not None and a.kind in COMPUTE_KINDS]
             for r in range(p)]
    steps = [[i for i, a in enumerate(schedule[r]) if a is not None and a.kind in COMPUTE_KINDS]
             for r in range(p)]
    size = num_stages * m
    fwd_done, bwd_done = bytearray(size), bytearray(size)
    waiter: dict[tuple[int, int], int] = {}      # (0 = forward / 1 = backward, key) -> rank
    pos = [0] * p
    todo = list(range(p - 1, -1, -1))
    while todo:
        r = todo.pop()
        acts = lists[r]
        while pos[r] < len(acts):
            s, kind, mb = acts[pos[r]]
            need = _input_of(s, kind, mb, m, num_stages)
            if need is not None and not (fwd_done if need[0] == 0 else bwd_done)[need[1]]:
                waiter[need] = r
                break
            key = s * m + mb
            done = fwd_done if kind == F else bwd_done if kind in (B, I) else None
            if done is not None:
                done[key] = 1
                woken = waiter.pop((0 if kind == F else 1, key), None)
                if woken is not None:
                    todo.append(woken)
            pos[r] += 1
    stuck = [r for r in range(p) if pos[r] < len(lists[r])]
    if stuck:
        raise _deadlock(schedule, lists, steps, pos, stuck, p, m, num_stages)


def _input_of(s: int, kind: str, mb: int, m: int, num_stages: int) -> tuple[int, int] | None:
    """What an action waits for from another stage: the previous F, or the next stage's B/I."""
    if kind == F:
        return (0, (s - 1) * m + mb) if s > 0 else None
    if kind in (B, I) and s < num_stages - 1:
        return (1, (s + 1) * m + mb)
    return None


def _deadlock(schedule: Schedule, lists: list[list[Action]], steps: list[list[int]],
              pos: list[int], stuck: list[int], p: int, m: int,
              num_stages: int) -> PartitaError:
    parts = []
    for r in stuck[:4]:
        s, kind, mb = action = lists[r][pos[r]]
        need = _input_of(s, kind, mb, m, num_stages)
        assert need is not None, "an action without inputs never blocks"
        dep = Action(s - 1, F, mb) if need[0] == 0 else Action(s + 1, B, mb)
        q = stage_rank(dep.stage, p)
        where = next((steps[q][i] for i, a in enumerate(lists[q])
                      if a.stage == dep.stage and a.microbatch == mb
                      and (a.kind == F) == (dep.kind == F)), None)
        if need[0] == 1 and where is not None:
            dep = lists[q][steps[q].index(where)]
        at = f"rank {q}, step {where}" if where is not None else f"nowhere on rank {q}"
        parts.append(f"rank {r}, step {steps[r][pos[r]]}: {action} waits for {dep} ({at})")
    r = stuck[0]
    return PartitaError(f"schedule deadlocks: {'; '.join(parts)}; rank {r} runs "
                        f"{format_actions(schedule[r], steps[r][pos[r]])}")
