"""Hugging Face config.json -> TransformerDims: published configs, defaults, aliases and errors."""
from __future__ import annotations

import pytest

from partita.cli import main
from partita.planner.costmodel import total_params
from partita.planner.errors import PartitaError
from partita.planner.hf_config import dims_from_hf_config
from partita.planner.modelspec import TransformerDims, preset_dims

# The config.json files of the published checkpoints (keys that do not matter trimmed).
GPT2 = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "eos_token_id": 50256, "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12,
        "n_positions": 1024, "summary_activation": None, "vocab_size": 50257}
LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
             "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
             "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
             "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
              "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
              "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
              "tie_word_embeddings": False, "vocab_size": 32000}
BERT_BASE = {"architectures": ["BertForMaskedLM"], "hidden_act": "gelu", "hidden_size": 768,
             "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
             "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 12,
             "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522}
T5_SMALL = {"architectures": ["T5ForConditionalGeneration"], "d_ff": 2048, "d_kv": 64, "d_model": 512,
            "decoder_start_token_id": 0, "layer_norm_epsilon": 1e-06, "model_type": "t5",
            "n_positions": 512, "num_heads": 8, "num_layers": 6, "relative_attention_num_buckets": 32,
            "vocab_size": 32128}


@pytest.mark.parametrize("cfg, preset", [(GPT2, "gpt2"), (LLAMA2_7B, "llama2-7b"),
                                         (BERT_BASE, "bert-base"), (T5_SMALL, "t5-small")])
def test_published_configs_give_the_presets(cfg, preset):
    dims = dims_from_hf_config(cfg)
    want = preset_dims(preset)
    for key in ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "head_dim",
                "decoder_layers", "seq_len", "vocab", "max_positions", "tie_embeddings"):
        assert getattr(dims, key) == getattr(want, key), key


def test_mistral_is_a_llama_shape():
    dims = dims_from_hf_config(MISTRAL_7B)
    assert (dims.arch, dims.kv_heads, dims.ffn_hidden, dims.seq_len) == ("llama", 8, 14336, 32768)
    assert total_params(dims) == 7_241_732_096          # Mistral-7B-v0.1


def test_defaults_are_the_config_classes():
    assert dims_from_hf_config({"model_type": "gpt2"}) == TransformerDims(
        arch="gpt", layers=12, hidden=768, heads=12, seq_len=1024, vocab=50257)
    t5 = dims_from_hf_config({"model_type": "t5"})
    assert (t5.layers, t5.decoder_layers, t5.hidden, t5.heads, t5.head_dim, t5.ffn_hidden) == (6, 6, 512, 8, 64, 2048)
    llama = dims_from_hf_config({"model_type": "llama"})
    assert (llama.kv_heads, llama.ffn_hidden, llama.seq_len, llama.tie_embeddings) == (32, 11008, 2048, False)
    assert dims_from_hf_config({"model_type": "mistral"}).kv_heads == 8
    bert = dims_from_hf_config({"model_type": "bert", "type_vocab_size": 4})
    assert bert.type_vocab == 4 and total_params(bert) == total_params(preset_dims("bert-base")) + 2 * 768


def test_aliases_and_nulls():
    dims = dims_from_hf_config({"model_type": "gpt2", "num_hidden_layers": 2, "hidden_size": 64,
                                "num_attention_heads": 4, "n_inner": None})
    assert (dims.layers, dims.hidden, dims.heads, dims.ffn_hidden) == (2, 64, 4, 256)
    assert dims_from_hf_config({**LLAMA2_7B, "head_dim": None}).head_dim == 128


@pytest.mark.parametrize("cfg, message", [
    ({"n_layer": 2}, "model.hf_config.model_type: missing required key "
                     r"\(expected one of bert, gpt2, llama, mistral, t5\)"),
    ({"model_type": "gpt-neox"}, "unknown model.hf_config.model_type 'gpt-neox'.*valid: bert, gpt2, llama, mistral, t5"),
    ({"model_type": "gpt2", "n_layer": "twelve"}, "model.hf_config.n_layer: expected an integer, got 'twelve'"),
    ({"model_type": "gpt2", "n_head": 0}, "model.hf_config.n_head: must be >= 1, got 0"),
    ({"model_type": "t5", "feed_forward_proj": "gated-gelu"},
     "model.hf_config.feed_forward_proj: only 'relu' supported, got 'gated-gelu'"),
    ({"model_type": "llama", "attention_bias": True}, "model.hf_config.attention_bias: only False supported"),
    ({"model_type": "bert", "tie_word_embeddings": "yes"},
     "model.hf_config.tie_word_embeddings: expected true or false, got 'yes'"),
])
def test_errors(cfg, message):
    with pytest.raises(PartitaError, match=message):
        dims_from_hf_config(cfg)


def test_bad_hf_config_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {hf_config: {model_type: gpt2, n_layer: twelve}}\n"
                    "cluster: {system: dgx-h100, gpus: 8}\ntraining: {global_batch: 8}\n")
    assert main(["profile", str(path), "--json"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"error: {path}: model.hf_config.n_layer: expected an integer, got 'twelve'"


def test_a_hub_id_for_hf_config_says_what_to_give_instead(tmp_path, capsys):
    """A Hugging Face hub id (or a file name) is not fetched: one line naming the key, what it
    takes and the presets."""
    path = tmp_path / "hub.yaml"
    path.write_text("model: {hf_config: mistralai/Mistral-7B-v0.1}\n"
                    "cluster: {system: dgx-h100, gpus: 8}\ntraining: {global_batch: 8}\n")
    assert main(["simulate", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: model.hf_config: expected the fields of a Hugging Face "
                          "config.json as a mapping") and "\n" not in err
    assert "'mistralai/Mistral-7B-v0.1'" in err and "model.preset (valid: bert-base," in err


def test_hf_config_scenario_profiles(tmp_path, capsys):
    path = tmp_path / "hf.yaml"
    path.write_text("model: {hf_config: {model_type: llama, num_hidden_layers: 2, hidden_size: 64,\n"
                    "  num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 96,\n"
                    "  max_position_embeddings: 32, vocab_size: 100}}\n"
                    "cluster: {system: dgx-h100, gpus: 8}\ntraining: {global_batch: 8, precision: fp32}\n")
    assert main(["profile", str(path)]) == 0
    out = capsys.readouterr().out
    assert "block.1" in out and "total" in out


@pytest.mark.parametrize("cfg, message", [
    ({"model_type": "gpt2", "n_layers": 4}, "model.hf_config.n_layers: unknown key; did you mean 'n_layer'?"),
    ({"model_type": "llama", "num_hidden_layer": 4},
     "model.hf_config.num_hidden_layer: unknown key; did you mean 'num_hidden_layers'?"),
    ({"model_type": "gpt2", "n_layer": None}, "model.hf_config.n_layer: null is not a value here"),
    ({"model_type": "bert", "hidden_size": None}, "model.hf_config.hidden_size: null is not a value here"),
    ({"model_type": "gpt2", "n_layer": 4, "num_hidden_layers": 12},
     "model.hf_config.n_layer: 4, but its alias num_hidden_layers is 12; give one of them"),
])
def test_typos_and_nulls_are_errors_not_defaults(cfg, message):
    with pytest.raises(PartitaError) as exc:
        dims_from_hf_config(cfg)
    assert str(exc.value).startswith(message)


def test_nulls_that_mean_derive_it_and_shapeless_keys_are_accepted():
    dims = dims_from_hf_config({"model_type": "gpt2", "n_layer": 2, "n_inner": None, "n_ctx": 1024,
                                "layer_norm_epsilon": 1e-5, "architectures": ["GPT2LMHeadModel"]})
    assert dims.layers == 2 and dims.ffn_hidden == 4 * 768


@pytest.mark.parametrize("cfg, dropout", [
    (GPT2, True),                                                   # GPT2Config: 0.1 each
    ({**GPT2, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}, False),
    ({**GPT2, "attn_pdrop": 0.0, "resid_pdrop": 0.0}, True),        # embd_pdrop's default 0.1
    (LLAMA2_7B, False),                                             # attention_dropout 0.0
    ({**LLAMA2_7B, "attention_dropout": 0.1}, True),
    (BERT_BASE, True),
    ({**BERT_BASE, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}, False),
])
def test_dropout_is_read_from_the_configs_dropout_probabilities(cfg, dropout):
    assert dims_from_hf_config(cfg).dropout is dropout


@pytest.mark.parametrize("value, says", [(1.5, "expected 0 to 1, got 1.5"),
                                         (-0.1, "expected 0 to 1, got -0.1"),
                                         ("0.1", "expected a number")])
def test_a_bad_dropout_probability_names_the_key(value, says, tmp_path, capsys):
    with pytest.raises(PartitaError, match=rf"model\.hf_config\.resid_pdrop: .*{says}"):
        dims_from_hf_config({**GPT2, "resid_pdrop": value})
    import yaml
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"hf_config": {**GPT2, "resid_pdrop": value}},
        "cluster": {"system": "dgx-a100-80gb", "gpus": 8},
        "training": {"global_batch": 8}, "parallel": {"data": 8}}))
    assert main(["simulate", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "resid_pdrop" in err[0]
