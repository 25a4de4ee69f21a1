"""The pipeline schedule's vocabulary: `ComputationType` and `Action`, in torch's text form ("2F0").

The same strings as `torch.distributed.pipelining.schedules._Action`, so a schedule written by the
planner can be read by torch's runtime (`_load_csv`) and a torch CSV dump can be read here:

    "2F0"       stage 2, forward, micro-batch 0
    "2B0"       full backward (input and weight gradients together)
    "2I0"       backward-input only (the gradient sent to stage 1)
    "2W0"       backward-weight only (deferrable: nothing waits for it but the optimizer)
    "2SEND_F0"  send stage 2's output activation of micro-batch 0 to stage 3
    "3RECV_F0"  receive it on stage 3; SEND_B / RECV_B carry gradients the other way

A "stage" is a model chunk. With `v` chunks per rank, rank r holds stages r, r+p, r+2p, ...
(Megatron's and torch's looped placement), so `stage_rank(stage, p) == stage % p`.
"""
from __future__ import annotations

import re
from enum import Enum
from typing import NamedTuple

from partita.planner.errors import PartitaError


class ComputationType(str, Enum):
    FORWARD = "F"
    FULL_BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    # Written by torch's lowering passes (FSDP and gradient reduction); carried, never simulated.
    UNSHARD = "UNSHARD"
    RESHARD = "RESHARD"
    REDUCE_GRAD = "REDUCE_GRAD"


F = ComputationType.FORWARD
B = ComputationType.FULL_BACKWARD
I = ComputationType.BACKWARD_INPUT  # noqa: E741 (torch's own shorthand)
W = ComputationType.BACKWARD_WEIGHT
SEND_F = ComputationType.SEND_F
RECV_F = ComputationType.RECV_F
SEND_B = ComputationType.SEND_B
RECV_B = ComputationType.RECV_B

COMPUTE_KINDS = frozenset((F, B, I, W))
COMM_KINDS = frozenset((SEND_F, RECV_F, SEND_B, RECV_B))

# The longest names first so that "SEND_F" is not read as "S".
_ACTION_RE = re.compile(r"(\d+)(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d*)")
_EXAMPLES = "e.g. 2F0, 2B0, 2I0, 2W0, 2SEND_F0, 3RECV_F0"


class Action(NamedTuple):
    """One step of one rank: `str(Action(2, F, 0)) == "2F0"`, and `Action.from_str` reads it back."""
    stage: int
    kind: ComputationType
    microbatch: int | None = None

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.kind.value}{mb}"

    __repr__ = __str__

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @staticmethod
    def from_str(text: str) -> Action | None:
        """The action written as `text`; an empty cell is a bubble (None), as in torch's CSVs."""
        text = text.strip()
        if not text:
            return None
        match = _ACTION_RE.fullmatch(text)
        if match is None:
            raise PartitaError(f"invalid action {text!r}: expected stage, kind, micro-batch "
                               f"({_EXAMPLES})")
        stage, kind, mb = match.groups()
        return Action(int(stage), ComputationType(kind), int(mb) if mb else None)


# A schedule: for each pipeline rank, its actions in program order (None = a bubble, kept only so
# that step numbers match a CSV's columns; the simulator ignores it).
Schedule = dict[int, list[Action | None]]


def stage_rank(stage: int, p: int) -> int:
    """The rank that holds model chunk `stage` under looped placement."""
    return stage % p


def format_actions(actions: list[Action | None], around: int | None = None, width: int = 6) -> str:
    """A rank's list as "1F0,1F1,[1B2],1F2,..." marking step `around`, at most `width` either side."""
    lo, hi = 0, len(actions)
    if around is not None:
        lo, hi = max(0, around - width), min(len(actions), around + width + 1)
    cells = ["" if a is None else str(a) for a in actions[lo:hi]]
    if around is not None and lo <= around < hi:
        cells[around - lo] = f"[{cells[around - lo]}]"
    head = "...," if lo > 0 else ""
    tail = ",..." if hi < len(actions) else ""
    return head + ",".join(cells) + tail
