"""The resolved shape of a gpt / llama / bert / t5 transformer (`TransformerDims`).

The analytic cost model, the torch modules and the simulator all read it; `modelspec` resolves a
scenario's `model:` section (preset, HF config or explicit dims) to one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from partita.planner.enums import ARCHS
from partita.planner.errors import PartitaError


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
    dropout: bool | None = None  # dropout on the residual branches, attention and embedding;
                                 # None -> arch default: Megatron-LM's 0.1 for gpt, bert and t5,
                                 # none for llama (Llama has no dropout)
    type_vocab: int = 2          # bert token-type embeddings
    mlm_predictions: int = 0     # bert: positions per sequence the MLM head runs on; 0 -> all
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
        if self.dropout is None:
            set_(self, "dropout", self.arch != "llama")
        if self.heads % self.kv_heads:
            raise PartitaError(f"model.heads ({self.heads}) must be divisible by "
                               f"model.kv_heads ({self.kv_heads})")
        if self.mlm_predictions and self.arch != "bert":
            raise PartitaError(f"model.mlm_predictions: only for arch bert (its masked-LM head), "
                               f"got arch {self.arch}")
        if not 0 <= self.mlm_predictions <= self.seq_len:
            raise PartitaError(f"model.mlm_predictions: expected 1 to model.seq_len "
                               f"({self.seq_len}), got {self.mlm_predictions}")

    @property
    def total_layers(self) -> int:
        """Transformer blocks in the whole model (encoder + decoder for t5)."""
        return self.layers + self.decoder_layers

    @property
    def head_positions(self) -> int:
        """Positions per sequence the LM head (its transform, projection and loss) runs on.

        BERT pre-training predicts only the masked positions (Devlin et al. 2019, Sec. 3.1: 15% of
        them); NVIDIA's BERT gathers those before the head ("dense sequence output": DeepLearningExamples
        PyTorch/LanguageModeling/BERT/modeling.py, BertPreTrainingHeads, on by default in
        run_pretraining.py; MLPerf BERT's --dense_seq_output), so the head's matmuls and loss see
        `mlm_predictions` rows per sequence (run_pretraining.sh: max_predictions_per_seq 20 of 128,
        80 of 512). Hugging Face's and Megatron-LM's BERT run the head on every position."""
        return self.mlm_predictions or self.seq_len

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.mlm_predictions:
            del out["mlm_predictions"]
        return out
