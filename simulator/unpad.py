"""Unpadding around a variable-length flash attention kernel: its op stream, bytes and host waits.

`training.attention_unpad: true` is attention as llm-foundry's `flash_attn_fn` runs it
(llmfoundry/models/layers/attention.py at 5e85bd62d, the commit of its H100 benchmark tables) and
as Hugging Face's flash_attention_2 does with an attention mask: q, k and v each pass through
flash-attn's `bert_padding.unpad_input` (flash_attn/bert_padding.py, v2.4.2) into
`flash_attn_varlen_func`, and the kernel's output through `pad_input` back to (batch, seq).
One `unpad_input` call runs, in order (`UNPAD_CALL`):

    attention_mask.sum(-1)                             a kernel
    torch.nonzero(attention_mask.flatten())            a kernel; the host waits for its count
    seqlens.max(), .item()                             a kernel, and a copy the host waits for
    torch.cumsum(seqlens), F.pad(...)                  two kernels
    torch.gather(x, 0, indices expanded over the row)  reads and writes every element of x

and `pad_input` zero-fills a (batch * seq) x width tensor and index-puts the rows into it.
Backward, through flash-attn's IndexPutFirstAxis and IndexFirstAxis: the output's gradient is
gathered (`grad_output[indices]`) and each of q's, k's and v's is zero-filled and scattered.

Two costs follow from that code, neither fitted:
- memory traffic (`unpad_bytes`): forward, read and write each element of q, k and v (2e) and
  zero-fill, read and write each of the output (3e); backward, 2e per output element and 3e per
  element of q, k and v. The gathers' index tensors are one int64 per row, expanded with stride 0
  across it, so they come from cache, not memory.
- host waits (`sync_windows`): a nonzero or an .item() returns only when the GPU has run
  everything queued before it, so the GPU then idles while the host issues the ops up to the next
  wait (each a dispatch and a launch, `simulator.host`), less the device work those ops bring.
  The last window ends when the host has issued the flash kernel. Six waits per block forward,
  and again in a recompute of it.
"""
from __future__ import annotations

from dataclasses import dataclass

from partita.planner import inventory
from partita.planner.modelspec import TransformerDims


@dataclass(frozen=True)
class PaddingOp:
    """One host-issued op of the unpadding: `kernel` (a device kernel, else a host-side copy),
    `waits` (the host blocks until the GPU is done), `gather` (the one that moves the tensor)."""
    name: str
    kernel: bool = True
    waits: bool = False
    gather: bool = False


UNPAD_CALL = (PaddingOp("sum"), PaddingOp("nonzero", waits=True), PaddingOp("max"),
              PaddingOp("item", kernel=False, waits=True), PaddingOp("cumsum"), PaddingOp("pad"),
              PaddingOp("gather", gather=True))
UNPADDED = ("q", "k", "v")                      # unpad_input calls per block forward, in order
PAD_FORWARD_KERNELS = 2                         # pad_input: zeros, index_put
BACKWARD_KERNELS = 1 + 2 * len(UNPADDED)        # the output's gather; zeros + scatter per input


@dataclass(frozen=True)
class UnpadBytes:
    """Bytes of one block's unpadding on one rank: each gather's forward (q, k, v) and the rest."""
    gathers: tuple[float, ...]      # forward gathers of q, k, v
    pad_forward: tuple[float, ...]  # the output's zeros and index_put
    backward: tuple[float, ...]     # the output's gather; each input's zeros and scatter


def unpad_bytes(dims: TransformerDims, micro_batch: int, tp: int, cp: int,
                element_bytes: int) -> UnpadBytes:
    """Memory traffic of the unpadding of one block forward and backward (module docstring)."""
    e = element_bytes
    tokens = micro_batch * dims.seq_len / cp
    q_heads, kv_heads = inventory.heads_per_rank(dims, tp)
    q = tokens * q_heads * dims.head_dim
    kv = tokens * kv_heads * dims.head_dim
    inputs = (q, kv, kv)
    backward = (2 * e * q,) + tuple(b for n in inputs for b in (e * n, 2 * e * n))
    return UnpadBytes(gathers=tuple(2 * e * n for n in inputs), pad_forward=(e * q, 2 * e * q),
                      backward=backward)


def forward_ops() -> tuple[PaddingOp, ...]:
    """The unpadding's host-issued ops of one block forward, before the flash kernel."""
    return UNPAD_CALL * len(UNPADDED)


def forward_kernels() -> int:
    """Device kernels of one block forward's unpadding and padding."""
    return sum(op.kernel for op in forward_ops()) + PAD_FORWARD_KERNELS


def small_forward_kernels() -> int:
    """Of those, the kernels over the mask and its counts (a few hundred elements at most)."""
    return sum(op.kernel and not op.gather for op in forward_ops())


def ahead_ops() -> int:
    """Host-issued ops of one block forward's unpadding that the host issues ahead of the GPU, as
    it does the block's other ops: those before the first wait, and pad_input's after the flash
    kernel. The rest are issued inside `sync_windows`."""
    ops = forward_ops()
    first_wait = next(i for i, op in enumerate(ops) if op.waits)
    return first_wait + 1 + PAD_FORWARD_KERNELS


def sync_windows(gather_s: tuple[float, ...], floor_s: float) -> tuple[tuple[int, float], ...]:
    """(host ops, device seconds) of each stretch after a wait, up to and including the next
    waiting op, the last one up to and including the flash kernel's launch. `gather_s`: device
    seconds of the q, k and v gathers; `floor_s`: a small kernel's device time."""
    windows: list[tuple[int, float]] = []
    ops = dev = 0
    started = False
    gathers = iter(gather_s)
    for op in forward_ops():
        if started:
            ops += 1
            dev += next(gathers) if op.gather else (floor_s if op.kernel else 0.0)
        elif op.gather:
            next(gathers)                              # issued while the host ran ahead
        if op.waits:
            if started:
                windows.append((ops, dev))
            ops, dev, started = 0, 0.0, True
    windows.append((ops + 1, dev))                     # + the flash kernel's dispatch and launch
    return tuple(windows)
