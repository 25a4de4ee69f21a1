"""The plan search space: which (system, GPUs, TP/PP/CP/DP, micro-batch, recompute, ZeRO) to try.

`Space` holds what the scenario fixes and what is searched; `layouts(space, ...)` yields every
combination that passes the divisibility rules of the scenario contract, and `memory_floor`
bounds a rank's memory from below (so a layout it rejects can never fit; the simulator judges the
rest). Schedules, virtual stages and the data-parallel reduction are expanded later, for the
layouts that rank best (planner.search).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

from partita.planner.costmodel import analytic_profile
from partita.planner.enums import WHOLE_FORWARD_AGAIN
from partita.planner.layergraph import bytes_per_parameter
from partita.planner.modelspec import TransformerDims
from partita.planner.scenario import ParallelSpec, TrainingSpec, tensor_ok

RECOMPUTE_ORDER = ("none", "selective", "selective-op", "full")   # from least recomputed to most
# What the search tries where the scenario does not fix training.recompute; torchtitan's op-level
# policy (selective-op) is a torch checkpointing policy, tried for FSDP training only.
SEARCHED_RECOMPUTE = ("none", "selective", "full")
SEARCHED_RECOMPUTE_FSDP = ("none", "selective", "selective-op", "full")
ZERO_ORDER = (0, 1, 3)
MAX_MICRO_BATCH = 16           # sequences; beyond it the pipeline bubble and memory only grow
MIN_CONTEXT_TOKENS = 1024      # context parallelism keeps at least this many tokens per rank
CONTEXT_FROM_SEQ = 8192        # and is searched only for sequences at least this long


@dataclass(frozen=True, kw_only=True)
class Layout:
    system: str
    gpus: int
    nodes: int
    tensor: int
    pipeline: int
    context: int
    data: int
    micro_batch: int
    recompute: str
    zero: int
    recompute_layers: int | None = None   # full recompute of only this many blocks per model chunk
    data_shard: int | None = None         # ZeRO shard group (hybrid sharding); None: all of data


def layout_of(plan) -> Layout:
    """The layout a planned candidate (planner.planresult.Candidate, or anything carrying the
    layout's fields) was built from, so the search can expand or re-split it."""
    return Layout(**{f.name: getattr(plan, f.name) for f in fields(Layout)})


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def gpu_counts(gpus_per_node: int, max_gpus: int) -> list[int]:
    """1, 2, 4, ... up to one node, then whole nodes in powers of two up to `max_gpus`."""
    out, g = [], 1
    while g <= min(gpus_per_node, max_gpus):
        out.append(g)
        g *= 2
    if gpus_per_node not in out and gpus_per_node <= max_gpus:
        out.append(gpus_per_node)
    nodes = 2
    while nodes * gpus_per_node <= max_gpus:
        out.append(nodes * gpus_per_node)
        nodes *= 2
    return out


def layouts(dims: TransformerDims, training: TrainingSpec, *, system: str, gpus: int,
            gpus_per_node: int, fixed: dict, micro_batches, recomputes, zeros):
    """Every layout on `gpus` GPUs that the scenario rules allow, fixed fields kept.
    `micro_batches` None: every divisor of the per-replica batch up to MAX_MICRO_BATCH."""
    nodes = -(-gpus // gpus_per_node)
    ts = [fixed["tensor"]] if "tensor" in fixed else [
        t for t in divisors(gpus) if t <= gpus_per_node and tensor_ok(dims, t)]
    cs = [fixed["context"]] if "context" in fixed else [1] + [
        c for c in (2 ** k for k in range(1, 12)) if c <= gpus and dims.seq_len % c == 0
        and dims.seq_len >= CONTEXT_FROM_SEQ and dims.seq_len // c >= MIN_CONTEXT_TOKENS]
    for t in ts:
        for c in cs:
            if gpus % (t * c):
                continue
            ps = [fixed["pipeline"]] if "pipeline" in fixed else [
                p for p in divisors(gpus // (t * c)) if p <= dims.total_layers]
            for p in ps:
                rest = gpus // (t * c)
                if rest % p:
                    continue
                d = rest // p
                if "data" in fixed and fixed["data"] != d:
                    continue
                per_replica = training.global_batch // d if training.global_batch % d == 0 else 0
                mbs = micro_batches if micro_batches is not None else [
                    mb for mb in range(1, min(per_replica, MAX_MICRO_BATCH) + 1)
                    if per_replica % mb == 0]
                for mb in mbs:
                    if training.global_batch % (mb * d):
                        continue
                    for rc in recomputes:
                        for z in zeros:
                            if z and d * c == 1:
                                continue            # nothing to shard over
                            yield Layout(system=system, gpus=gpus, nodes=nodes, tensor=t,
                                         pipeline=p, context=c, data=d, micro_batch=mb,
                                         recompute=rc, zero=z)


@lru_cache(maxsize=64)
def _per_block(dims: TransformerDims, precision: str) -> tuple[float, float, float, float, float]:
    """(block params, embedding params, head params, activation bytes, checkpoint bytes) of
    one micro-batch of one sequence (bytes scale with the micro-batch)."""
    prof = analytic_profile(dims, micro_batch=1, precision=precision)
    emb, *blocks, head = prof.layers
    n = len(blocks)
    return (sum(b.params for b in blocks) / n, emb.params, head.params,
            sum(b.activation_bytes for b in blocks) / n,
            sum(b.output_bytes for b in blocks) / n)


def memory_floor(dims: TransformerDims, training: TrainingSpec, layout: Layout,
                 schedule: str = "1f1b") -> float:
    """A lower bound on the busiest rank's bytes: rank 0 holds the embedding, at least
    floor(blocks/p) blocks and, under 1f1b, min(p, m) micro-batches of their activations."""
    block, emb, _head, act, ckpt = _per_block(dims, training.precision)
    par = ParallelSpec(tensor=layout.tensor, pipeline=layout.pipeline, data=layout.data,
                       context=layout.context, zero=layout.zero)
    t = TrainingSpec(global_batch=training.global_batch, micro_batch=layout.micro_batch,
                     precision=training.precision, recompute=layout.recompute,
                     optimizer=training.optimizer)
    per_param = bytes_per_parameter(t, par)
    blocks = dims.total_layers // layout.pipeline
    state = (blocks * block + emb) / layout.tensor * per_param
    m = training.global_batch // (layout.micro_batch * layout.data)
    held = m if schedule == "gpipe" else min(layout.pipeline, m)
    per_mb = (ckpt if layout.recompute in WHOLE_FORWARD_AGAIN else act) * layout.micro_batch
    acts = blocks * per_mb * held / (layout.tensor * layout.context)
    return state + acts
