"""GPT-2 / GPT-3 as a pipeline chain: learned positions, pre-LN blocks, tanh-GELU MLP, biases.

Parameter for parameter the same as Hugging Face's GPT2LMHeadModel (whose fused `c_attn` holds
the q, k and v projections kept separate here), with the LM head tied to the token embedding
unless `tie_embeddings` is false.
"""
from __future__ import annotations

import torch
from torch import nn

from partita.planner.modelspec import TransformerDims
from partita.planner.models.common import MLP, Attention, PipelineLM, SequenceShard, positions_of

LN_EPS = 1e-5     # GPT2Config.layer_norm_epsilon


class GPTEmbedding(nn.Module):
    sequence_shard: SequenceShard | None = None     # context parallelism: this rank's positions

    def __init__(self, d: TransformerDims):
        super().__init__()
        self.tok = nn.Embedding(d.vocab, d.hidden)
        self.pos = nn.Embedding(d.max_positions, d.hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:     # (B, S) -> (B, S, H)
        pos = positions_of(self, ids.shape[1], ids.device)
        return self.tok(ids) + self.pos(pos)


class GPTBlock(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.attn_norm = nn.LayerNorm(d.hidden, eps=LN_EPS)
        self.attn = Attention(d.hidden, d.heads, d.kv_heads, d.head_dim, bias=True, causal=True)
        self.mlp_norm = nn.LayerNorm(d.hidden, eps=LN_EPS)
        self.mlp = MLP(d.hidden, d.ffn_hidden, bias=True, act="gelu_tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # (B, S, H) -> (B, S, H)
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPTHead(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.norm = nn.LayerNorm(d.hidden, eps=LN_EPS)
        self.lm_head = nn.Linear(d.hidden, d.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # (B, S, H) -> (B, S, V)
        return self.lm_head(self.norm(x))


class GPT(PipelineLM):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.dims = d
        self.embedding = GPTEmbedding(d)
        self.block = nn.ModuleList(GPTBlock(d) for _ in range(d.layers))
        self.head = GPTHead(d)
        if d.tie_embeddings:
            self.head.lm_head.weight = self.embedding.tok.weight
