"""A published row's metric as seconds per training step, by the source's own FLOP convention.

Sources report throughput in different currencies (seconds per iteration, tokens/s, TFLOP/s per
GPU, MFU, weak-scaling efficiency, days per epoch). `step_time_from_metric` turns each into the one
quantity the simulator predicts, the time of one optimizer step, and says which formula it used.
(What `partita run` measures on this machine is executor/measure.py, unrelated to this module.)

[Note: FLOP conventions]
Per token of one step, a transformer block costs, forward (the GEMMs of planner.costmodel, which
counts exactly what the sources count: matmuls only; Narayanan et al. 2021,
Appendix "Floating-point operations", generalised to grouped-query attention and gated MLPs as in
Megatron-LM's `num_floating_point_operations`, megatron/training/training.py):
    projections  2 h (a d) + 4 h (g d) + 2 (a d) h     (Q, K and V, output; a heads, g KV heads, d head dim)
    attention    4 s (a d)                           (Q K^T and scores x V, counted in full, not causal)
    MLP          2 h f * (3 if gated else 2)          (up [gate] down)
and the logit layer 2 h V. Backward is twice the forward, so model FLOPs = 3 x forward. For GPT
(g = a, f = 4h) this is the 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) of Megatron-LM's 2024 README,
MosaicML and NeMo (whose llama2 formula 12 + 12 g/a + 18 f/h + 12 s/h + 6 V/(l h) is the same).
Hardware FLOPs add the recomputed forward: full recompute one more forward of every block, giving
Narayanan et al. 2021's 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (Sec. 5.1), which BLOOM's and
MT-NLG's logs and the Megatron 2019/2021 papers report; selective recompute adds the attention core
only (Korthikanti et al. 2022, Sec. 5).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from partita.planner.costmodel import block_gemms, layer_params, model_flops_per_step
from partita.planner.enums import RECOMPUTE
from partita.planner.inventory import block_linears, op_policy_split
from partita.planner.modelspec import TransformerDims
from partita.planner.scenario import Scenario

SECONDS_PER_DAY = 86400.0
CONVENTIONS = ("model", "hardware")
ATTENTION_CORE = (".scores", ".context")     # costmodel's GEMM names for Q K^T and scores x V


class Unconvertible(Exception):
    """The row's metric cannot be turned into seconds per step (a ratio, an average, a bound)."""


@dataclass(frozen=True)
class Measured:
    step_time_s: float
    formula: str            # how the row's value became seconds per step
    convention: str = ""    # "model" | "hardware" where a FLOP count was needed


def model_flops(d: TransformerDims, sequences: int) -> float:
    """Model FLOPs of one step over `sequences` of `d.seq_len` tokens: 3 x forward, no recompute.

    planner.costmodel counts exactly the matmuls of [Note: FLOP conventions], so the sources'
    convention and the simulator's own FLOP count are one function."""
    return model_flops_per_step(d, sequences)


def hardware_flops(d: TransformerDims, sequences: int, recompute: str) -> float:
    """Model FLOPs plus the recomputed forward work (see [Note: FLOP conventions])."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute {recompute!r}")
    blocks = Counter(kind for _, kind, _ in layer_params(d) if kind not in ("embedding", "head"))
    if recompute == "selective-op":              # the linears the op policy runs again
        extra = sum(count * sum(g.flops for g in op_policy_split(block_linears(d, kind=kind))[1])
                    for kind, count in blocks.items())
    else:
        extra = 0 if recompute == "none" else sum(
            count * sum(g.flops for g in block_gemms(d, 1, kind=kind)
                        if recompute == "full" or g.name.endswith(ATTENTION_CORE))
            for kind, count in blocks.items())
    return model_flops(d, sequences) + float(extra) * sequences


def step_flops(s: Scenario, convention: str) -> float:
    dims = s.model.resolve()
    if dims is None:
        raise Unconvertible("model has no transformer dims, so its FLOPs are unknown")
    if convention == "hardware":
        return hardware_flops(dims, s.training.global_batch, s.training.recompute)
    return model_flops(dims, s.training.global_batch)


def _gpus(s: Scenario) -> int:
    if s.parallel is None:
        raise Unconvertible("no parallel plan, so the GPU count is unknown")
    return s.parallel.gpus


def _seq_len(s: Scenario) -> int:
    dims = s.model.resolve()
    if dims is not None:
        return dims.seq_len
    if s.model.seq_len is None:
        raise Unconvertible("model has no sequence length, so tokens per step are unknown")
    return s.model.seq_len


def _iterations(metric: str) -> float:
    """'time per epoch (68,507 iterations)' -> 68507; 'time-to-train 600k iters' -> 600000."""
    m = re.search(r"([\d][\d,]*(?:\.\d+)?)\s*([kKM]?)\s*(?:iterations|iters|steps)\b", metric)
    if not m:
        raise Unconvertible(f"a time in days, but the metric {metric!r} names no iteration count")
    scale = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6}[m.group(2)]
    return float(m.group(1).replace(",", "")) * scale


def _baseline_tflops(metric: str) -> float:
    """'weak-scaling efficiency vs 1.2B on 1 GPU (39 TFLOP/s baseline)' -> 39."""
    m = re.search(r"\(([\d.]+)\s*TFLOP/s baseline\)", metric)
    if not m:
        raise Unconvertible(f"a scaling efficiency without an absolute baseline ({metric!r})")
    return float(m.group(1))


def _from_flop_rate(s: Scenario, tflops_per_gpu: float, convention: str, what: str) -> Measured:
    flops, gpus = step_flops(s, convention), _gpus(s)
    name = "F_hw (model + recomputed forward)" if convention == "hardware" else "F_model"
    return Measured(flops / (tflops_per_gpu * 1e12 * gpus),
                    f"step = {name} / ({what} x gpus) = {flops:.4g} / ({tflops_per_gpu:.4g}e12 x {gpus})",
                    convention)


def step_time_from_metric(s: Scenario, metric: str, value: float, unit: str, *,
                          convention: str, peak_tflops: float | None) -> Measured:
    """Seconds per step for a row reporting `value` in `unit` (`metric` is the row's description).

    `convention` ("model" or "hardware") says how the source counted FLOPs; `peak_tflops` is the
    dense peak the source divided by when it quoted MFU.
    """
    u, low = unit.strip(), metric.lower()
    if u in ("s/iter", "s/step", "s"):
        return Measured(value, "step = reported seconds per iteration")
    tokens = s.training.global_batch * _seq_len(s)
    if u == "tokens/s":
        return Measured(tokens / value, f"step = global_batch x seq_len / tokens_per_s = {tokens} / {value:g}")
    if u == "tokens/s/GPU":
        return Measured(tokens / (value * _gpus(s)),
                        f"step = global_batch x seq_len / (tokens_per_s_per_gpu x gpus) = {tokens} / "
                        f"({value:g} x {_gpus(s)})")
    if u == "samples/s":
        return Measured(s.training.global_batch / value,
                        f"step = global_batch / samples_per_s = {s.training.global_batch} / {value:g}")
    if u == "days":
        iters = _iterations(metric)
        return Measured(value * SECONDS_PER_DAY / iters, f"step = days x 86400 / iterations = "
                        f"{value:g} x 86400 / {iters:g}")
    if u == "TFLOP/s/GPU":
        return _from_flop_rate(s, value, convention, "TFLOP/s per GPU")
    if u == "%" and ("mfu" in low or "flops utilization" in low):
        if peak_tflops is None:
            raise Unconvertible("an MFU, but the peak the source divided by is unknown for this GPU")
        return _from_flop_rate(s, value / 100 * peak_tflops, "model",
                               f"MFU {value:g}% x {peak_tflops:g} TFLOP/s peak")
    if u == "%" and "efficiency" in low:
        base = _baseline_tflops(metric)
        return _from_flop_rate(s, value / 100 * base, convention,
                               f"efficiency {value:g}% x {base:g} TFLOP/s baseline")
    raise Unconvertible(f"metric {metric!r} in {unit!r} is not a time, throughput or FLOP rate "
                        "of this run (a ratio, an aggregate or another quantity)")
