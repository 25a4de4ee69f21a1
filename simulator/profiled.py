"""Costs of a model given only as a torch module (`model: {module: ...}`), from its profile.

Without transformer dimensions there are no GEMM shapes, tensor-parallel splits or attention
kernels to model. Each layer of the meta-device profile (planner.profiler) is costed as its matmul
FLOPs at the GPU's matmul efficiency for one GEMM of that ideal time, times the sustained fraction,
plus its saved and passed activation bytes moved at memory bandwidth; the backward does twice the
forward's matmul work (Narayanan et al. 2021, Sec. 3.4) and twice its memory traffic. Tensor,
context and sequence parallelism and ZeRO-3 need a transformer model and are refused.

This is one of the two implementations of `simulator.modelcosts.ModelCosts`. It only reads profiles: the record is planner/profile.py's `ModelProfile`, made by
planner/profiler.py (`load_profile` below calls it). A transformer scenario is costed by
simulator/compute.py and stagecosts.py instead (simulator/modelcosts.py chooses).
"""
from __future__ import annotations

from partita.planner.errors import PartitaError
from partita.planner.profile import ModelProfile, refuse_partial_recompute
from partita.planner.scenario import check_stages
from partita.planner.stages import chunk_ranges
from partita.simulator.chunkcost import ChunkCost
from partita.simulator.memory import MemoryEstimate, bytes_per_parameter

ELEMENTWISE_PASSES = 2.0        # the saved activations are written once and read once


def load_profile(scenario) -> ModelProfile:
    """The meta-device profile of the scenario's module at its micro-batch and precision."""
    from partita.planner.profiler import profile_module          # torch, only for module models
    m, t = scenario.model, scenario.training
    return profile_module(m, micro_batch=t.micro_batch, seq_len=m.seq_len, precision=t.precision,
                          vocab=m.vocab)


def check(scenario, profile: ModelProfile) -> None:
    p = scenario.parallel
    where = f"{scenario.origin}: " if scenario.origin else ""
    for key, value in (("tensor", p.tensor), ("context", p.context)):
        if value > 1:
            raise PartitaError(f"{where}parallel.{key} = {value}: a model given as model.module has "
                               "no known layer structure to split; give transformer dims, a preset "
                               "or an hf_config, or set it to 1")
    refuse_partial_recompute(scenario.training.recompute, where)
    if p.sequence_parallel or p.zero >= 3:
        raise PartitaError(f"{where}parallel: sequence_parallel and zero 3 need a transformer model "
                           "(dims, preset or hf_config), not model.module")
    layers, chunks = len(profile.layers), p.pipeline * p.virtual_stages
    if chunks > layers:
        raise PartitaError(f"{where}pipeline*virtual_stages ({chunks}) exceeds the module's "
                           f"{layers} profiled layers ({', '.join(l.name for l in profile.layers)})")
    if p.stages is not None:
        check_stages(p.stages, chunks, layers, lambda msg: PartitaError(
            f"{where}{msg} (the module's profiled layers: {', '.join(l.name for l in profile.layers)})"))


def _layer_times(layer, env) -> tuple[float, float, float]:
    ctx, cal, oh = env.ctx, env.cal, env.oh
    gpu, precision = ctx.system.gpu, ctx.training.precision
    g = cal.gpu(gpu.name)
    peak = gpu.peak(precision)
    frac = oh.matmul_fraction(gpu, precision, ctx.training.framework)
    ideal = layer.matmul_flops / peak
    matmul = ideal / (g.matmul_efficiency(precision, ideal, gpu.peak_is_measured(precision)) * frac) \
        if ideal > 0 else 0.0
    nbytes = ELEMENTWISE_PASSES * (layer.activation_bytes + layer.output_bytes)
    memory = nbytes / (gpu.memory_bandwidth_bytes_per_s * g.memory_efficiency(nbytes)) if nbytes else 0.0
    fwd = max(matmul + memory, g.kernel_floor_s)
    return fwd, 2.0 * matmul + 2.0 * memory, matmul      # forward, backward, weight-gradient part


def chunk_costs(env) -> list[ChunkCost]:
    """Per model chunk, seconds per micro-batch (env: a simulator.stepenv.StepEnv)."""
    ctx = env.ctx
    layers = ctx.profile.layers
    out = []
    for a, b in chunk_ranges(len(layers), ctx.parallel):
        f = bw = w = recompute = 0.0
        again = set(recomputed_layers(ctx.training, a, b))
        for i in range(a, b):
            lf, lb, lw = _layer_times(layers[i], env)
            f, bw, w = f + lf, bw + lb, w + lw
            recompute += lf if i in again else 0.0
        parts = {"compute": f + bw}
        if recompute:
            parts["recompute"] = recompute
        out.append(ChunkCost(f, bw + recompute, w, parts))
    return out


def recomputed_layers(training, a: int, b: int) -> range:
    """Indices of the layers of the chunk [a, b) whose forward runs again in backward: under full
    recompute every layer, or the first `recompute_num_layers` where that is set; layer 0 (it takes
    the token ids) is never recomputed when N is given, as the executor runs it
    (executor.stages.Chunk)."""
    if training.recompute != "full":
        return range(0)
    if training.recompute_num_layers is None:
        return range(a, b)
    start = max(a, 1)
    return range(start, min(b, start + training.recompute_num_layers))


def boundary_bytes(ctx, chunk: int) -> float:
    a, b = chunk_ranges(len(ctx.profile.layers), ctx.parallel)[chunk]
    return float(ctx.profile.layers[b - 1].output_bytes)


def chunk_parameters(ctx) -> list[float]:
    layers = ctx.profile.layers
    return [float(sum(l.params for l in layers[a:b]))
            for a, b in chunk_ranges(len(layers), ctx.parallel)]


def pipeline_memory(env, inflight) -> tuple[MemoryEstimate, ...]:
    ctx, cal = env.ctx, env.cal
    p, t = ctx.parallel, ctx.training
    layers = ctx.profile.layers
    ranges = chunk_ranges(len(layers), p)
    w, g, o = bytes_per_parameter(t.precision, t.optimizer, p.zero, p.shard, t.framework)
    out = []
    for rank in range(p.pipeline):
        chunks = [ranges[c] for c in range(rank, len(ranges), p.pipeline)]
        mine = [l for a, b in chunks for l in layers[a:b]]
        again = {i for a, b in chunks for i in recomputed_layers(t, a, b)}
        params = sum(l.params for l in mine)
        activations = sum(layers[i].output_bytes if i in again else layers[i].activation_bytes
                          for a, b in chunks for i in range(a, b)) * inflight[rank]
        if again:                               # one layer re-run whole for its backward
            activations += max(layers[i].activation_bytes for i in again)
        allocated = params * (w + g + o) + activations
        reserve = cal.memory.reserve_bytes(allocated, t.framework)
        out.append(MemoryEstimate(params * w, params * g, params * o, activations, reserve,
                                  {"framework_reserve": reserve}))
    return tuple(out)


def model_flops_per_step(ctx) -> float:
    t = ctx.training
    return ctx.profile.total_flops * t.global_batch / t.micro_batch
