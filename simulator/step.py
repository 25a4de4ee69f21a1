"""One training step of a scenario: `simulate(scenario, catalog) -> SimResult`.

The step is composed from the parts, each its own module:
1. `context.resolve`: the system (what-ifs applied), GPU count, model shape, placement; the
   scenario's consistency rules.
2. `modelcosts.model_costs`: the model's costs (analytic `stagecosts`, or `profiled` for a torch
   module): per model chunk, seconds per micro-batch of forward and backward including the
   collectives inside layers (TP, CP, ZeRO-3); per chunk boundary, the p2p transfer seconds. The
   inputs they are costed on travel as one `stepenv.StepEnv`.
3. `pipeline.simulate_pipeline`: the schedule (planner.schedule, one action list per rank) run on
   the event core, giving each rank's finish time, its busy time and each chunk's last backward.
4. `dataparallel`: the gradient reduction (ring / tree / hierarchical / parameter server; ZeRO-1/2
   reduce-scatter + all-gather), started bucket by bucket as each chunk's last backward runs.
5. the optimizer update (memory-bound: bytes touched per parameter over HBM bandwidth), after the
   step's own synchronisations (`dataparallel.step_sync_time`: the tied-embedding gradient
   all-reduce between the first and last pipeline stage, the gradient-norm and loss all-reduces).
6. `memory.pipeline_memory`: per-rank memory with the activations actually in flight.
Every rank of a data-parallel replica runs the same pipeline, so one pipeline is simulated.
"""
from __future__ import annotations

from functools import lru_cache

from partita.planner.schedule import build
from partita.planner.stages import chunk_ranges
from partita.simulator.calibration import load_calibration
from partita.simulator.chunkcost import ChunkCost
from partita.simulator.context import StepContext, resolve
from partita.simulator.dataparallel import dp_finish_times, optimizer_time, step_sync_time
from partita.simulator.host import HostCosts, load_host_costs
from partita.simulator.interval import step_time_interval
from partita.simulator.modelcosts import ModelCosts, model_costs
from partita.simulator.network import build_topology
from partita.simulator.overheads import Overheads, load_overheads
from partita.simulator.pipeline import CompiledSchedule, PipelineCosts, compile_schedule, simulate_pipeline
from partita.simulator.result import SimResult, Span
from partita.simulator.stagecosts import p2p_costs
from partita.simulator.stepenv import StepEnv

PART_ORDER = ("compute", "recompute", "tp_comm", "cp_comm", "fsdp_comm")


def simulate(scenario, catalog, *, trace: bool = False, calibration=None,
             overheads=None) -> SimResult:
    ctx = resolve(scenario, catalog)
    cal = calibration if calibration is not None else load_calibration()
    local = ctx.system.kind == "local"
    if overheads is not None:
        oh = overheads
    elif local:
        oh = Overheads()        # `partita calibrate` measured this machine as the executor runs it
    else:
        oh = load_overheads()
    # On `local`, `partita calibrate` measured the host's costs (none measured: none).
    host = (cal.local_host or HostCosts()) if local else load_host_costs()
    env = StepEnv(ctx=ctx, topo=build_topology(ctx.system, cal), cal=cal, oh=oh, host=host)
    model = model_costs(ctx)
    p = ctx.parallel
    chunks = [_with_schedule_work(c, host, p.pipeline, p.schedule) for c in model.chunk_costs(env)]
    act, grad, same = p2p_costs(env, model.boundary_bytes(ctx))
    costs = PipelineCosts(tuple(c.forward_s for c in chunks), tuple(c.backward_s for c in chunks),
                          tuple(c.backward_weight_s for c in chunks), tuple(act), tuple(grad),
                          tuple(same), blocking_sends=env.framework.blocking_sends)
    schedule = compiled_schedule(p.schedule, p.pipeline, ctx.microbatches, p.virtual_stages)
    timeline = simulate_pipeline(schedule, costs, trace=trace)
    # The fill and the drain each cross every chunk boundary once on the critical path
    # ((m + p - 1)(f + b) + (p - 1)(a + g) for uniform 1F1B), the steady state hides the rest.
    critical_p2p = sum(act) + sum(grad)

    rank_compute_end = _rank_ends(timeline, p.pipeline)
    params = model.chunk_parameters(ctx)
    dp_end, dp_spans = dp_finish_times(env, timeline, costs, rank_compute_end, params, trace=trace)
    opt_s = optimizer_time(env, params)
    sync = step_sync_time(env)
    critical = max(range(p.pipeline), key=lambda r: (dp_end[r], -r))
    step = dp_end[critical] + sum(sync.values()) + opt_s + oh.step_overhead_s
    inflight = [float(x) / max(1, p.virtual_stages) for x in _inflight(timeline, p)]
    mem = model.pipeline_memory(env, inflight)
    peak_rank = max(range(len(mem)), key=lambda r: (_total(mem[r]), -r))
    breakdown = _breakdown(ctx, chunks, timeline, critical, rank_compute_end, dp_end, opt_s,
                           critical_p2p)
    breakdown |= {k: v for k, v in sync.items() if v > 0}
    if oh.step_overhead_s:
        breakdown["step_overhead"] = oh.step_overhead_s
    spans = _spans(timeline, dp_spans, opt_s, dp_end, p.pipeline) if trace else ()
    result = _result(ctx, cal, model.model_flops_per_step(ctx), step, timeline, breakdown,
                     mem[peak_rank], spans, peak_rank)
    result.details.update(stage_details(ctx, mem, model))
    result.details["chunk_parts_s"] = [dict(c.parts) for c in chunks]   # per micro-batch, fwd+bwd
    return result


@lru_cache(maxsize=64)
def compiled_schedule(name: str, p: int, m: int, v: int) -> CompiledSchedule:
    """The named schedule for p ranks, m micro-batches and v chunks per rank, built and compiled
    once: a planner's sweep or a validation run simulates the same few schedules many times."""
    return compile_schedule(build(name, p, m, v), p * v)


def _rank_ends(timeline, pipeline: int) -> list[float]:
    """Finish time of each pipeline rank's last compute action (always a backward)."""
    last = timeline.last_backward_s
    return [max(last[c] for c in range(r, len(last), pipeline)) for r in range(pipeline)]


def _inflight(timeline, p) -> list[float]:
    return list(timeline.peak_inflight_rank)


def _total(m) -> float:
    return m.parameters + m.gradients + m.optimizer + m.activations + m.other


def _with_schedule_work(chunk: ChunkCost, host: HostCosts, pipeline: int,
                        schedule: str = "1f1b") -> ChunkCost:
    """The chunk with the pipeline schedule's own work per action (`HostCosts.pipeline_action`)
    in its forward and backward, kept apart in its parts as "pipeline_schedule"."""
    f = host.pipeline_action(chunk.forward_s, pipeline, schedule)
    b = host.pipeline_action(chunk.backward_s, pipeline, schedule)
    added = (f - chunk.forward_s) + (b - chunk.backward_s)
    if added <= 0.0:
        return chunk
    parts = dict(chunk.parts)
    parts["pipeline_schedule"] = parts.get("pipeline_schedule", 0.0) + added
    return ChunkCost(f, b, chunk.backward_weight_s, parts)


def _breakdown(ctx: StepContext, chunks, timeline, r: int, ends, dp_end, opt_s: float,
               critical_p2p: float) -> dict[str, float]:
    """Where the critical rank's step time went; the values add up to the step time."""
    p = ctx.parallel
    m = ctx.microbatches
    out: dict[str, float] = {key: 0.0 for key in PART_ORDER}
    for c in range(r, len(chunks), p.pipeline):
        for key, value in chunks[c].parts.items():
            out[key] = out.get(key, 0.0) + m * value
    busy = sum(out.values())
    pp_comm = min(critical_p2p, max(0.0, ends[r] - busy))
    out["pp_comm"] = pp_comm
    out["bubble"] = max(0.0, ends[r] - busy - pp_comm)
    out["dp_comm"] = max(0.0, dp_end[r] - ends[r])
    out["optimizer"] = opt_s
    return {k: v for k, v in out.items() if v > 0 or k in ("compute", "bubble", "dp_comm",
                                                           "optimizer")}


def _spans(timeline, dp_spans, opt_s: float, dp_end, pipeline: int) -> tuple[Span, ...]:
    spans = list(timeline.spans) + list(dp_spans)
    step_end = max(dp_end)
    for r in range(pipeline):
        spans.append(Span(r, "optimizer", "optimizer", step_end, step_end + opt_s, "optimizer"))
    return tuple(spans)


def stage_details(ctx: StepContext, mem, model: ModelCosts) -> dict:
    """Per pipeline rank: the [start, stop) block ranges of its chunks and its memory by kind
    (`buffers`: logits, fp8 weight copies, ZeRO-3 gathered layers; `reserve`: the allocator's and
    framework's share)."""
    p = ctx.parallel
    ranges = chunk_ranges(model.layer_count(ctx), p)
    layers = [[list(ranges[c]) for c in range(r, len(ranges), p.pipeline)] for r in range(p.pipeline)]
    memory = []
    for m in mem:
        reserve = m.details.get("framework_reserve", 0.0)
        memory.append({"parameters": int(m.parameters), "gradients": int(m.gradients),
                       "optimizer": int(m.optimizer), "activations": int(m.activations),
                       "buffers": int(m.other - reserve), "reserve": int(reserve)})
    return {"stage_layers": layers, "stage_memory_bytes": memory}


def _result(ctx: StepContext, cal, model_flops: float, step: float, timeline, breakdown, mem, spans,
            peak_rank) -> SimResult:
    t = ctx.training
    gpu = ctx.system.gpu
    tokens = t.global_batch * ctx.seq_len
    per_gpu = model_flops / step / ctx.gpus
    price = ctx.system.price.best_usd_per_hour
    nodes = -(-ctx.gpus // ctx.system.gpus_per_node)
    band = step_time_interval(step)
    memory = {"parameters": int(mem.parameters), "gradients": int(mem.gradients),
              "optimizer": int(mem.optimizer), "activations": int(mem.activations),
              "other": int(mem.other)}
    return SimResult(
        step_time_s=step, tokens_per_s=tokens / step, samples_per_s=t.global_batch / step,
        tflops_per_gpu=per_gpu / 1e12, mfu=per_gpu / gpu.peak(t.precision),
        peak_memory_bytes=int(sum(memory.values())),
        memory_capacity_bytes=int(cal.memory.usable_bytes(gpu.name, gpu.memory_bytes)),
        bubble_fraction=timeline.bubble_fraction, breakdown_s=breakdown,
        memory_breakdown_bytes=memory, gpus=ctx.gpus, system=ctx.system.name,
        usd_per_hour=price * nodes if price is not None else None, spans=spans,
        step_time_interval_s=(band.low_s, band.high_s) if band is not None else None,
        interval_rows=band.rows if band is not None else 0,
        details={"microbatches": ctx.microbatches, "nodes": nodes, "peak_memory_rank": peak_rank,
                 "model_flops_per_step": model_flops})
