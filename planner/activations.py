"""Activation bytes of the model-cost inventory's layers: one interface, two accountings.

An `ActivationModel` gives the bytes one layer of `planner.inventory.layers` keeps for its backward
(per micro-batch, on one GPU, under the parallel degrees, recompute and precision of an
`ActivationSettings`). Planner and simulator sum it over the same list of layers; which accounting
they sum is chosen once, by who asks:

- `MODULES` counts the tensors partita's own torch modules (planner/models/) save. It is the
  analytic twin of the meta-device profile (`planner.profiler` measures the same tensors; the tests
  hold the two within 1%), so `planner.costmodel.analytic_profile` and the planner's layer graph
  use it, and a `model: {module: ...}` scenario gets the measured profile instead. It is counted on
  one unsplit device without recompute; the layer graph divides by the TP x CP degree and applies
  recompute itself.
- `MEGATRON` counts what Megatron-LM keeps, after Korthikanti et al. 2022 (Sec. 4.1, Table 2),
  with tensor, sequence and context parallelism, selective and full recompute, and the dropout
  masks partita's modules do not have. The simulator's per-rank memory (`simulator.memory`) uses it.

The two differ on purpose: each is the tensor list of a different implementation of the same model.

[Note: modules] What one micro-batch keeps for backward, per layer, without recompute.
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

[Note: megatron] Korthikanti et al. 2022 (Sec. 4.1, Table 2): s*b*h*(34 + 5*a*s/h) bytes per
transformer layer at 16-bit with no parallelism, (10 + 24/t + 5as/(ht)) with tensor parallelism,
(34 + 5as/h)/t with sequence parallelism; selective recomputation drops the 5as/h attention-score
term, full recomputation keeps only the layer input (2sbh). A flash-style attention kernel never
stores the scores, so with `flash_attention=True` the 5as/h term is absent whatever the recompute
(an fp32 log-sum-exp per query and head instead). Llama has no dropout masks. The embedding keeps
the int64 token ids and its dropout mask; the head its final-norm and head inputs and the fp32
logits of the loss.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from partita.planner.errors import PartitaError
from partita.planner import inventory
from partita.planner.inventory import Layer
from partita.planner.modelspec import TransformerDims

PRECISION_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}   # params and activations
FP32 = 4
INDEX = 8              # int64 token / position / bucket ids


def element_bytes(precision: str) -> int:
    if precision not in PRECISION_BYTES:
        raise PartitaError(f"training.precision: expected one of {', '.join(PRECISION_BYTES)}, "
                           f"got {precision!r}")
    return PRECISION_BYTES[precision]


@dataclass(frozen=True, kw_only=True)
class ActivationSettings:
    """What the activation bytes of a layer depend on besides the model: one micro-batch of
    `micro_batch` sequences, its precision, the parallel degrees and the recompute policy."""

    micro_batch: int
    precision: str
    tensor: int = 1
    context: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    flash_attention: bool = True
    softmax_fp32: bool = False      # stored-score attention keeps its softmax output in fp32
    fused_loss: bool = False        # a fused cross-entropy keeps the logits at their own precision
    eager_norm: bool = False        # RMSNorms as fp32 PyTorch ops (training.norm_kernel: eager)
    attention_unpad: bool = False   # the flash kernel's unpadded output kept beside its padded copy


class ActivationModel(Protocol):
    name: str

    def layer_bytes(self, dims: TransformerDims, layer: Layer, s: ActivationSettings) -> float:
        """Bytes `layer` (one of `inventory.layers(dims)`) keeps for its backward, one micro-batch."""


# ---- MODULES: the tensors partita's torch modules save (see [Note: modules]) ------------------

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


def _module_block(d: TransformerDims, kind: str, b: int, p: int, last: bool) -> int:
    s, t = d.seq_len, b * d.seq_len
    if kind == "decoder":
        return (3 * _norm(d, t, p) + _attention(d, b, s, s, p, bias=True)
                + _attention(d, b, s, s, p, bias=False, cross=True) + _mlp(d, t, p))
    norms = 2 + (1 if last else 0)
    return norms * _norm(d, t, p) + _attention(d, b, s, s, p, bias=d.arch == "t5") + _mlp(d, t, p)


def _module_head(d: TransformerDims, b: int, p: int) -> int:
    t = b * d.head_positions                  # BERT's gathered masked positions (`TransformerDims`)
    loss = t * d.vocab * FP32 + t * INDEX + FP32          # fp32 log-softmax, targets, total weight
    transform = 2 * t * d.hidden * p if d.arch == "bert" else 0   # dense input, GELU input
    return transform + _norm(d, t, p) + t * d.hidden * p + loss


def _module_embedding(d: TransformerDims, b: int, p: int) -> int:
    s = d.seq_len * (2 if d.arch == "t5" else 1)
    ids = b * s * INDEX
    if d.arch in ("gpt", "bert"):
        ids += s * INDEX                                   # position ids
    return ids + (_norm(d, b * s, p) if d.arch == "bert" else 0)


@dataclass(frozen=True)
class ModuleActivations:
    """The tensors partita's torch modules save, on one unsplit device, no recompute."""

    name: str = "modules"

    def layer_bytes(self, dims: TransformerDims, layer: Layer, s: ActivationSettings) -> int:
        if (s.tensor, s.context, s.sequence_parallel, s.recompute) != (1, 1, False, "none"):
            raise ValueError(f"modules activations are counted unsplit without recompute, got {s}")
        b, p = s.micro_batch, element_bytes(s.precision)
        if layer.kind == "embedding":
            return _module_embedding(dims, b, p)
        if layer.kind == "head":
            return _module_head(dims, b, p)
        return _module_block(dims, layer.kind, b, p, last=layer.name == f"encoder.{dims.layers - 1}")


# ---- MEGATRON: Megatron-LM after Korthikanti et al. 2022 (see [Note: megatron]) ---------------

def _has_dropout(dims: TransformerDims) -> bool:
    return bool(dims.dropout)            # Korthikanti counts dropout masks; llama has none


def block_activation_bytes(dims: TransformerDims, micro_batch: int, *, tp: int = 1, sp: bool = False,
                           cp: int = 1, precision: str = "bf16", recompute: str = "none",
                           flash_attention: bool = True, decoder: bool = False,
                           softmax_fp32: bool = False, eager_norm: bool = False,
                           attention_unpad: bool = False) -> float:
    """Bytes one Megatron-LM block keeps for its backward, one micro-batch (Korthikanti et al.
    2022, Sec. 4.1, Table 2). `softmax_fp32`: eager attention soft-maxes in fp32 and autograd keeps
    that output for the softmax's backward, 4 bytes per score in place of the 16-bit 2.
    `eager_norm`: an RMSNorm written as PyTorch ops keeps the fp32 copy of its input (saved by
    pow and by the multiply with 1/rms) and its normalised output before the weight (saved by the
    weight multiply), not its 16-bit input: 4 bytes more per element of each norm.
    `attention_unpad` (`simulator.unpad`): the variable-length flash kernel keeps its own
    (unpadded) output for its backward and the output projection the padded copy pad_input made:
    one attention output more. Its saved q, k and v are the unpadded copies, in place of views of
    the QKV projection's output, which nothing then keeps: the same bytes."""
    e = element_bytes(precision)
    sb = dims.seq_len / cp * micro_batch
    h = dims.hidden
    if recompute == "full":
        return e * sb * h / (tp if sp else 1)
    if recompute == "selective-op":
        return sb * _op_policy_bytes(dims, tp=tp, sp=sp, e=e, flash_attention=flash_attention,
                                     decoder=decoder)
    hd = dims.head_dim
    q_heads, kv_heads = dims.heads // tp, max(dims.kv_heads // tp, 1)
    gated = dims.arch == "llama"
    attn_blocks = 2 if decoder else 1
    sublayers = 3 if decoder else 2
    # replicated across TP ranks unless sequence parallel: norm inputs, GEMM inputs (+ masks)
    replicated = e * (2 * sublayers) * h + (sublayers if _has_dropout(dims) else 0) * h
    if eager_norm:
        replicated += FP32 * sublayers * h
    # TP-sharded: Q, K, V, attention output (O-proj input), MLP up output and activation output
    sharded = e * attn_blocks * ((q_heads + 2 * kv_heads) * hd + q_heads * hd)
    if attention_unpad:
        sharded += e * attn_blocks * q_heads * hd
    sharded += e * ((2 if gated else 1) + 1) * dims.ffn_hidden / tp
    if flash_attention:
        sharded += attn_blocks * 4 * q_heads                   # fp32 logsumexp per query and head
    elif recompute == "none":                                  # scores, softmax, dropout (5as/h)
        score_bytes = (5 if _has_dropout(dims) else 2) + (4 - e if softmax_fp32 else 0)
        sharded += attn_blocks * score_bytes * q_heads * dims.seq_len
    return sb * (replicated / (tp if sp else 1) + sharded)


ROW_PARALLEL = ("attn.o", "cross_attn.o", "mlp.down")     # outputs h wide, reduced across TP


def _op_policy_bytes(dims: TransformerDims, *, tp: int, sp: bool, e: int, flash_attention: bool,
                     decoder: bool) -> float:
    """Bytes per token a block keeps under torchtitan's op-level selective checkpointing
    (`inventory.op_policy_split`): the block's input (the checkpoint's), the outputs of the saved
    linears and of the attention kernel (with a flash kernel its output and fp32 log-sum-exp; with
    stored scores the Q K^T and probabilities x V batched GEMMs' outputs, also kept). Norms,
    activations, RoPE, softmax and dropout are recomputed, so none of their outputs or masks stay.
    A row-parallel projection's output is counted h wide (h/t under sequence parallelism, where
    the reduce-scatter's output is what later ops read)."""
    h, split = dims.hidden, (tp if sp else 1)
    kind = inventory.block_kind(dims, decoder)
    saved, _ = inventory.op_policy_split(inventory.block_linears(dims, kind=kind, tensor=tp))
    q_heads = dims.heads // tp
    kept = e * h / split
    kept += sum(e * (h / split if g.name in ROW_PARALLEL else g.n) for g in saved)
    cores = 2 if decoder else 1
    if flash_attention:
        kept += cores * (e * q_heads * dims.head_dim + FP32 * q_heads)
    else:
        kept += cores * e * q_heads * (dims.seq_len + dims.head_dim)
    return kept


@dataclass(frozen=True)
class MegatronActivations:
    """What Megatron-LM keeps, with tensor / sequence / context parallelism and recompute."""

    name: str = "megatron"

    def layer_bytes(self, dims: TransformerDims, layer: Layer, s: ActivationSettings) -> float:
        tokens = dims.seq_len / s.context * s.micro_batch
        split = s.tensor if s.sequence_parallel else 1         # replicated unless sequence parallel
        if layer.kind == "embedding":       # int64 token ids and the embedding dropout mask
            return INDEX * tokens + (tokens * dims.hidden / split if _has_dropout(dims) else 0.0)
        if layer.kind == "head":            # final-norm and head inputs, fp32 logits in the loss
            e = element_bytes(s.precision)  # (a fused loss keeps them as they are, for its backward)
            logit = e if s.fused_loss else FP32
            rows = dims.head_positions / s.context * s.micro_batch   # BERT: the masked positions
            return 2 * e * rows * dims.hidden / split + logit * rows * dims.vocab / s.tensor
        return block_activation_bytes(dims, s.micro_batch, tp=s.tensor, sp=s.sequence_parallel,
                                      cp=s.context, precision=s.precision, recompute=s.recompute,
                                      flash_attention=s.flash_attention,
                                      decoder=layer.kind == "decoder",
                                      softmax_fp32=s.softmax_fp32, eager_norm=s.eager_norm,
                                      attention_unpad=s.attention_unpad)


MODULES = ModuleActivations()
MEGATRON = MegatronActivations()
