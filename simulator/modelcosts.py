"""The model-cost interface: what the step simulation asks of a model, and its two implementations.

A transformer scenario is costed analytically from its dimensions (`AnalyticCosts`: the inventory
of planner/inventory.py through simulator/compute.py, stagecosts.py and memory.py); a
`model: {module: ...}` scenario from its meta-device profile (`ProfiledCosts`:
simulator/profiled.py). `model_costs` chooses once, from the resolved scenario; the step
simulation (simulator/step.py) calls only the interface.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from partita.planner.activations import MEGATRON, ActivationModel
from partita.planner.enums import FLASH_KERNELS
from partita.planner.costmodel import model_flops_per_step
from partita.simulator import memory, profiled, stagecosts
from partita.simulator.chunkcost import ChunkCost
from partita.simulator.context import StepContext
from partita.simulator.memory import MemoryEstimate
from partita.simulator.stepenv import StepEnv


class ModelCosts(Protocol):
    def layer_count(self, ctx: StepContext) -> int:
        """Pipeline layers the chunks split (blocks of a transformer, profiled layers of a module)."""

    def chunk_costs(self, env: StepEnv) -> list[ChunkCost]:
        """Per model chunk, seconds per micro-batch."""

    def boundary_bytes(self, ctx: StepContext) -> list[float]:
        """Per chunk boundary, the bytes of the activation (and of its gradient) that cross it."""

    def chunk_parameters(self, ctx: StepContext) -> list[float]:
        """Per model chunk, the parameters one tensor-parallel rank holds."""

    def pipeline_memory(self, env: StepEnv, inflight: Sequence[float]) -> tuple[MemoryEstimate, ...]:
        """Per pipeline rank, its memory with `inflight` micro-batches of activations."""

    def model_flops_per_step(self, ctx: StepContext) -> float:
        """Forward plus backward FLOPs of one optimizer step, no recompute."""


def _boundaries(ctx: StepContext) -> range:
    return range(ctx.parallel.pipeline * ctx.parallel.virtual_stages - 1)


@dataclass(frozen=True)
class AnalyticCosts:
    """A transformer given by its dimensions; its activations as `activations` counts them
    (planner/activations.py)."""

    activations: ActivationModel = MEGATRON

    def layer_count(self, ctx: StepContext) -> int:
        return ctx.dims.total_layers

    def chunk_costs(self, env: StepEnv) -> list[ChunkCost]:
        return stagecosts.chunk_costs(env)

    def boundary_bytes(self, ctx: StepContext) -> list[float]:
        return [stagecosts.boundary_bytes(ctx, c) for c in _boundaries(ctx)]

    def chunk_parameters(self, ctx: StepContext) -> list[float]:
        return memory.chunk_parameters(ctx.dims, ctx.parallel)

    def pipeline_memory(self, env: StepEnv, inflight: Sequence[float]) -> tuple[MemoryEstimate, ...]:
        ctx = env.ctx
        return memory.pipeline_memory(ctx.dims, ctx.training, ctx.parallel, env.cal,
                                      microbatches=ctx.microbatches, inflight=inflight,
                                      flash_attention=ctx.training.attention in FLASH_KERNELS,
                                      activation_model=self.activations)

    def model_flops_per_step(self, ctx: StepContext) -> float:
        return model_flops_per_step(ctx.dims, ctx.training.global_batch)


@dataclass(frozen=True)
class ProfiledCosts:
    """A torch module, from its meta-device profile (`ctx.profile`)."""

    def layer_count(self, ctx: StepContext) -> int:
        return len(ctx.profile.layers)

    def chunk_costs(self, env: StepEnv) -> list[ChunkCost]:
        return profiled.chunk_costs(env)

    def boundary_bytes(self, ctx: StepContext) -> list[float]:
        return [profiled.boundary_bytes(ctx, c) for c in _boundaries(ctx)]

    def chunk_parameters(self, ctx: StepContext) -> list[float]:
        return profiled.chunk_parameters(ctx)

    def pipeline_memory(self, env: StepEnv, inflight: Sequence[float]) -> tuple[MemoryEstimate, ...]:
        return profiled.pipeline_memory(env, inflight)

    def model_flops_per_step(self, ctx: StepContext) -> float:
        return profiled.model_flops_per_step(ctx)


def model_costs(ctx: StepContext) -> ModelCosts:
    """The implementation for a resolved scenario: profiled for a module model (its measured
    per-layer activations), else analytic (Megatron-LM's activations, Korthikanti et al. 2022)."""
    return ProfiledCosts() if ctx.profile is not None else AnalyticCosts(activations=MEGATRON)
