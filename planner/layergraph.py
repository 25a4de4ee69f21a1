"""A transformer's pipeline layers as a `partition_problem.LayerGraph`, and the partition problem of a plan.

Nodes are the transformer blocks in `parallel.stages` numbering (t5: encoder 0..L-1, then decoder);
the embedding is folded into block 0 and the final norm, LM head and loss into the last block, as
chunk 0 and the last chunk hold them. Edges: each block feeds the next; a t5 encoder's last block
feeds every decoder block (cross-attention), so every decoder boundary also carries the encoder
output. Tied embeddings (gpt, bert, t5) are a `Tie` between the first and the last block.

`profile_graph` does the same for any profile (`partita profile` of an nn.Module): a chain of its
layers. Costs come from the analytic model (`planner.costmodel`, no hardware calibration): seconds are
model FLOPs over the GPU's dense peak (the ILP needs the ratio of compute to sends, and every plan
it splits is then timed by the simulator), bytes as in `costmodel` and the Megatron memory
accounting (weights, gradients, Adam moments and fp32 master copy, sharded by ZeRO).
"""
from __future__ import annotations

from functools import lru_cache

from partita.planner import inventory
from partita.planner.activations import block_activation_bytes
from partita.planner.costmodel import analytic_profile, element_bytes
from partita.planner.modelspec import TransformerDims
from partita.planner.partition_problem import Layer, LayerGraph, PartitionProblem, Tie
from partita.planner.paths import CALIBRATION_DIR
from partita.planner.profile import ModelProfile, refuse_partial_recompute
from partita.planner.provenance import load_by_provenance
from partita.planner.scenario import ParallelSpec, TrainingSpec
from partita.planner.units import GIB

OPTIMIZER_STATE_BYTES = {"adam": 8.0, "sgd": 4.0}     # fp32 moments (Adam two, SGD momentum one)
DEFAULT_HEADROOM = 0.05                               # of the usable memory, kept free
# Above this fraction of a GPU's memory `simulate` flags a step NEAR CAPACITY: there PyTorch's
# caching allocator may fail to serve a request from its cache, free every cached block (cudaFree
# synchronises the device) and retry (torch.cuda.memory_stats()["num_alloc_retries"]; DeepSpeed warns
# of "pytorch allocator cache flushes since last step ... detrimental to performance",
# deepspeed/runtime/zero/stage3.py), which the step model has no term for. The evidence is mixed, so
# it is a flag, not a penalty or a planner rule: the two dev runs predicted above it (BLOOM's BLMSW-02
# and -08, 98% and 94%) measured 20-23% slower than predicted, while in the frozen test's BLOOM jobs
# layouts predicted above it were the measured fastest as often as not.
MEMORY_PRESSURE_FRACTION = 0.90


def near_memory_capacity(peak: float, capacity: float) -> bool:
    """Fits in `capacity`, but above MEMORY_PRESSURE_FRACTION of it (both in one unit): what
    `simulate` flags NEAR CAPACITY and `plan` and `report compare` flag near capacity."""
    return MEMORY_PRESSURE_FRACTION * capacity < peak <= capacity


@lru_cache(maxsize=1)
def _memory_calibration() -> dict:
    """memory.yaml's measured and chosen reserve with fitted_memory.yaml's fitted numbers."""
    return (load_by_provenance(CALIBRATION_DIR / "memory.yaml")
            | load_by_provenance(CALIBRATION_DIR / "fitted_memory.yaml"))


def usable_bytes(memory_bytes: int, *, headroom: float = DEFAULT_HEADROOM) -> float:
    """What a GPU of `memory_bytes` leaves for tensors: minus the CUDA context and NCCL buffers,
    over (1 + the caching allocator's fragmentation) (data/calibration/memory.yaml, fitted_memory.yaml), minus
    `headroom` of that."""
    cal = _memory_calibration()
    fixed = (float(cal["cuda_context_gib"]) + float(cal["communication_buffers_gib"])) * GIB
    return max(0.0, (memory_bytes - fixed) / (1.0 + float(cal["fragmentation_fraction"]))) * (
        1.0 - headroom)


def bytes_per_parameter(training: TrainingSpec, parallel: ParallelSpec) -> float:
    """Weights + gradients + optimizer state per parameter on one GPU (Rajbhandari et al. 2020,
    Sec. 5: 2 + 2 + 12 bytes for mixed-precision Adam, sharded by ZeRO stage over the shard group
    (`ParallelSpec.shard`, all of data without hybrid sharding) times context)."""
    wide = training.precision in ("fp32", "tf32")
    shard = parallel.shard * parallel.context
    w = 4.0 if wide else 2.0
    g = 4.0 if (wide or training.precision != "fp16") and parallel.zero < 2 else 2.0
    o = OPTIMIZER_STATE_BYTES.get(training.optimizer, 8.0) + (0.0 if wide else 4.0)
    z = parallel.zero
    return (w / shard if z >= 3 else w) + (g / shard if z >= 2 else g) + (o / shard if z >= 1 else o)


def inflight(schedule: str, pipeline: int, virtual: int, microbatches: int) -> tuple[float, ...]:
    """Micro-batches of activations each chunk holds at its rank's peak (gpipe: all m; 1f1b and
    zero-bubble: p - rank; interleaved: Megatron's warm-up, Narayanan et al. 2021, Sec. 2.2.2)."""
    p, m = pipeline, microbatches
    out = []
    for c in range(p * virtual):
        r = c % p
        if p == 1:
            out.append(1.0)
        elif schedule == "gpipe":
            out.append(float(m))
        elif schedule == "interleaved-1f1b":
            out.append(min(2 * (p - r - 1) + (virtual - 1) * p + 1, m * virtual) / virtual)
        else:
            out.append(float(min(p - r, m)))
    return tuple(out)


def transformer_graph(dims: TransformerDims, training: TrainingSpec, parallel: ParallelSpec, *,
                      peak_flops: float, link_bytes_per_s: float) -> LayerGraph:
    """The blocks of `dims` with per-micro-batch seconds and bytes on one GPU of the plan."""
    prof = analytic_profile(dims, micro_batch=training.micro_batch, precision=training.precision)
    tp, cp = parallel.tensor, parallel.context
    per_param = bytes_per_parameter(training, parallel)
    e = element_bytes(training.precision)
    rate = peak_flops * tp * cp
    emb, *blocks, head = prof.layers
    # Full recompute of only `recompute_num_layers` blocks per chunk is a property of the split,
    # not of a layer: each block carries the share of recompute an even split gives it.
    chunks = parallel.pipeline * parallel.virtual_stages
    share = training.recomputed_blocks(len(blocks)) if chunks == 1 else min(
        len(blocks), chunks * training.recomputed_blocks(-(-len(blocks) // chunks)))
    share = share / len(blocks) if blocks else 0.0
    op_policy = training.recompute == "selective-op"     # every block, part of its forward

    def seconds(layer) -> float:
        fwd = layer.fwd_flops
        redo = 0.0
        if layer.kind not in ("embedding", "head"):
            redo = fwd * (inventory.op_policy_gemm_share(dims, layer.kind == "decoder")
                          if op_policy else share)
        return (fwd + layer.bwd_flops + redo) / rate

    def kept(layer) -> float:
        if op_policy and layer.kind not in ("embedding", "head"):   # what the op policy saves
            return block_activation_bytes(dims, training.micro_batch, precision=training.precision,
                                          recompute="selective-op",
                                          decoder=layer.kind == "decoder") / (tp * cp)
        if share and layer.kind not in ("embedding", "head"):   # recomputed: the input only
            return (share * layer.output_bytes + (1 - share) * layer.activation_bytes) / (tp * cp)
        return layer.activation_bytes / (tp * cp)

    layers = []
    for i, blk in enumerate(blocks):
        t, state, act = seconds(blk), blk.params / tp * per_param, kept(blk)
        if i == 0:
            t += seconds(emb)
            state += emb.params / tp * per_param
            act += kept(emb)
        if i == len(blocks) - 1:
            t += seconds(head)
            state += head.params / tp * per_param
            act += kept(head)
        out = training.micro_batch * dims.seq_len * dims.hidden * e / (tp * cp)   # hidden states
        layers.append(Layer(name=blk.name, time_s=t, state_bytes=state, activation_bytes=act,
                            output_bytes=out))
    n = len(layers)
    edges = [(i, i + 1) for i in range(n - 1)]
    if dims.arch == "t5":
        enc_last = dims.layers - 1
        edges += [(enc_last, j) for j in range(dims.layers + 1, n)]
    ties = ()
    if dims.tie_embeddings and n > 1:
        table = inventory.layers(dims)[0].vocab_params / tp          # the shared word table
        m = max(1, training.global_batch // (training.micro_batch * parallel.data))
        sync = 2 * table * e / link_bytes_per_s / m       # the embedding group's all-reduce
        ties = (Tie(first=0, second=n - 1, state_bytes=table * per_param, sync_s=sync),)
    return LayerGraph(layers=tuple(layers), edges=tuple(edges), ties=ties)


def profile_graph(profile: ModelProfile, training: TrainingSpec, parallel: ParallelSpec, *,
                  peak_flops: float, link_bytes_per_s: float | None = None) -> LayerGraph:
    """The layers of a profile (analytic, or `partita profile` of any nn.Module on the meta
    device) as a chain, one node per profiled layer: the `parallel.stages` numbering of a
    `model.module` scenario. A layer's measured times (`profile --measure`) replace its FLOPs
    at peak where present."""
    per_param = bytes_per_parameter(training, parallel)
    out = []
    for layer in profile.layers:
        if layer.fwd_s is not None and layer.bwd_s is not None:
            fwd, bwd = layer.fwd_s, layer.bwd_s
        else:
            fwd, bwd = layer.fwd_flops / peak_flops, layer.bwd_flops / peak_flops
        refuse_partial_recompute(training.recompute)
        redo = fwd if training.recompute == "full" else 0.0
        kept = layer.output_bytes if training.recompute == "full" else layer.activation_bytes
        out.append(Layer(name=layer.name, time_s=fwd + bwd + redo,
                         state_bytes=layer.params * per_param, activation_bytes=kept,
                         output_bytes=layer.output_bytes))
    return LayerGraph.chain(out)


def plan_problem(dims: TransformerDims, training: TrainingSpec, parallel: ParallelSpec, *,
                 memory_bytes: int, peak_flops: float, link_bytes_per_s: float,
                 optimize: str = "speed", headroom: float = DEFAULT_HEADROOM,
                 time_limit_s: float = 30.0) -> PartitionProblem:
    """The partition problem of a plan on a GPU with `memory_bytes` and `peak_flops`."""
    graph = transformer_graph(dims, training, parallel, peak_flops=peak_flops,
                              link_bytes_per_s=link_bytes_per_s)
    m = max(1, training.global_batch // (training.micro_batch * parallel.data))
    p, v = parallel.pipeline, parallel.virtual_stages
    tokens = training.micro_batch * dims.seq_len / parallel.context
    logits = 4.0 * tokens * dims.vocab / parallel.tensor       # fp32 log-softmax in the loss
    fixed = tuple(logits if r == p - 1 else 0.0 for r in range(p))
    return PartitionProblem(graph=graph, stages=p, virtual_stages=v,
                            capacity_bytes=usable_bytes(memory_bytes, headroom=headroom),
                            link_bytes_per_s=link_bytes_per_s,
                            inflight=inflight(parallel.schedule, p, v, m), fixed_bytes=fixed,
                            optimize=optimize, time_limit_s=time_limit_s)
