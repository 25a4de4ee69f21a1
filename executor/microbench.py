"""The timed kernels of `partita calibrate`, run by each of N processes at once on this machine.

Every rank measures its own device while the others do the same (so each sees the share of cores,
caches and memory bandwidth it has during a run): matmul rates by size and precision, copy
bandwidth by size, a GPT block's elementwise kernels, scaled-dot-product attention, and the
shortest time of one autograd-recorded op, and the host time per kernel of a GPT block and per
parameter tensor of an optimizer step (executor.hostbench).
Then rank 0 and rank 1 time a send/recv ping-pong and all ranks an all-reduce, by message size; on
a CPU, pairs of ranks run the executor's pipeline schedule and time exchanges after compute
(executor.hostbench `pipeline_timings`, `handoff_stall`).
`rank_main` writes each rank's results to `<out>/rank<R>.json`; executor.measure_machine combines them.

Times are medians of `repeats` batches, each batch long enough (`min_s`) for the clock; collectives
agree on the batch length through a broadcast from rank 0 so that no rank waits on another.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from partita.executor.hostbench import (block_host, handoff_stall, optimizer_step_per_tensor,
                                        pipeline_timings)
from partita.planner.enums import OPTIMIZERS

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Plan:
    """What to measure (sizes per precision, bytes, message sizes) and for how long."""
    device: str                               # "cpu" | "cuda"
    backend: str                              # "gloo" | "nccl"
    threads: int                              # torch intra-op threads per process (CPU)
    matmul_sizes: dict[str, list[int]]        # precision -> square sizes n (n x n x n)
    copy_bytes: list[int]                     # bytes of the source tensor of each copy
    elementwise_tokens: list[int]             # rows of the transformer elementwise mix
    elementwise_hidden: int
    message_bytes: list[int]                  # send/recv and all-reduce buffer sizes
    attention_shape: tuple[int, int, int, int]   # (batch, heads, seq, head_dim)
    min_s: float                              # length of one timed batch
    repeats: int


def rank_main(rank: int, world: int, plan_json: str, store: str, out: str) -> None:
    """One process: measure, then write `<out>/rank<R>.json`."""
    plan = Plan(**json.loads(plan_json))
    torch.set_num_threads(plan.threads)
    if plan.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(plan.backend, init_method=f"file://{store}", rank=rank,
                            world_size=world)
    try:
        result = measure(plan, rank, world)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")
        # Tear down together: a gloo rank whose peer closed its sockets first can abort in C++
        # ("terminate called without an active exception") on the way out.
        _barrier()
    finally:
        dist.destroy_process_group()


def measure(plan: Plan, rank: int, world: int) -> dict:
    device = torch.device(plan.device, rank) if plan.device == "cuda" else torch.device("cpu")
    _barrier()
    result = {"rank": rank, "threads": torch.get_num_threads(),
              "matmul": {p: matmul_rates(n, p, device, plan) for p, n in plan.matmul_sizes.items()},
              "copy": copy_rates(plan.copy_bytes, device, plan),
              "elementwise": elementwise_times(plan.elementwise_tokens, plan.elementwise_hidden,
                                               device, plan),
              "attention": attention_times(plan.attention_shape, device, plan),
              "op_floor_s": op_floor(device, plan),
              "op_dispatch_s": op_dispatch(device, plan),
              # wall time, all ranks at once: a rank's share of the cores counts, as in a run
              "block_host": asdict(block_host(device, repeats=plan.repeats,
                                              clock=time.perf_counter)),
              "optimizer_step_per_tensor_s": {
                  name: optimizer_step_per_tensor(name, device, repeats=plan.repeats,
                                                  clock=time.perf_counter)
                  for name in OPTIMIZERS}}
    _barrier()
    if world > 1:
        result["p2p"] = p2p_times(plan.message_bytes, rank, device, plan)
        result["allreduce"] = allreduce_times(plan.message_bytes, device, plan)
        if plan.device == "cpu":
            result["pipeline_timings"] = pipeline_timings(rank, world, 3 * plan.repeats)
            result["handoff_stall"] = handoff_stall(rank, world, iterations=40 * plan.repeats)
    return result


# ---------------------------------------------------------------- timing

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, plan: Plan) -> float:
    """Median seconds per call over `repeats` batches of at least `min_s` each (after a warm-up)."""
    calls = max(1, math.ceil(plan.min_s / _one_call(fn, device, plan.min_s)))
    return statistics.median(_batch(fn, calls, device) for _ in range(plan.repeats))


def _one_call(fn: Callable[[], object], device: torch.device, min_s: float) -> float:
    """Seconds of one call after a warm-up call: the least of up to three (a busy machine can
    stall any single call), or the first if that already fills a batch."""
    fn()
    best = math.inf
    for _ in range(3):
        best = min(best, max(_batch(fn, 1, device), 1e-7))
        if best >= min_s:
            break
    return best


def _batch(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / calls


# ---------------------------------------------------------------- one device

def matmul_rates(sizes: list[int], precision: str, device: torch.device, plan: Plan) -> list[list]:
    """[[m, n, k, FLOP/s], ...] of square matmuls (2mnk FLOPs each)."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    out = []
    for n in sizes:
        a = torch.randn(n, n, device=device).to(DTYPES[precision])
        b = torch.randn(n, n, device=device).to(DTYPES[precision])
        c = torch.empty(n, n, device=device, dtype=DTYPES[precision])
        seconds = time_call(lambda: torch.mm(a, b, out=c), device, plan)
        out.append([n, n, n, 2.0 * n ** 3 / seconds])
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def copy_rates(sizes: list[int], device: torch.device, plan: Plan) -> list[list]:
    """[[bytes moved, bytes/s], ...]: a copy of B bytes reads B and writes B (moves 2B)."""
    out = []
    for nbytes in sizes:
        src = torch.ones(nbytes // 4, device=device)
        dst = torch.empty_like(src)
        seconds = time_call(lambda: dst.copy_(src), device, plan)
        out.append([2 * nbytes, 2 * nbytes / seconds])
    return out


def elementwise_times(tokens: list[int], hidden: int, device: torch.device, plan: Plan) -> list[list]:
    """[[tokens, hidden, forward s, forward + backward s], ...] of one GPT block's memory-bound
    kernels as training runs them (fp32, autograd recording): two layer norms and two residual
    adds on (tokens, hidden), GELU (GPT-2's tanh form, planner/models/gpt.py) on (tokens, 4 hidden)."""
    out = []
    for t in tokens:
        x = torch.randn(t, hidden, device=device, requires_grad=True)
        up = torch.randn(t, 4 * hidden, device=device, requires_grad=True)
        w1, w2 = (torch.ones(hidden, device=device, requires_grad=True) for _ in range(2))
        b1, b2 = (torch.zeros(hidden, device=device, requires_grad=True) for _ in range(2))
        grads = (torch.randn(t, hidden, device=device), torch.randn(t, 4 * hidden, device=device))

        def forward():
            r1 = x + F.layer_norm(x, (hidden,), w1, b1)
            return r1 + F.layer_norm(r1, (hidden,), w2, b2), F.gelu(up, approximate="tanh")

        def both():
            torch.autograd.backward(forward(), grads)

        out.append([t, hidden, time_call(forward, device, plan), time_call(both, device, plan)])
    return out


def attention_times(shape: tuple[int, int, int, int], device: torch.device, plan: Plan) -> dict:
    """Causal fp32 scaled-dot-product attention as training runs it (autograd recording): the
    forward, and forward + backward, in seconds."""
    b, h, s, d = shape
    q, k, v = (torch.randn(b, h, s, d, device=device, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, h, s, d, device=device)

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    return {"shape": list(shape), "forward_s": time_call(forward, device, plan),
            "forward_backward_s": time_call(both, device, plan)}


def op_floor(device: torch.device, plan: Plan) -> float:
    """Seconds of the smallest op as a training step runs it: a 1x8 @ 8x8 matmul recorded by
    autograd (dispatch, autograd node, allocation); no arithmetic to speak of."""
    x = torch.randn(1, 8, device=device)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    return time_call(lambda: x @ w, device, plan)


def op_dispatch(device: torch.device, plan: Plan) -> float:
    """Host seconds to issue the op of `op_floor` without waiting for it: the Python, dispatcher
    and autograd work (and, on CUDA, the launch) that the host must do before the device can run
    the op. On a CPU device the op runs inside the call, so this is the op's time."""
    x = torch.randn(1, 8, device=device)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    calls = max(1, math.ceil(plan.min_s / _one_call(lambda: x @ w, device, plan.min_s)))
    calls = min(calls, 512)            # stay well inside a CUDA launch queue (1,024 entries)
    times = []
    for _ in range(plan.repeats):
        _sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            x @ w
        times.append((time.perf_counter() - start) / calls)
        _sync(device)
    return statistics.median(times)


# ---------------------------------------------------------------- between processes

def _agreed_calls(fn: Callable[[], object], device: torch.device, plan: Plan) -> int:
    """Calls per timed batch, chosen by rank 0 from a warm-up and broadcast to all."""
    fn()
    _sync(device)
    once = min(_batch(fn, 1, device) for _ in range(3))
    calls = torch.tensor([max(1, math.ceil(plan.min_s / max(once, 1e-7)))], device=device)
    dist.broadcast(calls, src=0)
    return int(calls.item())


def _collective_time(fn: Callable[[], object], device: torch.device, plan: Plan) -> float:
    calls = _agreed_calls(fn, device, plan)
    times = []
    for _ in range(plan.repeats):
        _barrier()
        times.append(_batch(fn, calls, device))
    return statistics.median(times)


def p2p_times(sizes: list[int], rank: int, device: torch.device, plan: Plan) -> list[list]:
    """[[bytes, one-way seconds], ...] from a rank 0 <-> rank 1 ping-pong (round trip / 2)."""
    out = []
    for nbytes in sizes:
        buf = torch.ones(max(nbytes // 4, 1), device=device)

        def pingpong():
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        seconds = _collective_time(pingpong, device, plan)
        out.append([buf.numel() * 4, seconds / 2])
    return out


def allreduce_times(sizes: list[int], device: torch.device, plan: Plan) -> list[list]:
    """[[bytes per rank, seconds], ...] of a sum all-reduce over every rank."""
    out = []
    for nbytes in sizes:
        buf = torch.zeros(max(nbytes // 4, 1), device=device)     # zeros: sums stay finite
        seconds = _collective_time(lambda: dist.all_reduce(buf), device, plan)
        out.append([buf.numel() * 4, seconds])
    return out


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def plan_to_json(plan: Plan) -> str:
    return json.dumps(asdict(plan))


def main(argv: list[str] | None = None) -> None:
    """`python -m partita.executor.microbench --rank R --world N --plan PLAN.json --store FILE --out DIR`."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m partita.executor.microbench")
    for flag in ("--rank", "--world"):
        parser.add_argument(flag, type=int, required=True)
    for flag in ("--plan", "--store", "--out"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    rank_main(args.rank, args.world, Path(args.plan).read_text(encoding="utf-8"), args.store,
              args.out)


if __name__ == "__main__":
    main()
