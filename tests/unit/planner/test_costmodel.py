"""The analytic cost model: parameters, FLOPs (Narayanan et al. 2021), activation bytes
(Korthikanti et al. 2022), GEMM shapes, and its errors."""
from __future__ import annotations

import pytest

from partita.planner.costmodel import (analytic_profile, block_gemms, head_gemms, layer_params,
                               model_flops_per_step, total_params)
from partita.planner.errors import PartitaError
from partita.planner.modelspec import TransformerDims, preset_dims, preset_names


def test_tiny_gpt_by_hand():
    """1 layer, h=4, 2 heads, s=3, V=5, 3 positions, tied head; micro-batch 2."""
    d = TransformerDims(arch="gpt", layers=1, hidden=4, heads=2, seq_len=3, vocab=5)
    assert layer_params(d) == [
        ("embedding", "embedding", (5 + 3) * 4),
        # 2 LayerNorms (2h each) + q,k,v,o (h*h + h each) + up (h*4h + 4h) + down (4h*h + h)
        ("block.0", "block", 16 + 4 * (16 + 4) + (64 + 16) + (64 + 4)),
        ("head", "head", 8)]
    p = analytic_profile(d, micro_batch=2, precision="bf16")
    t = 2 * 3                                  # tokens
    gemms = 2 * t * (4 * 4 * 4)                # q, k, v, o
    attention = 2 * 2 * (2 * 2 * 3 * 3 * 2)   # scores + context: 2 * (b*a*s) * s * hd each
    mlp = 2 * 2 * t * 4 * 16
    assert p.layers[1].fwd_flops == gemms + attention + mlp
    assert p.layers[2].fwd_flops == 2 * t * 4 * 5
    assert p.layers[0].fwd_flops == 0
    assert all(l.bwd_flops == 2 * l.fwd_flops for l in p.layers)
    assert p.layers[1].output_bytes == t * 4 * 2 and p.layers[2].output_bytes == t * 5 * 2


# Hugging Face parameter counts (GPT2LMHeadModel, BertForMaskedLM, T5ForConditionalGeneration,
# LlamaForCausalLM) of the published checkpoints.
HF_COUNTS = {
    "gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200, "bert-base": 109_514_298, "bert-large": 335_174_458,
    "t5-small": 60_506_624, "t5-base": 222_903_552, "t5-large": 737_668_096,
    "t5-3b": 2_851_598_336, "t5-11b": 11_307_321_344, "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192, "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
}


@pytest.mark.parametrize("name", sorted(HF_COUNTS))
def test_preset_parameter_counts(name):
    assert total_params(preset_dims(name)) == HF_COUNTS[name]


def test_parameter_counts_match_the_torch_models():
    torch = pytest.importorskip("torch")
    from partita.planner.models import build_model
    for name in preset_names():
        model = build_model(preset_dims(name), device="meta")
        assert sum(p.numel() for p in model.parameters()) == total_params(preset_dims(name)), name
        assert [n for n, _, _ in layer_params(preset_dims(name))] == model.layer_names()


@pytest.mark.parametrize("name", ["gpt2", "gpt2-xl", "gpt3-175b"])
def test_narayanan_eq3_for_gpt(name):
    """Narayanan et al. 2021, eq. 3 without recompute: 72 B s l h^2 (1 + s/(6h) + V/(12 l h))."""
    d = preset_dims(name)
    b, s, l, h, v = 1536, d.seq_len, d.layers, d.hidden, d.vocab
    expect = 72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
    assert model_flops_per_step(d, b) == pytest.approx(expect, rel=1e-12)


def _attention_flops(d: TransformerDims, batch: int) -> float:
    """Forward + backward FLOPs of q k^T and probabilities x v (3 x 2 GEMMs of 2 b a s^2 hd)."""
    blocks = d.layers if d.arch != "t5" else d.total_layers
    return 3 * 2 * 2 * batch * d.heads * d.seq_len**2 * d.head_dim * blocks


@pytest.mark.parametrize("name", ["gpt2", "gpt3-175b", "bert-large", "llama2-7b", "llama2-70b"])
def test_six_n_tokens_plus_attention(name):
    """Total FLOPs = 6 N tokens + attention, within 2% (N counts lookup-only tables, which do no
    FLOPs; without them the rule is exact up to biases and norms)."""
    d = preset_dims(name)
    batch, tokens = 64, 64 * d.seq_len
    total = model_flops_per_step(d, batch)
    rule = 6 * total_params(d) * tokens + _attention_flops(d, batch)
    assert abs(total - rule) / total < 0.02
    lookup_only = {"gpt": d.max_positions * d.hidden, "bert": (d.max_positions + d.type_vocab) * d.hidden,
                   "llama": 0 if d.tie_embeddings else d.vocab * d.hidden}[d.arch]
    exact = 6 * (total_params(d) - lookup_only) * tokens + _attention_flops(d, batch)
    assert total == pytest.approx(exact, rel=2e-3)


def test_t5_flops_count_both_stacks_and_cross_attention():
    d = preset_dims("t5-small")
    p = analytic_profile(d, micro_batch=1, precision="bf16")
    enc, dec = p.layers[1], p.layers[1 + d.layers]
    s, h, hd, a, f = d.seq_len, d.hidden, d.head_dim, d.heads, d.ffn_hidden
    attn = 2 * s * h * a * hd * 4 + 2 * 2 * a * s * s * hd
    assert enc.fwd_flops == attn + 2 * 2 * s * h * f
    assert dec.fwd_flops == 2 * attn + 2 * 2 * s * h * f


def test_flops_are_linear_in_micro_batch():
    d = preset_dims("llama2-7b")
    one = analytic_profile(d, micro_batch=1, precision="bf16")
    four = analytic_profile(d, micro_batch=4, precision="bf16")
    assert four.total_flops == 4 * one.total_flops
    rope_tables = 2 * d.seq_len * d.head_dim * 2              # per block, whatever the batch
    assert four.layers[5].activation_bytes - rope_tables == 4 * (one.layers[5].activation_bytes - rope_tables)


def _gpt_stats(d: TransformerDims, b: int) -> int:
    """fp32 extras the paper leaves out: mean + rstd of 2 LayerNorms, the kernel's log-sum-exp."""
    t = b * d.seq_len
    return 2 * 2 * t * 4 + b * d.heads * d.seq_len * 4


@pytest.mark.parametrize("name", ["gpt2", "gpt3-175b"])
def test_gpt_block_activations_are_korthikanti_with_flash_and_no_dropout(name):
    """Korthikanti et al. 2022, Sec. 4.1: 34 sbh + 5 a s^2 b bytes at 16-bit. A fused attention
    kernel stores no a s^2 term; without dropout the two 1-byte sbh masks go: 32 sbh."""
    d, b = preset_dims(name), 2
    sbh = d.seq_len * b * d.hidden
    bf16 = analytic_profile(d, micro_batch=b, precision="bf16").layers[1].activation_bytes
    fp32 = analytic_profile(d, micro_batch=b, precision="fp32").layers[1].activation_bytes
    assert bf16 == (34 - 2) * sbh + _gpt_stats(d, b)
    assert fp32 == 2 * (34 - 2) * sbh + _gpt_stats(d, b)       # fp32 doubles the 16-bit terms


def test_gqa_and_swiglu_activations():
    """Llama-2-70B block at 16-bit: norm inputs (2), q/k/v input, q, kernel output (= o_proj
    input) at h, k and v at kv width (h/8), up input and 4 ffn-wide SwiGLU tensors."""
    d, b = preset_dims("llama2-70b"), 1
    t, h, f = b * d.seq_len, d.hidden, d.ffn_hidden
    elems = t * h * (2 + 1 + 2 + 1) + 2 * t * h // 8 + 4 * t * f
    fp32 = 2 * t * 4 + b * d.heads * d.seq_len * 4               # 2 rstd, log-sum-exp
    rope = 2 * d.seq_len * d.head_dim * 2
    got = analytic_profile(d, micro_batch=b, precision="bf16").layers[1].activation_bytes
    assert got == 2 * elems + fp32 + rope


def test_head_keeps_fp32_log_softmax():
    d = preset_dims("llama3-8b")
    head = analytic_profile(d, micro_batch=1, precision="bf16").layers[-1]
    assert head.activation_bytes > d.seq_len * d.vocab * 4
    assert head.output_bytes == d.seq_len * d.vocab * 2


def test_block_gemms():
    d = preset_dims("llama2-70b")
    gemms = block_gemms(d, 2)
    names = [g.name for g in gemms]
    assert names == ["qkv", "attn_out", "mlp_up", "mlp_down", "attn.scores", "attn.context"]
    assert gemms[0] == ("qkv", 2 * 4096, (64 + 2 * 8) * 128, 8192)       # fused, 8 k/v heads
    p = analytic_profile(d, micro_batch=2, precision="bf16")
    assert sum(g.flops for g in gemms) == p.layers[1].fwd_flops
    tp8 = block_gemms(d, 2, tensor=8)
    assert sum(g.flops for g in tp8) * 8 == p.layers[1].fwd_flops
    assert tp8[0].n == (8 + 2 * 1) * 128                      # one k/v head per rank
    cp2 = block_gemms(d, 2, context=2)
    assert cp2[4] == ("attn.scores", 2 * 64 * 2048, 4096, 128)     # local queries, all keys
    t5 = preset_dims("t5-small")
    assert len(block_gemms(t5, 1, kind="decoder")) == 7 + 4
    assert sum(g.flops for g in head_gemms(preset_dims("bert-base"), 1)) == \
        analytic_profile(preset_dims("bert-base"), micro_batch=1, precision="fp32").layers[-1].fwd_flops


def test_errors():
    d = preset_dims("gpt2")
    with pytest.raises(PartitaError, match="training.precision: expected one of fp32, tf32, fp16, bf16, fp8, got 'int4'"):
        analytic_profile(d, micro_batch=1, precision="int4")
    with pytest.raises(PartitaError, match="training.micro_batch: must be >= 1, got 0"):
        analytic_profile(d, micro_batch=0, precision="bf16")
