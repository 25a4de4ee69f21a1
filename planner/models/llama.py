"""Llama as a pipeline chain: RoPE, pre-RMSNorm blocks, SwiGLU MLP, grouped-query attention, no biases.

Parameter for parameter the same as Hugging Face's LlamaForCausalLM (and Mistral, whose sliding
window changes neither parameters nor, at seq_len <= window, FLOPs). The LM head is untied unless
`tie_embeddings` is true. RoPE uses theta = 10000 (Llama 2); theta changes no cost.
"""
from __future__ import annotations

import torch
from torch import nn

from partita.planner.modelspec import TransformerDims
from partita.planner.models.common import (Attention, GatedMLP, PipelineLM, RMSNorm, positions_of,
                                           rope_tables)

RMS_EPS = 1e-5    # Llama 2 configs' rms_norm_eps


class LlamaEmbedding(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.tok = nn.Embedding(d.vocab, d.hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:     # (B, S) -> (B, S, H)
        return self.tok(ids)


class LlamaBlock(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.head_dim = d.head_dim
        self.attn_norm = RMSNorm(d.hidden, RMS_EPS)
        self.attn = Attention(d.hidden, d.heads, d.kv_heads, d.head_dim, bias=False, causal=True)
        self.mlp_norm = RMSNorm(d.hidden, RMS_EPS)
        self.mlp = GatedMLP(d.hidden, d.ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # (B, S, H) -> (B, S, H)
        rope = rope_tables(positions_of(self.attn, x.shape[1], x.device), self.head_dim, x.dtype)
        x = x + self.attn(self.attn_norm(x), rope=rope)
        return x + self.mlp(self.mlp_norm(x))


class LlamaHead(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.norm = RMSNorm(d.hidden, RMS_EPS)
        self.lm_head = nn.Linear(d.hidden, d.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # (B, S, H) -> (B, S, V)
        return self.lm_head(self.norm(x))


class Llama(PipelineLM):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.dims = d
        self.embedding = LlamaEmbedding(d)
        self.block = nn.ModuleList(LlamaBlock(d) for _ in range(d.layers))
        self.head = LlamaHead(d)
        if d.tie_embeddings:
            self.head.lm_head.weight = self.embedding.tok.weight
