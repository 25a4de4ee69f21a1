"""Megatron-Core's pipeline layout string (`--pipeline-model-parallel-layout`) as model chunks.

A layout names what every model chunk holds, chunk after chunk in the order of the pipeline
schedule (chunk k runs on pipeline rank k % pipeline, its virtual stage is k // pipeline):

    "E|t*3|tt|tt|ttL"       E the embedding, t one transformer block, L the LM head and loss
    "Et*3|(tt|)*29,tL"      `x*n` repeats one symbol, `(...)*n` a group; commas are cosmetic
    "E|(t|)*126,L"          a chunk may hold no block: here the first holds only the embedding and
                            the last only the head and loss (Dubey et al. 2024, Llama 3, Sec. 3.3.2)

as Megatron-Core reads it (megatron/core/transformer/pipeline_parallel_layer_layout.py,
`parse_str_to_list`: commas dropped, `(...)*n` then `x*n` unrolled, split at "|"; the embedding
first and the loss last, each once; the chunk count a multiple of the pipeline size, which gives
the virtual stages). MTP layers (`m`) are not modelled. The result is the block ranges of
`parallel.stages`.
"""
from __future__ import annotations

import re

SYMBOLS = {"E": "the embedding", "t": "a transformer block", "L": "the LM head and loss"}
MAX_CHARS = 10_000                  # the layout as written
MAX_EXPANDED = 1 << 20              # the layout unrolled: far above 4096 stages x 1024 layers' need
_GROUP = re.compile(r"\(([^()]+)\)\*(\d{1,7})")
_SYMBOL = re.compile(r"(.)\*(\d{1,7})")


class LayoutError(ValueError):
    """A layout string that is not one (the message says why, for the caller to name the key)."""


def unroll(text: str) -> str:
    """`text` with commas dropped and its repetitions written out (Megatron's order: groups, then
    single symbols); a repetition that would exceed MAX_EXPANDED characters is refused before it
    is built."""
    if len(text) > MAX_CHARS:
        raise LayoutError(f"{len(text)} characters, at most {MAX_CHARS}")
    text = text.replace(",", "").replace(" ", "")
    for pattern in (_GROUP, _SYMBOL):
        size = len(text) + sum(len(m.group(1)) * int(m.group(2)) - len(m.group(0))
                               for m in pattern.finditer(text))
        if size > MAX_EXPANDED:
            raise LayoutError(f"unrolls to {size} symbols, at most {MAX_EXPANDED}")
        text = pattern.sub(lambda m: m.group(1) * int(m.group(2)), text)
    return text


def layout_chunks(text: str) -> list[str]:
    """The symbols of every model chunk of layout `text`, in chunk order."""
    chunks = unroll(text).split("|")
    for i, chunk in enumerate(chunks):
        for symbol in chunk:
            if symbol not in SYMBOLS:
                valid = ", ".join(f"{k} ({v})" for k, v in SYMBOLS.items())
                extra = " (MTP layers are not modelled)" if symbol == "m" else ""
                raise LayoutError(f"chunk {i} ({chunk!r}) has {symbol!r}{extra}; valid symbols: "
                                  f"{valid}, '|' between chunks, x*n and (...)*n to repeat")
    flat = "".join(chunks)
    if flat.count("E") != 1 or not chunks[0].startswith("E"):
        raise LayoutError("the embedding E must come once, first in the first chunk")
    if flat.count("L") != 1 or not chunks[-1].endswith("L"):
        raise LayoutError("the head and loss L must come once, last in the last chunk")
    return chunks


def layout_stages(text: str, pipeline: int) -> tuple[tuple[int, int], ...]:
    """Block ranges [start, stop) of every model chunk of layout `text` over `pipeline` ranks;
    the chunk count must be a multiple of `pipeline` (the quotient: the virtual stages)."""
    chunks = layout_chunks(text)
    if len(chunks) % pipeline:
        raise LayoutError(f"{len(chunks)} chunks, not a multiple of parallel.pipeline ({pipeline})")
    out, start = [], 0
    for chunk in chunks:
        stop = start + chunk.count("t")
        out.append((start, stop))
        start = stop
    return tuple(out)
