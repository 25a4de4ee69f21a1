"""The pipeline schedules by name: GPipe, 1F1B, interleaved 1F1B and zero-bubble ZB-H1.

Each generator returns `{rank: [Action, ...]}` with compute actions only, in the order the rank
runs them; `add_comms` lowers it to sends and receives, `validate` checks it, the simulator times
it. The orders are the ones torch.distributed.pipelining runs (tests compare them action by
action), so a simulated step and an executed step follow the same program.

[Note: bubble sizes] With p ranks, m micro-batches, forward f and backward b per micro-batch and
rank, and free communication (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", section 2.2):
  GPipe, 1F1B:        step = (m + p - 1)(f + b)                     bubble (p-1)/m of the ideal
  interleaved, v:     step = m(f + b) + (p - 1)(f + b)/v            bubble (p-1)/(v m)
  ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 3.1), B = I + W:
                      step = m(f + i + w) + (p - 1)(f + i - w)      when m >= p, w <= min(f, i)
(the tests check each closed form against the simulator; ZB-H1's holds exactly when each W fits
the F- and I-sized gaps it fills, and the step is longer otherwise).
GPipe holds m micro-batches' activations on every rank; 1F1B at most p - r on rank r.
"""
from __future__ import annotations

from collections.abc import Callable

from partita.planner.errors import PartitaError, unknown_name
from partita.planner.schedules.actions import B, F, I, W, Action, Schedule

NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")


def gpipe(p: int, m: int) -> Schedule:
    """Fill-drain (Huang et al. 2019): all forwards, then all backwards (torch's ScheduleGPipe)."""
    _check_sizes(p, m)
    return {r: [Action(r, F, i) for i in range(m)] + [Action(r, B, i) for i in range(m)]
            for r in range(p)}


def one_f_one_b(p: int, m: int) -> Schedule:
    """PipeDream-Flush 1F1B (Narayanan et al. 2021): p-1-r warm-up forwards, then F/B pairs."""
    _check_sizes(p, m)
    return {r: _one_f_one_b_rank(p, m, r) for r in range(p)}


def _one_f_one_b_rank(p: int, m: int, r: int) -> list[Action | None]:
    warmup = min(p - 1 - r, m)
    ops: list[Action | None] = [Action(r, F, i) for i in range(warmup)]
    for i in range(m - warmup):
        ops += (Action(r, F, warmup + i), Action(r, B, i))
    ops += [Action(r, B, i) for i in range(m - warmup, m)]
    return ops


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B with v chunks per rank (Megatron-LM's `get_schedule_table` order).

    Forwards go in groups of p micro-batches per chunk: chunk (k // p) % v for the k-th forward,
    micro-batch (k // (p v)) p + k % p; backwards visit the chunks in reverse. Rank r warms up
    with 2(p - 1 - r) + (v - 1) p forwards (torch's `_get_warmup_ops`). Needs m % p == 0.
    """
    _check_sizes(p, m, v)
    if m % p:
        raise PartitaError(f"interleaved-1f1b needs the number of micro-batches ({m}) to be a "
                           f"multiple of the pipeline size ({p})")
    return {r: _interleaved_rank(p, m, v, r) for r in range(p)}


def _interleaved_rank(p: int, m: int, v: int, r: int) -> list[Action | None]:
    total = m * v
    warmup = min(2 * (p - 1 - r) + (v - 1) * p, total)

    def forward(k: int) -> Action:
        return Action(((k // p) % v) * p + r, F, (k // (p * v)) * p + k % p)

    def backward(k: int) -> Action:
        return Action((v - 1 - (k // p) % v) * p + r, B, (k // (p * v)) * p + k % p)

    ops: list[Action | None] = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        ops += (forward(warmup + k), backward(k))
    ops += [backward(k) for k in range(total - warmup, total)]
    return ops


def zero_bubble_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023, figure 3): 1F1B with B split into I and W, rank r deferring r W's.

    I (the gradient the previous stage waits for) keeps 1F1B's place; each W runs r micro-batches
    late, so the last ranks fill 1F1B's cool-down bubble with W's. Rank r holds at most
    (p - 1 - r) + 1 + r = p micro-batches from F to W, the same peak as 1F1B's first rank.
    Matches torch's ScheduleInterleavedZeroBubble with one chunk per rank.
    """
    _check_sizes(p, m)
    return {r: _zb_h1_rank(p, m, r) for r in range(p)}


def _zb_h1_rank(p: int, m: int, r: int) -> list[Action | None]:
    warmup, lag = min(p - 1 - r, m), r
    ops: list[Action | None] = [Action(r, F, i) for i in range(warmup)]
    for j in range(m):
        if warmup + j < m:
            ops.append(Action(r, F, warmup + j))
        ops.append(Action(r, I, j))
        if j >= lag:
            ops.append(Action(r, W, j - lag))
    ops += [Action(r, W, j) for j in range(max(0, m - lag), m)]
    return ops


_BUILDERS: dict[str, Callable[[int, int, int], Schedule]] = {
    "gpipe": lambda p, m, v: gpipe(p, m),
    "1f1b": lambda p, m, v: one_f_one_b(p, m),
    "interleaved-1f1b": interleaved_1f1b,
    "zero-bubble": lambda p, m, v: zero_bubble_h1(p, m),
}


def build(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """The schedule called `name` in a scenario (parallel.schedule) for p ranks and m micro-batches."""
    builder = _BUILDERS.get(name)
    if builder is None:
        raise unknown_name("pipeline schedule", name, NAMES)
    if v != 1 and name != "interleaved-1f1b":
        raise PartitaError(f"virtual_stages ({v}) > 1 needs schedule interleaved-1f1b, "
                           f"not {name}")
    return builder(p, m, v)


def _check_sizes(p: int, m: int, v: int = 1) -> None:
    for what, value in (("pipeline size", p), ("number of micro-batches", m),
                        ("virtual stages", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PartitaError(f"{what} must be a positive integer, got {value!r}")
