"""The torch models: the pipeline chain interface, determinism, tensor-parallel-ready attention,
meta-device builds, `module:` models, and exact agreement with Hugging Face (parameters and logits)."""
from __future__ import annotations

import re

import pytest
import torch

from partita.planner.errors import PartitaError
from partita.planner.hf_config import dims_from_hf_config
from partita.planner.modelspec import ModelSpec, TransformerDims, preset_dims
from partita.planner.models import build_from_spec, build_model, layer_chain
from partita.planner.models.common import Attention

TINY = {
    "gpt": dict(arch="gpt", layers=2, hidden=64, heads=4, seq_len=16, vocab=97, max_positions=32),
    "llama": dict(arch="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, seq_len=16,
                  vocab=97),
    "bert": dict(arch="bert", layers=2, hidden=64, heads=4, seq_len=16, vocab=97),
    "t5": dict(arch="t5", layers=2, decoder_layers=3, hidden=64, heads=4, head_dim=24, ffn_hidden=80,
               seq_len=16, vocab=97),
}


def tiny(arch: str, **over) -> TransformerDims:
    return TransformerDims(**{**TINY[arch], **over})


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())      # parameters() counts a tied tensor once


@pytest.mark.parametrize("arch", list(TINY))
def test_chain_equals_model_and_shapes(arch):
    model = build_model(tiny(arch))
    ids, targets = model.sample_batch(3, seed=1)
    x = ids
    for name, layer in zip(model.layer_names(), model.pipeline_layers()):
        x = layer(x)
        if name not in ("embedding", "head"):
            assert x.shape == (3, ids.shape[1], 64)
    logits = model(ids)
    assert torch.equal(x, logits)
    assert logits.shape == (3, 16, 97) and targets.shape == (3, 16)
    loss = model.loss(logits, targets)
    loss.backward()
    assert loss.dim() == 0 and 4.0 < loss.item() < 5.0          # about ln(97) = 4.57 at init
    assert all(p.grad is not None for p in model.parameters())


def test_layer_names():
    assert build_model(tiny("gpt"), device="meta").layer_names() == ["embedding", "block.0", "block.1", "head"]
    names = build_model(tiny("t5"), device="meta").layer_names()
    assert names == ["embedding", "encoder.0", "encoder.1", "decoder.0", "decoder.1", "decoder.2", "head"]


@pytest.mark.parametrize("arch", list(TINY))
def test_layer_names_are_module_paths(arch):
    """`block.3` is also the module's qualified name, so parameter FQNs start with the layer name."""
    model = build_model(tiny(arch), device="meta")
    modules = dict(model.named_modules())
    assert all(modules[n] is layer for n, layer in zip(model.layer_names(), model.pipeline_layers()))


def test_t5_encoder_blocks_pass_the_decoder_half_through():
    model = build_model(tiny("t5"))
    ids, _ = model.sample_batch(2)
    x = model.embedding(ids)
    y = model.encoder[0](x)
    assert torch.equal(y[:, 16:], x[:, 16:]) and not torch.equal(y[:, :16], x[:, :16])
    z = model.decoder[0](y)
    assert torch.equal(z[:, :16], y[:, :16]) and not torch.equal(z[:, 16:], y[:, 16:])


def test_decoder_is_causal():
    """Changing a late token leaves earlier logits unchanged (gpt, llama, t5 decoder), not in bert."""
    for arch in ("gpt", "llama", "t5", "bert"):
        model = build_model(tiny(arch))
        ids, _ = model.sample_batch(1)
        changed = ids.clone()
        changed[0, -1] = (changed[0, -1] + 1) % 97
        same = torch.allclose(model(ids)[0, :-1], model(changed)[0, :-1])
        assert same == (arch != "bert"), arch


def test_same_seed_same_weights_and_subsets_materialise_identically():
    full = build_model(tiny("t5"), seed=3)
    assert torch.equal(full.encoder[1].mlp.up_proj.weight, build_model(tiny("t5"), seed=3).encoder[1].mlp.up_proj.weight)
    assert not torch.equal(full.encoder[1].mlp.up_proj.weight, build_model(tiny("t5"), seed=4).encoder[1].mlp.up_proj.weight)
    part = build_model(tiny("t5"), device="meta")
    part.materialize("cpu", seed=3, layers=[2, 6])           # encoder.1 and the (tied) head
    assert torch.equal(part.encoder[1].attn.q_proj.weight, full.encoder[1].attn.q_proj.weight)
    assert torch.equal(part.encoder[1].rel_bias.weight, full.encoder[0].rel_bias.weight)
    assert torch.equal(part.head.lm_head.weight, full.embedding.tok.weight)
    assert part.embedding.tok.weight is part.head.lm_head.weight       # the tie survives
    assert part.encoder[0].attn.q_proj.weight.is_meta


def test_tied_parameters():
    assert build_model(tiny("gpt"), device="meta").tied_parameters() == [["embedding.tok.weight", "head.lm_head.weight"]]
    assert build_model(tiny("llama"), device="meta").tied_parameters() == []
    groups = build_model(tiny("t5"), device="meta").tied_parameters()
    assert ["decoder.0.rel_bias.weight", "decoder.1.rel_bias.weight", "decoder.2.rel_bias.weight"] in groups


def test_dtype_and_meta():
    model = build_model(tiny("llama"), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ids, _ = model.sample_batch(2)
    assert model(ids).dtype == torch.bfloat16
    meta = build_model(tiny("llama"), device="meta")
    assert all(p.is_meta for p in meta.parameters())
    assert meta(ids.to("meta")).shape == (2, 16, 97)


def test_llama2_70b_on_meta_allocates_nothing():
    model = build_model(preset_dims("llama2-70b"), device="meta", dtype=torch.bfloat16)
    assert n_params(model) == 68_976_648_192        # Llama-2-70b-hf: 68.98 B
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attention_shards_like_megatron_tensor_parallelism(kv_heads):
    """Column-split q/k/v and row-split o over 2 'ranks' (what ColwiseParallel / RowwiseParallel do):
    each shard infers its local head count at run time and the partial outputs sum to the whole."""
    torch.manual_seed(0)
    full = Attention(32, 4, kv_heads, 8, bias=False, causal=True)
    x = torch.randn(2, 5, 32)
    total = torch.zeros(2, 5, 32)
    for rank in range(2):
        shard = Attention(32, 2, kv_heads // 2, 8, bias=False, causal=True)
        for name in ("q_proj", "k_proj", "v_proj"):
            w = getattr(full, name).weight
            rows = w.shape[0] // 2
            getattr(shard, name).weight.data = w[rank * rows:(rank + 1) * rows].clone()
        shard.o_proj.weight.data = full.o_proj.weight[:, rank * 16:(rank + 1) * 16].clone()
        total += shard(x)
    torch.testing.assert_close(total, full(x), rtol=1e-5, atol=1e-6)


def test_layer_chain_of_other_modules():
    seq = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    assert [name for name, _ in layer_chain(seq)] == ["0", "1"]
    lin = torch.nn.Linear(3, 3)
    assert layer_chain(lin) == [("model", lin)]


def test_build_from_spec_forms(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "def seq():\n    return torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50))\n"
        "def number():\n    return 3\n"
        "def broken():\n    raise ValueError('no weights here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seq = build_from_spec(ModelSpec(module="my_models:seq", seq_len=4, vocab=50), device="meta")
    assert isinstance(seq, torch.nn.Sequential) and seq[0].weight.is_meta
    a = build_from_spec(ModelSpec(module="my_models:seq", seq_len=4, vocab=50), seed=1)
    b = build_from_spec(ModelSpec(module="my_models:seq", seq_len=4, vocab=50), seed=1)
    assert torch.equal(a[1].weight, b[1].weight)
    gpt = build_from_spec(ModelSpec(hf_config={"model_type": "gpt2", "n_layer": 1, "n_embd": 32,
                                               "n_head": 2, "n_positions": 8, "vocab_size": 40}))
    assert gpt.layer_names() == ["embedding", "block.0", "head"]
    cases = {"my_models:number": "returned int, expected a torch.nn.Module",
             "my_models:missing": "'my_models' has no function 'missing'",
             "my_models:broken": "raised ValueError: no weights here",
             "no_such_pkg.mod:fn": "model.module: cannot import 'no_such_pkg.mod': No module named 'no_such_pkg'"}
    for path, message in cases.items():
        with pytest.raises(PartitaError, match=message):
            build_from_spec(ModelSpec(module=path, seq_len=4, vocab=50))


# ---- agreement with Hugging Face transformers ------------------------------------------------

HF_CONFIGS = {
    "gpt": {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32,
            "vocab_size": 97, "n_inner": 96},
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
              "max_position_embeddings": 16, "vocab_size": 97, "rms_norm_eps": 1e-5},
    "llama-tied": {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64,
                   "num_attention_heads": 8, "head_dim": 16, "intermediate_size": 40,
                   "max_position_embeddings": 16, "vocab_size": 97, "tie_word_embeddings": True,
                   "rms_norm_eps": 1e-5},
    "mistral": {"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 64,
                "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
                "max_position_embeddings": 16,
                "vocab_size": 97, "rms_norm_eps": 1e-5},
    "bert": {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
             "intermediate_size": 80, "max_position_embeddings": 24, "vocab_size": 97,
             "type_vocab_size": 3},
    "t5": {"model_type": "t5", "num_layers": 2, "num_decoder_layers": 3, "d_model": 64, "d_kv": 24,
           "num_heads": 4, "d_ff": 80, "vocab_size": 97, "n_positions": 16},
}
HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
              "bert": "BertForMaskedLM", "t5": "T5ForConditionalGeneration"}


def hf_model(cfg: dict):
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return getattr(transformers, HF_CLASSES[cfg["model_type"]])(config).eval()


@pytest.mark.parametrize("key", list(HF_CONFIGS))
def test_parameter_counts_equal_hugging_face(key):
    hf = hf_model(HF_CONFIGS[key])
    ours = build_model(dims_from_hf_config(HF_CONFIGS[key]), device="meta")
    assert n_params(ours) == n_params(hf)


# our parameter name (regex) -> Hugging Face state-dict name
HF_NAMES = {
    "gpt": [(r"embedding\.tok\.", "transformer.wte."), (r"embedding\.pos\.", "transformer.wpe."),
            (r"block\.(\d+)\.attn_norm\.", r"transformer.h.\1.ln_1."),
            (r"block\.(\d+)\.attn\.[qkv]_proj\.", r"transformer.h.\1.attn.c_attn."),
            (r"block\.(\d+)\.attn\.o_proj\.", r"transformer.h.\1.attn.c_proj."),
            (r"block\.(\d+)\.mlp_norm\.", r"transformer.h.\1.ln_2."),
            (r"block\.(\d+)\.mlp\.up_proj\.", r"transformer.h.\1.mlp.c_fc."),
            (r"block\.(\d+)\.mlp\.down_proj\.", r"transformer.h.\1.mlp.c_proj."),
            (r"head\.norm\.", "transformer.ln_f."), (r"head\.lm_head\.", "lm_head.")],
    "llama": [(r"embedding\.tok\.", "model.embed_tokens."),
              (r"block\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
              (r"block\.(\d+)\.attn\.", r"model.layers.\1.self_attn."),
              (r"block\.(\d+)\.mlp_norm\.", r"model.layers.\1.post_attention_layernorm."),
              (r"block\.(\d+)\.mlp\.", r"model.layers.\1.mlp."),
              (r"head\.norm\.", "model.norm."), (r"head\.lm_head\.", "lm_head.")],
    "bert": [(r"embedding\.tok\.", "bert.embeddings.word_embeddings."),
             (r"embedding\.pos\.", "bert.embeddings.position_embeddings."),
             (r"embedding\.token_type\.", "bert.embeddings.token_type_embeddings."),
             (r"embedding\.norm\.", "bert.embeddings.LayerNorm."),
             (r"block\.(\d+)\.attn\.q_proj\.", r"bert.encoder.layer.\1.attention.self.query."),
             (r"block\.(\d+)\.attn\.k_proj\.", r"bert.encoder.layer.\1.attention.self.key."),
             (r"block\.(\d+)\.attn\.v_proj\.", r"bert.encoder.layer.\1.attention.self.value."),
             (r"block\.(\d+)\.attn\.o_proj\.", r"bert.encoder.layer.\1.attention.output.dense."),
             (r"block\.(\d+)\.attn_norm\.", r"bert.encoder.layer.\1.attention.output.LayerNorm."),
             (r"block\.(\d+)\.mlp\.up_proj\.", r"bert.encoder.layer.\1.intermediate.dense."),
             (r"block\.(\d+)\.mlp\.down_proj\.", r"bert.encoder.layer.\1.output.dense."),
             (r"block\.(\d+)\.mlp_norm\.", r"bert.encoder.layer.\1.output.LayerNorm."),
             (r"head\.transform\.", "cls.predictions.transform.dense."),
             (r"head\.norm\.", "cls.predictions.transform.LayerNorm."),
             (r"head\.lm_head\.weight", "cls.predictions.decoder.weight"),
             (r"head\.lm_head\.bias", "cls.predictions.bias")],
    "t5": [(r"embedding\.tok\.", "shared."),
           (r"(encoder|decoder)\.\d+\.rel_bias\.", r"\1.block.0.layer.0.SelfAttention.relative_attention_bias."),
           (r"(encoder|decoder)\.(\d+)\.attn_norm\.", r"\1.block.\2.layer.0.layer_norm."),
           (r"(encoder|decoder)\.(\d+)\.attn\.([qkvo])_proj\.", r"\1.block.\2.layer.0.SelfAttention.\3."),
           (r"decoder\.(\d+)\.cross_norm\.", r"decoder.block.\1.layer.1.layer_norm."),
           (r"decoder\.(\d+)\.cross_attn\.([qkvo])_proj\.", r"decoder.block.\1.layer.1.EncDecAttention.\2."),
           (r"encoder\.(\d+)\.mlp_norm\.", r"encoder.block.\1.layer.1.layer_norm."),
           (r"decoder\.(\d+)\.mlp_norm\.", r"decoder.block.\1.layer.2.layer_norm."),
           (r"encoder\.(\d+)\.mlp\.up_proj\.", r"encoder.block.\1.layer.1.DenseReluDense.wi."),
           (r"encoder\.(\d+)\.mlp\.down_proj\.", r"encoder.block.\1.layer.1.DenseReluDense.wo."),
           (r"decoder\.(\d+)\.mlp\.up_proj\.", r"decoder.block.\1.layer.2.DenseReluDense.wi."),
           (r"decoder\.(\d+)\.mlp\.down_proj\.", r"decoder.block.\1.layer.2.DenseReluDense.wo."),
           (r"encoder\.\d+\.final_norm\.", "encoder.final_layer_norm."),
           (r"head\.norm\.", "decoder.final_layer_norm."), (r"head\.lm_head\.", "lm_head.")],
}


def hf_value(arch: str, name: str, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The Hugging Face tensor for our parameter `name` (GPT-2's Conv1D stores (in, out) and
    fuses q, k, v along out)."""
    for pattern, repl in HF_NAMES[arch]:
        if re.match(pattern, name):
            value = state[re.sub(pattern, repl, name, count=1)]
            break
    else:
        raise KeyError(name)
    if arch == "gpt" and re.search(r"\.(attn|mlp)\.", name):
        if "_proj.weight" in name:
            value = value.t()
        proj = re.search(r"attn\.([qkv])_proj", name)
        if proj:
            part = "qkv".index(proj.group(1))
            rows = value.shape[0] // 3
            value = value[part * rows:(part + 1) * rows]
    return value


def load_hf_weights(ours, hf) -> None:
    state = hf.state_dict()
    with torch.no_grad():
        for name, param in ours.named_parameters():
            param.copy_(hf_value(ours.dims.arch, name, state))


@pytest.mark.parametrize("key", ["gpt", "llama", "llama-tied", "bert", "t5"])
def test_logits_equal_hugging_face(key):
    """With Hugging Face's weights copied in, our chain computes HF's logits."""
    cfg = HF_CONFIGS[key]
    hf = hf_model(cfg)
    ours = build_model(dims_from_hf_config(cfg))
    load_hf_weights(ours, hf)
    ids, _ = ours.sample_batch(2, seed=5)
    with torch.no_grad():
        if ours.dims.arch == "t5":
            s = ids.shape[1] // 2
            expect = hf(input_ids=ids[:, :s], decoder_input_ids=ids[:, s:]).logits
        else:
            expect = hf(input_ids=ids).logits
        torch.testing.assert_close(ours(ids), expect, rtol=1e-4, atol=1e-4)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("arch", list(TINY))
def test_cuda_model_equals_cpu_model(arch):
    """Same seed, same weights on every device; the fused SDPA kernels (GQA, T5's bias with a
    causal mask) compute what the CPU computes."""
    cpu, gpu = build_model(tiny(arch), seed=2), build_model(tiny(arch), device="cuda", seed=2)
    for (name, a), (_, b) in zip(cpu.named_parameters(), gpu.named_parameters()):
        assert torch.equal(a, b.cpu()), name
    ids, targets = cpu.sample_batch(2)
    torch.testing.assert_close(gpu(ids.cuda()).cpu(), cpu(ids), rtol=1e-4, atol=1e-4)
    loss = gpu.loss(gpu(ids.cuda()), targets.cuda())
    loss.backward()
    assert all(p.grad is not None for p in gpu.parameters())
    half = build_model(tiny(arch), device="cuda", dtype=torch.bfloat16)
    assert half(ids.cuda()).dtype == torch.bfloat16
