"""T5 (original, ReLU) as a pipeline chain that carries encoder and decoder states in one tensor.

[Note: t5 chain] The chain tensor is (B, S_enc + S_dec, H) with S_enc = S_dec = seq_len, encoder
positions first. The input ids are the encoder tokens followed by the decoder inputs (the targets
shifted right behind token 0, T5's decoder start). Encoder blocks update the first half and pass
the second through; decoder blocks update the second half with causal self-attention and
cross-attention to the first half (by then the encoder output, normalised by the encoder's final
norm, which lives in the last encoder block). The head returns logits for the decoder half only.
The halves are found as x.shape[1] // 2, so any even chain length works.

Parameter for parameter the same as Hugging Face's T5ForConditionalGeneration: no biases,
T5LayerNorm (RMS, weight only), unscaled attention, a 32-bucket relative position bias in the first
block of each stack that the stack's other blocks reuse (here: the same nn.Embedding object), and a
tied LM head behind a d_model**-0.5 rescale.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from partita.planner.modelspec import TransformerDims
from partita.planner.models.common import MLP, Attention, PipelineLM, RMSNorm, t5_scale

LN_EPS = 1e-6           # T5Config.layer_norm_epsilon
NUM_BUCKETS = 32        # T5Config.relative_attention_num_buckets
MAX_DISTANCE = 128      # T5Config.relative_attention_max_distance


def relative_bucket(rel: torch.Tensor, bidirectional: bool) -> torch.Tensor:
    """T5's log-spaced relative position buckets (Raffel et al. 2020, Sec. 2.1; HF's
    T5Attention._relative_position_bucket); rel = key position - query position."""
    buckets = torch.zeros_like(rel)
    n = NUM_BUCKETS
    if bidirectional:
        n //= 2
        buckets = buckets + (rel > 0).long() * n
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    exact = n // 2
    large = exact + (torch.log(rel.float() / exact) / math.log(MAX_DISTANCE / exact)
                     * (n - exact)).long()
    large = torch.clamp(large, max=n - 1)
    return buckets + torch.where(rel < exact, rel, large)


def position_bias(table: nn.Embedding, s_q: int, s_kv: int, bidirectional: bool) -> torch.Tensor:
    """(1, heads, s_q, s_kv) additive attention bias from the bucket table."""
    device = table.weight.device
    rel = (torch.arange(s_kv, device=device)[None, :] - torch.arange(s_q, device=device)[:, None])
    values = table(relative_bucket(rel, bidirectional))          # (s_q, s_kv, heads)
    return values.permute(2, 0, 1).unsqueeze(0)


def halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder and decoder halves of the chain tensor, as copies: a saved view would keep the
    whole (B, 2S, H) tensor alive for backward, and a linear layer would copy a strided view
    once per projection (k and v)."""
    s = x.shape[1] // 2
    return (x[:, :s].clone(memory_format=torch.contiguous_format),
            x[:, s:].clone(memory_format=torch.contiguous_format))


def _attention(d: TransformerDims, causal: bool) -> Attention:
    return Attention(d.hidden, d.heads, d.kv_heads, d.head_dim, bias=False, causal=causal, scale=1.0)


class T5Embedding(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.tok = nn.Embedding(d.vocab, d.hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:     # (B, 2S) -> (B, 2S, H)
        return self.tok(ids)


class T5EncoderBlock(nn.Module):
    def __init__(self, d: TransformerDims, rel_bias: nn.Embedding, last: bool):
        super().__init__()
        self.rel_bias = rel_bias
        self.attn_norm = RMSNorm(d.hidden, LN_EPS)
        self.attn = _attention(d, causal=False)
        self.mlp_norm = RMSNorm(d.hidden, LN_EPS)
        self.mlp = MLP(d.hidden, d.ffn_hidden, bias=False, act="relu")
        self.final_norm = RMSNorm(d.hidden, LN_EPS) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # (B, 2S, H) -> (B, 2S, H)
        enc, dec = halves(x)
        s = enc.shape[1]
        bias = position_bias(self.rel_bias, s, s, bidirectional=True)
        enc = enc + self.attn(self.attn_norm(enc), bias=bias)
        enc = enc + self.mlp(self.mlp_norm(enc))
        if self.final_norm is not None:
            enc = self.final_norm(enc)
        return torch.cat((enc, dec), dim=1)


class T5DecoderBlock(nn.Module):
    def __init__(self, d: TransformerDims, rel_bias: nn.Embedding):
        super().__init__()
        self.rel_bias = rel_bias
        self.attn_norm = RMSNorm(d.hidden, LN_EPS)
        self.attn = _attention(d, causal=True)
        self.cross_norm = RMSNorm(d.hidden, LN_EPS)
        self.cross_attn = _attention(d, causal=False)
        self.mlp_norm = RMSNorm(d.hidden, LN_EPS)
        self.mlp = MLP(d.hidden, d.ffn_hidden, bias=False, act="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # (B, 2S, H) -> (B, 2S, H)
        enc, dec = halves(x)
        s = dec.shape[1]
        bias = position_bias(self.rel_bias, s, s, bidirectional=False)
        dec = dec + self.attn(self.attn_norm(dec), bias=bias)
        dec = dec + self.cross_attn(self.cross_norm(dec), memory=enc)
        dec = dec + self.mlp(self.mlp_norm(dec))
        return torch.cat((enc, dec), dim=1)


class T5Head(nn.Module):
    def __init__(self, d: TransformerDims):
        super().__init__()
        self.scale = t5_scale(d.hidden) if d.tie_embeddings else 1.0
        self.norm = RMSNorm(d.hidden, LN_EPS)
        self.lm_head = nn.Linear(d.hidden, d.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # (B, 2S, H) -> (B, S, V)
        _, dec = halves(x)
        return self.lm_head(self.norm(dec) * self.scale)


class T5(PipelineLM):
    block_groups = ("encoder", "decoder")

    def __init__(self, d: TransformerDims):
        super().__init__()
        self.dims = d
        self.embedding = T5Embedding(d)
        enc_bias, dec_bias = nn.Embedding(NUM_BUCKETS, d.heads), nn.Embedding(NUM_BUCKETS, d.heads)
        self.encoder = nn.ModuleList(T5EncoderBlock(d, enc_bias, last=i == d.layers - 1)
                                     for i in range(d.layers))
        self.decoder = nn.ModuleList(T5DecoderBlock(d, dec_bias) for _ in range(d.decoder_layers))
        self.head = T5Head(d)
        if d.tie_embeddings:
            self.head.lm_head.weight = self.embedding.tok.weight

    def sample_batch(self, batch: int, *, seed: int = 0,
                     device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (B, 2S): random encoder tokens, then the targets shifted right behind token 0;
        targets (B, S): random tokens."""
        d = self.dims
        gen = torch.Generator().manual_seed(seed)
        source = torch.randint(0, d.vocab, (batch, d.seq_len), generator=gen)
        targets = torch.randint(0, d.vocab, (batch, d.seq_len), generator=gen)
        shifted = torch.cat((torch.zeros((batch, 1), dtype=torch.long), targets[:, :-1]), dim=1)
        return torch.cat((source, shifted), dim=1).to(device), targets.to(device)
