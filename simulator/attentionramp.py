"""How a flash-attention kernel's efficiency falls with shorter sequences, smaller heads and a causal mask.

A flash kernel (Dao et al. 2022, 2023) tiles the queries over thread blocks and streams the keys
through each; the work per tile is fixed (load Q, write O, rescale the softmax), so a short sequence
amortises it over fewer key tiles, a small head dimension gives each tile less math per byte, and
a causal mask leaves the diagonal tiles half empty. FlashAttention-2's published benchmark
(forward + backward TFLOP/s by sequence length, head dimension 64 and 128, with and without the
mask; causal FLOPs counted for the unmasked half, as `simulator.compute` counts them) measures that
ramp. `AttentionRamp` holds those points relative to the best of them, so a GPU's attention
efficiency is its long-sequence efficiency (data/calibration/compute.yaml) times the ramp at the
kernel's sequence length and head dimension: the shape comes from the measurement, the level from
the kernel the run uses. A GPU whose own flash kernel was timed apart has a ramp of its own for
it (Hopper: cuDNN's fused attention, timed forward and backward on an H200, steeper than
FlashAttention-2's under the causal mask: 27% of its best at 512 tokens, 68% at 2k, 83% at 4k).
Between head dimensions 64 and 128 the ramp is interpolated in log2(head dim), beyond them held.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from partita.simulator.curve import Curve

HEAD_DIMS = (64, 128)
CURVE_KEYS = tuple(f"{mask}_hd{d}" for mask in ("causal", "full") for d in HEAD_DIMS)


@dataclass(frozen=True)
class AttentionRamp:
    """Relative efficiency (1.0 = the best measured point) over sequence length, per (causal,
    head dim) in `curves` (keys of CURVE_KEYS)."""
    curves: dict[str, Curve] = field(hash=False)
    source: tuple[str, ...] = ()

    @property
    def best(self) -> float:
        """The ramp at its best measured point (1.0 unless taken relative to another kernel)."""
        return max(max(c.ys) for c in self.curves.values())

    def __call__(self, seq_len: float, head_dim: float, causal: bool) -> float:
        mask = "causal" if causal else "full"
        lo, hi = (self.curves[f"{mask}_hd{d}"](seq_len) for d in HEAD_DIMS)
        d = min(max(head_dim, HEAD_DIMS[0]), HEAD_DIMS[1])
        w = math.log2(d / HEAD_DIMS[0]) / math.log2(HEAD_DIMS[1] / HEAD_DIMS[0])
        return lo + (hi - lo) * w


def ramp_from_tflops(points: dict[str, list[tuple[float, float]]],
                     source: tuple[str, ...] = (), best: float | None = None) -> AttentionRamp:
    """An AttentionRamp from measured [sequence length, TFLOP/s] points per curve key, each point
    taken relative to `best` (default: the best point of all curves). An older kernel measured in
    the same figure as FlashAttention-2 takes FlashAttention-2's best, so its ramp times the GPU's
    FlashAttention-2 efficiency is its own efficiency."""
    best = best if best is not None else max(t for pts in points.values() for _, t in pts)
    curves = {key: Curve(tuple(s for s, _ in sorted(pts)), tuple(t / best for _, t in sorted(pts)))
              for key, pts in points.items()}
    return AttentionRamp(curves, source)
