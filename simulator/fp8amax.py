"""Transformer Engine's delayed-scaling amax reductions: one small all-reduce per model-chunk pass.

Under `training.precision: fp8` partita prices Transformer Engine's delayed scaling, the recipe
`simulator.fp8casts` follows (TE's `DelayedScaling`, `reduce_amax=True` by default; Megatron-LM's
`--fp8-recipe` default `delayed`). TE records every fp8 tensor's amax in a global buffer. At the
exit of the outermost `fp8_autocast` the forward amaxes are concatenated and all-reduced (MAX) over
the autocast's `fp8_group` with `async_op=False`, so the compute stream waits for the collective,
and one fused kernel then updates the scales (TE v1.9 transformer_engine/pytorch/fp8.py
`fp8_autocast_exit` -> `reduce_and_update_fp8_tensors(forward=True)` ->
`reduce_tensor_across_group_op_max`; unchanged in v2.18, quantization.py). The backward's amaxes
are reduced the same way, once, in the backward of the region's first fp8 module (module/linear.py,
layernorm_linear.py, layernorm_mlp.py: `reduce_and_update_bwd_fp8_tensors`, set on the module for
which `is_first_fp8_module()` is true).

Megatron-Core wraps a model chunk's whole block loop in one `fp8_autocast` under the delayed recipe
(megatron/core/transformer/transformer_block.py, `use_outer_quantization_context`) with
`fp8_group = get_amax_reduction_group(with_context_parallel=True)`: the tensor-, context- and
data-parallel ranks of one pipeline stage (megatron/core/parallel_state.py,
`_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP`), consecutive in Megatron's rank order. So each
micro-batch's forward and backward of each chunk that holds a block end with one all-reduce over
tensor x context x data ranks. It carries 4 bytes per amax, 3 per GEMM forward (input, weight,
output) and 2 backward (output and input gradients; module/base.py: `num_gemms * 3 if fwd else
num_gemms * 2`), so it costs the collective's latency.

A recomputed forward makes none: TE's checkpoint reruns the forward in its recompute phase,
without an autocast exit (distributed.py `CheckpointFunction.backward`). Left out: the
scale-update kernel after each reduction (one launch) and the host's `torch.cat` of the buffer.
The embedding and the output layer run outside the autocast and add no amaxes.
"""
from __future__ import annotations

from partita.simulator.network import Group, Topology, collective

AMAX_BYTES = 4.0                  # fp32
FORWARD_AMAXES_PER_GEMM = 3       # input, weight, output
BACKWARD_AMAXES_PER_GEMM = 2      # output gradient, input gradient


def amax_group(tensor: int, context: int, data: int, gpus_per_node: int) -> Group:
    """The amax reduction group of one pipeline stage: its tensor x context x data ranks, which
    Megatron's rank order (tensor fastest, pipeline slowest) numbers consecutively."""
    return Group.from_stride(tensor * context * data, 1, gpus_per_node)


def reduction_times(gemms: int, group: Group, topo: Topology) -> tuple[float, float]:
    """(forward, backward) seconds of the amax all-reduces that end one micro-batch's pass through
    a chunk of `gemms` fp8 GEMMs per rank; nothing for a chunk without GEMMs or a group of one."""
    if gemms <= 0 or group.ranks <= 1:
        return 0.0, 0.0
    fwd = collective("allreduce", "auto", AMAX_BYTES * FORWARD_AMAXES_PER_GEMM * gemms, group,
                     topo)
    bwd = collective("allreduce", "auto", AMAX_BYTES * BACKWARD_AMAXES_PER_GEMM * gemms, group,
                     topo)
    return fwd, bwd
