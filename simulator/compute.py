"""Compute time of transformer layers on one GPU: matmuls, flash-style attention, elementwise traffic.

Every kernel is a roofline with calibrated efficiencies (data/calibration/compute.yaml):
    matmul       max(2mnk / (peak * eff(ideal time)), bytes / (HBM * mem_eff(bytes)), kernel floor)
    attention    FLOPs of the unmasked part / (peak * attention efficiency)
    elementwise  bytes / (HBM * mem_eff(bytes))   (norms, activations, residual adds, RoPE, loss)
A transformer block is sharded by tensor parallelism `tp` (Megatron column/row split: GEMM n or k
divided by tp, heads divided by tp), context parallelism `cp` (each rank holds seq/cp queries and
attends over the whole sequence through the ring) and sequence parallelism `sp` (norms and residuals
on tokens/tp). Backward matmul work is twice the forward's, split into input-gradient and
weight-gradient GEMMs (the zero-bubble schedule runs them apart). FLOPs match the 6*N*tokens
convention (Narayanan et al. 2021, eq. 3): each GEMM is 2mnk forward, 4mnk backward.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from partita.planner import inventory
from partita.planner.costmodel import element_bytes
from partita.planner.inventory import Gemm
from partita.planner.enums import RECOMPUTE
from partita.planner.errors import PartitaError
from partita.planner.hardware import GPU
from partita.planner.modelspec import TransformerDims
from partita.simulator import eagerops, fp8casts, unpad
from partita.simulator.calibration import Calibration, GpuCalibration

CAUSAL_FRACTION = 0.5      # flash kernels skip the masked upper triangle (FA2/FA3 count it so too)
FLASH_BWD_FACTOR = 2.5     # flash backward: 5 matmuls (recomputes QK^T) against 2 forward (FA2 paper)
ELEMENTWISE_BWD_FACTOR = 2.0   # backward reads the saved input and the incoming gradient, writes one


@dataclass(frozen=True)
class LayerTimes:
    """Seconds for one micro-batch through one layer on one GPU.

    bwd_s = bwd_input_s + bwd_weight_s; recompute_s is extra forward work done before the backward
    (the caller adds it to the backward). `parts` breaks the forward and backward down by kind.
    """
    fwd_s: float
    bwd_s: float
    bwd_input_s: float
    bwd_weight_s: float
    recompute_s: float = 0.0
    parts: dict[str, float] = field(default_factory=dict, hash=False, compare=False)

    def __add__(self, other: "LayerTimes") -> "LayerTimes":
        parts = dict(self.parts)
        for key, value in other.parts.items():
            parts[key] = parts.get(key, 0.0) + value
        return LayerTimes(self.fwd_s + other.fwd_s, self.bwd_s + other.bwd_s,
                          self.bwd_input_s + other.bwd_input_s,
                          self.bwd_weight_s + other.bwd_weight_s,
                          self.recompute_s + other.recompute_s, parts)


def attention_precision(gpu: GPU, precision: str) -> str:
    """Attention runs in bf16 (else fp16) under fp8 training, as Transformer Engine does."""
    if precision != "fp8":
        return precision
    return "bf16" if gpu.supports("bf16") else "fp16"


# A 16-bit matmul peak this many times the fp32 peak or more means tensor cores beside the CUDA
# cores: V100 8x, A100 16x, H100 15x, and 3-4x on the Ampere and Ada parts whose fp32 CUDA-core
# rate is doubled (A10G, L4, L40S). K80 and M60 have no 16-bit rate.
TENSOR_CORE_PEAK_RATIO = 1.5


def cuda_core_matmul(gpu: GPU, precision: str) -> bool:
    """True where `precision`'s matmuls run on a GPU's CUDA cores beside tensor cores that run the
    16-bit ones: fp32 on V100, A100, H100 (TF32 runs on the tensor cores). A device without a
    separate 16-bit rate (a CPU) is not such a GPU."""
    if precision != "fp32" or not gpu.supports("fp32"):
        return False
    half = max((gpu.peak(p) for p in ("fp16", "bf16") if gpu.supports(p)), default=0.0)
    return half >= TENSOR_CORE_PEAK_RATIO * gpu.peak("fp32")


# ---- kernels ----

def gemm_time(m: int, n: int, k: int, gpu: GPU, precision: str, cal: Calibration) -> float:
    """Seconds for one (m x k) @ (k x n) matmul."""
    return _gemm(m, n, k, gpu, precision, cal.gpu(gpu.name))


def _gemm(m: int, n: int, k: int, gpu: GPU, precision: str, g: GpuCalibration,
          batch: int = 1) -> float:
    """One matmul, or `batch` of them stacked along m (a batched GEMM, one launch: attention's
    per-head Q K^T and P V) whose (k x n) operands differ per matrix and are each read."""
    peak = gpu.peak(precision)
    ideal = 2.0 * m * n * k / peak
    compute = ideal / g.matmul_efficiency(precision, ideal, gpu.peak_is_measured(precision))
    nbytes = (m * k + batch * k * n + m * n) * element_bytes(precision)
    memory = nbytes / (gpu.memory_bandwidth_bytes_per_s * g.memory_efficiency(nbytes))
    return max(compute, memory, g.kernel_floor_s)


def elementwise_time(nbytes: float, gpu: GPU, cal: Calibration) -> float:
    """Seconds for a memory-bound kernel that reads and writes `nbytes` in all."""
    return _elementwise(nbytes, gpu, cal.gpu(gpu.name))


def _elementwise(nbytes: float, gpu: GPU, g: GpuCalibration) -> float:
    if nbytes <= 0:
        return 0.0
    t = nbytes / (gpu.memory_bandwidth_bytes_per_s * g.memory_efficiency(nbytes))
    return max(t, g.kernel_floor_s)


def attention_flops(batch: int, heads: int, q_len: int, kv_len: int, head_dim: int) -> float:
    """Forward FLOPs of softmax(QK^T)V counted in full (Megatron convention, no causal discount)."""
    return 4.0 * batch * heads * q_len * kv_len * head_dim


def attention_time(flops: float, causal: bool, gpu: GPU, precision: str, cal: Calibration,
                   *, backward: bool = False, seq_len: float | None = None,
                   head_dim: float | None = None) -> float:
    """Seconds of a flash-style attention kernel given its full forward FLOPs; with the kernel's
    key length and head dimension its efficiency follows the GPU's ramp (simulator/attentionramp)."""
    return _attention(flops, causal, gpu, precision, cal.gpu(gpu.name), backward, seq_len,
                      head_dim)


def _attention(flops: float, causal: bool, gpu: GPU, precision: str, g: GpuCalibration,
               backward: bool, seq_len: float | None = None,
               head_dim: float | None = None, kernel: str = "flash") -> float:
    if flops <= 0:
        return 0.0
    work = flops * (CAUSAL_FRACTION if causal else 1.0)
    peak = gpu.peak(attention_precision(gpu, precision))
    eff = g.attention_efficiency(backward, seq_len, head_dim, causal, kernel)
    factor = FLASH_BWD_FACTOR if backward else 1.0
    return max(factor * work / (peak * eff), g.kernel_floor_s)


# ---- shapes of one block ----

def block_gemms(dims: TransformerDims, micro_batch: int, tp: int = 1, cp: int = 1,
                *, decoder: bool = False) -> list[Gemm]:
    """The GEMM kernels of one block forward on one TP rank (planner.inventory; the attention
    core, which the attention kernel runs, excluded)."""
    kind = inventory.block_kind(dims, decoder)
    return list(inventory.block(dims, kind=kind, micro_batch=micro_batch, tensor=tp, context=cp).gemms)


def _block_elementwise_bytes(dims: TransformerDims, micro_batch: int, tp: int, cp: int, sp: bool,
                             precision: str, decoder: bool, fused: bool = True) -> float:
    """Forward bytes read plus written by the block's memory-bound kernels.

    `fused` (Megatron-LM's fusions, Narayanan et al. 2021, Sec. 4.2): the MLP's bias and activation
    are one kernel (bias-GeLU, or the SwiGLU) and each residual sublayer's bias, dropout and add one
    (bias-dropout-add: read two, write one; its 1-byte dropout mask is left out). Unfused (Megatron's
    --no-bias-gelu-fusion --no-bias-dropout-fusion, Megatron-LM 2019, a Hugging Face model run
    eagerly): the bias add on the MLP's hidden activation is a kernel of its own (read and write),
    and each residual sublayer runs a bias add (read, write), dropout (read, write, 1-byte mask)
    and the add (read two, write one): 4e + 1 bytes more per element than the fused kernel. A
    llama block has no biases and no dropout: unfused, its SwiGLU's SiLU and multiply are two
    kernels (read gate, write; read two, write one) and its residual adds are as fused."""
    e = element_bytes(precision)
    tokens = micro_batch * dims.seq_len / cp
    norm_tokens = tokens / tp if sp else tokens      # without SP every TP rank repeats them
    h = dims.hidden
    sublayers = 3 if decoder else 2
    norm_elements, rope_elements = eagerops.norm_rope_elements(dims, micro_batch, tp, cp, sp,
                                                              decoder)
    norms = 2 * norm_elements                        # read x, write normed x
    residuals = sublayers * 3 * norm_tokens * h      # read two, write one
    ffn_local = dims.ffn_hidden / tp
    act = (3 if dims.arch == "llama" else 2) * tokens * ffn_local   # SwiGLU reads gate and up
    rope = 2 * rope_elements                         # read q and k, write them rotated
    unfused = 0.0
    if not fused and dims.arch == "llama":
        unfused = e * 2 * tokens * ffn_local
    elif not fused:
        unfused = e * (2 * tokens * ffn_local + sublayers * 4 * norm_tokens * h) \
            + sublayers * norm_tokens * h
    return e * (norms + residuals + act + rope) + unfused


def _self_attention_core(dims: TransformerDims, micro_batch: int, tp: int,
                         cp: int) -> tuple[Gemm, Gemm]:
    """The inventory's Q K^T and probabilities x V of one block's self-attention on one TP rank
    (batch x heads/tp x seq/cp query rows against the whole sequence)."""
    layer = inventory.block(dims, micro_batch=micro_batch, tensor=tp, context=cp)
    scores, context = layer.attention[:2]
    return scores, context


def _block_attention_flops(dims: TransformerDims, micro_batch: int, tp: int,
                           cp: int) -> float:
    return float(sum(g.flops for g in _self_attention_core(dims, micro_batch, tp, cp)))


def _unfused_attention(dims: TransformerDims, micro_batch: int, tp: int, cp: int, precision: str,
                       gpu: GPU, g: GpuCalibration, eager: bool = False,
                       softmax_fp32: bool = False) -> tuple[float, float, float, float]:
    """Forward and backward seconds of attention with a stored score matrix (no causal skip), and
    the batched GEMMs' share of each (cuBLAS matmuls, which a training run sustains as it does the
    block's other GEMMs: `simulator.stagecosts.sustained`).

    QK^T and PV run as batched GEMMs (stacked here: same FLOPs, one launch; each matrix reads
    its own K or V, `_gemm`'s `batch`); the scores
    (b * heads/tp * s_q * s_kv elements) are written by QK^T, read and written by the fused
    scale-mask-softmax, read and written by dropout (plus a 1-byte mask), and read by PV.
    Backward: two GEMMs per forward GEMM, dropout and softmax backward over the same elements.
    `eager`: the scale, the mask and the softmax are separate kernels, as Megatron-LM's GPT-2
    attention ran them before its fused softmax (mpu/transformer.py, 2019: scores / sqrt(hn);
    torch.mul(scores, ltor_mask) - 10000.0 * (1.0 - ltor_mask); Softmax; dropout): forward
    2e + 2e + 2e + 2e + (2e + 1) bytes per score, backward dropout (2e + 1), softmax (3e), the
    mask's multiply (2e) and the scale (2e); the subtraction of a constant passes its gradient.
    `softmax_fp32` (eager only; Megatron-LM's --attention-softmax-in-fp32, which
    --apply-query-key-layer-scaling turned on, and Hugging Face's eager attention,
    softmax(..., dtype=torch.float32)): the scores are cast to fp32 (read e, write 4), scaled,
    masked and soft-maxed in fp32 (4 bytes in place of e) and cast back (read 4, write e) before
    dropout; the backward runs the casts' gradients too. Megatron's fused kernel (not eager) reads
    and writes 16-bit scores whatever the flag says.
    """
    qk, pv = _self_attention_core(dims, micro_batch, tp, cp)
    e = element_bytes(precision)
    scores = float(qk.m * qk.n)
    batch = qk.m // (dims.seq_len // cp)          # micro-batch x heads on this rank, a matrix each
    fwd = (_gemm(*qk[1:], gpu, precision, g, batch=batch)
           + _gemm(*pv[1:], gpu, precision, g, batch=batch))
    bwd = 2 * fwd
    matmul_f, matmul_b = fwd, bwd
    if eager:
        f = 4 if softmax_fp32 else e                  # element bytes of the scale-mask-softmax chain
        casts = (e + 4, 4 + e) if softmax_fp32 and e != 4 else ()
        fwd += sum(_elementwise(scores * b, gpu, g)
                   for b in (2 * f, 2 * f, 2 * f, 2 * f, 2 * e + 1) + casts)
        bwd += sum(_elementwise(scores * b, gpu, g)
                   for b in (2 * e + 1, 3 * f, 2 * f, 2 * f) + casts)
    else:
        fwd += _elementwise(scores * (2 * e + 2 * e + 1), gpu, g)
        bwd += _elementwise(scores * (3 * e + 1 + 3 * e), gpu, g)
    return fwd, bwd, matmul_f, matmul_b


# ---- layers ----

def layer_times(dims: TransformerDims, micro_batch: int, tp: int, sp: bool, cp: int,
                precision: str, recompute: str, gpu: GPU, cal: Calibration,
                *, decoder: bool = False, attention: str = "flash",
                fused_elementwise: bool = True, softmax_fp32: bool = False,
                norm_kernel: str = "fused", rope_kernel: str = "fused",
                early_stop: bool = False, attention_unpad: str = "none",
                fp8_recipe: str = "delayed") -> LayerTimes:
    """One transformer block (a t5 decoder block with decoder=True) for one micro-batch.

    attention "flash": one fused kernel that never stores the scores (Dao et al. 2022), the GPU's
    best generation of it (Hopper: FlashAttention-3, Shah et al. 2024, or cuDNN's); "flash2":
    FlashAttention-2 (Dao 2023) itself, as PyTorch's SDPA flash backend and flash-attn 2.x run it;
    "flash1": FlashAttention (Dao et al. 2022) as flash-attn 1.x ran it, at its measured rate
    relative to FlashAttention-2 (`GpuCalibration.attention_efficiency`);
    "unfused": two batched GEMMs around a stored score matrix with a fused scale-mask-softmax and
    dropout (Megatron-LM before flash attention; Korthikanti et al. 2022, Sec. 4.1); "eager": the
    same with the scale, mask and softmax as separate kernels (Megatron-LM 2019).
    `fused_elementwise`: bias-GeLU and bias-dropout-add as single kernels (see
    `_block_elementwise_bytes`); `softmax_fp32`: eager attention's softmax in fp32 (see
    `_unfused_attention`); `norm_kernel` "eager", `rope_kernel` "complex", "rotate-half" or
    "matrix": the RMSNorms and RoPE as PyTorch ops, at their measured traffic
    (`simulator.eagerops`). Under fp8, Transformer Engine's casts of the GEMM inputs and output
    gradients to fp8 add to the elementwise work (`simulator.fp8casts`; `fp8_recipe` delayed or
    current scaling, or MXFP8 block scaling). `early_stop`: full
    recompute stops where the block's last saved tensor is saved again (`early_stop_skip`).
    `attention_unpad` ("per-tensor", "per-layer"): q, k and v are unpadded and the output padded
    around a variable-length flash kernel (`unpad_times`)."""
    if recompute not in RECOMPUTE:
        raise PartitaError(f"training.recompute: expected one of {', '.join(RECOMPUTE)}, "
                           f"got {recompute!r}")
    g = cal.gpu(gpu.name)
    gemm_f = gemm_i = gemm_w = 0.0
    for gm in block_gemms(dims, micro_batch, tp, cp, decoder=decoder):
        gemm_f += _gemm(gm.m, gm.n, gm.k, gpu, precision, g)
        gemm_i += _gemm(gm.m, gm.k, gm.n, gpu, precision, g)     # dX = dY @ W^T
        gemm_w += _gemm(gm.k, gm.n, gm.m, gpu, precision, g)     # dW = X^T @ dY
    causal = dims.arch in ("gpt", "llama") or decoder
    attn_mm_f = attn_mm_b = 0.0       # unfused attention's batched GEMMs (in attn_f, attn_b)
    if attention in ("unfused", "eager"):
        eager = attention == "eager"
        attn_f, attn_b, attn_mm_f, attn_mm_b = _unfused_attention(
            dims, micro_batch, tp, cp, precision, gpu, g, eager, softmax_fp32)
        if decoder:                     # cross-attention: the same score matrix
            attn_f, attn_b, attn_mm_f, attn_mm_b = (2 * x for x in (attn_f, attn_b, attn_mm_f,
                                                                    attn_mm_b))
    else:
        flops = _block_attention_flops(dims, micro_batch, tp, cp)
        # Each kernel runs over seq/cp keys (context parallelism's ring hands it one chunk a step).
        shape = (dims.seq_len / cp, dims.head_dim, attention)
        attn_f = _attention(flops, causal, gpu, precision, g, False, *shape)
        attn_b = _attention(flops, causal, gpu, precision, g, True, *shape)
        if decoder:                                     # cross-attention: never masked
            attn_f += _attention(flops, False, gpu, precision, g, False, *shape)
            attn_b += _attention(flops, False, gpu, precision, g, True, *shape)
    ew_bytes = _block_elementwise_bytes(dims, micro_batch, tp, cp, sp, precision, decoder,
                                        fused_elementwise)
    eager_f, eager_b = eagerops.extra_bytes(dims, micro_batch, tp, cp, sp, decoder,
                                            element_bytes(precision), norm=norm_kernel,
                                            rope=rope_kernel)
    ew_f = _elementwise(ew_bytes + eager_f, gpu, g)
    ew_b = _elementwise(ELEMENTWISE_BWD_FACTOR * ew_bytes + eager_b, gpu, g)
    if precision == "fp8":
        casts = fp8casts.block_casts(dims, micro_batch, tp, cp, sp, decoder=decoder,
                                     recipe=fp8_recipe)
        ew_f = (_elementwise(ew_bytes + eager_f - casts.forward_saved_bytes, gpu, g)
                + sum(_elementwise(b, gpu, g) for b in casts.forward_kernel_bytes))
        ew_b += sum(_elementwise(b, gpu, g) for b in casts.backward_kernel_bytes)
    if attention_unpad != "none":
        pad_f, pad_b = unpad_times(dims, micro_batch, tp, cp, precision, gpu, g, attention_unpad)
        ew_f, ew_b = ew_f + pad_f, ew_b + pad_b
    fwd = gemm_f + attn_f + ew_f
    redo_gemm = 0.0
    if recompute == "selective-op":
        redo_gemm = op_policy_recompute_gemm_s(dims, micro_batch, tp, cp, decoder, gpu, precision, g)
    recompute_s = {"none": 0.0, "selective": attn_f, "selective-op": redo_gemm + ew_f,
                   "full": fwd}[recompute]
    bwd_input = gemm_i + attn_b + ew_b
    parts = {"gemm_fwd": gemm_f, "attention_fwd": attn_f, "elementwise_fwd": ew_f,
             "gemm_bwd_input": gemm_i, "gemm_bwd_weight": gemm_w, "attention_bwd": attn_b,
             "elementwise_bwd": ew_b}
    if attn_mm_f:
        parts["attention_matmul_fwd"], parts["attention_matmul_bwd"] = attn_mm_f, attn_mm_b
    if recompute in ("selective", "selective-op"):     # what the recompute re-runs, by kind
        parts["recompute_gemm"] = redo_gemm
        parts["recompute_attention"] = attn_f if recompute == "selective" else 0.0
    elif recompute == "full" and early_stop:
        skip_gemm, skip_ew = early_stop_skip(dims, micro_batch, tp, cp, sp, precision, gpu, g,
                                             decoder, fused_elementwise)
        if skip_gemm or skip_ew:
            recompute_s = fwd - skip_gemm - skip_ew
            parts["recompute_gemm"] = gemm_f - skip_gemm
            parts["recompute_attention"] = attn_f
    return LayerTimes(fwd, bwd_input + gemm_w, bwd_input, gemm_w, recompute_s, parts)


def unpad_gather_times(dims: TransformerDims, micro_batch: int, tp: int, cp: int,
                       precision: str, gpu: GPU, g: GpuCalibration) -> tuple[float, ...]:
    """Device seconds of the forward gathers of q, k and v into their unpadded form
    (`simulator.unpad`)."""
    b = unpad.unpad_bytes(dims, micro_batch, tp, cp, element_bytes(precision))
    return tuple(_elementwise(n, gpu, g) for n in b.gathers)


def unpad_times(dims: TransformerDims, micro_batch: int, tp: int, cp: int, precision: str,
                gpu: GPU, g: GpuCalibration, form: str) -> tuple[float, float]:
    """(forward, backward) device seconds of one block's unpadding and padding around a
    variable-length flash kernel in `form` (`simulator.unpad`): the gathers, the output's zero-fill and
    index-put, the kernels over the mask (each at the kernel floor), and their backwards."""
    b = unpad.unpad_bytes(dims, micro_batch, tp, cp, element_bytes(precision))
    fwd = (sum(unpad_gather_times(dims, micro_batch, tp, cp, precision, gpu, g))
           + sum(_elementwise(n, gpu, g) for n in b.pad_forward)
           + unpad.small_forward_kernels(form) * g.kernel_floor_s)
    return fwd, sum(_elementwise(n, gpu, g) for n in b.backward)


def early_stop_skips(dims: TransformerDims, fused_elementwise: bool = True) -> tuple[bool, bool]:
    """(the MLP output projection, the residual add after it): what a full recompute with early
    stop leaves out of a block (`early_stop_skip`). A pre-norm block without dropout: both; with
    dropout, the add alone where it is a kernel of its own (a fused bias-dropout-add saves its mask
    and runs); a post-norm block (bert): neither."""
    if dims.arch == "bert":
        return False, False
    if dims.dropout:
        return False, not fused_elementwise
    return True, True


def early_stop_skip(dims: TransformerDims, micro_batch: int, tp: int, cp: int, sp: bool,
                    precision: str, gpu: GPU, g: GpuCalibration, decoder: bool,
                    fused_elementwise: bool = True) -> tuple[float, float]:
    """Forward seconds (GEMM, elementwise) a full recompute with early stop does not run again.

    torch.utils.checkpoint(use_reentrant=False) stops the recompute when the last tensor the
    backward needs has been saved again (set_checkpoint_early_stop, the default since PyTorch 2.1).
    Autograd saves an op's inputs before its kernel runs and its outputs after, so the recompute
    halts at the first op whose inputs are the block's last saved tensors. In a pre-norm block (gpt,
    llama, t5) that is the MLP's output projection, which saves its input and weight: neither
    that GEMM nor the residual add after it runs again. A dropout after the projection saves its
    mask, an output, so with `dims.dropout` the GEMM and the dropout run and only the add is
    skipped. A post-norm block (bert) ends in a layer norm that saves its mean and rstd, outputs:
    the recompute runs to the end (`early_stop_skips`). Checked on PyTorch's op stream
    (tests/unit/simulator/test_recompute_early_stop.py)."""
    linear, add = early_stop_skips(dims, fused_elementwise)
    add_s = 0.0
    if add:
        tokens = micro_batch * dims.seq_len / cp
        add_tokens = tokens / tp if sp else tokens
        add_s = _elementwise(3 * add_tokens * dims.hidden * element_bytes(precision), gpu, g)
    if not linear:
        return 0.0, add_s
    down = block_gemms(dims, micro_batch, tp, cp, decoder=decoder)[-1]
    return _gemm(down.m, down.n, down.k, gpu, precision, g), add_s


def op_policy_recompute_gemm_s(dims: TransformerDims, micro_batch: int, tp: int, cp: int,
                               decoder: bool, gpu: GPU, precision: str, g: GpuCalibration) -> float:
    """Forward seconds of the linears torchtitan's op-level selective checkpointing recomputes
    (every second one a block runs, `inventory.op_policy_split`), each its own GEMM. The rest of
    its recompute is the block's elementwise forward (norms, activations, RoPE, residual adds); the
    attention kernel's outputs are kept."""
    kind = inventory.block_kind(dims, decoder)
    linears = inventory.block_linears(dims, kind=kind, micro_batch=micro_batch, tensor=tp,
                                      context=cp)
    _, redo = inventory.op_policy_split(linears)
    return sum(_gemm(gm.m, gm.n, gm.k, gpu, precision, g) for gm in redo)


def embedding_times(dims: TransformerDims, micro_batch: int, tp: int, sp: bool, cp: int,
                    precision: str, gpu: GPU, cal: Calibration) -> LayerTimes:
    """Token (+ position, + token-type) lookup; its backward accumulates into the tables only.

    With a vocab-parallel table every TP rank looks up all tokens (rows it does not own read as
    zero) before the all-reduce or reduce-scatter, which is communication and not counted here.
    """
    g = cal.gpu(gpu.name)
    tokens = micro_batch * dims.seq_len / cp * (2 if dims.arch == "t5" else 1)
    tables = {"gpt": 2, "bert": 3}.get(dims.arch, 1)          # word (+ position) (+ token type)
    nbytes = element_bytes(precision) * tokens * dims.hidden * (tables + 1)   # reads + one write
    fwd = _elementwise(nbytes, gpu, g)
    bwd = _elementwise(ELEMENTWISE_BWD_FACTOR * nbytes, gpu, g)
    return LayerTimes(fwd, bwd, 0.0, bwd, 0.0, {"elementwise_fwd": fwd, "elementwise_bwd": bwd})


def loss_forward_bytes(e: int) -> tuple[float, ...]:
    """Bytes per logit element of each memory-bound kernel of the vocab-parallel cross-entropy
    forward, as Megatron-LM runs it (megatron/core/tensor_parallel/cross_entropy.py,
    VocabParallelCrossEntropy): logits.float() (read e, write 4), max over the vocab (read 4),
    in-place subtract of the max (read 4, write 4), exp in place (4 + 4), sum (4), in-place divide
    to the softmax kept for backward (4 + 4): e + 36 bytes in six kernels.
    PyTorch's F.cross_entropy under autocast (FSDP, nanoGPT) moves the same in all, split
    differently: forward the fp32 cast (e + 4) and log_softmax's max, sum-of-exp and write passes
    (4 + 4 + 8): e + 20; backward the nll gradient (write 4), log_softmax backward (sum of the
    gradient 4, then read 4 + 4, write 4) and the cast back (4 + e): 28 + e. Both total 48 + 2e."""
    return (e + 4.0, 4.0, 8.0, 8.0, 4.0, 8.0)


def loss_backward_bytes(e: int) -> tuple[float, ...]:
    """Bytes per logit element of the cross-entropy backward (same file,
    calculate_gradients): the one-hot update is a gather (negligible), grad_input.mul_(grad_output)
    reads and writes fp32 (8), and the backward of .float() casts to the activation dtype (4 + e)."""
    return (8.0, 4.0 + e)


def fused_loss_bytes(e: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Bytes per logit element of a fused cross-entropy (forward, backward): the forward reads the
    logits once, with an online softmax (max and sum of exponentials in one pass), and writes one
    number per row; the backward reads them again and writes the gradient, in place
    (flash-attn's flash_attn/ops/triton/cross_entropy.py, cross_entropy_fwd_kernel and
    cross_entropy_bwd_kernel; apex's xentropy likewise reads and writes the logits at their own
    precision). Megatron-Core's --cross-entropy-loss-fusion is not such a kernel: its jit-fused
    functions still cast the logits to fp32 and keep their softmax for the backward
    (megatron/core/fusions/fused_cross_entropy.py, tensor_parallel/cross_entropy.py)."""
    return (float(e),), (2.0 * e,)


def head_times(dims: TransformerDims, micro_batch: int, tp: int, sp: bool, cp: int,
               precision: str, gpu: GPU, cal: Calibration, *,
               fused_loss: bool = False) -> LayerTimes:
    """Final norm, LM head GEMM (the inventory's, vocab split over tp) and the cross-entropy loss
    (fp32, unfused; `fused_loss`: one fused kernel each way, `fused_loss_bytes`), on the head's
    positions (`TransformerDims.head_positions`: BERT's masked ones when gathered). BERT's MLM
    transform GEMM (hidden x hidden, in the inventory's head) is not timed."""
    g = cal.gpu(gpu.name)
    e = element_bytes(precision)
    head = inventory.layers(dims, micro_batch=micro_batch, tensor=tp, context=cp)[-1]
    tokens, vocab_local, _ = next(gm for gm in head.gemms if gm.name == "lm_head")[1:]
    gemm_f = _gemm(tokens, vocab_local, dims.hidden, gpu, precision, g)
    gemm_i = _gemm(tokens, dims.hidden, vocab_local, gpu, precision, g)
    gemm_w = _gemm(dims.hidden, vocab_local, tokens, gpu, precision, g)
    norm_tokens = tokens / tp if sp else tokens
    norm = 2 * e * norm_tokens * dims.hidden
    logits = tokens * vocab_local
    fwd_bytes, bwd_bytes = (fused_loss_bytes(e) if fused_loss
                            else (loss_forward_bytes(e), loss_backward_bytes(e)))
    ew_f = _elementwise(norm, gpu, g) + sum(_elementwise(logits * b, gpu, g) for b in fwd_bytes)
    ew_b = _elementwise(ELEMENTWISE_BWD_FACTOR * norm, gpu, g) + sum(
        _elementwise(logits * b, gpu, g) for b in bwd_bytes)
    if dims.head_positions < dims.seq_len:
        # BERT's gather of the masked positions (index_select: read and write those rows); its
        # backward zero-fills the gradient of every position, then adds the rows back (index_add)
        rows = e * tokens * dims.hidden
        ew_f += _elementwise(2 * rows, gpu, g)
        ew_b += (_elementwise(e * micro_batch * dims.seq_len / cp * dims.hidden, gpu, g)
                 + _elementwise(2 * rows, gpu, g))
    bwd_input = gemm_i + ew_b
    parts = {"gemm_fwd": gemm_f, "elementwise_fwd": ew_f, "gemm_bwd_input": gemm_i,
             "gemm_bwd_weight": gemm_w, "elementwise_bwd": ew_b}
    return LayerTimes(gemm_f + ew_f, bwd_input + gemm_w, bwd_input, gemm_w, 0.0, parts)


def block_matmul_flops(dims: TransformerDims, micro_batch: int, *, decoder: bool = False) -> float:
    """Forward matmul FLOPs of one whole block (all TP ranks, attention core included)."""
    return float(inventory.block(dims, kind=inventory.block_kind(dims, decoder),
                                 micro_batch=micro_batch).fwd_flops)
