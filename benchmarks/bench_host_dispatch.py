"""Host seconds PyTorch eager spends per operator before any kernel runs (dispatch, autograd
recording, Python), measured on this machine's CPU with 1-element tensors so that the kernel itself
is negligible: the host-side cost data/calibration/host.yaml quotes for GPU systems beside the
published launch latency.

    python benchmarks/bench_host_dispatch.py

Prints microseconds per op for a forward op with autograd recording (linear, add, layer_norm,
gelu: the ops of a transformer block) and for the backward of the same chain (per op recorded).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F


def per_op_us(fn, ops: int, repeats: int = 7, calls: int = 2000) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / (calls * ops))
    return statistics.median(times) * 1e6


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
    print(f"forward, autograd recording: {fwd:.1f} us per op")
    print(f"forward + backward: {total:.1f} us per forward op (backward {total - fwd:.1f} us per op)")


if __name__ == "__main__":
    main()
