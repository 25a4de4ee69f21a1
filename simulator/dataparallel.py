"""Data-parallel gradient reduction overlapped with the backward pass, and the optimizer update.

Gradients of a model chunk are ready bucket by bucket while its last micro-batch's backward runs
(PyTorch DDP and Megatron-LM both launch a bucket's reduction as soon as it fills; Li et al. 2020
"PyTorch Distributed", Sec. 3.2.3). A rank's reductions share its network lane, one after the
other; only the last bucket of the rank's last chunk cannot overlap at all. Algorithms:
- zero 0: all-reduce of the gradients (fp16 as they are, fp32 for bf16, or the scenario's
  `grad_reduce_dtype`: `reduce_bytes`) (ring, tree, hierarchical or parameter server).
- zero 1 / 2 (Megatron distributed optimizer, DeepSpeed ZeRO-1/2): reduce-scatter of gradients,
  then after the update an all-gather of the 16-bit parameters. With `overlap_param_gather`
  (Megatron-Core `--overlap-param-gather`) it runs beside the next step's first micro-batch
  forward, bucket by bucket: the forward pre-hook of a bucket's first layer waits for that bucket
  and dispatches the next (megatron/core/distributed/distributed_data_parallel.py
  `_make_forward_pre_hook`, param_and_grad_buffer.py `finish_param_sync`), so the first bucket's
  gather is exposed, the rest hide behind that one forward, and what does not fit in it waits.
- zero 3: reduced per block inside the backward (see stagecosts); nothing left at the end.
Each runs as one collective over a rank's parameters, or, where the framework issues one per
wrapped block (FSDP: `dp_collectives_per_block`), one per transformer block (`per_collective`).
With hybrid sharding (`parallel.data_shard`) ZeRO's collectives run within the shard group and the
gradient shard is then all-reduced across the replicas (FSDP HYBRID_SHARD, `_reduce_grad`: a
reduce-scatter in the shard group, then an all-reduce of the shard in the inter-node group;
Megatron-Core's distributed optimizer instances do the same).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from partita.planner import inventory
from partita.planner.stages import chunk_ranges
from partita.simulator import fp16optimizer
from partita.simulator.compute import element_bytes, elementwise_time
from partita.simulator.context import StepContext
from partita.simulator.memory import (block_parameters, chunk_blocks, embedding_parameters,
                                      grad_bytes, reduce_bytes)
from partita.simulator.network import Group, collective
from partita.simulator.result import Span
from partita.simulator.stepenv import StepEnv

BUCKET_PARAMS = 40_000_000       # Megatron-Core DDP default bucket size (elements)
# Adam touches per parameter: read fp32 master, grad, m, v; write master, m, v, 16-bit copy;
# plus one read of the grads for the global norm (clipping): 4*4 + 3*4 + 2 + 4 bytes.
ADAM_BYTES_PER_PARAM = 34.0
SGD_BYTES_PER_PARAM = 22.0


def _dp_group(ctx: StepContext) -> Group:
    return ctx.placement.dp_group().group()



def shard_groups(ctx: StepContext) -> tuple[Group, Group | None]:
    """(the ZeRO shard group, the replica group or None without hybrid sharding)."""
    p = ctx.parallel
    if p.shard == p.data:
        return _dp_group(ctx), None
    return ctx.placement.shard_group(p.shard).group(), ctx.placement.replica_group(p.shard).group()


def _pieces(env: StepEnv, params: float) -> tuple[tuple[int, float], ...]:
    """The collectives a rank's `params` go out in, as (how many, parameters in each), the one at
    the step's edge last: one collective, or, where the framework issues one per block
    (`dp_collectives_per_block`: FSDP's wrapped units), one per transformer block and one for the
    rest, the root unit (embedding, head, final norm), whose gradients are the backward's last and
    whose parameters the forward gathers first. A t5 decoder block is counted at its encoder
    block's size."""
    dims = env.ctx.dims
    if not env.framework.dp_collectives_per_block or dims is None:
        return ((1, params),)
    block = block_parameters(dims) / env.ctx.parallel.tensor
    blocks = int(params // block) if block > 0 else 0
    rest = params - blocks * block
    if rest < 1.0:
        return ((blocks - 1, block), (1, block)) if blocks > 1 else ((blocks, block),)
    return ((blocks, block), (1, rest))


def per_collective(env: StepEnv, params: float, seconds: Callable[[float], float]) -> float:
    """`seconds(n)` of one collective over n parameters, summed over the collectives a rank's
    `params` go out in (`_pieces`), each paying the collective's latency."""
    return sum(count * seconds(n) for count, n in _pieces(env, params) if count)


def edge_collective(env: StepEnv, params: float, total_s: float,
                    seconds: Callable[[float], float]) -> float:
    """Seconds of the collective at the step's edge, the one no compute can hide: the gradient
    reduction's last (after the backward's end) and the parameter gather's first (before the
    forward's start). One per block: the root unit's (`_pieces`); else one bucket, BUCKET_PARAMS
    of the rank's `params`, its share of the whole collective's `total_s`."""
    if env.framework.dp_collectives_per_block and env.ctx.dims is not None:
        return seconds(_pieces(env, params)[-1][1])
    return total_s * min(1.0, BUCKET_PARAMS / max(params, 1.0))


def _reduce_seconds(env: StepEnv) -> Callable[[float], float]:
    """Seconds to reduce n parameters' gradients in one collective across the data-parallel
    group: an all-reduce (ZeRO 0), or the sharded optimizer's reduce-scatter (NCCL runs it as a
    ring whatever grad_reduce says), then under hybrid sharding an all-reduce of the shard across
    the replicas."""
    ctx, topo = env.ctx, env.topo
    p = ctx.parallel
    per_param = reduce_bytes(ctx.training, p.zero)
    if p.zero == 0:
        group = _dp_group(ctx)
        return lambda n: collective("allreduce", p.grad_reduce, n * per_param, group, topo)
    shard, replicas = shard_groups(ctx)

    def one(n: float) -> float:
        t = collective("reduce_scatter", "ring", n * per_param, shard, topo)
        if replicas is not None:
            t += collective("allreduce", "auto", n * per_param / p.shard, replicas, topo)
        return t
    return one


def _gather_seconds(env: StepEnv) -> Callable[[float], float]:
    """Seconds to all-gather n updated 16-bit parameters in one collective (ZeRO-1/2)."""
    ctx, topo = env.ctx, env.topo
    e = element_bytes(ctx.training.precision)
    group = shard_groups(ctx)[0]
    return lambda n: collective("all_gather", "auto", n * e, group, topo)


def reduction_time(env: StepEnv, params: float) -> float:
    """Seconds to reduce `params` parameters' gradients across the data-parallel group
    (`per_collective`)."""
    p = env.ctx.parallel
    if p.data <= 1 or p.zero >= 3 or params <= 0:
        return 0.0
    return per_collective(env, params, _reduce_seconds(env))


def param_gather_time(env: StepEnv, params: float) -> float:
    """ZeRO-1/2: all-gather of the updated 16-bit parameters (exposed, or beside the next forward
    with `overlap_param_gather`; `per_collective`)."""
    p = env.ctx.parallel
    if p.data <= 1 or p.zero not in (1, 2) or params <= 0:
        return 0.0
    return per_collective(env, params, _gather_seconds(env))


def dp_finish_times(env: StepEnv, timeline, costs, rank_ends, params: Sequence[float], *,
                    trace: bool = False):
    """Per pipeline rank, when its gradients are reduced (>= its last backward); `params`: the
    parameters of each model chunk on one TP rank.

    Overlapped collectives slow the kernels beside them: `env.oh.contention(comm_s)` delays the
    backward a bucketed reduction runs beside, and the next step's first micro-batch forward beside
    the overlapped ZeRO-1/2 parameter all-gather; the part of that gather the forward cannot hide
    (its first bucket, and whatever outlasts the forward) adds to the step."""
    p = env.ctx.parallel
    contention = env.oh.contention
    reductions: dict[float, float] = {}       # by parameter count: most chunks hold the same
    ends, spans = [], []
    for r in range(p.pipeline):
        chunks = sorted(range(r, len(params), p.pipeline),
                        key=lambda c: timeline.last_backward_s[c])
        lane, delay = 0.0, 0.0
        for c in chunks:
            if params[c] not in reductions:
                reductions[params[c]] = reduction_time(env, params[c])
            t_red = reductions[params[c]]
            if t_red <= 0:
                continue
            done = timeline.last_backward_s[c] + delay
            last_bucket = edge_collective(env, params[c], t_red, _reduce_seconds(env))
            if p.overlap_grad_reduce:
                ready = done - costs.backward_s[c]
                start = max(ready, lane)
                beside = max(0.0, min(start + t_red, done) - start)     # runs beside the backward
                delay += contention(beside)
                done = timeline.last_backward_s[c] + delay
                lane = max(start + t_red, done + last_bucket)
            else:
                start = max(done, lane, rank_ends[r] + delay)
                lane = start + t_red
            if trace:
                spans.append(Span(r, "dp", f"{c}REDUCE_GRAD", start, lane, "comm"))
        rank_params = sum(params[c] for c in chunks)
        gather = param_gather_time(env, rank_params)
        if p.overlap_param_gather and gather > 0:
            first = edge_collective(env, rank_params, gather, _gather_seconds(env))
            beside = min(gather - first, sum(costs.forward_s[c] for c in chunks))
            delay, gather = delay + contention(beside), gather - beside
        ends.append(max(rank_ends[r] + delay, lane) + gather)
    return ends, spans


def optimizer_time(env: StepEnv, params: Sequence[float]) -> float:
    """The optimizer update of the largest rank's parameter shard (`params`: per model chunk on
    one TP rank): memory-bound on the device, beside the host's work per parameter tensor
    (`HostCosts.optimizer_step`: measured for a machine `partita calibrate` measured). Megatron-LM
    2019's FP16_Optimizer (`training.optimizer_impl: apex-fp16-optimizer`) goes tensor by tensor,
    pass by pass (`simulator.fp16optimizer`)."""
    ctx, cal = env.ctx, env.cal
    p, t = ctx.parallel, ctx.training
    per_rank = max(sum(params[c] for c in range(r, len(params), p.pipeline))
                   for r in range(p.pipeline))
    if p.zero >= 1:
        per_rank /= p.shard * p.context
    gpu = ctx.system.gpu
    if t.optimizer_impl == "apex-fp16-optimizer" and ctx.profile is None:
        sizes = max(rank_tensor_sizes(ctx), key=sum)
        return fp16optimizer.step_time(sizes, element_bytes(t.precision), env.host,
                                       lambda nbytes: elementwise_time(nbytes, gpu, cal))
    per_param = ADAM_BYTES_PER_PARAM if t.optimizer == "adam" else SGD_BYTES_PER_PARAM
    nbytes = per_rank * per_param
    eff = cal.gpu(gpu.name).memory_efficiency(nbytes)
    device_s = nbytes / (gpu.memory_bandwidth_bytes_per_s * eff)
    return env.host.optimizer_step(t.optimizer, rank_tensors(ctx), device_s)


def rank_tensors(ctx: StepContext) -> int:
    """Parameter tensors of the pipeline rank with the most (`rank_tensor_sizes`); 0 for a
    profiled module, whose profile counts parameters, not tensors."""
    return max((len(sizes) for sizes in rank_tensor_sizes(ctx)), default=0)


def rank_tensor_sizes(ctx: StepContext) -> list[list[float]]:
    """Elements of each parameter tensor one TP rank of each pipeline rank holds: its chunks'
    blocks from the inventory, the embedding's on the first chunk, the head's on the last (a
    pipelined tied model's copy of the word table with it), as `memory.held_parameters` places
    them. The inventory lays a GPT block out as Megatron-LM does (one fused QKV weight and bias).
    Tensor parallelism splits the vocabulary tables and every tensor wider than the hidden size;
    norms and the row-parallel projections' biases (hidden wide) stay whole. None for a profiled
    module: []."""
    if ctx.profile is not None:
        return []
    d, p = ctx.dims, ctx.parallel

    def local(tensors) -> list[float]:
        return [t.numel / p.tensor if t.vocab or t.numel > d.hidden else float(t.numel)
                for t in tensors]

    first, *_, last = inventory.layers(d)
    ranges = chunk_ranges(d.total_layers, p)
    per_rank: list[list[float]] = [[] for _ in range(p.pipeline)]
    for i, (a, b) in enumerate(ranges):
        enc, dec = chunk_blocks(d, a, b)
        sizes = enc * local(inventory.block(d, kind=inventory.block_kind(d, False)).tensors)
        if dec:
            sizes += dec * local(inventory.block(d, kind=inventory.block_kind(d, True)).tensors)
        if i == 0:
            sizes += local(first.tensors)
        if i == len(ranges) - 1:
            sizes += local(last.tensors)
            if d.tie_embeddings and len(ranges) > 1:
                sizes += local(t for t in first.tensors if t.vocab)
        per_rank[i % p.pipeline] += sizes
    return per_rank


# Small all-reduces every step makes outside the gradient reduction (Megatron-LM
# megatron/core/optimizer/clip_grads.py `get_grad_norm_fp32`: the squared norm summed over the
# model-parallel group; the loss averaged over data parallelism for logging;
# fp16's found-inf check in the same group as the norm): latency-bound, 4 bytes each.
STEP_SCALARS = {"grad_norm": "model", "loss": "data", "found_inf": "model"}


def step_sync_time(env: StepEnv) -> dict[str, float]:
    """Seconds of the step's synchronisations between the gradient reduction and the update.

    - `embedding_sync`: with a tied input embedding and LM head on different pipeline stages, the
      two copies' gradients are all-reduced between the first and last stage after the backward
      (Megatron-LM `_allreduce_embedding_grads`, Shoeybi et al. 2019 Sec. 3; Narayanan et al. 2021
      Sec. 2.2): vocab / tp x hidden gradient elements over a group of two ranks, one per stage.
    - `step_sync`: the scalar all-reduces of STEP_SCALARS (norm, loss, found-inf)."""
    ctx, topo = env.ctx, env.topo
    d, p, t = ctx.dims, ctx.parallel, ctx.training
    out = {"embedding_sync": 0.0, "step_sync": 0.0}
    if p.pipeline > 1 and d is not None and d.tie_embeddings:      # a module model has no dims
        nbytes = embedding_parameters(d)[0] / p.tensor * grad_bytes(t.precision)   # word table
        same_node = ctx.placement.gpus <= ctx.placement.gpus_per_node
        out["embedding_sync"] = collective("allreduce", "ring", nbytes,
                                           Group(2, 2 if same_node else 1), topo)
    model = p.tensor * p.pipeline * p.context
    groups = {"model": Group.from_stride(model, 1, ctx.placement.gpus_per_node) if model > 1 else None,
              "data": _dp_group(ctx) if p.data > 1 else None}
    for scalar, which in STEP_SCALARS.items():
        if groups[which] is None or (scalar == "found_inf" and t.precision != "fp16"):
            continue
        out["step_sync"] += collective("allreduce", "auto", 4.0, groups[which], topo)
    return out
