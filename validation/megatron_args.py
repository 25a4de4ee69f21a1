"""Megatron-LM's command-line arguments (`MODEL_ARGS` of a functional test's model_config.yaml) as a
partita scenario, or the reason they cannot be one.

Every argument is either mapped (the model's shape, the batch, the parallel layout, precision,
recompute, the attention backend), or taken as the block's arch implies it (`AS_ARCH`: biases, norm,
position encoding), or known to leave a step's memory and layout alone (logging, data, checkpoints,
learning-rate schedule, `--deterministic-mode`), or unexpressed: a row with an
unexpressed argument (mixture of experts, fp8, CUDA graphs, Megatron-FSDP, uneven pipeline splits,
multi-latent attention, ...) is skipped with that argument named, never approximated.

Mapping, each from megatron/training/arguments.py and the model code at the commit the data names:
- the shape: `--swiglu` makes the block a gated MLP (arch llama; its `--ffn-hidden-size` default is
  int(4h * 2/3 / 64) * 64), else arch gpt with 4h; `--group-query-attention` `--num-query-groups`,
  `--kv-channels`, `--untie-embeddings-and-output-weights`; dropout from `--hidden-dropout` and
  `--attention-dropout` (default 0.1 each);
- the vocabulary: `--vocab-size` (NullTokenizer) or GPT-2's BPE (50,257 with `--vocab-file`), padded
  to a multiple of `--make-vocab-size-divisible-by` (128) x TP (`_vocab_size_with_padding`);
- attention: with Transformer Engine (the default `--transformer-impl`) `--attention-backend` auto
  and fused run cuDNN's fused kernel (the GPU's flash), flash FlashAttention-2, unfused and local a
  stored score matrix; Megatron-Core's local implementation runs its DotProductAttention (stored
  scores) unless told otherwise;
- `--cross-entropy-loss-fusion` is left unexpressed: it is not partita's `fused_cross_entropy`
  (Megatron-Core's fused vocab-parallel cross entropy, megatron/core/fusions/fused_cross_entropy.py,
  casts the logits to fp32 and keeps their softmax for the backward, as the unfused one does), and
  its golden peak (gpt3_mcore_te_tp2_pp2_cross_entropy_loss_fusion, 1.71 GiB on H100) is 0.38 GiB
  above that of the same arguments without it (gpt3_mcore_te_tp2_pp2_resume_torch_dist, 1.33 GiB,
  which also sets `--deterministic-mode`; that flag leaves the cp2 cases' peaks equal), which no
  modelled tensor accounts for;
- recompute: `--recompute-granularity selective`; full with `--recompute-method block` keeps the
  first `--recompute-num-layers` recomputed; uniform with one layer per checkpoint is every block;
- the layout: TP, PP, CP, DP = GPUs / (TP x PP x CP), the distributed optimizer (ZeRO-1), sequence
  parallelism, virtual stages (`--num-layers-per-virtual-pipeline-stage` or
  `--num-virtual-stages-per-pipeline-rank`, the interleaved schedule), `--cp-comm-type`.
"""
from __future__ import annotations

import math
from typing import Any

# Arguments that change neither the memory a step allocates nor its layout.
NEUTRAL = frozenset("""
adam-beta1 adam-beta2 adam-eps apply-query-key-layer-scaling async-ckpt-use-cpu-shm async-save
async-strategy attention-softmax-in-fp32 auto-detect-ckpt-format calculate-per-token-loss
check-weight-hash-across-dp-replicas-interval ckpt-assume-constant-structure ckpt-format
ckpt-fully-parallel-load ckpt-fully-parallel-save clip-grad data-cache-path data-path
ddp-average-in-collective decoupled-lr decoupled-min-lr deterministic-mode
disable-gloo-process-groups dist-ckpt-optim-fully-reshardable dist-ckpt-strictness
distributed-backend distributed-timeout-minutes empty-unused-memory-level eval-interval eval-iters
exit-interval init-method-std load log-interval log-memory-to-tensorboard log-num-zeros-in-grad
log-params-norm log-progress log-throughput log-timers-to-tensorboard
log-validation-ppl-to-tensorboard lr lr-decay-iters lr-decay-samples lr-decay-style
lr-warmup-fraction lr-warmup-samples make-vocab-size-divisible-by manual-gc max-position-embeddings
merge-file min-lr mock-data no-ckpt-fully-parallel-save no-gradient-accumulation-fusion
no-masked-softmax-fusion no-mmap-bin-files no-persist-layer-norm no-rope-fusion norm-epsilon
num-workers overlap-grad-reduce overlap-param-gather rotary-base rotary-interleaved save
save-interval save-retain-interval seed split straggler-minmax-count tensorboard-dir
tensorboard-log-interval timing-log-level timing-log-option tokenizer-type train-iters
train-samples use-checkpoint-opt_param-scheduler use-mcore-models use-persistent-ckpt-worker
use-tp-pp-dp-mapping verify-integrity vocab-file wandb-entity wandb-exp-name wandb-project
wandb-save-dir weight-decay
""".split())
MAPPED = frozenset("""
attention-backend attention-dropout bf16 context-parallel-size cp-comm-type ffn-hidden-size fp16
global-batch-size group-query-attention hidden-dropout hidden-size kv-channels micro-batch-size
num-attention-heads num-layers num-layers-per-virtual-pipeline-stage num-query-groups
num-virtual-stages-per-pipeline-rank pipeline-model-parallel-size recompute-granularity
recompute-method recompute-num-layers seq-length sequence-parallel swiglu
tensor-model-parallel-size transformer-impl untie-embeddings-and-output-weights
use-distributed-optimizer vocab-size
""".split())
# Arguments taken as the arch implies them (gpt: LayerNorm, biases, learned positions; llama, with
# --swiglu: RMSNorm, no biases, RoPE): they move a norm's bias, the linears' biases, a position table
# or the data loader's attention mask, under 1% of these models' memory.
AS_ARCH = frozenset("""
disable-bias-linear no-create-attention-mask-in-dataloader normalization position-embedding-type
rotary-percent use-rotary-position-embeddings
""".split())
TOKENIZERS = {None: 50257, "GPT2BPETokenizer": 50257}     # GPT-2's BPE vocabulary
CP_COMM = {"p2p": "p2p", "allgather": "all_gather"}        # Megatron's --cp-comm-type -> partita's
TE_ATTENTION = {"auto": "flash", "fused": "flash", "flash": "flash2", "unfused": "unfused",
                "local": "unfused"}


class Unexpressed(ValueError):
    """The arguments name something a partita scenario cannot state."""


def _flag(a: dict[str, Any], key: str) -> bool:
    return a.get(key) in (True, "true", "True", 1)


def scenario(args: dict[str, Any], *, gpus: int, system: str, name: str) -> dict[str, Any]:
    """The scenario document of a run with Megatron-LM `args` ("--key": value, as in
    model_config.yaml) on `gpus` GPUs of `system`; Unexpressed naming what it cannot state."""
    a = {str(k).lstrip("-"): v for k, v in args.items()}
    other = sorted(k for k in a if k not in NEUTRAL | MAPPED | AS_ARCH)
    if other:
        raise Unexpressed("unexpressed: " + ", ".join(other))
    tp = int(a.get("tensor-model-parallel-size", 1))
    pp = int(a.get("pipeline-model-parallel-size", 1))
    cp = int(a.get("context-parallel-size", 1))
    if gpus % (tp * pp * cp):
        raise Unexpressed(f"TP {tp} x PP {pp} x CP {cp} does not divide {gpus} GPUs")
    dp = gpus // (tp * pp * cp)
    h, layers = int(a["hidden-size"]), int(a["num-layers"])
    if "vocab-size" in a:
        vocab = int(a["vocab-size"])
    elif a.get("tokenizer-type") in TOKENIZERS:
        vocab = TOKENIZERS[a.get("tokenizer-type")]
    else:
        raise Unexpressed(f"tokenizer {a.get('tokenizer-type')}: its vocabulary is not stated")
    multiple = int(a.get("make-vocab-size-divisible-by", 128)) * tp
    swiglu = _flag(a, "swiglu")
    ffn = a.get("ffn-hidden-size")
    if ffn is None:
        ffn = int(4 * h * 2 / 3 / 64) * 64 if swiglu else 4 * h
    model: dict[str, Any] = {
        "arch": "llama" if swiglu else "gpt", "layers": layers, "hidden": h,
        "heads": int(a["num-attention-heads"]), "ffn_hidden": int(ffn),
        "seq_len": int(a["seq-length"]), "vocab": math.ceil(vocab / multiple) * multiple,
        "tie_embeddings": not _flag(a, "untie-embeddings-and-output-weights"),
        "dropout": float(a.get("hidden-dropout", 0.1)) > 0 or float(a.get("attention-dropout", 0.1)) > 0}
    if _flag(a, "group-query-attention"):
        model["kv_heads"] = int(a["num-query-groups"])
    if "kv-channels" in a:
        model["head_dim"] = int(a["kv-channels"])
    precision = "bf16" if _flag(a, "bf16") else "fp16" if _flag(a, "fp16") else "fp32"
    micro = int(a["micro-batch-size"])
    backend = str(a.get("attention-backend", "auto"))
    if backend not in TE_ATTENTION:
        raise Unexpressed(f"attention-backend {backend}")
    impl = a.get("transformer-impl", "transformer_engine")
    if impl not in ("transformer_engine", "local"):
        raise Unexpressed(f"transformer-impl {impl}")
    if impl == "local" and backend == "auto":
        attention = "unfused"
    else:
        attention = TE_ATTENTION[backend]
    training: dict[str, Any] = {"global_batch": int(a.get("global-batch-size", micro * dp)),
                                "micro_batch": micro, "precision": precision,
                                "framework": "megatron", "attention": attention}
    granularity = a.get("recompute-granularity")
    if granularity == "selective":
        training["recompute"] = "selective"
    elif granularity == "full":
        method, n = a.get("recompute-method"), int(a.get("recompute-num-layers", 1))
        if method == "block":
            training.update(recompute="full", recompute_num_layers=n)
        elif method == "uniform" and n == 1:
            training["recompute"] = "full"
        else:
            raise Unexpressed(f"recompute-method {method} with recompute-num-layers {n}")
    parallel: dict[str, Any] = {"tensor": tp, "pipeline": pp, "data": dp, "context": cp,
                                "sequence_parallel": _flag(a, "sequence-parallel"),
                                "zero": 1 if _flag(a, "use-distributed-optimizer") else 0}
    if "num-layers-per-virtual-pipeline-stage" in a:
        virtual = layers // pp // int(a["num-layers-per-virtual-pipeline-stage"])
    else:
        virtual = int(a.get("num-virtual-stages-per-pipeline-rank", 1))
    if virtual > 1:
        parallel.update(schedule="interleaved-1f1b", virtual_stages=virtual)
    comm = str(a.get("cp-comm-type", "p2p"))
    if comm not in CP_COMM:
        raise Unexpressed(f"cp-comm-type {comm}")
    if CP_COMM[comm] != "p2p":
        parallel["cp_comm_type"] = CP_COMM[comm]
    return {"name": name, "model": model, "cluster": {"system": system, "gpus": gpus},
            "training": training, "parallel": parallel}
