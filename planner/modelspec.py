"""What model a scenario trains: transformer dimensions, named presets, HF configs, import paths.

`ModelSpec` is the scenario's `model:` section as written; `resolve()` turns it into the
`TransformerDims` (planner/dims.py) of a gpt / llama / bert / t5 transformer, from explicit dims, a
named preset or a Hugging Face config (planner/hf_config.py). A `module:` model has no dims; only
the torch profiler can cost it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import yaml

from partita.planner.dims import TransformerDims
from partita.planner.errors import PartitaError, unknown_name
from partita.planner.hf_config import dims_from_hf_config
from partita.planner.paths import MODELS_DIR


@dataclass(frozen=True)
class ModelSpec:
    """The scenario's `model:` section: exactly one of dims, preset, hf_config or module."""

    dims: TransformerDims | None = None
    preset: str | None = None
    hf_config: dict[str, Any] | None = field(default=None, hash=False)
    module: str | None = None
    seq_len: int | None = None      # override / required for module
    vocab: int | None = None        # required for module (token ids fed to it)
    origin: str = field(default="", compare=False)  # the scenario file: `module` is found beside it

    @property
    def kind(self) -> str:
        for k in ("dims", "preset", "hf_config", "module"):
            if getattr(self, k) is not None:
                return k
        raise AssertionError("ModelSpec with no model")

    def resolve(self) -> TransformerDims | None:
        """The transformer shape, or None for an arbitrary `module:` model."""
        if self.dims is not None:
            return self.dims
        if self.preset is not None:
            dims = preset_dims(self.preset)
        elif self.hf_config is not None:
            dims = dims_from_hf_config(self.hf_config)
        else:
            return None
        if self.seq_len is not None:
            dims = replace(dims, seq_len=self.seq_len,
                           max_positions=max(dims.max_positions, self.seq_len))
        return dims

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any]
        if self.dims is not None:
            d = self.dims
            out = {"arch": d.arch, "layers": d.layers, "hidden": d.hidden, "heads": d.heads,
                   "kv_heads": d.kv_heads, "ffn_hidden": d.ffn_hidden, "seq_len": d.seq_len,
                   "vocab": d.vocab}
            if d.arch == "t5":
                out["decoder_layers"] = d.decoder_layers
            if d.head_dim != d.hidden // d.heads:
                out["head_dim"] = d.head_dim
            if d.max_positions != d.seq_len:
                out["max_positions"] = d.max_positions
            if d.tie_embeddings != (d.arch != "llama"):
                out["tie_embeddings"] = d.tie_embeddings
            if d.dropout != (d.arch != "llama"):
                out["dropout"] = d.dropout
            if d.mlm_predictions:
                out["mlm_predictions"] = d.mlm_predictions
            return out
        out = {self.kind: getattr(self, self.kind)}
        if self.seq_len is not None:
            out["seq_len"] = self.seq_len
        if self.vocab is not None:
            out["vocab"] = self.vocab
        return out


@lru_cache(maxsize=1)
def _presets() -> dict[str, dict[str, Any]]:
    with open(MODELS_DIR / "presets.yaml", encoding="utf-8") as fh:
        return yaml.safe_load(fh)["presets"]


def preset_names() -> list[str]:
    return sorted(_presets())


def preset_dims(name: str) -> TransformerDims:
    presets = _presets()
    if name not in presets:
        raise unknown_name("model preset", name, presets)
    fields = {k: v for k, v in presets[name].items() if k != "source"}
    return TransformerDims(name=name, **fields)
