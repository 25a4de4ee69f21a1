"""Tensor and data parallelism around the pipeline chunks, and the gradient reductions they need.

The device mesh is (pp, dp, cp, tp), tensor fastest, as Megatron-LM orders ranks (executor/plan.py);
data and context flatten into one "dp_cp" dimension over which gradients are averaged (context
parallelism itself: executor/context.py).

Tensor parallelism (Shoeybi et al. 2019, Sec. 3): torch's ColwiseParallel on the q/k/v, up and
gate projections and RowwiseParallel on the attention output and down projections of every block,
so each rank holds heads/tp attention heads and ffn/tp MLP columns and one all-reduce closes each
sub-block. T5's relative position bias table is split by heads with its attention.

Sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2) on top of it: between the tensor-parallel
regions every rank holds seq_len/tp positions of the activations. torch's styles, as torchtitan
composes them (torchtitan/models/llama3/infra/parallelize.py): SequenceParallel on every norm, the
attention and MLP gather their input (Shard(1) -> Replicate, an all-gather) and their row-parallel
output projection reduce-scatters (output Shard(1)) instead of all-reducing. Each block runs on a
Shard(1) DTensor (so `x.shape[1]` is the whole sequence, as rotary tables need) and hands its
neighbours the local (B, S/tp, H) shard, which is also what crosses a pipeline-stage boundary. The
embedding output is cut to the rank's positions and the head gathers them back, so both stay
replicated. A norm's weight gradient is the sum of the ranks' sequence shards, pending (DTensor
Partial) after the backward; `reduce_partial_gradients` sums it over the tensor group before the
optimizer, as Megatron-LM does, so the optimizer step issues no collective.

Data parallelism, by ZeRO stage (Rajbhandari et al. 2020):
- 0: parameters and optimizer replicated; after the pipeline step the gradients are averaged over
  the data group in flat buckets (`average_gradients`), as DDP would, but outside the schedule.
  DDP itself is not used: re-checked on torch 2.13 CPU/gloo (pp 2 x dp 2, 4 micro-batches), its
  reducer asserts ("rebuilt parameter indices size is not same as original model parameters
  size") under GPipe and interleaved 1F1B and its weights drift 20% from the reference under
  zero-bubble; it only works under plain 1F1B.
- 1, 2: FSDP2 `fully_shard(reshard_after_forward=False)`, which torch documents as ZeRO-2 like
  (gradients reduce-scattered, optimizer state sharded, parameters kept gathered from forward to
  backward). ZeRO-1 runs as ZeRO-2: the same arithmetic and communication volume, less memory.
- 3: `fully_shard(reshard_after_forward=True)`: parameters gathered per layer and freed again.
  Not with zero-bubble: resharding between the input and weight halves of the backward gives
  wrong gradients (2e-4 relative loss error after 5 steps, torch 2.13); it runs as ZeRO-2 there.
`replicate` is not used: under 1F1B its weights drift 20% from the reference after 3 steps.

Hybrid sharding (`data_shard`, FSDP's HYBRID_SHARD): ZeRO 1 to 3 shard over groups of `shard`
consecutive data-parallel ranks (times the context ranks) and replicate across the groups: FSDP2
on a 2-D (dp_replicate, dp_shard_cp) mesh gathers parameters and reduce-scatters gradients within
the shard group, then all-reduces each gradient shard over the replica group (the ranks at the same
place in every shard group) and averages over both, as over the whole group without it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from partita.executor.plan import Coords, ExecPlan
from partita.executor.stages import Chunk, TiedGroup, local_copies
from partita.planner.units import MIB

COLWISE = ("q_proj", "k_proj", "v_proj", "up_proj", "gate_proj", "rel_bias")
ROWWISE = ("o_proj", "down_proj")
BUCKET_BYTES = 25 * MIB          # DDP's default bucket_cap_mb


def mesh_dims(plan: ExecPlan) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Names and sizes, slowest first, of the device mesh: (pp, dp, cp, tp), and under hybrid
    sharding dp split into (dp_replicate, dp_shard), so that a shard group is `shard` consecutive
    data-parallel ranks (ExecPlan.shard_groups) and a replica group one rank of each."""
    names, shape = plan.ranks.mesh(("pp", "dp", "cp", "tp"))
    if plan.shard_replicas == 1:
        return names, shape
    i = names.index("dp")
    return (names[:i] + ("dp_replicate", "dp_shard") + names[i + 1:],
            shape[:i] + (plan.shard_replicas, plan.shard) + shape[i + 1:])


def build_mesh(plan: ExecPlan, device_type: str) -> tuple[DeviceMesh, DeviceMesh]:
    """The device mesh (`mesh_dims`) and the mesh of the replicas that average gradients: dp and cp
    flattened into one dimension; under hybrid sharding the 2-D (dp_replicate, dp_shard_cp) mesh,
    over which FSDP2 shards along the second dimension and replicates along the first (HSDP)."""
    names, shape = mesh_dims(plan)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
    if plan.shard_replicas == 1:
        return mesh, mesh["dp", "cp"]._flatten("dp_cp")
    dp_cp = mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
    return mesh, dp_cp._unflatten(0, (plan.shard_replicas, plan.shard * plan.context),
                                  ("dp_replicate", "dp_shard_cp"))


def apply_tensor_parallel(chunk: Chunk, tp_mesh: DeviceMesh) -> None:
    """Shard the projections of every block of the chunk over the tensor-parallel group."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    done: set[int] = set()
    for name, layer in zip(chunk.names, chunk.layers):
        if name in ("embedding", "head"):
            continue
        for sub_name, module in layer.named_modules():
            leaf = sub_name.rsplit(".", 1)[-1]
            if id(module) in done or leaf not in COLWISE + ROWWISE:
                continue
            style = ColwiseParallel() if leaf in COLWISE else RowwiseParallel()
            parallelize_module(module, tp_mesh, style)
            done.add(id(module))


NORMS = (nn.LayerNorm,)          # and every module named *norm (RMSNorm of planner.models)
SUBLAYERS = ("attn", "cross_attn", "mlp")   # modules whose input the projections need whole


def apply_sequence_parallel(chunk: Chunk, tp_mesh: DeviceMesh) -> None:
    """Tensor parallelism with sequence-sharded activations on every layer of the chunk."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   PrepareModuleInputOutput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    for name, layer in zip(chunk.names, chunk.layers):
        if name == "embedding":
            layer.register_forward_hook(
                lambda m, args, out: _redistribute(out, tp_mesh, Replicate(), Shard(1)))
            continue
        if name == "head":
            layer.register_forward_pre_hook(
                lambda m, args: (_redistribute(args[0], tp_mesh, Shard(1), Replicate()), *args[1:]))
            continue
        plan = {}
        for sub_name, module in layer.named_modules():
            if not sub_name:
                continue
            leaf = sub_name.rsplit(".", 1)[-1]
            if leaf in COLWISE:
                plan[sub_name] = ColwiseParallel()
            elif leaf in ROWWISE:
                plan[sub_name] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
            elif leaf in SUBLAYERS:
                plan[sub_name] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                    desired_input_layouts=(Replicate(),))
            elif isinstance(module, NORMS) or leaf.endswith("norm"):
                plan[sub_name] = SequenceParallel()
        parallelize_module(layer, tp_mesh, plan)
        parallelize_module(layer, tp_mesh, PrepareModuleInputOutput(
            input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_input=False,
            output_layouts=(Shard(1),), desired_output_layouts=(Shard(1),), use_local_output=True))


def _redistribute(x: torch.Tensor, mesh: DeviceMesh, have, want) -> torch.Tensor:
    """A local tensor laid out as `have` over `mesh`, relaid out as `want`, as a local tensor
    (autograd runs the inverse collective backward: the all-gather of a scatter, and so on)."""
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(x, mesh, [have], run_check=False).redistribute(mesh, [want]).to_local()


def apply_data_parallel(chunk: Chunk, dp_mesh: DeviceMesh, mode: str) -> None:
    """FSDP2 over the data group (mode "fsdp" or "fsdp-reshard", ExecPlan.data_parallel; a 2-D
    `dp_mesh`: hybrid sharding): each layer that shares no parameter with another layer of the
    chunk is its own unit (one layer's parameters gathered at a time), then the chunk."""
    if not mode.startswith("fsdp"):
        return
    from torch.distributed.fsdp import fully_shard
    reshard = mode == "fsdp-reshard"
    owners: dict[int, int] = {}
    for layer in chunk.layers:
        for p in layer.parameters():
            owners[id(p)] = owners.get(id(p), 0) + 1
    for layer in chunk.layers:
        params = list(layer.parameters())
        if params and all(owners[id(p)] == 1 for p in params):
            fully_shard(layer, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(chunk, mesh=dp_mesh, reshard_after_forward=reshard)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (tensor or data parallel), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def reduce_partial_gradients(params: list[nn.Parameter]) -> int:
    """Sum, over their mesh dimension, the gradients a sequence-parallel layer leaves pending: a
    norm's replicated weights applied to sequence-sharded activations get DTensor gradients of
    placement Partial(sum). Megatron-LM all-reduces these sequence-parallel norm gradients over the
    tensor-parallel group before the optimizer (finalize_model_grads, _allreduce_layernorm_grads);
    left pending, DTensor would all-reduce them inside every optimizer step, one functional
    collective per tensor and update. One flat all-reduce per (mesh, dimension) here, then each
    gradient laid out Replicate on that dimension, so the optimizer runs on local tensors. Returns
    how many gradients it reduced."""
    from torch.distributed.tensor import DTensor, Replicate
    pending: dict[tuple[int, int], list[nn.Parameter]] = {}
    for p in params:
        g = p.grad
        if not isinstance(g, DTensor):
            continue
        dims = [i for i, pl in enumerate(g.placements)
                if pl.is_partial() and getattr(pl, "reduce_op", "sum") == "sum"]
        if dims:
            pending.setdefault((id(g.device_mesh), dims[0]), []).append(p)
    for (_, dim), group_params in pending.items():
        mesh = group_params[0].grad.device_mesh
        locals_ = [p.grad.to_local() for p in group_params]
        _all_reduce_flat(locals_, mesh.get_group(dim))
        for p, t in zip(group_params, locals_):
            placements = list(p.grad.placements)
            placements[dim] = Replicate()
            p.grad = DTensor.from_local(t, mesh, placements, run_check=False,
                                        shape=p.grad.shape, stride=p.grad.stride())
    return sum(len(v) for v in pending.values())


def average_gradients(params: list[nn.Parameter], group, size: int) -> None:
    """ZeRO-0 data parallelism: all-reduce the gradients over `group` in flat buckets, then / size."""
    grads = [_local(p.grad) for p in params if p.grad is not None]
    for bucket in _buckets(grads):
        _all_reduce_flat(bucket, group, divide=size)


def _all_reduce_flat(tensors: list[torch.Tensor], group, divide: int = 1) -> None:
    """All-reduce `tensors` in place as one flat buffer over `group` (then / `divide`)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    if divide != 1:
        flat.div_(divide)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def _buckets(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for g in grads:
        if out[-1] and size + g.numel() * g.element_size() > BUCKET_BYTES:
            out.append([])
            size = 0
        out[-1].append(g)
        size += g.numel() * g.element_size()
    return [b for b in out if b]


class TiedGradients:
    """Adds up the gradients of parameters tied across chunks, on every rank that holds a copy.

    Copies on one pipeline rank are summed locally; copies on several pipeline ranks are
    all-reduced among the ranks with the same (dp, cp, tp) coordinates, whose shards line up.
    Every rank creates every group (torch requires new_group calls in the same order everywhere).
    """

    def __init__(self, plan: ExecPlan, groups: list[TiedGroup], rank: int):
        me = plan.coords(rank)
        self.entries: list[tuple[TiedGroup, object]] = []
        for group in groups:
            pp_ranks = sorted({s % plan.pipeline for s in group.stages})
            handle = None
            if len(pp_ranks) > 1:
                for dp in range(plan.data):
                    for cp in range(plan.context):
                        for tp in range(plan.tensor):
                            ranks = [plan.rank_of(Coords(pp=r, dp=dp, tp=tp, cp=cp))
                                     for r in pp_ranks]
                            pg = dist.new_group(ranks)
                            if rank in ranks:
                                handle = pg
            if me.pp in pp_ranks:
                self.entries.append((group, handle))

    def sync(self, chunks: list[Chunk]) -> None:
        for group, handle in self.entries:
            copies = [p for p in local_copies(chunks, group) if p.grad is not None]
            if not copies:
                continue
            total = _local(copies[0].grad).clone()
            for p in copies[1:]:
                total.add_(_local(p.grad))
            if handle is not None:
                dist.all_reduce(total, group=handle)
            for p in copies:
                _local(p.grad).copy_(total)
