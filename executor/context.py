"""Context parallelism for `partita run`: every rank of a context group holds part of each sequence.

All-gather form, as Llama 3 trains (Dubey et al. 2024, Sec. 3.3.2): each rank computes queries,
keys and values for its own positions, all-gathers the keys and values of the group and attends
with its queries to the whole sequence; the backward reduce-scatters the key and value gradients
back to their owners. Positions are load-balanced (planner.models.common.context_positions: 2 * cp
chunks, rank r holds chunks r and 2cp-1-r, as Megatron-Core does), so causal work is even.
Everything outside attention is per token and runs on the local positions unchanged; the loss is
the mean over local tokens, and the gradients are averaged over data x context replicas, as
Megatron averages them over its data-context group.

Unlike torch's `context_parallel` (ring attention over DTensor, CUDA kernels only) this runs on any
backend: gloo has no reduce-scatter, so there the backward all-reduces and keeps its own slice.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from partita.executor.stages import Chunk
from partita.planner.models.common import SequenceShard, context_positions


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 2 ((B, h, S/cp, hd) -> (B, h, S, hd), rank order); backward: the sum
    over ranks of the gradient of this rank's slice (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, parts: int, index: int) -> torch.Tensor:
        ctx.group, ctx.parts, ctx.index = group, parts, index
        if x.device.type == "meta":      # shape inference (profiling, pipeline metadata)
            return torch.cat([x] * parts, dim=2)
        x = x.contiguous()
        pieces = [torch.empty_like(x) for _ in range(parts)]
        dist.all_gather(pieces, x, group=group)
        return torch.cat(pieces, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if grad.device.type == "meta":
            return grad.chunk(ctx.parts, dim=2)[ctx.index], None, None, None
        pieces = [g.contiguous() for g in grad.chunk(ctx.parts, dim=2)]
        if dist.get_backend(ctx.group) == "nccl":
            out = torch.empty_like(pieces[ctx.index])
            dist.reduce_scatter(out, pieces, group=ctx.group)
            return out, None, None, None
        total = torch.cat(pieces, dim=2)
        dist.all_reduce(total, group=ctx.group)
        return total.chunk(ctx.parts, dim=2)[ctx.index].contiguous(), None, None, None


def sequence_shard(group, parts: int, index: int) -> SequenceShard:
    """This rank's shard of every sequence, gathering over the context-parallel `group`."""
    return SequenceShard(index=index, parts=parts,
                         gather=lambda t: _GatherSequence.apply(t, group, parts, index))


def apply_context_parallel(chunk: Chunk, shard: SequenceShard) -> None:
    """Give every module of the chunk that reads positions (attention, position embeddings, rotary
    tables through their attention) this rank's shard."""
    for module in chunk.modules():
        if hasattr(type(module), "sequence_shard"):
            module.sequence_shard = shard


def local_tokens(tokens: torch.Tensor, parts: int, index: int) -> torch.Tensor:
    """The columns of a (B, S) batch of token ids or targets that context rank `index` holds."""
    if parts == 1:
        return tokens
    return tokens[:, context_positions(tokens.shape[1], parts, index).to(tokens.device)]
