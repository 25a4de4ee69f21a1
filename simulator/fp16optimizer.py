"""Megatron-LM 2019's mixed-precision optimizer step, pass by pass over the parameter tensors.

`training.optimizer_impl: apex-fp16-optimizer` is the optimizer of Megatron-LM at abe36e2e5f
(2019-07-29, the code of Shoeybi et al. 2019): pretrain_gpt2.py wraps apex.optimizers.FusedAdam in
fp16/fp16.py's FP16_Optimizer with dynamic loss scaling and clips the gradients (--clip-grad, 1.0
in its scripts). After the gradient all-reduce it makes one pass per parameter tensor for each of
(`PASSES`, in order):

    overflow check   float(grad.float().sum())        read e, write 4, read 4; the host waits
                     (fp16/loss_scaler.py, DynamicLossScaler._has_inf_or_nan)
    grads to master  master.grad.copy_(grad)          read e, write 4 (fp16util.py)
    unscale          master.grad.mul_(1 / scale)      read 4, write 4 (fp16.py, _downscale_master)
    norm             grad.norm(2), .item()            read 4; the host waits (mpu/grads.py,
                     clip_grad_norm)
    Adam             FusedAdam on the fp32 master     read weight, grad, m, v; write weight, m, v
    master to model  model.copy_(master)              read 4, write e (fp16util.py)

The clip itself, a multiply of every master gradient, runs only when the norm exceeds the limit,
which the step time cannot know, and is left out. A pass whose host waits for the GPU runs tensor
by tensor: each tensor costs the wait's return, then the longer of the host's ops for it and the
GPU's work on it (`HostCosts.optimizer_op_s` per op: small no-grad tensor ops, measured against a
block kernel's host time). Between waits the host runs ahead: those passes cost the longer of all
their host ops and all their GPU work. Multi-tensor optimizers (Megatron-Core, DeepSpeed, torch's
fused AdamW) do the same work in a few kernels over all tensors with one wait
(`simulator.dataparallel.ADAM_BYTES_PER_PARAM`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from partita.simulator.host import HostCosts

FP32 = 4


@dataclass(frozen=True)
class Pass:
    """One loop over the parameter tensors: bytes per element (`e`: the model's 16-bit bytes),
    host ops per tensor, whether the host waits for each tensor's result."""
    name: str
    bytes_per_element: Callable[[int], float]
    ops: int
    waits: bool = False


PASSES = (
    Pass("overflow check", lambda e: e + FP32 + FP32, ops=3, waits=True),   # .float, .sum, float()
    Pass("grads to master", lambda e: e + FP32, ops=1),
    Pass("unscale", lambda e: 2 * FP32, ops=1),
    Pass("norm", lambda e: FP32, ops=2, waits=True),                       # .norm, .item()
    Pass("adam", lambda e: 7 * FP32, ops=1),
    Pass("master to model", lambda e: FP32 + e, ops=1),
)


def bytes_per_parameter(e: int) -> float:
    """Memory traffic of one step per parameter (62 for fp16)."""
    return sum(p.bytes_per_element(e) for p in PASSES)


def step_time(sizes: Sequence[float], element_bytes: int, host: HostCosts,
              device_s: Callable[[float], float]) -> float:
    """Seconds of the optimizer step over parameter tensors of `sizes` elements, with
    `device_s(nbytes)` the GPU's time for one memory-bound kernel moving nbytes."""
    total, ahead_dev, ahead_host = 0.0, 0.0, 0.0
    op_s = host.optimizer_op_s

    def ran_ahead() -> float:
        return ahead_dev + ahead_host if host.synchronous else max(ahead_dev, ahead_host)

    for p in PASSES:
        per = p.bytes_per_element(element_bytes)
        if not p.waits:
            ahead_dev += sum(device_s(per * n) for n in sizes)
            ahead_host += p.ops * op_s * len(sizes)
            continue
        total += ran_ahead()                             # the first wait drains it
        ahead_dev = ahead_host = 0.0
        for n in sizes:
            dev, cpu = device_s(per * n), p.ops * op_s
            total += dev + cpu if host.synchronous else (
                host.launch_blocking_wait_s + max(cpu, dev))
    return total + ran_ahead()
