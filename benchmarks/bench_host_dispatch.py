"""Host seconds PyTorch eager spends per kernel-launching operator (dispatch, autograd recording,
Python, module calls, the view and layout ops around it), measured on this machine's CPU with
tensors so small that the kernels themselves are negligible: the host-side cost
data/calibration/host.yaml quotes for GPU systems beside the published launch latency.

    python benchmarks/bench_host_dispatch.py

Prints, in microseconds:
- per bare op: a forward chain of linear, add, layer_norm and gelu with autograd recording, and
  the backward of the same chain (the lower bound: no module, no view, no Python around the op);
- per kernel of a whole transformer block: partita's GPT block (planner/models/gpt.py, the
  executor's model: pre-LN, q/k/v/o projections, SDPA, GELU MLP) forward with autograd recording
  and its backward, through a stack of blocks so that the autograd engine's start is shared. The
  block's host time is divided by the operators in it that launch a kernel on a GPU (aten ops
  counted with a dispatch mode; views, transposes, detach and other metadata-only ops excluded):
  what the simulator charges per kernel (`op_dispatch_us`, `backward_op_dispatch_us`).
Timed in the process's own CPU time (time.process_time), single-threaded, so that other load on
the machine does not count.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that only make a new view or metadata: no kernel on a GPU.
METADATA_OPS = ("view", "_unsafe_view", "reshape", "t.default", "transpose", "permute", "expand",
                "as_strided", "unsqueeze", "squeeze", "detach", "alias", "slice", "select",
                "split", "unbind")
STACK = 8                 # blocks in the timed stack


def _median_seconds(fn, calls: int, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - t0) / calls)
    return statistics.median(times)


def per_op_us(fn, ops: int, repeats: int = 7, calls: int = 2000) -> float:
    return _median_seconds(fn, calls, repeats) / ops * 1e6


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not any(m in str(func) for m in METADATA_OPS):
            self.kernels += 1
        return func(*args, **(kwargs or {}))


def block_host_us() -> tuple[float, float, float, float]:
    """(forward us per kernel, backward us per kernel, forward kernels, backward kernels) per
    block of partita's GPT block at hidden 8, 2 heads, 4 tokens."""
    from partita.planner.modelspec import TransformerDims
    from partita.planner.models.gpt import GPTBlock
    d = TransformerDims(arch="gpt", layers=STACK, hidden=8, heads=2, seq_len=4, vocab=16)
    blocks = nn.Sequential(*[GPTBlock(d) for _ in range(STACK)])
    x = torch.randn(1, d.seq_len, d.hidden, requires_grad=True)
    with _Count() as fwd_count:
        y = blocks(x)
    loss = y.sum()
    with _Count() as bwd_count:
        loss.backward()
    kf = (fwd_count.kernels - 0) / STACK
    kb = (bwd_count.kernels - 1) / STACK          # less the ones-like seed of the loss gradient
    fwd = _median_seconds(lambda: blocks(x), 300)
    both = _median_seconds(lambda: blocks(x).sum().backward(), 200)
    return (fwd / STACK / kf * 1e6, (both - fwd) / STACK / kb * 1e6, kf, kb)


def main() -> None:
    torch.set_num_threads(1)
    x = torch.ones(1, 1, requires_grad=True)
    w = torch.ones(1, 1, requires_grad=True)
    b = torch.ones(1, requires_grad=True)

    def forward():
        h = F.layer_norm(x, (1,), w[0], b)
        h = F.linear(h, w, b)
        h = F.gelu(h)
        return h + x

    def both():
        forward().sum().backward()

    fwd = per_op_us(forward, 4)
    total = per_op_us(both, 4, calls=500)
    print(f"bare ops: forward, autograd recording: {fwd:.1f} us per op")
    print(f"bare ops: forward + backward: {total:.1f} us per forward op "
          f"(backward {total - fwd:.1f} us per op, the engine's start shared by 4 ops)")
    f_us, b_us, kf, kb = block_host_us()
    print(f"GPT block: {kf:.0f} forward kernels, {kb:.0f} backward kernels per block")
    print(f"GPT block: forward {f_us:.1f} us per kernel, backward {b_us:.1f} us per kernel "
          f"(op_dispatch_us, backward_op_dispatch_us)")


if __name__ == "__main__":
    main()
