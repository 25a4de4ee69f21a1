"""The cost of one pipeline model chunk for one micro-batch: the record both model-cost
implementations (simulator/stagecosts.py, simulator/profiled.py) return and the pipeline reads."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChunkCost:
    """Seconds per micro-batch for one model chunk, and what they are made of."""
    forward_s: float
    backward_s: float          # includes recompute
    backward_weight_s: float
    parts: dict[str, float] = field(default_factory=dict, hash=False)   # per micro-batch, fwd+bwd
