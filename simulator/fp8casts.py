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
(`scaled_exchange`). Where Megatron-LM passes `is_first_microbatch`, the weights are cast with
their transposes once per step and kept: 2 bytes per GEMM weight element beside the 16-bit
weights (`weight_cache_bytes`, counted by `simulator.memory`). Left out: that cast's time (4
bytes per parameter of the chunk: 8.8 GB, about 3 ms, per step of Llama 2 70B at TP 8 x PP 4 on
H100); the scale updates of delayed scaling (its amax reductions are `simulator.fp8amax`'s); the
memory of the saved fp8 activation copies (an fp8 input and its transpose take the 2 bytes per
element a bf16 input does). TE 2.x quantizes the norm output row- and
column-wise in the norm kernel itself where the forward has no all-gather, which moves the
transpose's bytes into the forward; the totals differ by at most a byte per norm output element
from v1.9's.

Current scaling (`training.fp8_recipe: current`: TE 2.x's `Float8CurrentScaling`, Megatron-LM's
`--fp8-recipe tensorwise`) scales each tensor by its own amax, so no cast can start before that
amax is known (TE v2.4 transformer_engine/pytorch/csrc/extensions/):
- every cast is preceded by `nvte_compute_amax` (reads the bf16 tensor: 2 bytes per element) and
  `nvte_compute_scale_from_amax` (one small kernel), then `nvte_quantize_v2` casts (cast.cpp;
  TE's recipe documentation: delayed scaling "reduces tensor reads per quantization from two to
  one" against current scaling, NVIDIA/TransformerEngine PR #2343);
- the norms and activations no longer write fp8: the norm writes bf16 and is quantized after it
  (normalization.cpp: `force_unfused_kernel` for any quantizer but delayed scaling's), and so is
  the activation (activation.cpp: "for current scaling, we need to compute amax first");
- the GELU's backward is no longer fused with the gradient's cast (module/layernorm_mlp.py,
  `_act_func`: "no activation fusion written yet" for current scaling): dgelu writes bf16, then
  amax, scale and cast-transpose;
- under sequence parallelism the amax of each tensor that is all-gathered in fp8 (a
  column-parallel input, a row-parallel output gradient) is all-reduced over the TP group before
  its cast, and the stream waits for it (`with_amax_reduction`, set in
  `_customize_quantizers_float8_current_scaling` of linear.py, layernorm_linear.py and
  layernorm_mlp.py; `process_group->allreduce(...)->wait()`): `Fp8Casts.*_tp_amax_reductions`.
There is no per-pass amax reduction of delayed scaling (`simulator.fp8amax`).

MXFP8 (`training.fp8_recipe: mxfp8`: TE 2.x's `MXFP8BlockScaling`, Megatron-LM's `--fp8-recipe
mxfp8`; Blackwell only, `planner.scenario.fp8_recipe_problem`) scales each block of 32 elements by
its own power of two, an E8M0 byte (OCP Microscaling Formats v1.0). A block runs along a row for
the forward GEMM's operands and along a column for the weight gradient's, so a transposed fp8 copy
cannot be made from the row-wise one: every quantization reads the bf16 tensor once and writes
both directions with their scales, 2 + 1 + 1 + 2/32 bytes per element (`MX_BOTH`), and nothing is
transposed in the backward (TE v2.8 transformer_engine/pytorch/csrc/extensions/):
- the norms write bf16 and a quantization follows (normalization.cpp: `Impl::UNFUSED` for MXFP8
  quantizers unless NVTE_NORM_FWD_USE_CUDNN);
- the activation writes MXFP8 itself (activation.cpp: `Impl::FULLY_FUSED` for MXFP8), and the GELU's
  backward stays fused with the gradient's quantization (module/layernorm_mlp.py `_act_func`:
  dbias_dgelu for delayed scaling and MXFP8);
- no amaxes, so no amax reduction of any kind;
- under sequence parallelism the forward gathers the row-wise data with its scales, and the
  backward gathers the row-parallel output gradients in both directions (`gathered_bytes`):
  2 + 2/32 bytes per element, more than the bf16 gather's 2. The column-wise copy of a gathered
  input is gathered in the backward beside the data gradient's GEMM (linear.py,
  `backward_input_needs_gather`, asynchronous), as Megatron-LM re-gathers a bf16 input: not charged.
Left out: the scales' share of a fused kernel's bytes (dbias_dgelu's 2/32 per element).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from partita.planner import inventory
from partita.planner.enums import FP8_RECIPES
from partita.planner.errors import PartitaError
from partita.planner.inventory import Gemm
from partita.planner.modelspec import TransformerDims

FP8 = 1                 # bytes per fp8 element
BF16 = 2                # bytes per element of the activations and gradients around the GEMMs
CAST_TRANSPOSE = BF16 + 2 * FP8     # read bf16, write fp8 and its transpose
CAST = BF16 + FP8                   # read bf16, write fp8
TRANSPOSE = 2 * FP8                 # read fp8, write its transpose
AMAX = BF16                         # current scaling: nvte_compute_amax reads the bf16 tensor
SCALE = 12                          # nvte_compute_scale_from_amax: reads the fp32 amax, writes the
                                    # scale and its inverse (a kernel at the GPU's shortest)
MX_BLOCK = 32                       # MXFP8: elements per E8M0 scale (1 byte), along one direction
MX_BOTH = BF16 + 2 * FP8 + 2 * FP8 / MX_BLOCK   # read bf16, write row- and column-wise fp8 and scales
MX_ROWWISE = FP8 + FP8 / MX_BLOCK   # bytes per element of one direction's data with its scales
WEIGHT_CACHE = 2 * FP8              # a cached fp8 weight and its transpose, per weight element
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
    forward_tp_amax_reductions: int = 0     # current scaling: amax all-reduces over the TP group
    backward_tp_amax_reductions: int = 0

    @property
    def forward_kernels(self) -> int:
        return len(self.forward_kernel_bytes)

    @property
    def backward_kernels(self) -> int:
        return len(self.backward_kernel_bytes)


def _gemm_casts(g: Gemm, tp: int, sp: bool, gated: bool,
                recipe: str = "delayed") -> tuple[list[float], list[float], float, int, int]:
    """(forward kernels' bytes, backward kernels' bytes, forward bf16 bytes saved, forward and
    backward TP amax all-reduces) of one GEMM (m tokens x k in -> n out on this rank) under the
    scaling `recipe` (see the module docstring)."""
    if recipe == "mxfp8":
        return _mxfp8_gemm_casts(g, tp, sp, gated)
    current = recipe == "current"
    fwd: list[float] = []
    bwd: list[float] = []
    saved = 0.0
    red_f = red_b = 0
    row = g.name in ROW_PARALLEL
    shard = g.m / tp if sp else g.m               # rows a rank holds before a sequence-parallel gather

    def amax(elements: float) -> list[float]:
        """Current scaling's amax and scale kernels before a cast of `elements`."""
        return [AMAX * elements, SCALE] if current else []

    if g.name in NORM_FED or g.name in ACTIVATION_FED:
        rows = shard if g.name in NORM_FED else g.m
        if current:                               # the norm or activation writes bf16, then a cast
            fwd += amax(rows * g.k) + [CAST * rows * g.k]
        else:
            saved += (BF16 - FP8) * rows * g.k    # the norm (on its own rows) or activation writes fp8
        bwd.append(TRANSPOSE * g.m * g.k)
    elif sp:
        fwd += amax((g.m if row else shard) * g.k) + [CAST * (g.m if row else shard) * g.k]
        bwd.append(TRANSPOSE * g.m * g.k)
    else:
        fwd += amax(g.m * g.k) + [CAST_TRANSPOSE * g.m * g.k]
    if current and sp and not row:
        red_f += 1                                # the gathered input's amax, over the TP group
    # the output gradient, m x n on this rank
    if row and sp:
        bwd += amax(shard * g.n) + [CAST * shard * g.n, TRANSPOSE * g.m * g.n]
        red_b += 1 if current else 0              # the gathered gradient's amax
    elif g.name == "mlp_up" and not gated and not current:
        pass                                      # fused into the GELU's backward
    else:
        bwd += amax(g.m * g.n) + [CAST_TRANSPOSE * g.m * g.n]
    return fwd, bwd, saved, red_f, red_b


def _mxfp8_gemm_casts(g: Gemm, tp: int, sp: bool,
                      gated: bool) -> tuple[list[float], list[float], float, int, int]:
    """`_gemm_casts` under MXFP8 block scaling: every quantization writes both directions with their
    scales from one read of the bf16 tensor, so no backward transposes (see the module docstring)."""
    fwd: list[float] = []
    bwd: list[float] = []
    saved = 0.0
    row = g.name in ROW_PARALLEL
    shard = g.m / tp if sp else g.m
    if g.name in ACTIVATION_FED:                  # the activation kernel writes MXFP8 itself
        saved += (BF16 - (MX_BOTH - BF16)) * g.m * g.k
    else:                                         # the norm writes bf16; a quantization follows
        fwd.append(MX_BOTH * (g.m if row else shard) * g.k)
    if g.name == "mlp_up" and not gated:
        pass                                      # fused into the GELU's backward (dbias_dgelu)
    else:                                         # the output gradient: quantized (then gathered)
        bwd.append(MX_BOTH * (shard if row and sp else g.m) * g.n)
    return fwd, bwd, saved, 0, 0


@lru_cache(maxsize=256)
def block_casts(dims: TransformerDims, micro_batch: int, tp: int = 1, cp: int = 1,
                sp: bool = False, *, decoder: bool = False, recipe: str = "delayed") -> Fp8Casts:
    """Transformer Engine's fp8 casts of one block (a T5 decoder block with `decoder`) for one
    micro-batch on one TP rank under the scaling `recipe` (see the module docstring)."""
    if recipe not in FP8_RECIPES:
        raise PartitaError(f"training.fp8_recipe: expected one of {', '.join(FP8_RECIPES)}, "
                           f"got {recipe!r}")
    kind = inventory.block_kind(dims, decoder)
    gemms = inventory.block(dims, kind=kind, micro_batch=micro_batch, tensor=tp, context=cp).gemms
    gated = dims.arch == "llama"
    fwd: list[float] = []
    bwd: list[float] = []
    saved = 0.0
    red_f = red_b = 0
    for g in gemms:
        f, b, s, rf, rb = _gemm_casts(g, tp, sp, gated, recipe)
        fwd += f
        bwd += b
        saved += s
        red_f, red_b = red_f + rf, red_b + rb
    return Fp8Casts(tuple(fwd), tuple(bwd), saved, red_f, red_b)


@lru_cache(maxsize=256)
def weight_cache_bytes(dims: TransformerDims, tp: int, blocks: int,
                       decoder_blocks: int = 0, recipe: str = "delayed") -> float:
    """Bytes of the fp8 weight copies Transformer Engine keeps on one TP rank for `blocks`
    (+ `decoder_blocks`) blocks: every GEMM weight cast to fp8 with its transpose, cached from the
    first micro-batch of a step for the rest and the backward (TE v1.9 module/linear.py: the
    `get_fp8_workspace(cache_name="weight", with_transpose=...)` that `is_first_microbatch` turns
    on; Megatron-Core's TE layers pass it unless --disable-parameter-transpose-cache,
    megatron/core/extensions/transformer_engine.py). Held beside the 16-bit weights. Under MXFP8 each
    copy carries its E8M0 scales (1 byte per `MX_BLOCK` elements: `MX_ROWWISE` per direction)."""
    def per_block(decoder: bool) -> float:
        kind = inventory.block_kind(dims, decoder)
        gemms = inventory.block(dims, kind=kind, micro_batch=1, tensor=tp, context=1).gemms
        return float(sum(g.k * g.n for g in gemms))
    total = blocks * per_block(False) + (decoder_blocks * per_block(True) if decoder_blocks else 0.0)
    per_element = 2 * MX_ROWWISE if recipe == "mxfp8" else WEIGHT_CACHE
    return per_element * total


def gathered_bytes(recipe: str = "delayed", *, backward: bool = False) -> float:
    """Bytes per element a sequence-parallel all-gather of a block moves under fp8: the norm
    outputs (forward) and the row-parallel output gradients (backward). Delayed and current
    scaling gather the fp8 data alone and transpose after (`FP8`); MXFP8 gathers the row-wise data
    with its scales forward, and both directions with theirs backward, where the weight gradient
    needs the column-wise copy (TE v2.8 distributed.py `_all_gather_mxfp8`; linear.py sets the
    gather's usage row-wise only in the forward, base.py `grad_output_preprocess` both)."""
    if recipe != "mxfp8":
        return FP8
    return 2 * MX_ROWWISE if backward else MX_ROWWISE


def scaled_exchange(nbytes: float, all_gather_s, reduce_scatter_s,
                    per_element: float = FP8) -> float:
    """The fraction of a bf16 sequence-parallel exchange of `nbytes` (an all-gather and a
    reduce-scatter of the same tensor) that the fp8 exchange takes: its all-gather moves
    `per_element` / BF16 of the bytes (`gathered_bytes`), the reduce-scatter stays in bf16.
    `all_gather_s` and `reduce_scatter_s` give a collective's seconds for a byte count."""
    bf16 = all_gather_s(nbytes) + reduce_scatter_s(nbytes)
    if bf16 <= 0.0:
        return 1.0
    return (all_gather_s(nbytes * per_element / BF16) + reduce_scatter_s(nbytes)) / bf16
