"""Per-chunk time of one micro-batch: compute plus the communication that sits inside a layer.

For each pipeline model chunk this adds up its blocks (and the embedding on chunk 0, the head and
loss on the last) from `simulator.compute`, and the collectives that run inside every layer and
block the compute stream:
- tensor parallelism (Shoeybi et al. 2019, Sec. 3; Korthikanti et al. 2022, Sec. 4.2.2): two
  all-reduces of the layer's b*s*h activations per block forward and two in backward (a t5 decoder
  block three), or with sequence parallelism the same volume as all-gather + reduce-scatter pairs;
  full recompute and torchtitan's op-level policy (selective-op) run the forward's collectives
  again; under fp8 with sequence parallelism the all-gathers move fp8 (`simulator.fp8casts`).
  `tp_comm_overlap` hides them behind GEMMs.
- context parallelism: the ring exchange of K/V blocks, hidden behind attention where it can be.
- ZeRO-3 / FSDP: each block's parameters are all-gathered before its forward and again before its
  backward, and its gradients reduce-scattered after (in `training.grad_reduce_dtype`), within the
  ZeRO shard group; with hybrid sharding (`parallel.data_shard`) each gradient shard is then
  all-reduced across the groups. Prefetching overlaps them with the neighbouring block's compute,
  so a block costs max(compute, communication).
- fp8: under delayed scaling each chunk's forward and backward end with an all-reduce of the
  amaxes over the stage's tensor x context x data ranks (`simulator.fp8amax`); under current
  scaling with sequence parallelism each fp8 all-gather waits for an amax all-reduce over the TP
  group (`simulator.fp8casts`), counted with the TP communication; under MXFP8 the backward's
  gathers carry both directions of the row-parallel gradients (`fp8casts.gathered_bytes`).
The result keeps the parts apart so the step summary can say where the time went.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from partita.planner import inventory
from partita.planner.enums import WHOLE_FORWARD_AGAIN
from partita.planner.hardware import GPU
from partita.planner.stages import chunk_ranges
from partita.simulator.chunkcost import ChunkCost
from partita.simulator.compute import (LayerTimes, block_gemms, early_stop_skips, element_bytes,
                                       elementwise_time, embedding_times, head_times, layer_times,
                                       unpad_gather_times)
from partita.simulator import eagerops, fp8amax, fp8casts, unpad
from partita.simulator.context import StepContext
from partita.simulator.host import (BACKWARD_KERNELS_PER_FORWARD, EMBEDDING_FORWARD_KERNELS,
                                    HEAD_FORWARD_KERNELS, attention_core_kernels,
                                    forward_kernels)
from partita.simulator.memory import (block_parameter_tensors, block_parameters, chunk_blocks,
                                      embedding_parameters, reduce_bytes)
from partita.simulator.network import Group, collective, cp_ring_time, p2p
from partita.simulator.overheads import Overheads
from partita.simulator.stepenv import StepEnv


@dataclass(frozen=True)
class BlockCost:
    fwd_s: float
    bwd_s: float
    bwd_weight_s: float
    parts: dict[str, float]


def _add(parts: dict[str, float], key: str, value: float) -> None:
    if value:
        parts[key] = parts.get(key, 0.0) + value


def sustained(lt: LayerTimes, oh: Overheads, gpu: GPU, precision: str,
              per_layer_s: float = 0.0, framework: str = "megatron") -> LayerTimes:
    """A layer's times with its matmuls and attention at the rates a training run sustains, and a
    fixed per-layer cost.

    Matmuls run at `Overheads.matmul_fraction` of their sweep: the GPU family's sustained
    fraction (fitted), the fp8 one for fp8, the framework's. A flash attention kernel runs at
    its own kernel benchmark (compute.yaml: FlashAttention-2's, v1's, cuDNN's rates at the
    kernel's sequence length and head dimension) times `Overheads.attention_fraction` and the
    framework's, not at the GEMMs' sustained fraction: measured, the FlashAttention (v1) and
    FlashAttention-2 columns of Dao 2023, Table 1 (the same GPT3-1.3B training at 8k tokens, 170
    and 220 model TFLOP/s: 16.9 us per token apart) differ by the two kernels' benchmark times
    (19.8 us per token), not by those times over the A100's fraction (25.8 at the 0.768 fitted
    then). Unfused attention (batched GEMMs around the stored scores, their softmax and dropout;
    `attention_matmul_*` is the GEMMs' share) keeps the family's fraction over all of it, GEMMs
    and memory-bound kernels alike: with the fraction on its GEMMs alone the 2019-2021 runs that
    use it (SHO19, DLEBERT, NAR21) come out faster than measured (leave-one-source-out 5.7%
    median, 12.2% p90, against 4.4 and 11.7): its memory-bound kernels run slower in training
    than the bandwidth model prices them, and the fraction stands in for that."""
    slow_g = 1.0 / oh.matmul_fraction(gpu, precision, framework) - 1.0
    slow_u = 1.0 / (oh.sustained(gpu.family) * oh.framework(framework)) - 1.0
    slow_k = 1.0 / (oh.framework(framework) * oh.attention_fraction) - 1.0
    p = lt.parts.get
    unfused = "attention_matmul_fwd" in lt.parts

    def attention(seconds: float) -> float:
        """Extra seconds of `seconds` of attention work."""
        return (slow_u if unfused else slow_k) * seconds

    extra_f = slow_g * p("gemm_fwd", 0.0) + attention(p("attention_fwd", 0.0)) + per_layer_s
    extra_i = slow_g * p("gemm_bwd_input", 0.0) + attention(p("attention_bwd", 0.0)) + per_layer_s
    extra_w = slow_g * p("gemm_bwd_weight", 0.0) + per_layer_s
    if lt.recompute_s and lt.recompute_s >= lt.fwd_s * (1 - 1e-12):
        recompute = lt.fwd_s + extra_f                      # full: the whole forward again
    elif "recompute_gemm" in lt.parts:
        # selective: the attention core; selective-op: every second linear and the elementwise
        # forward, a checkpointed pass of its own (the framework's per-pass cost)
        redo_gemm, redo_attn = p("recompute_gemm", 0.0), p("recompute_attention", 0.0)
        recompute = lt.recompute_s + slow_g * redo_gemm + attention(redo_attn)
        if redo_gemm:
            recompute += per_layer_s
    else:
        recompute = lt.recompute_s + attention(lt.recompute_s)    # selective: the core
    return LayerTimes(lt.fwd_s + extra_f, lt.bwd_s + extra_i + extra_w,
                      lt.bwd_input_s + extra_i, lt.bwd_weight_s + extra_w, recompute, lt.parts)


def block_cost(env: StepEnv, *, decoder: bool, recompute: str | None = None) -> BlockCost:
    """One block's seconds per micro-batch under `recompute` (default: the scenario's)."""
    ctx, topo, cal, oh = env.ctx, env.topo, env.cal, env.oh
    d, p, t = ctx.dims, ctx.parallel, ctx.training
    recompute = t.recompute if recompute is None else recompute
    gpu = ctx.system.gpu
    lt: LayerTimes = layer_times(d, t.micro_batch, p.tensor, p.sequence_parallel, p.context,
                                 t.precision, recompute, gpu, cal, decoder=decoder,
                                 attention=t.attention, fused_elementwise=t.fused_elementwise,
                                 softmax_fp32=t.attention_softmax_fp32,
                                 norm_kernel=t.norm_kernel, rope_kernel=t.rope_kernel,
                                 early_stop=env.recompute_early_stop,
                                 attention_unpad=t.attention_unpad, fp8_recipe=t.fp8_recipe)
    lt = sustained(lt, oh, gpu, t.precision, oh.block_overhead(t.framework), t.framework)
    parts: dict[str, float] = {}
    compute_f, compute_b = lt.fwd_s, lt.bwd_s
    _add(parts, "compute", compute_f + compute_b)
    _add(parts, "recompute", lt.recompute_s)
    fwd, bwd, bwd_w = compute_f, compute_b + lt.recompute_s, lt.bwd_weight_s

    tp_f = tp_b = 0.0
    if p.tensor > 1:
        nbytes = element_bytes(t.precision) * t.micro_batch * d.seq_len / p.context * d.hidden
        group = Group(p.tensor, min(p.tensor, ctx.placement.gpus_per_node))
        per_op = per_op_b = collective("allreduce", "auto", nbytes, group, topo)
        if p.sequence_parallel and t.precision == "fp8":
            # Transformer Engine all-gathers the norm outputs and the row-parallel gradients in fp8
            def scaled(backward: bool) -> float:
                return fp8casts.scaled_exchange(
                    nbytes, lambda n: collective("all_gather", "auto", n, group, topo),
                    lambda n: collective("reduce_scatter", "auto", n, group, topo),
                    fp8casts.gathered_bytes(t.fp8_recipe, backward=backward))
            per_op, per_op_b = per_op * scaled(False), per_op * scaled(True)
        ops = 3 if decoder else 2
        tp_f = ops * per_op
        # full and op-level selective recompute run the forward's collectives again (the op
        # policy keeps no all-gather or all-reduce output: torchtitan saves reduce-scatters only);
        # a full recompute stopped early leaves out the MLP output projection's reduction
        tp_b = ops * per_op_b + (tp_f if recompute in WHOLE_FORWARD_AGAIN else 0.0)
        if recompute == "full" and _early_stop_skips(env)[0]:
            tp_b -= per_op
    if p.tp_comm_overlap:
        # Transformer Engine's userbuffers split the GEMMs and move the TP data between chunks,
        # mostly by peer-to-peer copies (copy engines), not NCCL kernels on the SMs: the ideal
        # max, without the NCCL contention of `Overheads.overlapped`.
        tp_f, tp_b = max(fwd, tp_f) - fwd, max(bwd, tp_b) - bwd
    if p.tensor > 1 and t.precision == "fp8" and t.fp8_recipe == "current":
        # current scaling's amax all-reduces before the casts of sequence-parallel gathers
        # (`simulator.fp8casts`): 4 bytes each over the TP group, waited for, never overlapped;
        # a recompute of the whole forward casts, and reduces, again
        casts = fp8casts.block_casts(d, t.micro_batch, p.tensor, p.context, p.sequence_parallel,
                                     decoder=decoder, recipe=t.fp8_recipe)
        amax = collective("allreduce", "auto", 4.0, group, topo)
        again = casts.forward_tp_amax_reductions if recompute in WHOLE_FORWARD_AGAIN else 0
        tp_f += casts.forward_tp_amax_reductions * amax
        tp_b += (casts.backward_tp_amax_reductions + again) * amax
    _add(parts, "tp_comm", tp_f + tp_b)
    fwd, bwd = fwd + tp_f, bwd + tp_b

    if p.context > 1:
        e = element_bytes(t.precision)
        kv = 2 * e * t.micro_batch * d.seq_len / p.context * d.kv_heads * d.head_dim / min(
            p.tensor, d.kv_heads)
        shape = ctx.placement.cp_group()
        attn_f = lt.parts.get("attention_fwd", 0.0)
        attn_b = lt.parts.get("attention_bwd", 0.0)
        if p.cp_comm_type == "all_gather":
            # Llama 3's context parallelism (Dubey et al. 2024, Sec. 3.3.2): "we first all-gather
            # the key (K) and value (V) tensors, and then compute attention output for the local
            # query (Q) tensor chunk ... the all-gather communication latency is exposed in the
            # critical path"; the backward reduce-scatters dK and dV (the gathered K and V kept)
            group = shape.group()
            cf = collective("all_gather", "auto", kv * p.context, group, topo)
            cb = collective("reduce_scatter", "auto", kv * p.context, group, topo)
        else:
            cf = cp_ring_time(kv, p.context, shape.intra_only, topo, attention_s=attn_f,
                              concurrent=shape.sharing, overlap=oh.overlapped).exposed_s
            cb = cp_ring_time(2 * kv, p.context, shape.intra_only, topo, attention_s=attn_b,
                              concurrent=shape.sharing, overlap=oh.overlapped).exposed_s
        _add(parts, "cp_comm", cf + cb)
        fwd, bwd = fwd + cf, bwd + cb

    if p.zero >= 3 and p.shard * p.context > 1:
        fwd, bwd, bwd_w = _fsdp(env, decoder, fwd, bwd, bwd_w, parts, recompute,
                                copy_s=lambda nbytes: elementwise_time(2 * nbytes, gpu, cal))
    fwd, bwd, bwd_w = _host(env, decoder, fwd, bwd, bwd_w, parts, recompute)
    return BlockCost(fwd, bwd, bwd_w, parts)


def _host(env: StepEnv, decoder: bool, fwd: float, bwd: float, bwd_w: float,
          parts: dict[str, float], recompute: str) -> tuple[float, float, float]:
    """A block pass's host time (dispatch and launch per kernel, `simulator.host`) where it is
    exposed: beyond the device time, or all of it when launches block. The backward issues its own
    kernels and what the recompute issues again (`_recompute_kernels`): the whole forward (full,
    less what an early stop leaves out; selective-op dispatches it all and launches what its
    policy did not save) or the attention core (selective). With `training.attention_unpad` the
    unpadding's waits for the GPU (`simulator.unpad`) cut the forward, and any recompute of the
    whole forward: the ops between waits are issued while the GPU idles (`HostCosts.sync_stall`),
    the rest ahead of it as before. Under fp8, Transformer Engine's casts (`simulator.fp8casts`)
    cost their launches."""
    t, p, host = env.ctx.training, env.ctx.parallel, env.host
    kf = forward_kernels(decoder=decoder, tensor=p.tensor, attention=t.attention,
                         fused_elementwise=t.fused_elementwise) + eagerops.extra_forward_kernels(
        env.ctx.dims, decoder, norm=t.norm_kernel, rope=t.rope_kernel)
    recomputed, replayed = _recompute_kernels(env, decoder, recompute, kf)
    kb = BACKWARD_KERNELS_PER_FORWARD * kf
    cast_f = cast_b = 0
    if t.precision == "fp8":                       # launched from inside TE's linears
        casts = fp8casts.block_casts(env.ctx.dims, t.micro_batch, p.tensor, p.context,
                                     p.sequence_parallel, decoder=decoder, recipe=t.fp8_recipe)
        cast_f = casts.forward_kernels
        cast_b = casts.backward_kernels + (cast_f if recompute in WHOLE_FORWARD_AGAIN else 0)
    ahead, windows = kf, ()
    if t.attention_unpad != "none":
        form = t.attention_unpad
        kb += unpad.BACKWARD_KERNELS
        if host.synchronous or t.launch_blocking:
            ahead += unpad.forward_kernels(form)       # every op waits for its kernel anyway
        else:
            d, g = env.ctx.dims, env.cal.gpu(env.ctx.system.gpu.name)
            gathers = unpad_gather_times(d, t.micro_batch, p.tensor, p.context, t.precision,
                                         env.ctx.system.gpu, g)
            windows = unpad.sync_windows(gathers, g.kernel_floor_s, form)
            ahead += unpad.ahead_ops(form) - 1         # the flash kernel ends the last window
        if recompute in WHOLE_FORWARD_AGAIN:
            recomputed += ahead - kf
    in_windows = sum(dev for _, dev in windows)
    stall = host.sync_stall(windows, t.launch_blocking)
    hf = host.exposed(fwd - in_windows, ahead, t.launch_blocking, launched=cast_f) + stall
    again = recompute in WHOLE_FORWARD_AGAIN and bool(windows)
    hb = host.exposed(bwd - (in_windows if again else 0.0), recomputed, t.launch_blocking,
                      backward_kernels=kb, replayed=replayed,
                      launched=cast_b) + (stall if again else 0.0)
    _add(parts, "host", hf + hb)
    new_b = bwd + hb
    return fwd + hf, new_b, bwd_w * (new_b / bwd if bwd else 1.0)


def _recompute_kernels(env: StepEnv, decoder: bool, recompute: str, kf: int) -> tuple[int, int]:
    """(kernels launched again, ops dispatched again without a launch) by a block's recompute.
    Full: the whole forward, less the ops an early stop leaves out (`compute.early_stop_skip`).
    Selective: the attention core. Selective-op (torchtitan's op policy):
    torch's selective checkpoint runs the whole forward again, and the ops the policy saved, every
    second linear's matmul and the attention kernel (`inventory.op_policy_split`), return their
    kept outputs from its dispatch mode without a kernel (torch/utils/checkpoint.py: the forward's
    `_CachingTorchDispatchMode` stores them, the recompute's `_CachedTorchDispatchMode` returns
    them): dispatched, not launched."""
    t, p = env.ctx.training, env.ctx.parallel
    if recompute == "full":
        return kf - sum(_early_stop_skips(env)), 0
    if recompute == "selective":
        return attention_core_kernels(t.attention, decoder=decoder), 0
    if recompute == "selective-op":
        d = env.ctx.dims
        linears = inventory.block_linears(d, kind=inventory.block_kind(d, decoder),
                                          micro_batch=t.micro_batch, tensor=p.tensor,
                                          context=p.context)
        kept, _ = inventory.op_policy_split(linears)
        saved = min(kf, len(kept) + attention_core_kernels(t.attention, decoder=decoder))
        return kf - saved, saved
    return 0, 0


def _early_stop_skips(env: StepEnv) -> tuple[bool, bool]:
    """(output projection, residual add) a block's full recompute leaves out
    (`compute.early_stop_skips`)."""
    if not env.recompute_early_stop:
        return False, False
    return early_stop_skips(env.ctx.dims, env.ctx.training.fused_elementwise)


def _fsdp(env: StepEnv, decoder: bool, fwd: float, bwd: float,
          bwd_w: float, parts: dict[str, float], recompute: str, *,
          copy_s: Callable[[float], float] = lambda nbytes: 0.0) -> tuple[float, float, float]:
    """ZeRO-3: per-block parameter all-gathers and gradient reduce-scatter (Rajbhandari et al. 2020,
    Sec. 7.2.2). With `overlap_param_gather` (prefetching: DeepSpeed's prefetch buckets, FSDP's
    forward/backward prefetch) they overlap the neighbouring block's compute, so a block costs
    `Overheads.overlapped(compute, communication)`; without it they run between the block's
    kernels and add to them
    (DeepSpeed 0.3.x: every parameter all-gather synchronised the device, DeepSpeed PR #1188).

    What differs between frameworks is the framework profile's (simulator.frameworks,
    data/frameworks.yaml, with sources): `zero3_gather` `per_tensor` gathers tensor by tensor (one
    collective per parameter tensor of the inventory, each paying the collective's latency, as
    DeepSpeed's hooks fetch each submodule's parameters), `flat` one flat parameter per block (FSDP);
    tensors under `zero3_persistence_threshold_params` elements stay whole and are not gathered.
    `zero3_regather_on_recompute`: under full recompute a block's parameters are gathered a third
    time (DeepSpeed's hooks release them after every submodule forward, and the recomputed forward
    runs those hooks again; FSDP's pre-backward hook unshards the whole unit once).
    `zero3_list_collectives_without_prefetch`: without prefetching (DeepSpeed 0.3, see above) the
    gradients are also reduce-scattered tensor by tensor, and each gather and scatter builds a list
    of per-rank tensors, which costs `Overheads.list_collective` per call: per rank, host work and a
    copy of that rank's share (`copy_s(bytes)`: read and write, at least the GPU's shortest kernel).
    The framework's collectives run at its `zero3_collective_fraction` of the modelled bandwidth
    (1.0 unless a user's training.yaml sets one: `simulator.overheads`). They run in the ZeRO shard
    group; under hybrid sharding (`parallel.data_shard`, FSDP HYBRID_SHARD) each block's gradient
    shard is then all-reduced in the replica group, after the reduce-scatter (FSDP's
    `_reduce_grad`), so the two add up."""
    ctx, topo, oh = env.ctx, env.topo, env.oh
    p, t = ctx.parallel, ctx.training
    params = block_parameters(ctx.dims, decoder=decoder) / p.tensor
    shape = ctx.placement.shard_group(p.shard)
    group = Group(shape.n * p.context if p.context > 1 else shape.n, shape.per_node,
                  concurrent=shape.per_node * shape.sharing)
    e = element_bytes(t.precision)
    g = reduce_bytes(t, 3)
    slow = 1.0 / oh.zero3_collectives(t.framework)
    fw = env.framework
    tensors = (tuple(n / p.tensor for n in block_parameter_tensors(ctx.dims, decoder=decoder))
               if fw.zero3_gather == "per_tensor" else (params,))
    gathered = tuple(n for n in tensors if n >= fw.zero3_persistence_threshold_params)
    ag = sum(collective("all_gather", "auto", n * e, group, topo) for n in gathered) * slow
    if fw.zero3_list_collectives_without_prefetch and not p.overlap_param_gather:
        rs = sum(collective("reduce_scatter", "auto", n * g, group, topo)
                 for n in tensors) * slow
        n = group.ranks
        ag += sum(oh.list_collective("all_gather", n, copy_s(t * e / n)) for t in gathered)
        rs += sum(oh.list_collective("reduce_scatter", n, copy_s(t * g / n))
                  for t in tensors)
    else:
        rs = collective("reduce_scatter", "auto", params * g, group, topo) * slow
    if p.replicas > 1:              # hybrid sharding: the gradient shard across the replicas
        rep = ctx.placement.replica_group(p.shard)
        rs += collective("allreduce", "auto", params / group.ranks * g,
                         rep.group(),
                         topo) * slow
    regather = ag if (fw.zero3_regather_on_recompute and recompute in WHOLE_FORWARD_AGAIN) else 0.0
    if p.overlap_param_gather:
        new_f, new_b = oh.overlapped(fwd, ag), oh.overlapped(bwd, ag + regather + rs)
    else:
        new_f, new_b = fwd + ag, bwd + ag + regather + rs
    _add(parts, "fsdp_comm", (new_f - fwd) + (new_b - bwd))
    return new_f, new_b, bwd_w * (new_b / bwd if bwd else 1.0)


def chunk_costs(env: StepEnv) -> list[ChunkCost]:
    """Per model chunk, seconds per micro-batch of a transformer scenario."""
    ctx, cal, oh = env.ctx, env.cal, env.oh
    d, p, t = ctx.dims, ctx.parallel, ctx.training
    kinds: dict[tuple[bool, bool], BlockCost] = {}

    def blocks(decoder: bool, recomputed: bool) -> BlockCost:
        """A block's cost; under full recompute with `recompute_num_layers`, the blocks past the
        first N of a chunk are not recomputed."""
        if (decoder, recomputed) not in kinds:
            policy = "full" if recomputed else ("none" if t.recompute == "full" else t.recompute)
            kinds[decoder, recomputed] = block_cost(env, decoder=decoder, recompute=policy)
        return kinds[decoder, recomputed]
    gpu = ctx.system.gpu
    emb = embedding_times(d, t.micro_batch, p.tensor, p.sequence_parallel, p.context,
                          t.precision, gpu, cal)
    head = sustained(head_times(d, t.micro_batch, p.tensor, p.sequence_parallel, p.context,
                                t.precision, gpu, cal, fused_loss=t.fused_cross_entropy),
                     oh, gpu, t.precision, framework=t.framework)
    ranges = chunk_ranges(d.total_layers, p)
    out = []
    for i, (a, b) in enumerate(ranges):
        n_enc, n_dec = chunk_blocks(d, a, b)
        f = bw = w = 0.0
        parts: dict[str, float] = {}
        for n, decoder, recomputed in _block_groups(t, n_enc, n_dec):
            c = blocks(decoder, recomputed)
            f, bw, w = f + n * c.fwd_s, bw + n * c.bwd_s, w + n * c.bwd_weight_s
            for k, v in c.parts.items():
                parts[k] = parts.get(k, 0.0) + n * v
        for extra, present, kernels in ((emb, i == 0, EMBEDDING_FORWARD_KERNELS),
                                        (head, i == len(ranges) - 1, HEAD_FORWARD_KERNELS)):
            if present:
                f, bw, w = f + extra.fwd_s, bw + extra.bwd_s, w + extra.bwd_weight_s
                parts["compute"] = parts.get("compute", 0.0) + extra.fwd_s + extra.bwd_s
                if env.host.synchronous:
                    hf = env.host.exposed(0.0, kernels, False)
                    hb = env.host.exposed(0.0, 0, False,
                                          backward_kernels=BACKWARD_KERNELS_PER_FORWARD * kernels)
                    f, bw = f + hf, bw + hb
                    _add(parts, "host", hf + hb)
        if t.precision == "fp8" and t.fp8_recipe == "delayed" and n_enc + n_dec:
            af, ab = _amax_reductions(env, n_enc, n_dec)
            f, bw = f + af, bw + ab
            _add(parts, "fp8_amax", af + ab)
        hp = _hp_grad_update(env, n_enc, n_dec, i == 0 or i == len(ranges) - 1)
        if hp:
            bw, w = bw + hp, w + hp
            _add(parts, "hp_grad_update", hp)
        out.append(ChunkCost(f, bw, w, parts))
    return out


def _amax_reductions(env: StepEnv, n_enc: int, n_dec: int) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of the delayed-scaling amax all-reduces that
    end a chunk's passes under fp8 (`simulator.fp8amax`), over the chunk's GEMMs on one TP rank."""
    ctx = env.ctx
    d, p, t = ctx.dims, ctx.parallel, ctx.training
    gemms = n_enc * len(block_gemms(d, t.micro_batch, p.tensor, p.context))
    if n_dec:
        gemms += n_dec * len(block_gemms(d, t.micro_batch, p.tensor, p.context, decoder=True))
    group = fp8amax.amax_group(p.tensor, p.context, p.data, ctx.placement.gpus_per_node)
    return fp8amax.reduction_times(gemms, group, env.topo)


def _block_groups(t, n_enc: int, n_dec: int) -> list[tuple[int, bool, bool]]:
    """A chunk's blocks as (count, decoder, recomputed): its first `t.recomputed_blocks` blocks
    (encoder blocks come first in a t5 chunk) are recomputed, as Megatron-LM's block method
    recomputes the first N layers of each chunk (megatron/core/transformer/transformer_block.py,
    `_checkpointed_forward`, recompute_method 'block')."""
    r = t.recomputed_blocks(n_enc + n_dec)
    r_enc = min(r, n_enc)
    groups = [(n_enc - r_enc, False, False), (r_enc, False, True),
              (n_dec - (r - r_enc), True, False), (r - r_enc, True, True)]
    return [g for g in groups if g[0] > 0]


# DeepSpeed's BF16_Optimizer adds every micro-batch's bf16 gradients into fp32 gradient buffers
# right after that micro-batch's backward (runtime/pipe/engine.py `_exec_backward_pass` calls
# `optimizer.update_hp_grads()` when bf16 is on; runtime/bf16_optimizer.py, per parameter tensor:
# `hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))`): a cast kernel (read 2, write 4 bytes per
# parameter) and an add kernel (read 4 + 4, write 4).
HP_GRAD_KERNEL_BYTES = (6.0, 12.0)


def _hp_grad_update(env: StepEnv, n_enc: int, n_dec: int, has_table: bool) -> float:
    """Seconds per micro-batch of a bf16 gradient accumulation into fp32 on one chunk, for a
    framework whose profile has `bf16_microbatch_gradient_accumulation` (DeepSpeed's pipeline
    engine, pipeline > 1) under bf16 with ZeRO 0 or 1 (the BF16_Optimizer; ZeRO 2 and 3 accumulate
    in their own partitioned buffers)."""
    ctx, cal = env.ctx, env.cal
    p, t, d = ctx.parallel, ctx.training, ctx.dims
    if (not env.framework.bf16_microbatch_gradient_accumulation or t.precision != "bf16"
            or p.pipeline < 2 or p.zero > 1):
        return 0.0
    tensors = [n / p.tensor for n in block_parameter_tensors(d)] * n_enc
    if n_dec:
        tensors += [n / p.tensor for n in block_parameter_tensors(d, decoder=True)] * n_dec
    if has_table:
        tensors.append(embedding_parameters(d)[0] / p.tensor)      # the word table
    gpu = ctx.system.gpu
    return sum(elementwise_time(n * b, gpu, cal) for n in tensors for b in HP_GRAD_KERNEL_BYTES)


def boundary_bytes(ctx: StepContext, chunk: int) -> float:
    """Bytes of the activation passed from chunk `chunk` to the next (the gradient is the same
    size). Megatron splits it over the TP ranks (scatter-gather; Narayanan et al. 2021, Sec. 4.1);
    a t5 decoder chunk also carries the encoder output."""
    d, p, t = ctx.dims, ctx.parallel, ctx.training
    e = element_bytes(t.precision)
    nbytes = e * t.micro_batch * d.seq_len / p.context * d.hidden / p.tensor
    if d.arch == "t5":
        ranges = chunk_ranges(d.total_layers, p)
        if ranges[chunk][1] > d.layers:
            nbytes *= 2
    return nbytes


def p2p_costs(env: StepEnv, crossing: Sequence[float]) -> tuple[list[float], list[float], list[bool]]:
    """Per chunk boundary (`crossing`: the bytes that cross it, `ModelCosts.boundary_bytes`):
    activation and gradient transfer seconds, and same-node flags."""
    ctx, topo = env.ctx, env.topo
    p = ctx.parallel
    chunks = p.pipeline * p.virtual_stages
    same_rank_node = ctx.placement.pp_neighbours_same_node()
    act, grad, same = [], [], []
    sharing = ctx.placement.pp_sharing()
    for c in range(chunks - 1):
        r = c % p.pipeline
        same_node = same_rank_node[r] if r < p.pipeline - 1 else (
            ctx.placement.gpus <= ctx.placement.gpus_per_node)
        nbytes = crossing[c]
        secs = p2p(nbytes, same_node, topo, concurrent=sharing)
        act.append(secs)
        grad.append(secs)
        same.append(same_node)
    return act, grad, same
