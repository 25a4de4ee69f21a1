"""Fault injection for recovery tests: kill one rank at a chosen step and phase; torchrun restarts.

The run loop (and `save_checkpoint`) call `maybe_inject_fault(step, phase)` at fixed points; nothing
happens unless the variable `PARTITA_FAULT_AT_STEP` is set. Its value is a comma-separated list of
faults, `STEP[:PHASE[:RANK]]`; the i-th fault fires on torchrun attempt i only (attempt =
`TORCHELASTIC_RESTART_COUNT`, 0 on the first launch), so a run with `--max-restarts N` can be hit by
up to N faults and still finish:

    PARTITA_FAULT_AT_STEP=3                     attempt 0: rank 1 dies in the forward of step 3
    PARTITA_FAULT_AT_STEP=3,5:checkpoint:0      ... and attempt 1: rank 0 dies while saving step 5
                                                (after its shards are written, before the manifest)

Phases: forward, backward (inside the pipeline schedule of that step), optimizer (between the
schedule and `optimizer.step()`), checkpoint (inside `save_checkpoint`). The default rank is 1, the
last stage of a 2-stage pipeline, so the kill lands in the middle of a step that rank 0 has begun.
The process leaves with `os._exit(FAULT_EXIT_CODE)`: no cleanup, no flushing of torch state, as a
crash or an OOM kill would.

[Note: torchrun restarts on torch 2.13] By default torchrun shares its rendezvous TCPStore with the
workers' `init_process_group`; after a restart the new workers can read the previous attempt's
addresses from it and gloo fails with "connectFullMesh failed ... Connection refused" (seen here on
CPU; pytorch/pytorch#135712 and #167288 report the same for NCCL). Launchers that pass
`--max-restarts` must add `RESTART_SAFE_ENV` to the workers' environment.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from partita.planner.errors import PartitaError

FAULT_VARIABLE = "PARTITA_FAULT_AT_STEP"
PHASES = ("forward", "backward", "optimizer", "checkpoint")
FAULT_EXIT_CODE = 86
RESTART_SAFE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class Fault:
    step: int
    phase: str = "forward"
    rank: int = 1
    attempt: int = 0            # the torchrun attempt (restart count) it fires on


def parse_faults(text: str) -> tuple[Fault, ...]:
    """`3,5:checkpoint:0` -> (Fault(3, forward, 1, attempt 0), Fault(5, checkpoint, 0, attempt 1))."""
    faults = []
    for attempt, item in enumerate(part.strip() for part in text.split(",")):
        fields = item.split(":")
        if not item or len(fields) > 3:
            raise PartitaError(f"{FAULT_VARIABLE}: expected STEP[:PHASE[:RANK]] items separated by "
                               f"commas, got {text!r}")
        step = _whole(fields[0], "step", text)
        phase = fields[1] if len(fields) > 1 else "forward"
        if phase not in PHASES:
            raise PartitaError(f"{FAULT_VARIABLE}: unknown phase {phase!r} in {text!r} "
                               f"(valid: {', '.join(PHASES)})")
        rank = _whole(fields[2], "rank", text) if len(fields) > 2 else 1
        faults.append(Fault(step=step, phase=phase, rank=rank, attempt=attempt))
    return tuple(faults)


def _whole(field: str, what: str, text: str) -> int:
    if not field.strip().isdigit():
        raise PartitaError(f"{FAULT_VARIABLE}: {what} must be a whole number >= 0, got {field!r} "
                           f"in {text!r}")
    return int(field)


def due_fault(step: int, phase: str, environ: Mapping[str, str]) -> Fault | None:
    """The fault that this process must die of at (step, phase), if any."""
    text = environ.get(FAULT_VARIABLE, "").strip()
    if not text:
        return None
    attempt = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    rank = int(environ.get("RANK", "0") or 0)
    for fault in parse_faults(text):
        if (fault.attempt, fault.step, fault.phase, fault.rank) == (attempt, step, phase, rank):
            return fault
    return None


def maybe_inject_fault(step: int, phase: str, environ: Mapping[str, str] | None = None) -> None:
    """Kill this process now if `PARTITA_FAULT_AT_STEP` asks for it at (step, phase) on this attempt."""
    if phase not in PHASES:
        raise ValueError(f"unknown fault phase {phase!r} (valid: {', '.join(PHASES)})")
    fault = due_fault(step, phase, os.environ if environ is None else environ)
    if fault is None:
        return
    print(f"partita: injected fault: rank {fault.rank} killed in step {step} ({phase}), "
          f"attempt {fault.attempt}", file=sys.stderr, flush=True)
    os._exit(FAULT_EXIT_CODE)
