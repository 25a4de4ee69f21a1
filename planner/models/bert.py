"""BERT as a pipeline chain: learned positions and token types, post-LN blocks, GELU, MLM head.

Parameter for parameter the same as Hugging Face's BertForMaskedLM (no pooler): the head is
BertLMPredictionHead, a dense + GELU + LayerNorm transform and a decoder tied to the word
embedding with its own bias. All tokens get token type 0 (the chain carries one tensor).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from partita.planner.modelspec import TransformerDims
from partita.planner.models.common import MLP, Attention, PipelineLM, SequenceShard, positions_of

LN_EPS = 1e-12    # BertConfig.layer_norm_eps
MASK_FRACTION = 0.15   # Devlin et al. 2019, Sec. 3.1


class BertEmbedding(nn.Module):
    sequence_shard: SequenceShard | None = None     # context parallelism: this rank's positions

    def __init__(self, d: TransformerDims):
        super().__init__()
        self.tok = nn.Embedding(d.vocab, d.hidden)
        self.pos = nn.Embedding(d.max_positions, d.hidden)
        self.token_type = nn.Embedding(d.type_vocab, d.hidden)
        self.norm = nn.LayerNorm(d.hidden, eps=LN_EPS)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:     # (B, S) -> (B, S, H)
        pos = positions_of(self, ids.shape[1], ids.device)
        return self.norm(self.tok(ids) + self.pos(pos) + self.token_type.weight[0])


class BertBlock(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.attn = Attention(d.hidden, d.heads, d.kv_heads, d.head_dim, bias=True, causal=False)
        self.attn_norm = nn.LayerNorm(d.hidden, eps=LN_EPS)
        self.mlp = MLP(d.hidden, d.ffn_hidden, bias=True, act="gelu")
        self.mlp_norm = nn.LayerNorm(d.hidden, eps=LN_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # (B, S, H) -> (B, S, H)
        x = self.attn_norm(x + self.attn(x))
        return self.mlp_norm(x + self.mlp(x))


class BertHead(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.transform = nn.Linear(d.hidden, d.hidden)
        self.norm = nn.LayerNorm(d.hidden, eps=LN_EPS)
        self.lm_head = nn.Linear(d.hidden, d.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # (B, S, H) -> (B, S, V)
        return self.lm_head(self.norm(F.gelu(self.transform(x))))


class Bert(PipelineLM):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.dims = d
        self.embedding = BertEmbedding(d)
        self.block = nn.ModuleList(BertBlock(d) for _ in range(d.layers))
        self.head = BertHead(d)
        if d.tie_embeddings:
            self.head.lm_head.weight = self.embedding.tok.weight

    def sample_batch(self, batch: int, *, seed: int = 0,
                     device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A masked-LM batch: 15% of positions replaced by random tokens; targets are the originals."""
        d = self.dims
        gen = torch.Generator().manual_seed(seed)
        targets = torch.randint(0, d.vocab, (batch, d.seq_len), generator=gen)
        noise = torch.randint(0, d.vocab, (batch, d.seq_len), generator=gen)
        masked = torch.rand((batch, d.seq_len), generator=gen) < MASK_FRACTION
        return torch.where(masked, noise, targets).to(device), targets.to(device)
