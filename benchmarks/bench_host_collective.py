"""Host seconds per rank of a collective called with a Python list of per-rank tensors.

    .venv/bin/python benchmarks/bench_host_collective.py [--ranks 2048]

DeepSpeed 0.3's ZeRO-3 gathered every parameter with a loop over the ranks that narrows a flat
buffer into one view per rank and compares the index with `torch.distributed.get_rank(group)`
(partition_parameters.py `_allgather_param`), then called `torch.distributed.all_gather` on that
list; its gradient scatter built the list the same way without the rank check
(`_reduce_scatter_gradient`). This script times those two loops, and one `copy_` per rank (the
host side of the copies torch's NCCL process group makes between the list and its flat buffer),
on this machine's CPU with torch's gloo backend in one process, and prints microseconds per rank:
the numbers data/calibration/training.yaml keeps as `list_collective_host_us`. The copies' GPU
time is not measured here (no GPU needed); the simulator charges each as a memory-bound kernel
that reads and writes the rank's share (at least `kernel_floor_us`, data/calibration/compute.yaml).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

ELEMENTS_PER_RANK = 64
REPEATS = 20


def gather_loop(flat: torch.Tensor, ranks: int, group) -> list[torch.Tensor]:
    parts = []
    for i in range(ranks):
        parts.append(flat.narrow(0, ELEMENTS_PER_RANK * i, ELEMENTS_PER_RANK))
        if i == dist.get_rank(group=group):
            pass
    return parts


def scatter_loop(grad: torch.Tensor, ranks: int) -> list[torch.Tensor]:
    parts, numel = [], grad.numel()
    for i in range(ranks):
        start = i * ELEMENTS_PER_RANK
        if start + ELEMENTS_PER_RANK <= numel:
            parts.append(grad.view(-1).narrow(0, start, ELEMENTS_PER_RANK))
        else:
            parts.append(torch.zeros(ELEMENTS_PER_RANK, dtype=grad.dtype))
    return parts


def copies(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    for a, b in zip(dst, src):
        a.copy_(b, non_blocking=True)


def per_rank_us(fn, ranks: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best / ranks * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2048, help="list length (ranks in the group)")
    n = ap.parse_args().ranks
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{Path(tmp) / 'store'}", rank=0,
                                world_size=1)
        try:
            group = dist.new_group([0])
            flat = torch.zeros(n * ELEMENTS_PER_RANK, dtype=torch.float16)
            src = [t.clone() for t in gather_loop(flat, n, group)]
            dst = gather_loop(flat, n, group)
            print(f"torch {torch.__version__}, {n} ranks, best of {REPEATS}, microseconds per rank:")
            print(f"  all_gather list loop      {per_rank_us(lambda: gather_loop(flat, n, group), n):6.2f}")
            print(f"  reduce_scatter list loop  {per_rank_us(lambda: scatter_loop(flat, n), n):6.2f}")
            print(f"  copy_ dispatch            {per_rank_us(lambda: copies(dst, src), n):6.2f}"
                  "  (host side only; on a GPU each copy is also a kernel)")
        finally:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
