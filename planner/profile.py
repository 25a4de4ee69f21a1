"""Per-layer costs of one micro-batch: the record the profiler writes and the simulator reads.

A profile comes from the analytic transformer model (`planner.costmodel`, no torch) or from
tracing a torch module on the meta device (`planner.profiler`); both give the same record.
FLOPs are per micro-batch, forward and backward separately, without recompute.

Three modules, one profile: this one holds the record (types only, no torch); planner/profiler.py
makes it from a torch module (torch at import); simulator/profiled.py turns it into step costs for
a `model: {module: ...}` scenario, which has no transformer dimensions to cost analytically.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from partita.planner.errors import PartitaError


@dataclass(frozen=True)
class LayerProfile:
    name: str                      # "embedding", "block.0", "encoder.3", "decoder.0", "head"
    kind: str                      # embedding | block | encoder | decoder | head | other
    params: int
    param_bytes: int               # at the training precision's parameter dtype
    fwd_flops: float
    bwd_flops: float
    activation_bytes: int          # saved for backward (no recompute), one micro-batch
    output_bytes: int              # tensor passed to the next layer
    matmul_flops: float = 0.0      # part of fwd_flops done as matrix multiplies (incl. attention)
    fwd_s: float | None = None     # measured (profile --measure)
    bwd_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class ModelProfile:
    model: str
    method: str                    # "analytic" | "meta-device"
    precision: str
    micro_batch: int
    seq_len: int
    layers: tuple[LayerProfile, ...]
    device: str | None = None      # where measured timings were taken

    @property
    def total_params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def total_flops(self) -> float:
        """Forward plus backward FLOPs of one micro-batch, no recompute."""
        return sum(layer.fwd_flops + layer.bwd_flops for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "method": self.method, "precision": self.precision,
                "micro_batch": self.micro_batch, "seq_len": self.seq_len,
                "device": self.device, "total_params": self.total_params,
                "total_flops": self.total_flops, "layers": [l.to_dict() for l in self.layers]}


PARTIAL_RECOMPUTE = ("selective", "selective-op")     # policies that re-run parts of a block


def refuse_partial_recompute(recompute: str, where: str = "") -> None:
    """A profiled module (`model.module`) has layers but no known transformer block structure, so
    the recompute policies that re-run parts of a block cannot be priced: one error line."""
    if recompute in PARTIAL_RECOMPUTE:
        raise PartitaError(f"{where}training.recompute = {recompute}: selective recompute re-runs "
                           "parts of a transformer block, and a model given as model.module has no "
                           "known block structure; use none or full, or give transformer dims, a "
                           "preset or an hf_config")
