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

A pipeline action: what the executor's pipeline schedules (torch.distributed.pipelining) add to each
stage's forward and backward of a micro-batch: two-rank runs of each schedule runtime on a trivial
layer (`pipeline_timings`), from which executor.pipeline_fit finds the work per action.

A hand-off stall: how much longer an exchange of a send and a receive between two processes takes
when both computed just before it than when both were idle (`handoff_stall`). torch's gloo
process group moves the bytes on a communication thread of each process (gloo's TCP transport
loop); when every core is busy with a process's compute, that thread waits for a core until the
kernel's scheduler preempts the compute (at the latest at the next scheduler tick: 4 ms at
CONFIG_HZ=250) or the compute blocks. The wait grows with the compute it competes with and levels
off at about half a tick; where cores outnumber the busy threads it is about zero.

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
from torch.distributed.pipelining import PipelineStage
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


PIPELINE_MICROBATCHES = (4, 16)     # two schedule lengths: the step's growth per micro-batch
# One schedule of each of torch's two schedule runtimes (torch/distributed/pipelining/schedules.py):
# PipelineScheduleSingle (GPipe, 1F1B: one stage per rank) and PipelineScheduleMulti (interleaved
# 1F1B, zero bubble: several stages per rank, an action list run one action at a time).
PIPELINE_RUNTIMES = {"1f1b": 1, "interleaved-1f1b": 2}      # schedule -> stages per rank


def pipeline_timings(rank: int, world: int, repeats: int = 7) -> dict[str, dict]:
    """The executor's pipeline schedules (torch.distributed.pipelining, one of each runtime in
    PIPELINE_RUNTIMES) timed on a trivial layer, for `executor.pipeline_fit` to find the host work
    per action that the simulator's pipeline model needs to reproduce them. Ranks pair up (0-1,
    2-3, ...; an odd last rank waits), each pair a pipeline over its two ranks, all pairs at once
    as a run's stages would. Per schedule: {"stages_per_rank", "microbatches": PIPELINE_MICROBATCHES,
    "step_s": median step at each, "forward_s", "backward_s": one layer's forward and backward
    alone}. Wall time: where processes outnumber cores, the share of a core each gets counts.
    Collective over the default group (every rank must call it); {} on one process."""
    if world < 2:
        return {}
    group = _my_pair(rank, world)
    out = {}
    for name, per_rank in PIPELINE_RUNTIMES.items():
        if group is not None:
            out[name] = _pair_timings(group, rank % 2, name, per_rank, repeats)
        dist.barrier()
    return out


def _my_pair(rank: int, world: int):
    """This rank's two-rank process group (0-1, 2-3, ...), None for an odd last rank. Collective
    over the default group: every rank creates every pair's group."""
    pairs = [dist.new_group([2 * i, 2 * i + 1]) for i in range(world // 2)]
    return pairs[rank // 2] if rank // 2 < len(pairs) else None


def _pair_timings(group, pair_rank: int, name: str, per_rank: int, repeats: int) -> dict:
    """`pipeline_timings` of schedule `name` on one pair: this rank holds stages pair_rank,
    pair_rank + 2, ... of 2 * per_rank (torch's loop placement)."""
    import torch.distributed.pipelining as pipelining
    from partita.executor.plan import TORCH_SCHEDULES
    layers = [nn.Linear(8, 8) for _ in range(per_rank)]
    stages = [PipelineStage(layer, pair_rank + 2 * i, 2 * per_rank, torch.device("cpu"),
                            group=group) for i, layer in enumerate(layers)]
    cls = getattr(pipelining, TORCH_SCHEDULES[name])
    steps = []
    for m in PIPELINE_MICROBATCHES:
        schedule = cls(stages[0] if per_rank == 1 else stages, n_microbatches=m,
                       loss_fn=lambda y, t: y.sum())
        x, t = torch.randn(2 * m, 8), torch.randn(2 * m, 8)

        def step():
            schedule.step(x) if pair_rank == 0 else schedule.step(target=t)
        step()
        times = []
        for _ in range(repeats):
            dist.barrier(group)
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        steps.append(statistics.median(times))
    x = torch.randn(2, 8)
    layer = layers[0]
    forward = median_seconds(lambda: layer(x), 200, repeats, time.perf_counter)
    both = median_seconds(lambda: layer(x).sum().backward(), 200, repeats, time.perf_counter)
    return {"stages_per_rank": per_rank, "microbatches": list(PIPELINE_MICROBATCHES),
            "step_s": steps, "forward_s": forward, "backward_s": max(both - forward, 0.0)}


HANDOFF_BUSY_S = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)   # compute before each timed exchange
HANDOFF_BYTES = 4096                                # one small activation


def handoff_stall(rank: int, world: int, iterations: int = 100) -> list[list[float]]:
    """[[compute seconds, stall seconds], ...]: the mean time of a send-and-receive exchange
    between paired ranks (0-1, 2-3, ...; all pairs at once; an odd last rank waits) after each rank
    computed for HANDOFF_BUSY_S (matmuls of 64 x 64), less its mean after no compute (module
    docstring). Wall time; collective over the default group; [] on one process."""
    if world < 2:
        return []
    group = _my_pair(rank, world)
    out = []
    if group is not None:
        peer = rank + 1 if rank % 2 == 0 else rank - 1
        idle = _exchange_s(group, peer, 0.0, iterations)
        for busy in HANDOFF_BUSY_S:
            n = min(iterations, max(10, round(iterations * 2e-3 / busy)))   # ~0.2 s at most each
            out.append([busy, max(0.0, _exchange_s(group, peer, busy, n) - idle)])
    dist.barrier()
    return out if group is not None else [[busy, 0.0] for busy in HANDOFF_BUSY_S]


def _exchange_s(group, peer: int, busy_s: float, iterations: int) -> float:
    """Mean seconds to post and complete one isend and one irecv with `peer` after `busy_s` of
    compute, over `iterations` (after one untimed)."""
    a = torch.randn(64, 64)
    send, recv = torch.randn(HANDOFF_BYTES // 4), torch.empty(HANDOFF_BYTES // 4)
    total = 0.0
    dist.barrier(group)
    for i in range(iterations + 1):
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            torch.mm(a, a)
        start = time.perf_counter()
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer, group),
                                        dist.P2POp(dist.irecv, recv, peer, group)])
        for work in works:
            work.wait()
        if i:
            total += time.perf_counter() - start
    return total / iterations
