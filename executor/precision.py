"""Dynamic loss scaling for fp16 training, the same in a pipelined run and in one process.

fp16 keeps 5 exponent bits: gradients below 2^-24 flush to zero. Mixed-precision training
(Micikevicius et al. 2018, Sec. 3.2) multiplies the loss by a scale S before the backward, so the
fp16 gradients stay representable, divides the fp32 gradients by S before the optimizer, and skips
the step when any gradient is inf or NaN. The dynamic schedule and its constants are
torch.amp.GradScaler's defaults (S0 = 2^16, halve on overflow, double after 2,000 clean steps).

torch's GradScaler is not used: it checks for overflow on one process only, and a pipelined run
must skip or take the step on every rank together. `LossScaler.unscale` all-reduces the overflow
flag over the whole world (MAX), so every rank makes the same decision, and on one process it
makes exactly the decision the single-process reference makes.

bf16 keeps fp32's exponent range and needs no scaling (its `LossScaler` is disabled: scale 1).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

INIT_SCALE = 2.0 ** 16       # torch.amp.GradScaler init_scale
GROWTH_FACTOR = 2.0          # growth_factor
BACKOFF_FACTOR = 0.5         # backoff_factor
GROWTH_INTERVAL = 2000       # growth_interval (clean steps before the scale doubles)


class LossScaler:
    """The loss scale of one run; `enabled` only for fp16."""

    def __init__(self, precision: str):
        self.enabled = precision == "fp16"
        self.scale = INIT_SCALE if self.enabled else 1.0
        self.clean_steps = 0
        self.skipped = 0

    def scaled(self, loss_fn):
        """`loss_fn` whose result is multiplied by the current scale (what backward sees)."""
        if not self.enabled:
            return loss_fn

        def scaled_loss(output, target):
            return loss_fn(output, target) * self.scale
        return scaled_loss

    def unscale(self, grads: Iterable[torch.Tensor], device: torch.device) -> bool:
        """Divide the gradients by the scale; True if any rank has an inf or NaN gradient."""
        if not self.enabled:
            return False
        bad = torch.zeros(1, device=device)
        for g in grads:
            g.mul_(1.0 / self.scale)
            bad = torch.maximum(bad, (~torch.isfinite(g)).any().float().reshape(1))
        if dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return bool(bad.item())

    def update(self, found_inf: bool) -> None:
        """GradScaler's schedule: back off on overflow, grow after GROWTH_INTERVAL clean steps."""
        if not self.enabled:
            return
        if found_inf:
            self.scale *= BACKOFF_FACTOR
            self.clean_steps = 0
            self.skipped += 1
            return
        self.clean_steps += 1
        if self.clean_steps == GROWTH_INTERVAL:
            self.scale *= GROWTH_FACTOR
            self.clean_steps = 0

    def state_dict(self) -> dict:
        """What a checkpoint keeps, so that a resumed fp16 run scales as the uninterrupted one."""
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.skipped = int(state["skipped"])
