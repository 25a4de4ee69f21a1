"""Transformer dimensions from a Hugging Face `config.json` mapping (no transformers import needed).

Supported `model_type`s: gpt2, llama, mistral (a Llama shape), bert and t5 (original, ReLU). Missing
keys take the defaults of the transformers configuration classes (GPT2Config, LlamaConfig,
MistralConfig, BertConfig, T5Config); a key that changes the architecture beyond what the torch
models implement (biases in Llama, gated T5 feed-forward, ...) is rejected rather than ignored,
so parameter counts stay exact. seq_len defaults to the config's maximum positions (512 for t5).
`dropout` (a cost-model fact: dropout masks in memory, what an early-stopped recompute skips) is
whether any of the class's dropout probabilities is above 0.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from partita.planner.dims import TransformerDims
from partita.planner.documents import Checker
from partita.planner.errors import PartitaError, closest, unknown_name

WHERE = "model.hf_config"

# canonical key -> alias accepted in its place (the config classes' attribute_map)
ALIASES = {
    "gpt2": {"n_layer": "num_hidden_layers", "n_embd": "hidden_size", "n_head": "num_attention_heads",
             "n_positions": "max_position_embeddings"},
    "t5": {"d_model": "hidden_size", "num_heads": "num_attention_heads", "num_layers": "num_hidden_layers",
           "d_kv": "head_dim"},
}


# keys whose null means "derive it" in the transformers classes (GPT2Config.n_inner = None ->
# 4*n_embd; LlamaConfig.num_key_value_heads / head_dim = None -> heads / hidden // heads)
NULL_MEANS_DEFAULT = ("n_inner", "num_key_value_heads", "head_dim")
# common config.json keys that do not change the shape; never taken for a misspelling
SHAPELESS = ("n_ctx", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta",
             "rope_scaling", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype",
             "architectures", "transformers_version", "use_cache", "initializer_range",
             "initializer_factor", "dropout_rate", "attention_dropout", "hidden_dropout_prob",
             "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop",
             "decoder_start_token_id", "is_encoder_decoder", "activation_function",
             "position_embedding_type", "pretraining_tp", "num_decoder_layers")


class _Config:
    """Typed reads of the config with HF defaults; errors name `model.hf_config.<key>`.

    A key given as null, or misspelt (close to a key this reader uses), is an error rather than
    a silent default: `n_layers: 4` must not give GPT2Config's 12 layers."""

    def __init__(self, cfg: dict[str, Any], model_type: str):
        self.check = Checker(cfg, WHERE, "")
        self.aliases = ALIASES.get(model_type, {})
        self.used: set[str] = {"model_type"}

    def key(self, key: str) -> str:
        alias = self.aliases.get(key)
        self.used.update((key, alias) if alias else (key,))
        mapping = self.check.mapping
        if alias and key in mapping and alias in mapping and mapping[key] != mapping[alias]:
            raise self.check.error(f"{mapping[key]!r}, but its alias {alias} is "
                                   f"{mapping[alias]!r}; give one of them", key)
        if key not in self.check.mapping and alias and alias in self.check.mapping:
            key = alias
        if key in self.check.mapping and self.check.mapping[key] is None \
                and key not in NULL_MEANS_DEFAULT:
            raise self.check.error("null is not a value here; give the value or leave the key "
                                   "out for the transformers default", key)
        return key

    def int(self, key: str, default: int | None) -> int | None:
        return self.check.int(self.key(key), default)

    def bool(self, key: str, default: bool) -> bool:
        return self.check.bool(self.key(key), default)

    def dropout(self, defaults: dict[str, float]) -> bool:
        """Whether the model applies dropout: any of its dropout probabilities (`defaults`: the
        transformers class's keys and defaults) above 0 (`TransformerDims.dropout`)."""
        applied = False
        for key, default in defaults.items():
            p = self.check.number(self.key(key), default, positive=False)
            if not 0.0 <= p <= 1.0:
                raise self.check.error(f"a probability: expected 0 to 1, got {p:g}", key)
            applied = applied or p > 0
        return applied

    def check_spelling(self) -> None:
        """A key close to one this reader uses but not used itself is taken for a typo."""
        known = sorted(self.used)
        for key in self.check.mapping:
            key = str(key)
            if key in self.used or key in SHAPELESS:
                continue
            near = closest(key, known, n=1, cutoff=0.85)
            if near:
                raise self.check.error(f"unknown key; did you mean {near[0]!r}? (a misspelt key "
                                       "would silently take the transformers default)", key)

    def require(self, key: str, allowed: tuple[Any, ...], default: Any) -> None:
        """Reject a value the torch models do not implement (it would change the parameters)."""
        self.used.add(key)
        value = self.check.mapping.get(key, default)
        if value not in allowed:
            shown = ", ".join(repr(a) for a in allowed)
            raise self.check.error(f"only {shown} supported, got {value!r}", key)


def dims_from_hf_config(cfg: dict[str, Any]) -> TransformerDims:
    """The `TransformerDims` of a Hugging Face config dict (see the module docstring)."""
    if not isinstance(cfg, dict):
        raise PartitaError(f"{WHERE}: expected a mapping, got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type is None:
        raise PartitaError(f"{WHERE}.model_type: missing required key "
                           f"(expected one of {', '.join(sorted(READERS))})")
    if model_type not in READERS:
        raise unknown_name(f"{WHERE}.model_type", str(model_type), READERS)
    config = _Config(cfg, model_type)
    dims = READERS[model_type](config)
    config.check_spelling()
    return dims


def _gpt2(c: _Config) -> TransformerDims:
    """GPT2Config defaults (transformers 4.x/5.x)."""
    c.require("add_cross_attention", (False,), False)
    hidden, positions = c.int("n_embd", 768), c.int("n_positions", 1024)
    return TransformerDims(
        arch="gpt", layers=c.int("n_layer", 12), hidden=hidden, heads=c.int("n_head", 12),
        ffn_hidden=c.int("n_inner", 4 * hidden), seq_len=positions, max_positions=positions,
        vocab=c.int("vocab_size", 50257), tie_embeddings=c.bool("tie_word_embeddings", True),
        dropout=c.dropout({"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}))


def _llama(c: _Config, defaults: dict[str, int]) -> TransformerDims:
    c.require("attention_bias", (False,), False)
    c.require("mlp_bias", (False,), False)
    c.require("hidden_act", ("silu",), "silu")
    heads = c.int("num_attention_heads", 32)
    return TransformerDims(
        arch="llama", layers=c.int("num_hidden_layers", 32), hidden=c.int("hidden_size", 4096),
        heads=heads, kv_heads=c.int("num_key_value_heads", defaults["kv_heads"] or heads),
        ffn_hidden=c.int("intermediate_size", defaults["ffn"]), head_dim=c.int("head_dim", 0),
        seq_len=c.int("max_position_embeddings", defaults["positions"]),
        vocab=c.int("vocab_size", 32000), tie_embeddings=c.bool("tie_word_embeddings", False),
        dropout=c.dropout({"attention_dropout": 0.0}))


def _bert(c: _Config) -> TransformerDims:
    """BertConfig defaults."""
    positions = c.int("max_position_embeddings", 512)
    return TransformerDims(
        arch="bert", layers=c.int("num_hidden_layers", 12), hidden=c.int("hidden_size", 768),
        heads=c.int("num_attention_heads", 12), ffn_hidden=c.int("intermediate_size", 3072),
        seq_len=positions, max_positions=positions, vocab=c.int("vocab_size", 30522),
        type_vocab=c.int("type_vocab_size", 2), tie_embeddings=c.bool("tie_word_embeddings", True),
        dropout=c.dropout({"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}))


def _t5(c: _Config) -> TransformerDims:
    """T5Config defaults (t5-small); v1.1's gated-gelu feed-forward is not implemented."""
    c.require("feed_forward_proj", ("relu",), "relu")
    c.require("relative_attention_num_buckets", (32,), 32)
    c.require("relative_attention_max_distance", (128,), 128)
    layers = c.int("num_layers", 6)
    return TransformerDims(
        arch="t5", layers=layers, decoder_layers=c.int("num_decoder_layers", layers),
        hidden=c.int("d_model", 512), heads=c.int("num_heads", 8), head_dim=c.int("d_kv", 64),
        ffn_hidden=c.int("d_ff", 2048), seq_len=c.int("n_positions", 512),
        vocab=c.int("vocab_size", 32128), tie_embeddings=c.bool("tie_word_embeddings", True),
        dropout=c.dropout({"dropout_rate": 0.1}))


READERS: dict[str, Callable[[_Config], TransformerDims]] = {
    "gpt2": _gpt2,
    "llama": lambda c: _llama(c, {"kv_heads": 0, "ffn": 11008, "positions": 2048}),   # LlamaConfig
    "mistral": lambda c: _llama(c, {"kv_heads": 8, "ffn": 14336, "positions": 4096 * 32}),
    "bert": _bert,
    "t5": _t5,
}
