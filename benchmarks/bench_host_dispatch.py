"""Host seconds PyTorch eager spends per kernel-launching operator (dispatch, autograd recording,
Python, module calls, the view and layout ops around it), measured on this machine's CPU with
tensors so small that the kernels themselves are negligible: what `partita calibrate` measures for
`local` (executor/hostbench.py). GPU systems take the same block's cost measured on a GPU machine's
host, where CUDA's own host work adds to it (benchmarks/gpu_prediction.py --host,
data/calibration/host.yaml).

    python benchmarks/bench_host_dispatch.py

Prints, in microseconds:
- per bare op: a forward chain of linear, add, layer_norm and gelu with autograd recording, and
  the backward of the same chain (the lower bound: no module, no view, no Python around the op);
- per kernel of a whole transformer block: partita's GPT block (planner/models/gpt.py, the
  executor's model: pre-LN, q/k/v/o projections, SDPA, GELU MLP) forward with autograd recording
  and its backward, through a stack of blocks so that the autograd engine's start is shared. The
  block's host time is divided by the operators in it that launch a kernel on a GPU (aten ops
  counted with a dispatch mode; views, transposes, detach and other metadata-only ops excluded):
  what the simulator charges per kernel (`op_dispatch_us`, `backward_op_dispatch_us`) on this
  machine's `local`, measured by executor/hostbench.py, which `partita calibrate` runs;
- per parameter tensor of an Adam and an SGD step (the same module);
- per op of flash-attn's unpadding (bert_padding.unpad_input on q, k and v, the ops
  simulator/unpad.py lists, with autograd recording on the gathers; einops' rearrange and repeat
  written as the reshape and expand they run) and of Megatron-LM 2019's FP16_Optimizer passes over
  its parameter tensors (simulator/fp16optimizer.py), beside the GPT block's per kernel: how the
  host cost of such small functional ops compares with the per-kernel cost of a block's.
Timed in the process's own CPU time (time.process_time), single-threaded, so that other load on
the machine does not count.
"""
from __future__ import annotations

import argparse
import torch
import torch.nn.functional as F

from partita.executor.hostbench import block_host, median_seconds, optimizer_step_per_tensor


def per_op_us(fn, ops: int, repeats: int = 7, calls: int = 2000) -> float:
    return median_seconds(fn, calls, repeats) / ops * 1e6


def unpad_input(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """flash-attn v2.4.2 bert_padding.unpad_input's ops (simulator/unpad.py, UNPAD_CALL)."""
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    int(seqlens.max().item())
    F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    rows = x.reshape(-1, x.shape[-1])
    return torch.gather(rows, 0, indices[:, None].expand(-1, rows.shape[1]))


# Megatron-LM 2019's fp16.FP16_Optimizer around apex FusedAdam, the host ops per parameter tensor
# (simulator/fp16optimizer.py; the Adam update itself left out): the overflow check's
# float(grad.float().sum()), the copy into the fp32 master gradient, the unscale, the norm with
# .item() for clipping, and the copy of the master weight back.
FP16_OPTIMIZER_OPS = ("float", "sum", "item", "copy_", "mul_", "norm", "item", "copy_")


def fp16_optimizer_passes(grads: list[torch.Tensor], master: list[torch.Tensor],
                          inv_scale: float) -> None:
    for g in grads:
        float(g.float().sum())
    for g, m in zip(grads, master):
        m.grad.copy_(g)
    for m in master:
        m.grad.mul_(inv_scale)
    for m in master:
        float(m.grad.norm(2.0).item())
    for g, m in zip(grads, master):
        g.copy_(m)


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
    b = block_host()
    print(f"GPT block: {b.forward_kernels:.0f} forward kernels, {b.backward_kernels:.0f} backward "
          "kernels per block")
    print(f"GPT block: forward {b.forward_per_kernel_s * 1e6:.1f} us per kernel, backward "
          f"{b.backward_per_kernel_s * 1e6:.1f} us per kernel (local's op_dispatch_us, backward_op_dispatch_us)")
    q = torch.ones(1, 8, 4, requires_grad=True)
    mask = torch.ones(1, 8, dtype=torch.bool)

    def unpad_qkv():
        for _ in range(3):
            unpad_input(q, mask)

    ops = 3 * 7
    unpad_us = per_op_us(unpad_qkv, ops, calls=500)
    print(f"unpad_input x 3 (q, k, v): {unpad_us:.1f} us per op ({ops} ops), "
          f"{unpad_us / (b.forward_per_kernel_s * 1e6):.2f} x the GPT block's per kernel")
    grads = [torch.ones(4, 4, dtype=torch.float16) for _ in range(12)]
    master = [torch.ones(4, 4) for _ in range(12)]
    for m in master:
        m.grad = torch.zeros(4, 4)

    def fp16_optimizer_loops():
        fp16_optimizer_passes(grads, master, 1.0 / 1024)

    ops = 12 * len(FP16_OPTIMIZER_OPS)
    loop_us = per_op_us(fp16_optimizer_loops, ops, calls=200)
    print(f"FP16_Optimizer's per-tensor passes (12 tensors): {loop_us:.1f} us per op ({ops} ops), "
          f"{loop_us / (b.forward_per_kernel_s * 1e6):.2f} x the GPT block's per kernel")
    for name in ("adam", "sgd"):
        print(f"optimizer {name}: {optimizer_step_per_tensor(name) * 1e6:.1f} us per parameter tensor "
              "(single-tensor loop, as torch runs it on CPU tensors)")


if __name__ == "__main__":
    # No options: --help prints what the script prints; anything else is a usage error.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
