"""What model a scenario trains: transformer dimensions, named presets, HF configs, import paths.

`ModelSpec` is the scenario's `model:` section as written. `TransformerDims` is the resolved shape
of a gpt / llama / bert / t5 transformer, which the analytic cost model, the torch modules and the
simulator all read. A `module:` model has no dims; only the torch profiler can cost it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

import yaml

from partita.planner.enums import ARCHS
from partita.planner.errors import PartitaError, unknown_name
from partita.planner.paths import MODELS_DIR


@dataclass(frozen=True)
class TransformerDims:
    """Shape of a transformer language model. `layers` are encoder layers for t5."""

    arch: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int = 0            # 0 -> heads
    ffn_hidden: int = 0          # 0 -> 4 * hidden (gpt, bert, t5)
    head_dim: int = 0            # 0 -> hidden // heads
    decoder_layers: int = 0      # t5 only; 0 -> layers
    max_positions: int = 0       # learned position table (gpt, bert); 0 -> seq_len
    tie_embeddings: bool | None = None   # None -> arch default (untied for llama only)
    type_vocab: int = 2          # bert token-type embeddings
    name: str = ""

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise PartitaError(f"model.arch: expected one of {', '.join(ARCHS)}, got {self.arch!r}")
        set_ = object.__setattr__
        if not self.kv_heads:
            set_(self, "kv_heads", self.heads)
        if not self.head_dim:
            if self.hidden % self.heads:
                raise PartitaError(f"model.hidden ({self.hidden}) must be divisible by "
                                   f"model.heads ({self.heads})")
            set_(self, "head_dim", self.hidden // self.heads)
        if not self.ffn_hidden:
            if self.arch == "llama":
                raise PartitaError("model.ffn_hidden: required for arch llama")
            set_(self, "ffn_hidden", 4 * self.hidden)
        if self.arch == "t5" and not self.decoder_layers:
            set_(self, "decoder_layers", self.layers)
        if self.arch != "t5" and self.decoder_layers:
            raise PartitaError(f"model.decoder_layers: only for arch t5, got arch {self.arch}")
        if not self.max_positions:
            set_(self, "max_positions", self.seq_len)
        if self.tie_embeddings is None:
            set_(self, "tie_embeddings", self.arch != "llama")
        if self.heads % self.kv_heads:
            raise PartitaError(f"model.heads ({self.heads}) must be divisible by "
                               f"model.kv_heads ({self.kv_heads})")

    @property
    def total_layers(self) -> int:
        """Transformer blocks in the whole model (encoder + decoder for t5)."""
        return self.layers + self.decoder_layers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
            from partita.planner.hf_config import dims_from_hf_config
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
