"""A scenario resolved against the catalog: the system (with what-if overrides), GPU count, model shape.

Everything the step simulation needs that is not a cost: which hardware, how many GPUs and nodes,
the transformer dimensions, the micro-batching and the rank placement. Consistency rules of the
scenario contract are checked here, once the GPU count is known.
"""
from __future__ import annotations

from dataclasses import dataclass

from partita.planner.errors import PartitaError
from partita.planner.hardware import System
from partita.planner.modelspec import TransformerDims
from partita.planner.profile import ModelProfile
from partita.planner.scenario import (ParallelSpec, Scenario, TrainingSpec, check_kernel_forms,
                                      check_plan, fp8_recipe_problem)
from partita.planner.stages import with_default_stages
from partita.simulator import profiled
from partita.simulator.placement import Placement

@dataclass(frozen=True)
class StepContext:
    scenario: Scenario
    system: System
    gpus: int
    dims: TransformerDims | None          # None for a `model.module` model: see `profile`
    parallel: ParallelSpec
    training: TrainingSpec
    microbatches: int
    placement: Placement
    profile: ModelProfile | None = None   # the meta-device profile of a `model.module` model

    @property
    def seq_len(self) -> int:
        return self.dims.seq_len if self.dims is not None else self.profile.seq_len

    @property
    def nodes(self) -> int:
        return self.placement.nodes


def resolve(scenario: Scenario, catalog) -> StepContext:
    where = f"{scenario.origin}: " if scenario.origin else ""
    if scenario.parallel is None:
        raise PartitaError(f"{where}no parallel section; run `partita plan "
                           f"{scenario.origin or 'FILE'} -o planned.yaml` to choose one, "
                           "or add parallel: {tensor, pipeline, data, ...}")
    hw = catalog.resolve_cluster(scenario.cluster, origin=scenario.origin)
    system, gpus = hw.system, hw.gpus
    if gpus > system.gpus_per_node and gpus % system.gpus_per_node:
        raise PartitaError(f"{where}cluster.gpus ({gpus}) must fill whole {system.name} nodes "
                           f"of {system.gpus_per_node} GPUs (or be at most one node)")
    try:                                  # precision supported by this GPU? (before any model code)
        system.gpu.peak(scenario.training.precision)
    except PartitaError as exc:
        raise PartitaError(f"{where}training.precision: {exc}") from None
    problem = fp8_recipe_problem(scenario.training, system.gpu)
    if problem:
        raise PartitaError(f"{where}{problem}")
    spec = scenario.model
    if getattr(spec, "hf_config", None) is not None and getattr(spec, "seq_len", None) is None:
        positions = next((spec.hf_config[k] for k in ("max_position_embeddings", "n_positions",
                                                      "n_ctx") if k in spec.hf_config), None)
        raise PartitaError(f"{where}model.seq_len: required with hf_config (the config gives the "
                           f"longest sequence the model supports, {positions}, not the one a run "
                           "trains on); add model.seq_len, e.g. seq_len: 4096")
    dims = spec.resolve()
    check_plan(scenario, gpus, dims)
    check_kernel_forms(scenario.training, dims, where)
    profile = None
    if dims is None:                      # a torch module: cost it from its meta-device profile
        profile = profiled.load_profile(scenario)
        profiled.check(scenario, profile)
    p = with_default_stages(scenario.parallel, dims)     # uneven layer counts: balanced split
    if p is not scenario.parallel:
        scenario = scenario.with_parallel(p)
    if p.zero >= 1 and p.grad_reduce != "auto":
        raise PartitaError(f"{where}parallel.grad_reduce: {p.grad_reduce!r} chooses the all-reduce "
                           f"of ZeRO 0, but zero is {p.zero}: ZeRO 1/2 reduce-scatter the gradients "
                           "(a ring, as NCCL runs it) and ZeRO 3 per block; set grad_reduce: auto "
                           "or zero: 0")
    placement = Placement(p.tensor, p.context, p.data, p.pipeline,
                          min(system.gpus_per_node, gpus))
    return StepContext(scenario=scenario, system=system, gpus=gpus, dims=dims, parallel=p,
                       training=scenario.training, microbatches=scenario.microbatches(),
                       placement=placement, profile=profile)
