"""Unpadding around a variable-length flash attention kernel: its op stream, bytes and host waits.

`training.attention_unpad` runs attention through flash-attn's variable-length kernel
(`flash_attn_varlen_func`) on unpadded q, k and v, and pads the output back to (batch, seq) with
flash-attn's `bert_padding.pad_input` (flash_attn/bert_padding.py, v2.4.2). Unpadding a tensor
takes the mask's indices (`INDICES`):

    attention_mask.sum(-1)                             a kernel
    torch.nonzero(attention_mask.flatten())            a kernel; the host waits for its count
    seqlens.max(), .item()                             a kernel, and a copy the host waits for
    torch.cumsum(seqlens), F.pad(...)                  two kernels

and a gather, `torch.gather(x, 0, indices expanded over the row)`, which reads and writes every
element of x. `pad_input` zero-fills a (batch * seq) x width tensor and index-puts the rows into
it. Two forms (`FORMS`):
- `per-tensor`: llm-foundry's `flash_attn_fn` (llmfoundry/models/layers/attention.py at 5e85bd62d,
  the commit of its H100 benchmark tables) calls `bert_padding.unpad_input` on each of q, k and v,
  the indices and a gather each time (`UNPAD_CALL`): six waits per block forward;
- `per-layer`: Hugging Face's flash_attention_2 with an attention mask (`_upad_input`) takes the
  indices once per layer (`_get_unpad_data`) and gathers q, k and v with them: two waits.
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
  The last window ends when the host has issued the flash kernel; a recompute of the block's
  forward waits again.
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


INDICES = (PaddingOp("sum"), PaddingOp("nonzero", waits=True), PaddingOp("max"),
           PaddingOp("item", kernel=False, waits=True), PaddingOp("cumsum"), PaddingOp("pad"))
GATHER = PaddingOp("gather", gather=True)
UNPAD_CALL = INDICES + (GATHER,)                # bert_padding.unpad_input
UNPADDED = ("q", "k", "v")                      # the tensors gathered per block forward, in order
FORMS = {"per-tensor": UNPAD_CALL * len(UNPADDED),
         "per-layer": INDICES + (GATHER,) * len(UNPADDED)}
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


def forward_ops(form: str) -> tuple[PaddingOp, ...]:
    """The unpadding's host-issued ops of one block forward, before the flash kernel."""
    return FORMS[form]


def forward_kernels(form: str) -> int:
    """Device kernels of one block forward's unpadding and padding."""
    return sum(op.kernel for op in forward_ops(form)) + PAD_FORWARD_KERNELS


def small_forward_kernels(form: str) -> int:
    """Of those, the kernels over the mask and its counts (a few hundred elements at most)."""
    return sum(op.kernel and not op.gather for op in forward_ops(form))


def ahead_ops(form: str) -> int:
    """Host-issued ops of one block forward's unpadding that the host issues ahead of the GPU, as
    it does the block's other ops: those before the first wait, and pad_input's after the flash
    kernel. The rest are issued inside `sync_windows`."""
    ops = forward_ops(form)
    first_wait = next(i for i, op in enumerate(ops) if op.waits)
    return first_wait + 1 + PAD_FORWARD_KERNELS


def sync_windows(gather_s: tuple[float, ...], floor_s: float,
                 form: str) -> tuple[tuple[int, float], ...]:
    """(host ops, device seconds) of each stretch after a wait, up to and including the next
    waiting op, the last one up to and including the flash kernel's launch. `gather_s`: device
    seconds of the q, k and v gathers; `floor_s`: a small kernel's device time."""
    windows: list[tuple[int, float]] = []
    ops = dev = 0
    started = False
    gathers = iter(gather_s)
    for op in forward_ops(form):
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
