"""The model-cost inventory: a transformer as one list of layers, each with its parameter tensors
and its forward GEMMs (no torch).

Every model statistic is a sum over this list (the idea of Calculon's llm/layers.py): the planner's
per-layer parameters and FLOPs (`planner.costmodel`), the simulator's GEMM kernels
(`simulator.compute`), its memory and data-parallel parameter counts (`simulator.memory`,
`simulator.stagecosts`) and ZeRO-3's tensor-by-tensor gathers all read it. The torch models
(planner/models/) hold the same tensors: the tests count each against `nn.Module.parameters()`.

GEMMs are listed as Megatron-LM runs them on one tensor-parallel rank: one fused QKV projection,
one fused gate+up projection (Llama), column-parallel GEMMs split on n and row-parallel ones on k
(Shoeybi et al. 2019, Sec. 3); key/value heads replicate when fewer than the TP degree. The
attention core (Q K^T and probabilities x V, as batched GEMMs folding batch x heads into m) is
listed apart in `Layer.attention`: its FLOPs count (Narayanan et al. 2021, Sec. 5.1: no causal
discount) but a flash kernel, not a GEMM, runs it. Under context parallelism each rank projects
its own seq_len / context tokens and attends over the whole sequence.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from partita.planner.modelspec import TransformerDims

T5_BUCKETS = 32        # T5's relative_attention_num_buckets
BLOCK_KINDS = ("block", "encoder", "decoder")


class Gemm(NamedTuple):
    """One forward matrix multiply, (m x k) @ (k x n)."""

    name: str
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True, kw_only=True)
class Tensor:
    """One parameter tensor. `vocab`: a vocabulary-sized table split over the tensor-parallel ranks
    (Megatron's vocab-parallel embedding and LM head). `stack`: a tensor of a whole encoder or
    decoder stack that the stack's first (relative position bias) or last (final norm) block holds."""

    name: str
    numel: int
    vocab: bool = False
    stack: bool = False


@dataclass(frozen=True, kw_only=True)
class Layer:
    """One pipeline layer: its parameter tensors and its forward GEMMs for one micro-batch on one
    tensor-parallel rank."""

    name: str                       # "embedding", "block.3", "encoder.0", "decoder.5", "head"
    kind: str                       # embedding | block | encoder | decoder | head
    tensors: tuple[Tensor, ...]
    gemms: tuple[Gemm, ...] = ()    # run as GEMM kernels
    attention: tuple[Gemm, ...] = ()   # the attention core (QK^T, PV): a flash kernel runs it

    @property
    def params(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def vocab_params(self) -> int:
        """Parameters in vocabulary-sized tables (split over the tensor-parallel ranks)."""
        return sum(t.numel for t in self.tensors if t.vocab)

    @property
    def fwd_flops(self) -> int:
        """Forward matmul FLOPs, attention core included."""
        return sum(g.flops for g in self.gemms) + sum(g.flops for g in self.attention)


# ---- parameter tensors ----

def _attention_tensors(d: TransformerDims, prefix: str, *, bias: bool, fused: bool) -> tuple[Tensor, ...]:
    """Q, K, V and output projections: fused QKV (with bias) for gpt/bert, apart for llama/t5."""
    h, hq, hkv = d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim
    if fused:
        qkv = hq + 2 * hkv
        return (Tensor(name=f"{prefix}.qkv.weight", numel=h * qkv), Tensor(name=f"{prefix}.qkv.bias", numel=qkv),
                Tensor(name=f"{prefix}.proj.weight", numel=hq * h), Tensor(name=f"{prefix}.proj.bias", numel=h))
    return tuple(Tensor(name=f"{prefix}.{n}.weight", numel=size) for n, size in
                 (("q", h * hq), ("k", h * hkv), ("v", h * hkv), ("o", hq * h)))


def _block_tensors(d: TransformerDims, kind: str) -> tuple[Tensor, ...]:
    """A block's tensors in the order a framework that gathers tensor by tensor meets them."""
    h, f = d.hidden, d.ffn_hidden
    if d.arch == "llama":                      # q, k, v, o; gate, up, down; two RMSNorms
        mlp = tuple(Tensor(name=f"mlp.{n}.weight", numel=h * f) for n in ("gate", "up", "down"))
        norms = (Tensor(name="input_norm.weight", numel=h), Tensor(name="post_attn_norm.weight", numel=h))
        return _attention_tensors(d, "attn", bias=False, fused=False) + mlp + norms
    if d.arch == "t5":                         # q, k, v, o (self, then cross); wi, wo; norms
        attn = _attention_tensors(d, "attn", bias=False, fused=False)
        if kind == "decoder":
            attn += _attention_tensors(d, "cross_attn", bias=False, fused=False)
        mlp = (Tensor(name="mlp.wi.weight", numel=h * f), Tensor(name="mlp.wo.weight", numel=f * h))
        norms = tuple(Tensor(name=f"norm{i}.weight", numel=h) for i in range(3 if kind == "decoder" else 2))
        return attn + mlp + norms
    mlp = (Tensor(name="mlp.fc1.weight", numel=h * f), Tensor(name="mlp.fc1.bias", numel=f),   # gpt, bert
           Tensor(name="mlp.fc2.weight", numel=f * h), Tensor(name="mlp.fc2.bias", numel=h))
    norms = tuple(Tensor(name=f"ln{i}.{p}", numel=h) for i in (1, 2) for p in ("weight", "bias"))
    return _attention_tensors(d, "attn", bias=True, fused=True) + mlp + norms


def _embedding_tensors(d: TransformerDims) -> tuple[Tensor, ...]:
    h = d.hidden
    out = (Tensor(name="word", numel=d.vocab * h, vocab=True),)
    if d.arch == "gpt":
        out += (Tensor(name="position", numel=d.max_positions * h),)
    elif d.arch == "bert":                     # position, token type, LayerNorm
        out += (Tensor(name="position", numel=d.max_positions * h),
                Tensor(name="token_type", numel=d.type_vocab * h),
                Tensor(name="ln.weight", numel=h), Tensor(name="ln.bias", numel=h))
    return out


def _head_tensors(d: TransformerDims) -> tuple[Tensor, ...]:
    """Final norm (t5: the decoder's), BERT's MLM transform and output bias, an untied LM head."""
    h = d.hidden
    if d.arch == "gpt":
        out = (Tensor(name="ln_f.weight", numel=h), Tensor(name="ln_f.bias", numel=h))
    elif d.arch == "bert":
        out = (Tensor(name="transform.weight", numel=h * h), Tensor(name="transform.bias", numel=h),
               Tensor(name="transform_ln.weight", numel=h), Tensor(name="transform_ln.bias", numel=h),
               Tensor(name="decoder.bias", numel=d.vocab))
    else:
        out = (Tensor(name="final_norm.weight", numel=h),)
    if not d.tie_embeddings:
        out += (Tensor(name="lm_head.weight", numel=d.vocab * h, vocab=True),)
    return out


# ---- GEMMs ----

def heads_per_rank(d: TransformerDims, tensor: int) -> tuple[int, int]:
    """Query heads and key/value heads on one TP rank (kv heads replicate when fewer than tensor)."""
    return d.heads // tensor, max(d.kv_heads // tensor, 1)


def _block_gemms(d: TransformerDims, kind: str, b: int, tensor: int,
                 context: int) -> tuple[tuple[Gemm, ...], tuple[Gemm, ...]]:
    tokens = b * d.seq_len // context
    q_heads, kv_heads = heads_per_rank(d, tensor)
    hd, h, f = d.head_dim, d.hidden, d.ffn_hidden // tensor
    gemms = [Gemm("qkv", tokens, (q_heads + 2 * kv_heads) * hd, h), Gemm("attn_out", tokens, h, q_heads * hd)]
    rows, s_kv = b * q_heads * (d.seq_len // context), d.seq_len
    core = [Gemm("attn.scores", rows, s_kv, hd), Gemm("attn.context", rows, hd, s_kv)]
    if kind == "decoder":                      # t5 cross-attention over the encoder output
        gemms += [Gemm("cross_q", tokens, q_heads * hd, h), Gemm("cross_kv", tokens, 2 * kv_heads * hd, h),
                  Gemm("cross_out", tokens, h, q_heads * hd)]
        core += [Gemm("cross_attn.scores", rows, s_kv, hd), Gemm("cross_attn.context", rows, hd, s_kv)]
    gemms += [Gemm("mlp_up", tokens, (2 if d.arch == "llama" else 1) * f, h), Gemm("mlp_down", tokens, h, f)]
    return tuple(gemms), tuple(core)


def block_linears(dims: TransformerDims, *, kind: str = "block", micro_batch: int = 1,
                  tensor: int = 1, context: int = 1) -> tuple[Gemm, ...]:
    """The block's linear layers, one GEMM each, in the order its forward runs them on one TP rank:
    q, k, v, o projections (then the t5 decoder's cross-attention q, k, v, o), then the MLP's up
    (Llama: gate, then up) and down projections. This is how partita's torch modules
    (planner/models/common.py) and torchtitan's Llama (`wq, wk, wv, wo, w1, w3, w2`) run them, one
    matmul per projection; `block`'s GEMMs are the same work with q/k/v and gate/up fused."""
    if kind not in BLOCK_KINDS:
        raise ValueError(f"block kind: expected one of {', '.join(BLOCK_KINDS)}, got {kind!r}")
    tokens = micro_batch * dims.seq_len // context
    q_heads, kv_heads = heads_per_rank(dims, tensor)
    hd, h, f = dims.head_dim, dims.hidden, dims.ffn_hidden // tensor

    def attention(prefix: str) -> list[Gemm]:
        return [Gemm(f"{prefix}q", tokens, q_heads * hd, h), Gemm(f"{prefix}k", tokens, kv_heads * hd, h),
                Gemm(f"{prefix}v", tokens, kv_heads * hd, h), Gemm(f"{prefix}o", tokens, h, q_heads * hd)]

    out = attention("attn.") + (attention("cross_attn.") if kind == "decoder" else [])
    up = [Gemm("mlp.gate", tokens, f, h)] if dims.arch == "llama" else []
    return tuple(out + up + [Gemm("mlp.up", tokens, f, h), Gemm("mlp.down", tokens, h, f)])


def op_policy_split(linears: tuple[Gemm, ...]) -> tuple[tuple[Gemm, ...], tuple[Gemm, ...]]:
    """(saved, recomputed) linears of a block under torchtitan's op-level selective activation
    checkpointing (`recompute: selective-op`): it keeps the output of every matmul except every
    second one a checkpointed block runs, counting from the first (torchtitan
    torchtitan/distributed/activation_checkpoint.py, `_get_custom_policy`: "Save all compute/comm
    ops, except every second mm/linear")."""
    return linears[0::2], linears[1::2]


def op_policy_gemm_share(dims: TransformerDims, decoder: bool = False) -> float:
    """The share of a block's linear-layer FLOPs that op-level selective checkpointing runs again."""
    linears = block_linears(dims, kind=block_kind(dims, decoder))
    _, redo = op_policy_split(linears)
    return sum(g.flops for g in redo) / sum(g.flops for g in linears)


def _head_gemms(d: TransformerDims, b: int, tensor: int, context: int) -> tuple[Gemm, ...]:
    tokens = b * d.head_positions // context         # BERT's MLM head: the masked positions only
    transform = (Gemm("transform", tokens, d.hidden, d.hidden),) if d.arch == "bert" else ()
    return transform + (Gemm("lm_head", tokens, d.vocab // tensor, d.hidden),)


# ---- the list ----

def block_kind(dims: TransformerDims, decoder: bool = False) -> str:
    """The kind of a model's repeated block: "block", or for t5 "encoder" / "decoder"."""
    return "decoder" if decoder else ("encoder" if dims.arch == "t5" else "block")


@lru_cache(maxsize=256)
def block(dims: TransformerDims, *, kind: str = "block", micro_batch: int = 1, tensor: int = 1,
          context: int = 1) -> Layer:
    """One repeated block ("block"; for t5 "encoder" or "decoder"), without the stack's tensors."""
    if kind not in BLOCK_KINDS:
        raise ValueError(f"block kind: expected one of {', '.join(BLOCK_KINDS)}, got {kind!r}")
    gemms, core = _block_gemms(dims, kind, micro_batch, tensor, context)
    return Layer(name=kind, kind=kind, tensors=_block_tensors(dims, kind), gemms=gemms, attention=core)


@lru_cache(maxsize=64)
def layers(dims: TransformerDims, *, micro_batch: int = 1, tensor: int = 1,
           context: int = 1) -> tuple[Layer, ...]:
    """The pipeline layers in order: embedding, blocks (t5: encoder then decoder blocks), head.
    A tied LM head is the embedding's word table; T5's relative position bias lives in each stack's
    first block, the encoder's final norm in its last block, the decoder's in the head."""
    kw = dict(micro_batch=micro_batch, tensor=tensor, context=context)
    out = [Layer(name="embedding", kind="embedding", tensors=_embedding_tensors(dims))]
    stacks = ((("encoder", dims.layers), ("decoder", dims.decoder_layers)) if dims.arch == "t5"
              else (("block", dims.layers),))
    for kind, count in stacks:
        typical = block(dims, kind=kind, **kw)
        for i in range(count):
            extra: tuple[Tensor, ...] = ()
            if dims.arch == "t5" and i == 0:
                extra += (Tensor(name=f"{kind}.relative_attention_bias", numel=T5_BUCKETS * dims.heads,
                                 stack=True),)
            if kind == "encoder" and i == count - 1:
                extra += (Tensor(name="encoder.final_norm.weight", numel=dims.hidden, stack=True),)
            out.append(Layer(name=f"{kind}.{i}", kind=kind, tensors=typical.tensors + extra,
                             gemms=typical.gemms, attention=typical.attention))
    out.append(Layer(name="head", kind="head", tensors=_head_tensors(dims),
                     gemms=_head_gemms(dims, micro_batch, tensor, context)))
    return tuple(out)


def total_params(dims: TransformerDims) -> int:
    return sum(layer.params for layer in layers(dims))
