"""Per-GPU memory of one rank: parameters, gradients, optimizer state, activations, the rest.

Parameters, gradients and optimizer state follow mixed-precision training (Micikevicius et al.
2018) as Megatron-LM keeps it: 16-bit weights, fp32 main gradients (fp16 ones in fp16 training:
`grad_bytes`), an fp32 master copy and Adam's two fp32 moments, 2 + 4 + 4 + 8 = 18 bytes per
parameter for bf16 (megatron/training/theoretical_memory_usage.py); fp32 training keeps 4 + 4 + 8. ZeRO (Rajbhandari et al. 2020,
Sec. 5: (2 + 2 + K) * psi / N_d) shards over the data-parallel (times context-parallel) group: stage
1 the optimizer state (Megatron's distributed optimizer, 6 + 12/d), stage 2 also the gradients (kept
16-bit as DeepSpeed does), stage 3 also the parameters, plus two layers' gathered parameters.

Activations are the inventory's layers (`planner.inventory`) counted by an activation model
(`planner.activations`; `MEGATRON` by default: Korthikanti et al. 2022, Sec. 4.1, Table 2, with
tensor, sequence and context parallelism and recompute). Full recomputation keeps each block's
input plus, while one block is recomputed for its backward, that block's whole activations
(Chen et al. 2016, Sec. 4.1: checkpoints plus the largest segment); op-level selective
recomputation keeps the outputs its policy saves plus, likewise, one block whole. The head's
logits are counted under `other`, and so are, under fp8, the fp8 copies of the weights Transformer
Engine keeps for a step (`simulator.fp8casts.weight_cache_bytes`; under ZeRO-3 sharded as the
weights are). A rank holds the activations of the micro-batches in flight (`activation_microbatches`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from partita.planner import inventory
from partita.planner.activations import (FP32, MEGATRON, ActivationModel, ActivationSettings,
                                        element_bytes)
from partita.planner.enums import WHOLE_FORWARD_AGAIN
from partita.planner.errors import PartitaError
from partita.planner.modelspec import TransformerDims
from partita.planner.scenario import ParallelSpec, TrainingSpec
from partita.planner.stages import chunk_ranges
from partita.simulator import fp8casts
from partita.simulator.calibration import Calibration
from partita.simulator.frameworks import framework_profile

KEYS = ("parameters", "gradients", "optimizer", "activations", "other")
OPTIMIZER_STATE_BYTES = {"adam": 8.0, "sgd": 4.0}     # Adam: two fp32 moments; SGD: fp32 momentum


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one GPU. `other` = logits buffer and the loss's peak beyond it + fp8 weight
    copies + ZeRO-3 gathered layers + framework reserve."""
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    other: float
    details: dict[str, float] = field(default_factory=dict, hash=False, compare=False)

    @property
    def total_bytes(self) -> int:
        return int(round(self.parameters + self.gradients + self.optimizer + self.activations
                         + self.other))

    @property
    def allocated_bytes(self) -> int:
        """What the framework allocates (torch.cuda.max_memory_allocated), without the reserve."""
        return int(round(self.total_bytes - self.details.get("framework_reserve", 0.0)))

    def breakdown(self) -> dict[str, int]:
        return {k: int(round(getattr(self, k))) for k in KEYS}


# ---- parameter counts ----

@lru_cache(maxsize=64)
def block_parameters(dims: TransformerDims, *, decoder: bool = False) -> int:
    """Parameters of one repeated transformer block (a t5 decoder block with decoder=True)."""
    return inventory.block(dims, kind=inventory.block_kind(dims, decoder)).params


def block_parameter_tensors(dims: TransformerDims, *, decoder: bool = False) -> tuple[int, ...]:
    """Sizes of one block's parameter tensors (they add up to `block_parameters`), as a framework
    that gathers tensor by tensor sees them (DeepSpeed ZeRO-3 hooks; Hugging Face layouts)."""
    return tuple(t.numel for t in inventory.block(dims, kind=inventory.block_kind(dims, decoder)).tensors)


def _split(layer: inventory.Layer) -> tuple[int, int]:
    """(vocab-parallel tables, replicated tensors) of a layer."""
    return layer.vocab_params, layer.params - layer.vocab_params


@lru_cache(maxsize=64)
def embedding_parameters(dims: TransformerDims) -> tuple[int, int]:
    """(vocab-parallel word table, replicated position / token-type tables and norms)."""
    return _split(inventory.layers(dims)[0])


@lru_cache(maxsize=64)
def head_parameters(dims: TransformerDims) -> tuple[int, int]:
    """(vocab-parallel output table if untied, replicated final norms / BERT MLM transform).

    The blocks are counted as repeated blocks (`block_parameters`), so the stack-level tensors of
    the inventory are placed here: a t5 encoder's final norm counts with the head. T5's relative
    position bias (32 x heads per stack, under 1e-6 of any T5 model) is not counted in memory."""
    table, extra = _split(inventory.layers(dims)[-1])
    norms = sum(t.numel for layer in inventory.layers(dims) for t in layer.tensors
                if t.stack and t.name.endswith("final_norm.weight"))
    return table, extra + norms


def chunk_blocks(dims: TransformerDims, first_layer: int, end_layer: int) -> tuple[int, int]:
    """(encoder-or-only blocks, t5 decoder blocks) among layers [first_layer, end_layer) of
    dims.total_layers: a t5 model's decoder blocks follow its `layers` encoder blocks."""
    enc = max(0, min(end_layer, dims.layers) - first_layer)
    return enc, (end_layer - first_layer) - enc


def held_parameters(dims: TransformerDims, *, tp: int, blocks: int, decoder_blocks: int = 0,
                    first: bool, last: bool, pipelined: bool) -> float:
    """Parameters one tensor-parallel rank holds for `blocks` (+ `decoder_blocks`) blocks, with the
    embedding on the first stage and the head on the last; a pipelined model with tied
    embeddings keeps a copy of the word table on the last stage too (Megatron-LM)."""
    word, replicated = embedding_parameters(dims)
    table, head_extra = head_parameters(dims)
    params = (blocks * block_parameters(dims) + decoder_blocks * block_parameters(dims, decoder=True)) / tp
    if first:
        params += word / tp + replicated
    if last:
        params += head_extra + table / tp
        if pipelined and dims.tie_embeddings:
            params += word / tp
    return params


def grad_bytes(precision: str) -> int:
    """Bytes per gradient element held and reduced across data parallelism (ZeRO 0/1).

    Megatron-LM keeps and reduces fp16 gradients as they are (`--accumulate-allreduce-grads-in-fp32` defaults off) but forces fp32
    accumulation and reduction for bf16 (megatron/training/arguments.py: "bfloat16 requires
    gradient accumulation and all-reduce to be done in fp32"); fp8 trains on bf16 weights."""
    return 2 if precision == "fp16" else 4


def reduce_bytes(training: TrainingSpec, zero: int) -> int:
    """Bytes per gradient element in the data-parallel reduction. `training.grad_reduce_dtype`
    where it names one; by default ZeRO 0-2 reduce what they hold (`grad_bytes`, Megatron-LM) and
    ZeRO-3 the compute dtype: FSDP's MixedPrecision reduce_dtype defaults to its param_dtype
    (torch.distributed.fsdp MixedPrecision, MixedPrecisionPolicy) and DeepSpeed's ZeRO-3
    reduce-scatters the 16-bit gradients; fp32 and tf32 training compute in fp32, fp8 training
    keeps bf16 weights."""
    named = {"fp32": 4, "bf16": 2, "fp16": 2}.get(training.grad_reduce_dtype)
    if named is not None:
        return named
    if zero < 3:
        return grad_bytes(training.precision)
    return 4 if training.precision in ("fp32", "tf32") else 2


def bytes_per_parameter(precision: str, optimizer: str, zero: int, shard: int,
                        framework: str = "megatron") -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes per parameter on one GPU.

    A framework whose profile has `bf16_fp32_gradient_copy` (simulator.frameworks) keeps an fp32
    copy of every gradient in bf16 training below ZeRO-2: DeepSpeed's bf16 training without
    ZeRO-2/3 runs its BF16_Optimizer (deepspeed/runtime/
    bf16_optimizer.py), which keeps the bf16 `.grad` and accumulates into a full fp32 copy of every
    gradient (`fp32_groups_gradients`, not sharded): 2 + 4 bytes. BigScience's BLOOM log measured
    it: "additional memory usage is 4bytes x params and it's not sharded across gpus"
    (bigscience train/tr11-176B-ml/chronicles-prequel.md, 'Rebalancing layers')."""
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise PartitaError(f"training.optimizer: expected one of "
                           f"{', '.join(OPTIMIZER_STATE_BYTES)}, got {optimizer!r}")
    if zero not in (0, 1, 2, 3):
        raise PartitaError(f"parallel.zero: expected 0, 1, 2 or 3, got {zero!r}")
    wide = precision in ("fp32", "tf32")
    weights = 4.0 if wide else 2.0
    grads = float(grad_bytes(precision)) if (wide or zero < 2) else 2.0   # ZeRO-2/3: 16-bit
    if precision == "bf16" and zero < 2 and framework_profile(framework).bf16_fp32_gradient_copy:
        grads = 2.0 + 4.0                                   # BF16_Optimizer: bf16 + fp32 copy
    states = OPTIMIZER_STATE_BYTES[optimizer] + (0.0 if wide else 4.0)   # + fp32 master copy
    return (weights / shard if zero >= 3 else weights, grads / shard if zero >= 2 else grads,
            states / shard if zero >= 1 else states)


# ---- activations ----

def activation_microbatches(schedule: str, pipeline: int, microbatches: int, rank: int = 0,
                            virtual: int = 1) -> float:
    """Micro-batches' worth of a pipeline rank's activations held at the peak.

    gpipe: all m (fill then drain); 1f1b and zero-bubble (ZB-H1, Qi et al. 2023): p - rank;
    interleaved-1f1b: Megatron's warm-up of 2(p - rank - 1) + (v - 1)p chunk micro-batches plus one,
    in units of 1/v of the rank's layers (Narayanan et al. 2021, Sec. 2.2.2: p(1 + (p-1)/(pv))
    for the first rank).
    """
    p, m = pipeline, microbatches
    if p <= 1:
        return 1.0
    if schedule == "gpipe":
        return float(m)
    if schedule in ("1f1b", "zero-bubble"):
        return float(min(p - rank, m))
    if schedule == "interleaved-1f1b":
        chunks = 2 * (p - rank - 1) + (virtual - 1) * p + 1
        return min(chunks, m * virtual) / virtual
    raise PartitaError(f"parallel.schedule: expected one of gpipe, 1f1b, interleaved-1f1b, "
                       f"zero-bubble, got {schedule!r}")


# ---- one rank ----

def stage_memory(dims: TransformerDims, *, micro_batch: int, precision: str, optimizer: str,
                 recompute: str, cal: Calibration, tp: int = 1, dp: int = 1, cp: int = 1,
                 sp: bool = False, zero: int = 0, pipeline: int = 1, blocks: int | None = None,
                 decoder_blocks: int = 0, first: bool = True, last: bool = True,
                 inflight: float = 1.0, flash_attention: bool = True,
                 softmax_fp32: bool = False, fused_loss: bool = False,
                 eager_norm: bool = False, attention_unpad: bool = False,
                 framework: str = "megatron", recomputed: int | None = None,
                 activation_model: ActivationModel = MEGATRON,
                 fp8_recipe: str = "delayed") -> MemoryEstimate:
    """Memory of one GPU holding `blocks` encoder/decoder-only blocks and `decoder_blocks` t5
    decoder blocks (default: the whole model), `inflight` micro-batches of `activation_model`'s
    activations. Under full recompute, `recomputed` of those blocks (encoder blocks first; default
    all) keep only their input, the others all their activations
    (`TrainingSpec.recompute_num_layers`). ZeRO shards over `dp` x `cp` ranks: the data-parallel
    ranks of one shard group (`ParallelSpec.shard`) times the context-parallel ones."""
    if blocks is None:
        blocks, decoder_blocks = dims.layers, dims.decoder_layers
    shard = dp * cp
    params = held_parameters(dims, tp=tp, blocks=blocks, decoder_blocks=decoder_blocks, first=first,
                             last=last, pipelined=pipeline > 1)
    w, g, o = bytes_per_parameter(precision, optimizer, zero, shard, framework)
    s = ActivationSettings(micro_batch=micro_batch, precision=precision, tensor=tp, context=cp,
                           sequence_parallel=sp, recompute=recompute, flash_attention=flash_attention,
                           softmax_fp32=softmax_fp32, fused_loss=fused_loss, eager_norm=eager_norm,
                           attention_unpad=attention_unpad)
    kept = replace(s, recompute="none")
    r = blocks + decoder_blocks if recomputed is None or recompute != "full" else recomputed
    r_enc = min(r, blocks)
    enc_layer = inventory.block(dims, kind=inventory.block_kind(dims))
    held = [(r_enc, enc_layer, s), (blocks - r_enc, enc_layer, kept)]
    if decoder_blocks:
        dec_layer = inventory.block(dims, kind="decoder")
        held += [(r - r_enc, dec_layer, s), (decoder_blocks - (r - r_enc), dec_layer, kept)]
    if first:
        held.append((1, inventory.layers(dims)[0], s))
    activations = sum(n * activation_model.layer_bytes(dims, layer, how)
                      for n, layer, how in held if n > 0) * inflight
    details: dict[str, float] = {"parameter_count": params}
    if recompute in WHOLE_FORWARD_AGAIN and r > 0:
        # The backward re-runs one block's forward from its stored input and holds all that
        # block's activations until its backward is done: checkpoints plus the largest segment
        # (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", Sec. 4.1). The
        # op-level policy re-runs the block's forward too, around the outputs it kept.
        segment = activation_model.layer_bytes(
            dims, dec_layer if r > r_enc else enc_layer, kept)
        details["recompute_segment"] = segment
        activations += segment
    other = 0.0
    if last:                      # the head's activations: final-norm and head inputs, fp32 logits
        logits = activation_model.layer_bytes(dims, inventory.layers(dims)[-1], s)
        details["logits"] = logits
        e = element_bytes(precision)
        peak = loss_peak_bytes_per_logit(framework_profile(framework).loss, e, fused_loss)
        rows = dims.head_positions / cp * micro_batch
        details["loss_peak"] = rows * dims.vocab / tp * (peak - (e if fused_loss else FP32))
        other += logits + details["loss_peak"]
    if precision == "fp8":        # Transformer Engine's cached fp8 weights and transposes
        cache = fp8casts.weight_cache_bytes(dims, tp, blocks, decoder_blocks, fp8_recipe)
        details["fp8_weight_cache"] = cache / shard if zero >= 3 else cache
        other += details["fp8_weight_cache"]
    if zero >= 3:                 # two layers' full parameters gathered at once (prefetch)
        layer = block_parameters(dims, decoder=decoder_blocks > 0) / tp
        gathered = 2 * layer * (4.0 if precision in ("fp32", "tf32") else 2.0)
        details["zero3_gathered"] = gathered
        other += gathered
    allocated = params * (w + g + o) + activations + other
    reserve = cal.memory.reserve_bytes(allocated, framework)
    details["framework_reserve"] = reserve
    return MemoryEstimate(params * w, params * g, params * o, activations, other + reserve, details)


def loss_peak_bytes_per_logit(loss: str, e: int, fused: bool) -> float:
    """Bytes per logit the cross-entropy holds at its peak, logits and gradients together (the
    head's activation accounting keeps 4, the fp32 softmax, or e for a fused loss).

    vocab_parallel, Megatron-LM's VocabParallelCrossEntropy (megatron/core/tensor_parallel/
    cross_entropy.py): the 16-bit logits and their fp32 copy in the forward (softmax made in place
    on the copy and saved); in the backward the saved softmax becomes the gradient in place and is
    cast to 16 bits: 4 + e (4 in fp32 training, where the cast copies nothing).
    torch, F.cross_entropy on the logits cast to fp32 (partita's executor, executor/stages.py; the
    Llama models of Meta and torchtitan return self.output(h).float()): the 16-bit logits, the
    fp32 log-softmax it saves, the NLL's dense gradient and the log-softmax's gradient at once:
    e + 12. Measured on an H200 (benchmarks/bench_gpu_kernels.py --only loss_memory, the LM head's
    weight and input gradients included): 14.3-16.0 for bf16; 8.3-10.0 without the fp32 cast.
    torchtitan deletes its fp32 logits before the backward (12 there).
    fused (`training.fused_cross_entropy`): the logits at their precision, the gradient written in
    place: e."""
    if fused:
        return float(e)
    if loss == "vocab_parallel":
        return FP32 + (e if e < FP32 else 0)
    return e + 3.0 * FP32


def chunk_parameters(dims: TransformerDims, parallel: ParallelSpec) -> list[float]:
    """Parameters of each model chunk on one TP rank (embedding with chunk 0, head with the last)."""
    ranges = chunk_ranges(dims.total_layers, parallel)
    out = []
    for i, (a, b) in enumerate(ranges):
        enc, dec = chunk_blocks(dims, a, b)
        out.append(held_parameters(dims, tp=parallel.tensor, blocks=enc, decoder_blocks=dec,
                                   first=i == 0, last=i == len(ranges) - 1,
                                   pipelined=len(ranges) > 1))
    return out


def _stage_blocks(dims: TransformerDims, parallel: ParallelSpec,
                  training: TrainingSpec) -> list[tuple[int, int, int]]:
    """(encoder-or-only blocks, t5 decoder blocks, blocks recomputed) per pipeline rank, all its
    chunks together."""
    p = parallel.pipeline
    ranges = chunk_ranges(dims.total_layers, parallel)
    out = [[0, 0, 0] for _ in range(p)]
    for chunk, (a, b) in enumerate(ranges):
        enc, dec = chunk_blocks(dims, a, b)
        out[chunk % p][0] += enc
        out[chunk % p][1] += dec
        out[chunk % p][2] += training.recomputed_blocks(enc + dec)
    return [(e, d, r) for e, d, r in out]


def pipeline_memory(dims: TransformerDims, training: TrainingSpec, parallel: ParallelSpec,
                    cal: Calibration, *, microbatches: int | None = None,
                    inflight: Sequence[float] | None = None,
                    flash_attention: bool = True,
                    activation_model: ActivationModel = MEGATRON) -> tuple[MemoryEstimate, ...]:
    """Memory of each pipeline rank of a plan (the largest is the scenario's peak). `inflight`:
    per rank, from the pipeline simulation; default the closed form of `activation_microbatches`."""
    p = parallel.pipeline
    m = microbatches if microbatches is not None else max(
        1, training.global_batch // (training.micro_batch * parallel.data))
    blocks = _stage_blocks(dims, parallel, training)
    out = []
    for rank in range(p):
        held = inflight[rank] if inflight is not None else activation_microbatches(
            parallel.schedule, p, m, rank, parallel.virtual_stages)
        enc, dec, recomputed = blocks[rank]
        out.append(stage_memory(
            dims, micro_batch=training.micro_batch, precision=training.precision,
            optimizer=training.optimizer, recompute=training.recompute, cal=cal,
            tp=parallel.tensor, dp=parallel.shard, cp=parallel.context,
            sp=parallel.sequence_parallel, zero=parallel.zero, pipeline=p, blocks=enc,
            decoder_blocks=dec, first=(rank == 0), last=(rank == p - 1), inflight=held,
            flash_attention=flash_attention, framework=training.framework,
            softmax_fp32=training.attention_softmax_fp32 and training.attention == "eager",
            fused_loss=training.fused_cross_entropy, recomputed=recomputed,
            eager_norm=training.norm_kernel == "eager",
            attention_unpad=training.attention_unpad != "none",
            activation_model=activation_model, fp8_recipe=training.fp8_recipe))
    return tuple(out)
