"""Which transformer blocks each pipeline model chunk holds.

Blocks are numbered over the whole model (t5: encoder 0..L-1, then decoder L..L+D-1). Chunk c of
p*v runs on pipeline rank c % p (Megatron/torch looped placement); chunk 0 also holds the
embedding, the last chunk the final norm, LM head and loss. Without `parallel.stages` the blocks are
split as evenly as possible, earlier chunks taking the remainder.
"""
from __future__ import annotations

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
