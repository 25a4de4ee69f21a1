"""Transformer Engine's fp8 casts around a block's linear layers: their bytes and kernels.

Under `training.precision: fp8` a block's GEMMs read fp8 operands (delayed scaling, the E4M3
forward and E5M2 backward recipe), but everything between them stays in bf16: the attention
kernel's output, the residual stream and every gradient a GEMM writes. Transformer Engine
therefore casts each GEMM input to fp8 before its forward GEMM, and each output gradient to fp8
before its backward GEMMs, and keeps a transposed fp8 copy of each for the weight-gradient GEMM.
The kernels, as TE v1.9 runs them without userbuffers (transformer_engine/pytorch/module/):

- `Linear` (the attention output projection; a T5 decoder's cross-attention kv and output
  projections): `fp8_cast_transpose_fused` on its input, read 2 bytes and write 1 + 1 per element
  (linear.py, forward); with sequence parallelism only `cast_to_fp8` (read 2, write 1), and
  `fp8_transpose` of the (gathered) fp8 input in the backward (read 1, write 1).
- `LayerNormLinear` (QKV; a T5 decoder's cross-attention q) and `LayerNormMLP`'s first linear: the
  fused layer norm writes its output in fp8 (`layernorm_fwd_fp8`: 1 byte per element where bf16
  training writes 2), which the sequence-parallel all-gather then moves in fp8; the backward
  transposes it for the weight gradient (`fp8_transpose(ln_out_total)`, read 1, write 1)
  (layernorm_linear.py, layernorm_mlp.py).
- `LayerNormMLP`'s second linear: its activation kernel writes fp8 (`tex.gelu` / `tex.swiglu`
  with the GEMM2_INPUT scale: 1 byte where bf16 writes 2); the backward transposes it
  (`fp8_transpose(gelu_out)`).
- Output gradients (base.py, `grad_output_preprocess`): `fp8_cast_transpose(_bgrad)_fused`, read 2
  and write 1 + 1 per element; where a row-parallel layer's gradient is all-gathered under
  sequence parallelism, `cast_to_fp8` on the local shard (read 2, write 1), the all-gather in fp8,
  then `fp8_transpose` of the gathered gradient (read 1, write 1). `LayerNormMLP`'s first linear
  under GELU fuses the cast into the activation's backward (`fp8_cast_transpose_bgrad_dgelu_fused`:
  it writes 1 + 1 bytes where bf16's dgelu writes 2, so nothing extra); under SwiGLU `dswiglu` runs
  in bf16 and `fp8_cast_transpose_bgrad_fused` follows.

So under sequence parallelism every all-gather of a block (the norm outputs forward, the
row-parallel gradients backward) moves 1 byte per element while the reduce-scatters stay in bf16
(`scaled_exchange`). Left out: the weights' cast and transpose, once per step where Megatron-LM
passes `is_first_microbatch` (4 bytes per parameter of the chunk: 8.8 GB, about 3 ms, per step of
Llama 2 70B at TP 8 x PP 4 on H100); the scale updates of delayed scaling (its amax reductions
are `simulator.fp8amax`'s); the memory of the saved fp8 copies (an fp8 input and its transpose
take the 2 bytes per element a bf16 input does). TE 2.x quantizes the norm output row- and column-wise in the norm kernel itself
where the forward has no all-gather, which moves the transpose's bytes into the forward; the
totals differ by at most a byte per norm output element from v1.9's.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from partita.planner import inventory
from partita.planner.inventory import Gemm
from partita.planner.modelspec import TransformerDims

FP8 = 1                 # bytes per fp8 element
BF16 = 2                # bytes per element of the activations and gradients around the GEMMs
CAST_TRANSPOSE = BF16 + 2 * FP8     # read bf16, write fp8 and its transpose
CAST = BF16 + FP8                   # read bf16, write fp8
TRANSPOSE = 2 * FP8                 # read fp8, write its transpose
# The GEMMs (planner.inventory names) by what feeds them and how tensor parallelism splits them.
NORM_FED = ("qkv", "cross_q", "mlp_up")         # LayerNormLinear / LayerNormMLP's first linear
ACTIVATION_FED = ("mlp_down",)                  # LayerNormMLP's second linear
ROW_PARALLEL = ("attn_out", "cross_out", "mlp_down")


@dataclass(frozen=True)
class Fp8Casts:
    """One block's fp8 cast traffic on one TP rank for one micro-batch: the bytes each extra
    kernel reads and writes (forward, backward), and the bf16 bytes the fused norm and activation
    kernels no longer write because they write fp8 (`forward_saved_bytes`)."""
    forward_kernel_bytes: tuple[float, ...]
    backward_kernel_bytes: tuple[float, ...]
    forward_saved_bytes: float

    @property
    def forward_kernels(self) -> int:
        return len(self.forward_kernel_bytes)

    @property
    def backward_kernels(self) -> int:
        return len(self.backward_kernel_bytes)


def _gemm_casts(g: Gemm, tp: int, sp: bool, gated: bool) -> tuple[list[float], list[float], float]:
    """(forward kernels' bytes, backward kernels' bytes, forward bf16 bytes saved) of one GEMM
    (m tokens x k in -> n out on this rank)."""
    fwd: list[float] = []
    bwd: list[float] = []
    saved = 0.0
    row = g.name in ROW_PARALLEL
    shard = g.m / tp if sp else g.m               # rows a rank holds before a sequence-parallel gather
    if g.name in NORM_FED:
        saved += (BF16 - FP8) * shard * g.k       # the norm writes fp8, on its own rows
        bwd.append(TRANSPOSE * g.m * g.k)
    elif g.name in ACTIVATION_FED:
        saved += (BF16 - FP8) * g.m * g.k         # the activation writes fp8
        bwd.append(TRANSPOSE * g.m * g.k)
    elif sp:
        fwd.append(CAST * (g.m if row else shard) * g.k)
        bwd.append(TRANSPOSE * g.m * g.k)
    else:
        fwd.append(CAST_TRANSPOSE * g.m * g.k)
    # the output gradient, m x n on this rank
    if row and sp:
        bwd += [CAST * shard * g.n, TRANSPOSE * g.m * g.n]
    elif g.name == "mlp_up" and not gated:
        pass                                      # fused into the GELU's backward
    else:
        bwd.append(CAST_TRANSPOSE * g.m * g.n)
    return fwd, bwd, saved


@lru_cache(maxsize=256)
def block_casts(dims: TransformerDims, micro_batch: int, tp: int = 1, cp: int = 1,
                sp: bool = False, *, decoder: bool = False) -> Fp8Casts:
    """Transformer Engine's fp8 casts of one block (a T5 decoder block with `decoder`) for one
    micro-batch on one TP rank (see the module docstring)."""
    kind = inventory.block_kind(dims, decoder)
    gemms = inventory.block(dims, kind=kind, micro_batch=micro_batch, tensor=tp, context=cp).gemms
    gated = dims.arch == "llama"
    fwd: list[float] = []
    bwd: list[float] = []
    saved = 0.0
    for g in gemms:
        f, b, s = _gemm_casts(g, tp, sp, gated)
        fwd += f
        bwd += b
        saved += s
    return Fp8Casts(tuple(fwd), tuple(bwd), saved)


def scaled_exchange(nbytes: float, all_gather_s, reduce_scatter_s) -> float:
    """The fraction of a bf16 sequence-parallel exchange of `nbytes` (an all-gather and a
    reduce-scatter of the same tensor) that the fp8 exchange takes: its all-gather moves
    FP8 / BF16 of the bytes. `all_gather_s` and `reduce_scatter_s` give a collective's seconds for
    a byte count."""
    bf16 = all_gather_s(nbytes) + reduce_scatter_s(nbytes)
    if bf16 <= 0.0:
        return 1.0
    return (all_gather_s(nbytes * FP8 / BF16) + reduce_scatter_s(nbytes)) / bf16
