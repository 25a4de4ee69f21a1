"""Which transformer blocks each pipeline model chunk holds.

Blocks are numbered over the whole model (t5: encoder 0..L-1, then decoder L..L+D-1). Chunk c of
p*v runs on pipeline rank c % p (Megatron/torch looped placement); chunk 0 also holds the
embedding, the last chunk the final norm, LM head and loss. Without `parallel.stages` the blocks
are split evenly when the chunk count divides them; otherwise `balanced_stages` gives the
planner's balanced split (the smallest slowest chunk, in model FLOPs, embedding and head counted),
which `simulate` and `run` both use, so the executor runs the split the simulator timed.
"""
from __future__ import annotations

from functools import lru_cache

from partita.planner.modelspec import TransformerDims
from partita.planner.scenario import ParallelSpec


def chunk_ranges(total_blocks: int, parallel: ParallelSpec) -> list[tuple[int, int]]:
    """[start, stop) block range of every model chunk, in chunk order."""
    if parallel.stages is not None:
        return [tuple(r) for r in parallel.stages]
    chunks = parallel.pipeline * parallel.virtual_stages
    base, extra = divmod(total_blocks, chunks)
    out, start = [], 0
    for i in range(chunks):
        n = base + (1 if i < extra else 0)
        out.append((start, start + n))
        start += n
    return out


def with_default_stages(parallel: ParallelSpec, dims: TransformerDims | None) -> ParallelSpec:
    """`parallel` with `stages` filled in by the balanced split when the chunk count does not
    divide the blocks and none were given; otherwise `parallel` unchanged."""
    if dims is None or parallel.stages is not None:
        return parallel
    chunks = parallel.pipeline * parallel.virtual_stages
    if chunks <= 1 or dims.total_layers % chunks == 0 or dims.total_layers < chunks:
        return parallel
    from dataclasses import replace
    return replace(parallel, stages=balanced_stages(dims, chunks))


@lru_cache(maxsize=256)
def balanced_stages(dims: TransformerDims, chunks: int) -> tuple[tuple[int, int], ...]:
    """Contiguous block ranges for `chunks` chunks minimising the largest chunk's forward FLOPs
    (embedding with block 0, head with the last block): exact, by bisection on the bottleneck
    with a greedy fill (a contiguous min-max partition with positive costs; the bottleneck is
    one of the O(n^2) range sums, found by bisecting over them)."""
    from partita.planner.costmodel import analytic_profile
    prof = analytic_profile(dims, micro_batch=1, precision="bf16")
    emb, *blocks, head = prof.layers
    cost = [b.fwd_flops for b in blocks]
    cost[0] += emb.fwd_flops
    cost[-1] += head.fwd_flops
    return min_max_ranges(cost, chunks)


def min_max_ranges(cost: list[float], chunks: int) -> tuple[tuple[int, int], ...]:
    """The contiguous split of `cost` into `chunks` non-empty ranges with the smallest largest
    sum (earlier ranges as full as that bound allows)."""
    n = len(cost)
    prefix = [0.0]
    for c in cost:
        prefix.append(prefix[-1] + c)
    sums = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    lo, hi = 0, len(sums) - 1
    while lo < hi:                      # smallest bound that a greedy fill meets
        mid = (lo + hi) // 2
        if _fill(cost, chunks, sums[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    return _even_within(cost, chunks, sums[lo])


def _even_within(cost: list[float], chunks: int, bound: float) -> tuple[tuple[int, int], ...]:
    """Among the splits whose largest range is `bound`, cut each range nearest to an equal share
    of what is left, as long as the rest still fits (no one-block tail behind full chunks)."""
    n, out, start = len(cost), [], 0
    for c in range(chunks - 1):
        left = chunks - c
        share = sum(cost[start:]) / left
        best, acc = None, 0.0
        for stop in range(start + 1, n - (left - 1) + 1):
            acc += cost[stop - 1]
            if acc > bound * (1 + 1e-12):
                break
            if _fill(cost[stop:], left - 1, bound) is None:
                continue
            if best is None or abs(acc - share) < best[0] - 1e-12 * share:
                best = (abs(acc - share), stop)
        out.append((start, best[1]))
        start = best[1]
    out.append((start, n))
    return tuple(out)


def _fill(cost: list[float], chunks: int, bound: float):
    n, out, start, acc = len(cost), [], 0, 0.0
    tol = bound * 1e-12
    for i, c in enumerate(cost):
        if c > bound + tol:
            return None
        must_open = n - i == chunks - len(out) - 1 + 1 and i > start   # one layer per chunk left
        if i > start and (acc + c > bound + tol or must_open) and len(out) < chunks - 1:
            out.append((start, i))
            start, acc = i, 0.0
        acc += c
    if acc > bound + tol:
        return None
    out.append((start, n))
    return tuple(out) if len(out) == chunks else None
