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

A pipeline action: what the executor's pipeline schedule (torch.distributed.pipelining) adds to each
stage's forward and backward of a micro-batch, from two-stage runs of a trivial layer
(`pipeline_action`).

benchmarks/bench_host_dispatch.py prints the first two for the GPU systems' host.yaml; `partita calibrate`
(executor/microbench.py) records them for `local`.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
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


def median_seconds(fn: Callable[[], object], calls: int, repeats: int = 7,
                           clock: Callable[[], float] = time.process_time) -> float:
    """Median over `repeats` of the seconds per call of `calls` calls: the process's CPU time by
    default, or `clock` (time.perf_counter: wall time, which counts the share of a core the
    process gets where more processes than cores run at once)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - t0) / calls)
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


def block_host(device: torch.device | None = None, calls: int = 200, repeats: int = 7,
               clock: Callable[[], float] = time.process_time) -> BlockHost:
    """Host seconds per forward and per backward kernel of partita's GPT block (module docstring)
    on `device` (default the CPU; on CUDA the host's time to issue them, launches included), by
    `clock` (see `median_seconds`)."""
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
    fwd = median_seconds(lambda: blocks(x), calls, repeats, clock)
    both = median_seconds(lambda: blocks(x).sum().backward(), calls, repeats, clock)
    return BlockHost(fwd / STACK / kf, max(both - fwd, 0.0) / STACK / kb, kf, kb)


def optimizer_step_per_tensor(name: str, device: torch.device | None = None, calls: int = 100,
                              repeats: int = 7, clock: Callable[[], float] = time.process_time
                              ) -> float:
    """Host seconds per parameter tensor of one `name` ("adam" | "sgd") step (module docstring)."""
    device = device or torch.device("cpu")
    params = [nn.Parameter(torch.randn(OPTIMIZER_NUMEL, device=device))
              for _ in range(OPTIMIZER_TENSORS)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = make_optimizer(name, params, 1e-3)
    return median_seconds(opt.step, calls, repeats, clock) / OPTIMIZER_TENSORS


PIPELINE_MICROBATCHES = (4, 16)     # two schedule lengths: the step's slope per micro-batch


def pipeline_action(rank: int, world: int, repeats: int = 7) -> float:
    """Host seconds per pipeline action (one micro-batch's forward or backward on one stage) that
    the executor's schedule (torch.distributed.pipelining's Schedule1F1B) adds to the stage's own
    work: its bookkeeping and the posting of and waiting on each activation's and gradient's
    send and receive. Ranks pair up (0-1, 2-3, ...; an odd last rank waits), each pair a
    two-stage pipeline of an 8 x 8 linear layer, all pairs at once as a run's stages would: the
    step grows by one forward, one backward and two actions' overhead per micro-batch in the
    steady state, so the overhead per action is (slope - forward - backward) / 2, with the slope
    between PIPELINE_MICROBATCHES and the layer's forward and backward timed alone. Wall time:
    where processes outnumber cores, the share of a core each gets counts. Collective over the
    default group (every rank must call it); 0 on one process."""
    if world < 2:
        return 0.0
    pairs = [dist.new_group([2 * i, 2 * i + 1]) for i in range(world // 2)]
    mine = rank // 2 if rank // 2 < len(pairs) else None
    per_action = _pair_overhead(pairs[mine], rank % 2, repeats) if mine is not None else 0.0
    dist.barrier()
    return per_action


def _pair_overhead(group, stage_index: int, repeats: int) -> float:
    """`pipeline_action` on one pair of ranks: this rank's stage `stage_index` of two."""
    layer = nn.Linear(8, 8)
    stage = PipelineStage(layer, stage_index, 2, torch.device("cpu"), group=group)
    steps = []
    for m in PIPELINE_MICROBATCHES:
        schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=lambda y, t: y.sum())
        x, t = torch.randn(2 * m, 8), torch.randn(2 * m, 8)

        def step():
            schedule.step(x) if stage_index == 0 else schedule.step(target=t)
        step()
        times = []
        for _ in range(repeats):
            dist.barrier(group)
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        steps.append(statistics.median(times))
    x = torch.randn(2, 8)
    alone = median_seconds(lambda: layer(x).sum().backward(), 200, repeats,
                                   time.perf_counter)
    (m1, m2), (t1, t2) = PIPELINE_MICROBATCHES, steps
    return max(0.0, ((t2 - t1) / (m2 - m1) - alone) / 2)
