"""Building blocks shared by the four transformer families: attention, norms, MLPs and `PipelineLM`.

Every model is a chain of layers that each take one tensor and return one tensor, so that the
executor can cut it into pipeline stages anywhere and the profiler can cost it layer by layer.
Projection names (`attn.q_proj`, `mlp.up_proj`, ...) follow torchtitan's, so that a tensor-parallel
plan of ColwiseParallel / RowwiseParallel applies unchanged: attention never reads a head count
from its configuration, it reshapes projection outputs with `view(B, S, -1, head_dim)`.

No dropout anywhere: the models are deterministic.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from partita.planner.modelspec import TransformerDims

INIT_STD = 0.02      # GPT-2 / BERT / Llama `initializer_range`


def context_positions(seq_len: int, parts: int, index: int) -> torch.Tensor:
    """The positions of a `seq_len` sequence that rank `index` of a `parts`-way context-parallel
    group holds, in the order it holds them: the sequence is cut into 2 * parts equal chunks and the
    rank holds chunks `index` and `2 * parts - 1 - index`, so that every rank does the same causal
    attention work (the load balancing of Megatron-Core's context parallelism and of Llama 3,
    Dubey et al. 2024, Sec. 3.3.2). seq_len must be a multiple of 2 * parts."""
    chunk = seq_len // (2 * parts)
    first, second = index * chunk, (2 * parts - 1 - index) * chunk
    return torch.cat((torch.arange(first, first + chunk), torch.arange(second, second + chunk)))


@dataclass(frozen=True)
class SequenceShard:
    """Context parallelism (all-gather form, Llama 3, Dubey et al. 2024, Sec. 3.3.2): this rank holds
    the positions `context_positions(seq_len, parts, index)` of every sequence; its queries attend to
    the keys and values of all ranks, which `gather` collects along dim 2 in rank order
    ((B, h, S/parts, hd) -> (B, h, S, hd), autograd-aware; the executor supplies it).

    Set as the `sequence_shard` attribute of the modules that read positions (attention, position
    embeddings, rotary tables); None (the default) means the module sees the whole sequence."""
    index: int
    parts: int
    gather: Callable[[torch.Tensor], torch.Tensor]

    def positions(self, local_len: int, device: torch.device) -> torch.Tensor:
        """Global positions of this rank's `local_len` tokens."""
        return context_positions(local_len * self.parts, self.parts, self.index).to(device)

    def all_positions(self, local_len: int, device: torch.device) -> torch.Tensor:
        """Global positions of the gathered keys, in gather (rank) order."""
        seq = local_len * self.parts
        return torch.cat([context_positions(seq, self.parts, r) for r in range(self.parts)]).to(device)


def positions_of(module: nn.Module, local_len: int, device: torch.device) -> torch.Tensor:
    """The global positions of the tokens `module` sees: 0..S-1, or its shard's under context
    parallelism."""
    shard = getattr(module, "sequence_shard", None)
    if shard is None:
        return torch.arange(local_len, device=device)
    return shard.positions(local_len, device)


class Attention(nn.Module):
    """Multi-head (or grouped-query) attention with separate q/k/v/o projections.

    `forward(x, memory=None, bias=None, rope=None)`: queries from x (B, S, H); keys and values from
    `memory` (B, S_kv, H) for cross-attention, else from x. `bias` is an additive (1, heads, S, S_kv)
    position bias (T5); `rope` a (cos, sin) pair of (S, head_dim) tables (Llama).
    With a `sequence_shard` (context parallelism) the keys and values of every rank are gathered
    and the causal mask compares global positions.
    """

    sequence_shard: SequenceShard | None = None

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, *, bias: bool,
                 causal: bool, scale: float | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.causal = causal
        self.scale = scale
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                bias: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        kv_in = x if memory is None else memory
        q = self._heads(self.q_proj(x))                     # (B, heads, S, hd)
        k = self._heads(self.k_proj(kv_in))                 # (B, kv_heads, S_kv, hd)
        v = self._heads(self.v_proj(kv_in))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        causal, shard = self.causal, self.sequence_shard
        if shard is not None:
            s_local = q.shape[-2]
            k, v = shard.gather(k), shard.gather(v)
            if causal:      # key position after query position: masked
                q_pos = shard.positions(s_local, q.device)
                k_pos = shard.all_positions(s_local, q.device)
                mask = torch.zeros((s_local, k.shape[-2]), device=q.device, dtype=q.dtype)
                bias = mask.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
                causal = False
        out = attention(q, k, v, bias=bias, causal=causal, scale=self.scale)
        return self.o_proj(out.transpose(1, 2).flatten(2))  # (B, S, heads*hd) -> (B, S, H)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], -1, self.head_dim).transpose(1, 2)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: torch.Tensor | None,
              causal: bool, scale: float | None) -> torch.Tensor:
    """softmax(q k^T * scale + bias [+ causal mask]) v, with grouped-query k/v; (B, h, S, hd).

    On the meta device this runs `_MetaFlashAttention` (see [Note: meta attention]).
    """
    if q.device.type == "meta":
        return _MetaFlashAttention.apply(q, k, v, bias, causal, scale)
    if bias is not None and causal:
        bias = bias + causal_mask(q.shape[-2], k.shape[-2], q.device, bias.dtype)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, is_causal=causal and bias is None, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1])


def causal_mask(s_q: int, s_kv: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(s_q, s_kv) additive mask: 0 on and below the diagonal, -inf above."""
    full = torch.full((s_q, s_kv), float("-inf"), device=device, dtype=dtype)
    return torch.triu(full, diagonal=1)


class _MetaFlashAttention(torch.autograd.Function):
    """[Note: meta attention]
    On the meta device `F.scaled_dot_product_attention` has no fused kernel and falls back to the
    math path, which upcasts to fp32 and saves the (B, h, S, S) probabilities for backward. No GPU
    run does that: flash and memory-efficient attention save only q, k, v, the output and the
    row log-sum-exp (plus the bias when there is one), and grouped-query k/v stay unrepeated. So the
    profiler would overstate activation memory by the 5as/h term of Korthikanti et al. 2022.
    This function makes the meta run save what a fused kernel saves, lay its output out as flash
    attention does, (B, S, h, hd) in memory, and issue the math path's matmuls for FLOP counting:
    2 batched GEMMs forward (scores, probabilities x values) and 4 backward (dV, dP, dQ, dK), i.e.
    backward = 2 x forward, without the flash backward's score recompute (the Megatron convention,
    Narayanan et al. 2021).
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, causal, scale):
        b, h, s, _ = q.shape
        rep = h // k.shape[1]
        kr, vr = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = torch.matmul(q, kr.transpose(-1, -2))          # (B, h, S, S_kv)
        torch.matmul(scores, vr)                                 # (B, h, S, hd), for the count
        # flash kernels write the output as (B, S, h, hd): the caller's transpose + flatten is
        # then a view, and the o_proj input is the very tensor the kernel saved
        out = torch.empty((b, s, h, q.shape[-1]), device=q.device, dtype=q.dtype).transpose(1, 2)
        lse = torch.empty((b, h, s), device=q.device, dtype=torch.float32)
        ctx.rep = rep
        ctx.bias_shape = None if bias is None else bias.shape
        saved = (q, k, v, out, lse) + (() if bias is None else (bias,))
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, _out, _lse = ctx.saved_tensors[:5]
        rep = ctx.rep
        kr, vr = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        probs = torch.empty(q.shape[:-1] + (k.shape[-2],), device=q.device, dtype=q.dtype)
        grad_v = torch.matmul(probs.transpose(-1, -2), grad_out)     # (B, h, S_kv, hd)
        grad_p = torch.matmul(grad_out, vr.transpose(-1, -2))        # (B, h, S, S_kv)
        grad_q = torch.matmul(grad_p, kr)
        grad_k = torch.matmul(grad_p.transpose(-1, -2), q)
        grad_k, grad_v = _sum_groups(grad_k, rep), _sum_groups(grad_v, rep)
        grad_bias = None
        if ctx.bias_shape is not None:
            grad_bias = grad_p.sum(0, keepdim=True).expand(ctx.bias_shape)
        return grad_q, grad_k, grad_v, grad_bias, None, None


def _sum_groups(t: torch.Tensor, rep: int) -> torch.Tensor:
    """(B, kv*rep, S, hd) -> (B, kv, S, hd), summing the query heads that share one k/v head."""
    if rep == 1:
        return t
    b, h, s, d = t.shape
    return t.view(b, h // rep, rep, s, d).sum(2)


def rope_tables(positions: torch.Tensor, head_dim: int, dtype: torch.dtype,
                theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (S, head_dim) for the S `positions`: rotary position embedding (Su et al.
    2021, eq. 34), in the half-split layout of Hugging Face Llama. Computed per call, so the model
    holds no buffers."""
    device = positions.device
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                               / head_dim)
    pos = positions.to(torch.float32)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    """x / rms(x) * weight (Zhang & Sennrich 2019); also T5's LayerNorm (no mean, no bias)."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFunction.apply(x, self.weight, self.eps)


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm computed in fp32 that saves only its input and the fp32 1/rms per token, as the
    fused kernels of Apex and Transformer Engine do. (`F.rms_norm` decomposes and saves two fp32
    copies of the input, which would make bf16 activation profiles 4x too large for every norm.)

    With r = 1/rms(x), x^ = x r and g = dy * w: dx = r (g - x^ mean(g x^)), dw = sum(dy x^).
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)     # (..., 1) fp32
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        x_hat = x.float() * rstd
        g = grad_out.float() * weight.float()
        grad_x = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
        grad_w = (grad_out.float() * x_hat).flatten(0, -2).sum(0)
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


class MLP(nn.Module):
    """down(act(up(x))) for GPT (tanh GELU), BERT (erf GELU) and T5 (ReLU)."""

    def __init__(self, hidden: int, ffn: int, *, bias: bool, act: str):
        super().__init__()
        self.act = act
        self.up_proj = nn.Linear(hidden, ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up_proj(x)
        if self.act == "relu":
            h = F.relu(h)
        else:
            h = F.gelu(h, approximate="tanh" if self.act == "gelu_tanh" else "none")
        return self.down_proj(h)


class GatedMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (Shazeer 2020), as in Llama."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class PipelineLM(nn.Module):
    """A language model as a chain [embedding, blocks..., head] of one-tensor-in, one-tensor-out layers.

    Subclasses set `self.dims` and register the layers as attributes whose qualified names are the
    layer names: `embedding`, `block.<i>` (or `encoder.<i>`, `decoder.<i>`) and `head`.
    """

    dims: TransformerDims
    block_groups: tuple[str, ...] = ("block",)

    def pipeline_layers(self) -> list[nn.Module]:
        return [module for _, module in self._layers()]

    def layer_names(self) -> list[str]:
        return [name for name, _ in self._layers()]

    def _layers(self) -> Iterator[tuple[str, nn.Module]]:
        yield "embedding", self.embedding
        for group in self.block_groups:
            for i, block in enumerate(getattr(self, group)):
                yield f"{group}.{i}", block
        yield "head", self.head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = ids
        for layer in self.pipeline_layers():
            x = layer(x)
        return x

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean token cross-entropy, computed in fp32 (as Megatron does) whatever the logits' dtype."""
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    def sample_batch(self, batch: int, *, seed: int = 0,
                     device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, targets) of random tokens for a next-token task: ids (B, S), targets (B, S)."""
        d = self.dims
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, d.vocab, (batch, d.seq_len + 1), generator=gen)
        return tokens[:, :-1].to(device), tokens[:, 1:].to(device)

    def tied_parameters(self) -> list[list[str]]:
        """Groups of qualified parameter names that are one tensor (tied embeddings, T5's shared
        relative position bias). A pipeline executor that puts a group's names on different stages
        must add up their gradients across those stages (as Megatron does for tied embeddings)."""
        groups: dict[int, list[str]] = {}
        for name, param in self.named_parameters(remove_duplicate=False):
            groups.setdefault(id(param), []).append(name)
        return [names for names in groups.values() if len(names) > 1]

    def materialize(self, device: torch.device | str, *, seed: int = 0,
                    layers: list[int] | None = None) -> None:
        """Give the parameters of `layers` (indices into pipeline_layers(); default all) real
        storage on `device`, initialised deterministically (see `init_value`): the same layer
        gets the same weights whichever subset is materialised and on whichever device."""
        originals = dict(self.named_parameters())     # kept alive: ids below must stay unique
        canonical = {id(p): name for name, p in originals.items()}
        chosen = self.pipeline_layers() if layers is None else [self.pipeline_layers()[i] for i in layers]
        replaced: dict[int, nn.Parameter] = {}
        fresh: set[int] = set()
        for layer in chosen:
            for module in layer.modules():
                for key, param in list(module._parameters.items()):
                    if param is None or id(param) in fresh:
                        continue     # a module shared by two layers, already done
                    if id(param) not in replaced:
                        value = init_value(canonical[id(param)], param.shape, seed)
                        replaced[id(param)] = nn.Parameter(
                            value.to(device=device, dtype=param.dtype), param.requires_grad)
                        fresh.add(id(replaced[id(param)]))
                    module._parameters[key] = replaced[id(param)]
        self._retie(replaced)

    def _retie(self, replaced: dict[int, nn.Parameter]) -> None:
        """Point every other reference to a replaced parameter (a tie outside `layers`) at the new one."""
        for module in self.modules():
            for key, param in list(module._parameters.items()):
                if param is not None and id(param) in replaced:
                    module._parameters[key] = replaced[id(param)]


def init_value(name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """The initial fp32 CPU value of parameter `name`: ones for norm weights, zeros for biases,
    N(0, 0.02) otherwise (GPT-2 / BERT initialisation), from a generator seeded by (seed, name)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape)
    if leaf == "weight" and len(shape) == 1:
        return torch.ones(shape)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    return torch.empty(shape).normal_(0.0, INIT_STD, generator=gen)


def t5_scale(hidden: int) -> float:
    """T5 rescales the decoder output by d_model**-0.5 before a tied LM head (Raffel et al. 2020)."""
    return 1.0 / math.sqrt(hidden)
