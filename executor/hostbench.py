"""Host-side costs of a training step measured on this machine: per kernel of a transformer block
(forward with autograd recording, and backward) and per parameter tensor of an optimizer step.

A block: partita's GPT block (planner/models/gpt.py, the executor's model: pre-LN, q/k/v/o
projections, SDPA, GELU MLP) at hidden 8, 2 heads, 4 tokens, so that the kernels themselves cost
next to nothing, through a stack of blocks so that the autograd engine's start is shared. Its host
time (the process's own CPU time, `time.process_time`, so other load on the machine does not count)
is divided by the operators in it that launch a kernel on a GPU: aten ops counted with a dispatch
mode, views, transposes, detach and other metadata-only ops excluded. That is what the simulator
charges per kernel (`op_dispatch_us`, `backward_op_dispatch_us`; simulator/host.py).

An optimizer step: torch.optim.Adam / SGD (momentum) as the executor builds them
(executor/train.py `make_optimizer`), over many small parameters with gradients, process time per
parameter tensor. On a CPU device torch runs the single-tensor loop (the foreach and fused
implementations default on for CUDA tensors only: torch/optim/optimizer.py
`_default_to_fused_or_foreach`), so every tensor pays its own ops' dispatch.

benchmarks/bench_host_dispatch.py prints these for the GPU systems' host.yaml; `partita calibrate`
(executor/microbench.py) records them for `local`.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from partita.executor.train import make_optimizer
from partita.planner.models.gpt import GPTBlock
from partita.planner.modelspec import TransformerDims

# aten ops that only make a new view or metadata: no kernel on a GPU.
METADATA_OPS = ("view", "_unsafe_view", "reshape", "t.default", "transpose", "permute", "expand",
                "as_strided", "unsqueeze", "squeeze", "detach", "alias", "slice", "select",
                "split", "unbind")
STACK = 8                 # blocks in the timed stack
OPTIMIZER_TENSORS = 64    # small parameter tensors in the timed optimizer step
OPTIMIZER_NUMEL = 16


@dataclass(frozen=True)
class BlockHost:
    """Host seconds per kernel of a GPT block's forward and backward, and the kernel counts."""
    forward_per_kernel_s: float
    backward_per_kernel_s: float
    forward_kernels: float
    backward_kernels: float


def median_process_seconds(fn: Callable[[], object], calls: int, repeats: int = 7) -> float:
    """Median over `repeats` of the process CPU seconds per call of `calls` calls."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - t0) / calls)
    return statistics.median(times)


class KernelCount(TorchDispatchMode):
    """Counts the aten ops dispatched inside it that launch a kernel (not METADATA_OPS)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not any(m in str(func) for m in METADATA_OPS):
            self.kernels += 1
        return func(*args, **(kwargs or {}))


def block_host(device: torch.device | None = None, calls: int = 200, repeats: int = 7
               ) -> BlockHost:
    """Host seconds per forward and per backward kernel of partita's GPT block (module docstring)
    on `device` (default the CPU; on CUDA the host's time to issue them, launches included)."""
    device = device or torch.device("cpu")
    d = TransformerDims(arch="gpt", layers=STACK, hidden=8, heads=2, seq_len=4, vocab=16)
    blocks = nn.Sequential(*[GPTBlock(d) for _ in range(STACK)]).to(device)
    x = torch.randn(1, d.seq_len, d.hidden, device=device, requires_grad=True)
    with KernelCount() as fwd_count:
        y = blocks(x)
    loss = y.sum()
    with KernelCount() as bwd_count:
        loss.backward()
    kf = fwd_count.kernels / STACK
    kb = (bwd_count.kernels - 1) / STACK          # less the ones-like seed of the loss gradient
    fwd = median_process_seconds(lambda: blocks(x), calls, repeats)
    both = median_process_seconds(lambda: blocks(x).sum().backward(), calls, repeats)
    return BlockHost(fwd / STACK / kf, max(both - fwd, 0.0) / STACK / kb, kf, kb)


def optimizer_step_per_tensor(name: str, device: torch.device | None = None, calls: int = 100,
                              repeats: int = 7) -> float:
    """Host seconds per parameter tensor of one `name` ("adam" | "sgd") step (module docstring)."""
    device = device or torch.device("cpu")
    params = [nn.Parameter(torch.randn(OPTIMIZER_NUMEL, device=device))
              for _ in range(OPTIMIZER_TENSORS)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = make_optimizer(name, params, 1e-3)
    return median_process_seconds(opt.step, calls, repeats) / OPTIMIZER_TENSORS
