"""Analytic per-layer costs of a transformer (no torch): parameters, FLOPs, activation and output bytes.

Parameters and GEMMs are sums over the model-cost inventory (`planner.inventory`); this module
adds the activation and output bytes and assembles the `ModelProfile`. This is the simulator's fast path; `planner.profiler` measures the same quantities on the torch
models (planner/models/) and the tests hold the two together: parameters exactly, FLOPs and
activation bytes to well under 1%.

FLOPs: 2*m*n*k per GEMM, attention scores and attention-over-values included, causal masking not
discounted, backward = 2 x forward (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters using Megatron-LM", Sec. 5.1); embeddings, norms and element-wise ops
count 0. The LM head GEMM belongs to the "head" layer.

[Note: activation bytes] What one micro-batch keeps for backward, per layer, without recompute.
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", Sec.
4.1) count s*b*h*(34 + 5*a*s/h) bytes per GPT layer at 16-bit: attention 11sbh + 5as^2b (QKV input
2, q and k 4, softmax output 2as^2b, its dropout mask as^2b, dropout output 2as^2b, v 2, output
projection input 2, dropout mask 1), MLP 19sbh (input 2, GELU input 8, GELU output 8, dropout mask
1), layer norms 4sbh. We assume a fused (flash / memory-efficient) attention kernel, as every
current GPU stack uses: it keeps q, k, v, its output (which is also the output projection's input)
and an fp32 log-sum-exp per row, so the 5as^2b term is not stored. Our models have no dropout, so
the three masks go too: a GPT layer at 16-bit keeps 32sbh (34 minus the two 1-byte sbh masks),
plus the fp32 norm statistics and log-sum-exp that the paper leaves out. Each term is a tensor our
torch modules save (see planner/models/), so Llama (SwiGLU keeps 4 ffn-wide tensors, RoPE its
cos/sin tables), BERT, T5 (ReLU keeps 1 ffn-wide tensor; the relative position bias and its bucket
ids) and grouped-query attention (k, v at kv width) follow from the same accounting. Activations
are stored at the precision's element size (4 bytes fp32/tf32, 2 bytes otherwise: fp8 training
keeps bf16 activations), so fp32 doubles the 16-bit terms; statistics are always fp32, indices int64.
The head includes the fp32 log-softmax of the loss (t * vocab * 4 bytes).
"""
from __future__ import annotations

from partita.planner import inventory
from partita.planner.errors import PartitaError
from partita.planner.modelspec import TransformerDims
from partita.planner.inventory import Gemm, total_params
from partita.planner.profile import LayerProfile, ModelProfile

__all__ = ["Gemm", "analytic_profile", "block_gemms", "element_bytes", "head_gemms", "layer_params",
           "model_flops_per_step", "total_params"]

PRECISION_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}   # params and activations
FP32 = 4
INDEX = 8              # int64 token / position / bucket ids


def element_bytes(precision: str) -> int:
    if precision not in PRECISION_BYTES:
        raise PartitaError(f"training.precision: expected one of {', '.join(PRECISION_BYTES)}, "
                           f"got {precision!r}")
    return PRECISION_BYTES[precision]


# ---- parameters and GEMMs: sums over planner.inventory ----------------------------------------

def layer_params(d: TransformerDims) -> list[tuple[str, str, int]]:
    """(name, kind, parameters) per pipeline layer (planner.inventory.layers)."""
    return [(layer.name, layer.kind, layer.params) for layer in inventory.layers(d)]


def block_gemms(dims: TransformerDims, micro_batch: int, *, kind: str | None = None,
                tensor: int = 1, context: int = 1) -> list[Gemm]:
    """The forward GEMMs of one block ("block"; for t5 "encoder" (default) or "decoder") on one
    tensor-parallel rank, the attention core (`*.scores`, `*.context`) included."""
    kind = kind or inventory.block_kind(dims)
    layer = inventory.block(dims, kind=kind, micro_batch=micro_batch, tensor=tensor, context=context)
    return list(layer.gemms + layer.attention)


def head_gemms(d: TransformerDims, micro_batch: int) -> list[Gemm]:
    return list(inventory.layers(d, micro_batch=micro_batch)[-1].gemms)


def _fwd_flops(d: TransformerDims, kind: str, micro_batch: int) -> int:
    if kind == "embedding":
        return 0
    if kind == "head":
        return sum(g.flops for g in head_gemms(d, micro_batch))
    return inventory.block(d, kind=kind, micro_batch=micro_batch).fwd_flops


def model_flops_per_step(dims: TransformerDims, global_batch: int) -> float:
    """Forward + backward FLOPs of one optimizer step of `global_batch` sequences, no recompute.
    For GPT with ffn = 4h this is exactly Narayanan et al. 2021, eq. 3 without recomputation:
    72 B s l h^2 (1 + s/(6h) + V/(12 l h))."""
    per_seq = sum(3 * _fwd_flops(dims, kind, 1) for _, kind, _ in layer_params(dims))
    return float(per_seq * global_batch)


# ---- activation bytes (see [Note: activation bytes]) -----------------------------------------

def _norm(d: TransformerDims, t: int, p: int) -> int:
    """A norm keeps its input and fp32 statistics (LayerNorm mean + rstd, RMSNorm rstd)."""
    stats = 1 if d.arch in ("llama", "t5") else 2
    return t * d.hidden * p + stats * t * FP32


def _attention(d: TransformerDims, b: int, s_q: int, s_kv: int, p: int, *, bias: bool,
               cross: bool = False) -> int:
    """Input of the projections (query and memory inputs for cross-attention), q, k, v, kernel
    output (also the o_proj input) + fp32 log-sum-exp; T5's bias values and bucket ids; Llama's
    RoPE tables."""
    qw, kvw, h = d.heads * d.head_dim, d.kv_heads * d.head_dim, d.hidden
    inputs = b * s_q * h + (b * s_kv * h if cross else 0)
    elems = inputs + 2 * b * s_q * qw + 2 * b * s_kv * kvw
    extra = b * d.heads * s_q * FP32
    if bias:
        extra += d.heads * s_q * s_kv * p + s_q * s_kv * INDEX
    if d.arch == "llama":
        extra += 2 * s_q * d.head_dim * p
    return elems * p + extra


def _mlp(d: TransformerDims, t: int, p: int) -> int:
    """MLP input plus the ffn-wide tensors: GELU in/out (2), ReLU out (1), SwiGLU gate, up,
    silu(gate), product (4)."""
    wide = {"llama": 4, "t5": 1}.get(d.arch, 2)
    return t * d.hidden * p + wide * t * d.ffn_hidden * p


def _block_activation(d: TransformerDims, kind: str, b: int, p: int, last: bool) -> int:
    s, t = d.seq_len, b * d.seq_len
    if kind == "decoder":
        return (3 * _norm(d, t, p) + _attention(d, b, s, s, p, bias=True)
                + _attention(d, b, s, s, p, bias=False, cross=True) + _mlp(d, t, p))
    norms = 2 + (1 if last else 0)
    return norms * _norm(d, t, p) + _attention(d, b, s, s, p, bias=d.arch == "t5") + _mlp(d, t, p)


def _head_activation(d: TransformerDims, b: int, p: int) -> int:
    t = b * d.seq_len
    loss = t * d.vocab * FP32 + t * INDEX + FP32          # fp32 log-softmax, targets, total weight
    transform = 2 * t * d.hidden * p if d.arch == "bert" else 0   # dense input, GELU input
    return transform + _norm(d, t, p) + t * d.hidden * p + loss


def _embedding_activation(d: TransformerDims, b: int, p: int) -> int:
    s = d.seq_len * (2 if d.arch == "t5" else 1)
    ids = b * s * INDEX
    if d.arch in ("gpt", "bert"):
        ids += s * INDEX                                   # position ids
    return ids + (_norm(d, b * s, p) if d.arch == "bert" else 0)


def _activation(d: TransformerDims, name: str, kind: str, b: int, p: int) -> int:
    if kind == "embedding":
        return _embedding_activation(d, b, p)
    if kind == "head":
        return _head_activation(d, b, p)
    return _block_activation(d, kind, b, p, last=name == f"encoder.{d.layers - 1}")


def _output_bytes(d: TransformerDims, kind: str, b: int, p: int) -> int:
    if kind == "head":
        return b * d.seq_len * d.vocab * p
    chain = 2 * d.seq_len if d.arch == "t5" else d.seq_len
    return b * chain * d.hidden * p


# ---- the profile -----------------------------------------------------------------------------

def analytic_profile(dims: TransformerDims, *, micro_batch: int, precision: str,
                     name: str = "") -> ModelProfile:
    """Per-layer costs of one micro-batch of `micro_batch` sequences of dims.seq_len tokens."""
    if micro_batch < 1:
        raise PartitaError(f"training.micro_batch: must be >= 1, got {micro_batch}")
    p = element_bytes(precision)
    layers = []
    for lname, kind, params in layer_params(dims):
        fwd = _fwd_flops(dims, kind, micro_batch)
        layers.append(LayerProfile(
            name=lname, kind=kind, params=params, param_bytes=params * p, fwd_flops=float(fwd),
            bwd_flops=float(2 * fwd), matmul_flops=float(fwd),
            activation_bytes=_activation(dims, lname, kind, micro_batch, p),
            output_bytes=_output_bytes(dims, kind, micro_batch, p)))
    return ModelProfile(model=name or dims.name or dims.arch, method="analytic", precision=precision,
                        micro_batch=micro_batch, seq_len=dims.seq_len, layers=tuple(layers))
