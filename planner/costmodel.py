"""Analytic per-layer costs of a transformer (no torch): parameters, FLOPs, activation and output bytes.

Parameters and GEMMs are sums over the model-cost inventory (`planner.inventory`); this module
adds the activation and output bytes and assembles the `ModelProfile`. This is the simulator's
fast path; `planner.profiler` measures the same quantities on the torch models (planner/models/)
and the tests hold the two together: parameters exactly, FLOPs and activation bytes to well under
1%.

FLOPs: 2*m*n*k per GEMM, attention scores and attention-over-values included, causal masking not
discounted, backward = 2 x forward (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters using Megatron-LM", Sec. 5.1); embeddings, norms and element-wise ops
count 0. The LM head GEMM belongs to the "head" layer.

Activation bytes are the inventory's layers counted by `planner.activations.MODULES` (the
tensors partita's torch modules save, [Note: modules] there); output bytes are the hidden states a
layer hands the next (the logits for the head).
"""
from __future__ import annotations

from partita.planner import inventory
from partita.planner.activations import MODULES, ActivationSettings, element_bytes
from partita.planner.errors import PartitaError
from partita.planner.modelspec import TransformerDims
from partita.planner.inventory import Gemm, total_params
from partita.planner.profile import LayerProfile, ModelProfile

__all__ = ["Gemm", "analytic_profile", "block_gemms", "element_bytes", "head_gemms", "layer_params",
           "model_flops_per_step", "total_params"]


# ---- parameters and GEMMs: sums over planner.inventory ----------------------------------------

def layer_params(d: TransformerDims) -> list[tuple[str, str, int]]:
    """(name, kind, parameters) per pipeline layer (planner.inventory.layers)."""
    return [(layer.name, layer.kind, layer.params) for layer in inventory.layers(d)]


def block_gemms(dims: TransformerDims, micro_batch: int, *, kind: str | None = None,
                tensor: int = 1, context: int = 1) -> list[Gemm]:
    """The forward GEMMs of one block ("block"; for t5 "encoder" (default) or "decoder") on one
    tensor-parallel rank, the attention core (`*.scores`, `*.context`) included."""
    kind = kind or inventory.block_kind(dims)
    layer = inventory.block(dims, kind=kind, micro_batch=micro_batch, tensor=tensor, context=context)
    return list(layer.gemms + layer.attention)


def head_gemms(d: TransformerDims, micro_batch: int) -> list[Gemm]:
    return list(inventory.layers(d, micro_batch=micro_batch)[-1].gemms)


def model_flops_per_step(dims: TransformerDims, global_batch: int) -> float:
    """Forward + backward FLOPs of one optimizer step of `global_batch` sequences, no recompute.
    For GPT with ffn = 4h this is exactly Narayanan et al. 2021, eq. 3 without recomputation:
    72 B s l h^2 (1 + s/(6h) + V/(12 l h))."""
    per_seq = sum(3 * layer.fwd_flops for layer in inventory.layers(dims))
    return float(per_seq * global_batch)


def _output_bytes(d: TransformerDims, kind: str, b: int, p: int) -> int:
    if kind == "head":
        return b * d.seq_len * d.vocab * p
    chain = 2 * d.seq_len if d.arch == "t5" else d.seq_len
    return b * chain * d.hidden * p


# ---- the profile -----------------------------------------------------------------------------

def analytic_profile(dims: TransformerDims, *, micro_batch: int, precision: str,
                     name: str = "") -> ModelProfile:
    """Per-layer costs of one micro-batch of `micro_batch` sequences of dims.seq_len tokens."""
    if micro_batch < 1:
        raise PartitaError(f"training.micro_batch: must be >= 1, got {micro_batch}")
    p = element_bytes(precision)
    settings = ActivationSettings(micro_batch=micro_batch, precision=precision)
    layers = []
    for layer in inventory.layers(dims, micro_batch=micro_batch):
        fwd = layer.fwd_flops
        layers.append(LayerProfile(
            name=layer.name, kind=layer.kind, params=layer.params, param_bytes=layer.params * p,
            fwd_flops=float(fwd), bwd_flops=float(2 * fwd), matmul_flops=float(fwd),
            activation_bytes=MODULES.layer_bytes(dims, layer, settings),
            output_bytes=_output_bytes(dims, layer.kind, micro_batch, p)))
    return ModelProfile(model=name or dims.name or dims.arch, method="analytic", precision=precision,
                        micro_batch=micro_batch, seq_len=dims.seq_len, layers=tuple(layers))
