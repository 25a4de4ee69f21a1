"""The scenario document (../shared/specs/scenario.md): model, cluster, training and parallel plan.

`load_scenario(path)` reads YAML or JSON and returns a frozen `Scenario`; every problem is a
`PartitaError` naming the file and the key path. `check_plan()` applies the consistency rules
(degrees multiply to the GPU count, batch / layer / head divisibility) once the GPU count is known.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from partita.planner.documents import Checker, load_document
from partita.planner.enums import (ARCHS, ATTENTION, BLOCK_SCALED_ARCHS, CP_COMM_TYPES,
                                   FLASH_KERNELS, FP8_RECIPES, FRAMEWORKS, GRAD_REDUCE, NORM_FORMS,
                                   OPTIMIZER_IMPLS, OPTIMIZERS, PRECISIONS, RECOMPUTE,
                                   REDUCE_DTYPES, ROPE_FORMS, SCHEDULES, UNPAD_FORMS)
from partita.planner.errors import PartitaError
from partita.planner.layout import LayoutError, layout_stages
from partita.planner.modelspec import ModelSpec, TransformerDims, preset_names
from partita.planner.paths import SCENARIOS_DIR

TOP_KEYS = ("name", "model", "cluster", "training", "parallel")
DIM_KEYS = ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab",
            "decoder_layers", "head_dim", "max_positions", "tie_embeddings", "dropout",
            "mlm_predictions", "name")
MODEL_KEYS = DIM_KEYS + ("preset", "hf_config", "module")
CLUSTER_KEYS = ("system", "gpus", "nodes", "inter_node_gbps", "gpus_per_node", "intra_node_gbps")
TRAINING_KEYS = ("global_batch", "micro_batch", "precision", "recompute", "optimizer", "attention",
                 "framework", "launch_blocking", "fused_elementwise", "attention_softmax_fp32",
                 "fused_cross_entropy", "recompute_num_layers", "grad_reduce_dtype", "norm_kernel",
                 "rope_kernel", "recompute_early_stop", "attention_unpad", "optimizer_impl",
                 "fp8_recipe")
PARALLEL_KEYS = ("tensor", "pipeline", "data", "context", "sequence_parallel", "schedule",
                 "virtual_stages", "zero", "overlap_grad_reduce", "stages", "grad_reduce",
                 "overlap_param_gather", "tp_comm_overlap", "data_shard", "layout", "cp_comm_type")

# Upper bounds on sizes, far above any real job, so that a typo (1e30 layers, 10^9 GPUs) is an error
# naming the limit instead of a simulation that allocates per layer or micro-batch without end.
LIMITS = {
    "model.layers": 1024, "model.decoder_layers": 1024, "model.hidden": 1 << 20,
    "model.heads": 1 << 16, "model.kv_heads": 1 << 16, "model.head_dim": 1 << 16,
    "model.ffn_hidden": 1 << 22, "model.seq_len": 1 << 24, "model.vocab": 1 << 24,
    "model.max_positions": 1 << 24, "model.mlm_predictions": 1 << 24,
    "cluster.gpus": 1 << 20, "cluster.nodes": 1 << 17, "cluster.gpus_per_node": 1024,
    "training.global_batch": 1 << 24, "training.micro_batch": 1 << 16,
    "training.recompute_num_layers": 1024,
    "parallel.tensor": 1024, "parallel.pipeline": 4096, "parallel.context": 1024,
    "parallel.data": 1 << 20, "parallel.virtual_stages": 1024,
}
MAX_GBPS = 1e6                        # cluster.*_gbps what-ifs: Gbit/s
MAX_PIPELINE_ACTIONS = 1_000_000      # pipeline * virtual_stages * micro-batches: the schedule's size


def _lim(c: Checker, key: str) -> int:
    return LIMITS[c.key_path(key)]


@dataclass(frozen=True)
class ClusterSpec:
    system: str
    gpus: int | None = None             # exactly one of gpus / nodes
    nodes: int | None = None
    inter_node_gbps: float | None = None   # what-if: network per node, Gbit/s
    intra_node_gbps: float | None = None   # what-if: GPU-to-GPU per GPU, one direction, Gbit/s
    gpus_per_node: int | None = None       # what-if


@dataclass(frozen=True)
class TrainingSpec:
    global_batch: int
    micro_batch: int = 1
    precision: str = "bf16"
    recompute: str = "none"
    optimizer: str = "adam"
    attention: str = "flash"        # flash (fused, scores never stored; the GPU's best generation)
                                    # | flash2 (FlashAttention-2 itself) | flash1 (FlashAttention
                                    # v1, flash-attn 1.x) | unfused (stored scores)
                                    # | eager (stored scores, scale/mask/softmax/dropout unfused)
    framework: str = "megatron"     # megatron (Megatron-LM/-Core, NeMo) | deepspeed | fsdp (torch FSDP)
    launch_blocking: bool = False   # CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the kernel
    fused_elementwise: bool = True  # bias-GeLU and bias-dropout-add as one kernel each (Megatron's
                                    # fusions); false: separate kernels (--no-bias-gelu-fusion
                                    # --no-bias-dropout-fusion, Megatron-LM 2019, eager HF models)
    attention_softmax_fp32: bool = False  # eager attention's scale, mask and softmax in fp32
                                    # (Megatron --attention-softmax-in-fp32; HF eager attention)
    fused_cross_entropy: bool = False  # the loss as one fused kernel each way (flash-attn's
                                    # cross-entropy, apex xentropy); false: the fp32 chain, which
                                    # Megatron-Core's --cross-entropy-loss-fusion also keeps
                                    # (fp32 logits and their softmax, fewer kernels)
    recompute_early_stop: bool | None = None  # full recompute halts once the block's last tensor
                                    # the backward needs is saved again, skipping the ops after
                                    # it (torch.utils.checkpoint use_reentrant=False, PyTorch >= 2.1);
                                    # None: the framework's (data/frameworks.yaml)
    recompute_num_layers: int | None = None  # with recompute full: only the first N blocks of each
                                    # model chunk are recomputed, the others keep their activations
                                    # (Megatron-LM --recompute-method block --recompute-num-layers N);
                                    # None: every block
    grad_reduce_dtype: str = "auto"  # the data-parallel gradient reduction's dtype (its bytes on
                                    # the wire; the buffers held stay the framework's): auto (ZeRO
                                    # 0-2 as Megatron-LM, fp32 for bf16; ZeRO-3 the compute dtype,
                                    # FSDP's default) | fp32 (torchtitan, Composer's DEFAULT) | bf16 | fp16
    norm_kernel: str = "fused"      # RMSNorm as one kernel each way (Apex, Transformer Engine, a
                                    # Triton kernel) | eager: PyTorch ops in fp32 (Hugging Face's
                                    # LlamaRMSNorm, torchtitan's rmsnorm, fms; simulator/eagerops.py)
    rope_kernel: str = "fused"      # RoPE as one kernel | the eager forms: complex (fp32 complex
                                    # multiply: Meta's, torchtitan's) | rotate-half (Hugging Face's,
                                    # partita's executor) | matrix (fp32 2 x 2 rotations: fms)
    attention_unpad: str = "none"   # q, k, v unpadded into a variable-length flash kernel and its
                                    # output padded back (flash-attn's bert_padding): none |
                                    # per-tensor (llm-foundry's flash_attn_fn: the mask's indices
                                    # for each of q, k, v) | per-layer (Hugging Face's
                                    # flash_attention_2 with a mask: once per layer);
                                    # simulator/unpad.py
    optimizer_impl: str = "fused"   # the mixed-precision optimizer's passes: fused (multi-tensor
                                    # kernels, one wait: Megatron-Core, DeepSpeed, torch's fused
                                    # AdamW) | apex-fp16-optimizer (Megatron-LM 2019's
                                    # FP16_Optimizer: per-tensor passes, two host waits per tensor;
                                    # simulator/fp16optimizer.py)
    fp8_recipe: str = "delayed"     # with precision fp8, Transformer Engine's scaling: delayed
                                    # (DelayedScaling, Megatron-LM's --fp8-recipe delayed: amaxes
                                    # from the history, all-reduced per autocast; simulator/fp8amax.py)
                                    # | current (Float8CurrentScaling, --fp8-recipe tensorwise: each
                                    # cast takes its tensor's own amax first; simulator/fp8casts.py)
                                    # | mxfp8 (MXFP8BlockScaling, --fp8-recipe mxfp8: a scale per 32
                                    # elements, both directions quantized; Blackwell only)

    def recomputed_blocks(self, blocks: int) -> int:
        """How many of a chunk's `blocks` transformer blocks run their forward again in backward:
        all of them under full recompute, the first `recompute_num_layers` where that is set,
        none otherwise (selective recompute re-runs part of every block, not whole blocks)."""
        if self.recompute != "full":
            return 0
        n = self.recompute_num_layers
        return blocks if n is None else min(n, blocks)


@dataclass(frozen=True)
class ParallelSpec:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    context: int = 1
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    virtual_stages: int = 1
    zero: int = 0
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True                   # ZeRO-1/2 gather beside the first forward;
                                                        # ZeRO-3 gathers prefetched behind compute
    tp_comm_overlap: bool = False                       # TP collectives hidden behind GEMMs (TE userbuffers)
    grad_reduce: str = "auto"
    stages: tuple[tuple[int, int], ...] | None = None   # block ranges [start, stop) per model chunk
    layout: str | None = None           # the Megatron-Core layout string `stages` came from
    data_shard: int | None = None       # ZeRO shards over groups of this many data-parallel ranks
                                        # and replicates across the groups (FSDP HYBRID_SHARD,
                                        # torchtitan's dp_shard, DeepSpeed MiCS); None: all of them
    cp_comm_type: str = "p2p"           # how context parallelism, where context > 1, moves K and V
                                        # (Megatron-Core --cp-comm-type; `partita plan` applies it to
                                        # the degrees it tries): p2p, a ring passing blocks beside the
                                        # attention (Liu et al. 2023); all_gather, K and V gathered
                                        # before the attention, dK and dV reduce-scattered after it,
                                        # on the critical path (Llama 3, Dubey et al. 2024 Sec. 3.3.2)

    @property
    def shard(self) -> int:
        """Data-parallel ranks one ZeRO shard group spans (`data_shard`, else all `data`)."""
        return self.data if self.data_shard is None else self.data_shard

    @property
    def replicas(self) -> int:
        """Copies of each ZeRO shard: data-parallel ranks / shard group size (1 without
        `data_shard`)."""
        return self.data // self.shard

    @property
    def model_parallel(self) -> int:
        return self.tensor * self.pipeline * self.context

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline * self.context * self.data


@dataclass(frozen=True)
class Scenario:
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    parallel: ParallelSpec | None = None
    name: str = ""
    origin: str = field(default="", compare=False)   # the file it came from, for messages

    def microbatches(self) -> int:
        """Micro-batches per optimizer step per pipeline replica (gradient accumulation implied)."""
        if self.parallel is None:
            raise PartitaError(f"{self.origin or 'scenario'}: no parallel section; run "
                               f"`partita plan {self.origin or 'FILE'} -o planned.yaml` to choose one")
        return self.training.global_batch // (self.training.micro_batch * self.parallel.data)

    def with_parallel(self, parallel: ParallelSpec) -> "Scenario":
        return replace(self, parallel=parallel)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.name:
            out["name"] = self.name
        out["model"] = self.model.to_dict()
        c = self.cluster
        out["cluster"] = {k: v for k, v in (("system", c.system), ("gpus", c.gpus), ("nodes", c.nodes),
                                            ("inter_node_gbps", c.inter_node_gbps),
                                            ("intra_node_gbps", c.intra_node_gbps),
                                            ("gpus_per_node", c.gpus_per_node)) if v is not None}
        t = self.training
        out["training"] = {"global_batch": t.global_batch, "micro_batch": t.micro_batch,
                           "precision": t.precision, "recompute": t.recompute, "optimizer": t.optimizer}
        if t.attention != "flash":
            out["training"]["attention"] = t.attention
        if t.framework != "megatron":
            out["training"]["framework"] = t.framework
        if t.launch_blocking:
            out["training"]["launch_blocking"] = True
        if not t.fused_elementwise:
            out["training"]["fused_elementwise"] = False
        if t.attention_softmax_fp32:
            out["training"]["attention_softmax_fp32"] = True
        if t.fused_cross_entropy:
            out["training"]["fused_cross_entropy"] = True
        if t.recompute_num_layers is not None:
            out["training"]["recompute_num_layers"] = t.recompute_num_layers
        if t.recompute_early_stop is not None:
            out["training"]["recompute_early_stop"] = t.recompute_early_stop
        if t.grad_reduce_dtype != "auto":
            out["training"]["grad_reduce_dtype"] = t.grad_reduce_dtype
        for key in ("norm_kernel", "rope_kernel"):
            if getattr(t, key) != "fused":
                out["training"][key] = getattr(t, key)
        if t.attention_unpad != "none":
            out["training"]["attention_unpad"] = t.attention_unpad
        if t.optimizer_impl != "fused":
            out["training"]["optimizer_impl"] = t.optimizer_impl
        if t.fp8_recipe != "delayed":
            out["training"]["fp8_recipe"] = t.fp8_recipe
        if self.parallel is not None:
            p = self.parallel
            par = {"tensor": p.tensor, "pipeline": p.pipeline, "data": p.data, "context": p.context,
                   "sequence_parallel": p.sequence_parallel, "schedule": p.schedule,
                   "virtual_stages": p.virtual_stages, "zero": p.zero,
                   "overlap_grad_reduce": p.overlap_grad_reduce, "grad_reduce": p.grad_reduce}
            if not p.overlap_param_gather:
                par["overlap_param_gather"] = False
            if p.tp_comm_overlap:
                par["tp_comm_overlap"] = True
            if p.layout is not None:
                par["layout"] = p.layout
            elif p.stages is not None:
                par["stages"] = [list(s) for s in p.stages]
            if p.data_shard is not None:
                par["data_shard"] = p.data_shard
            if p.cp_comm_type != "p2p":
                par["cp_comm_type"] = p.cp_comm_type
            out["parallel"] = par
        return out


def find_scenario_file(name: str | Path) -> Path:
    """A path as given, or the name of a shipped example in data/scenarios (with or without .yaml)."""
    path = Path(name)
    if path.exists() or path.is_symlink():    # a dangling link or a loop: read_text says which
        return path
    for candidate in (SCENARIOS_DIR / f"{name}.yaml", SCENARIOS_DIR / str(name)):
        if candidate.is_file():
            return candidate
    shipped = sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml"))
    from partita.planner.errors import closest
    near = closest(str(name), shipped)
    hint = f"; did you mean the shipped example {near[0]!r}?" if near else ""
    raise PartitaError(f"{name}: no such file{hint} (shipped examples: {', '.join(shipped)})")


def load_scenario(path: str | Path) -> Scenario:
    """Read and structurally validate a scenario file (or a shipped example's name)."""
    path = find_scenario_file(path)
    return parse_scenario(load_document(path), origin=str(path))


def parse_scenario(doc: dict[str, Any], origin: str = "") -> Scenario:
    from partita.planner.sagemaker import translate      # SageMaker's parameter names
    doc, _ = translate(doc, origin)
    top = Checker(doc, "", origin)
    top.only(TOP_KEYS)
    name = top.str("name", "") or ""
    model = _with_origin(origin, lambda: _parse_model(top.sub("model")))
    cluster = _parse_cluster(top.sub("cluster"))
    training = _parse_training(top.sub("training"))
    psec = top.sub("parallel", required=False)
    parallel = _parse_parallel(psec) if psec is not None else None
    scenario = Scenario(model=model, cluster=cluster, training=training, parallel=parallel,
                        name=name, origin=origin)
    if parallel is not None and cluster.gpus is not None:
        check_plan(scenario, cluster.gpus)
    return scenario


def _with_origin(origin: str, parse):
    """`parse()`, its PartitaErrors prefixed with the file when they lack it."""
    try:
        return parse()
    except PartitaError as exc:
        msg = str(exc)
        if origin and not msg.startswith(f"{origin}: "):
            raise PartitaError(f"{origin}: {msg}") from None
        raise


def _parse_model(c: Checker) -> ModelSpec:
    c.only(MODEL_KEYS)
    forms = [k for k in ("preset", "hf_config", "module") if c.has(k)]
    has_dims = c.has("arch")
    if len(forms) + has_dims != 1:
        given = forms + (["arch (transformer dims)"] if has_dims else [])
        raise c.error("expected exactly one of: transformer dims (arch, layers, ...), preset, "
                      f"hf_config, module; got {', '.join(given) if given else 'none'}")
    seq_len = c.int("seq_len", maximum=_lim(c, "seq_len"))
    if forms == ["preset"]:
        c.only(("preset", "seq_len"))
        spec = ModelSpec(preset=c.str("preset"), seq_len=seq_len)
        try:
            spec.resolve()
        except PartitaError as exc:
            raise c.error(str(exc), "preset") from None
        return spec
    if forms == ["hf_config"]:
        c.only(("hf_config", "seq_len"))
        if isinstance(c.mapping["hf_config"], str):      # a hub id or a file name, not its fields
            raise c.error(f"expected the fields of a Hugging Face config.json as a mapping "
                          f"({{model_type: llama, hidden_size: 4096, ...}}), got the string "
                          f"{c.mapping['hf_config']!r}: partita reads no hub or file here; copy "
                          f"the config's fields in, or use model.preset (valid: "
                          f"{', '.join(preset_names())})", "hf_config")
        cfg = c.sub("hf_config")
        spec = ModelSpec(hf_config=dict(cfg.mapping), seq_len=seq_len)
        _check_dim_limits(spec.resolve(), c)
        return spec
    if forms == ["module"]:
        c.only(("module", "seq_len", "vocab"))
        module = c.str("module")
        if ":" not in module:
            raise c.error(f"expected 'package.module:function', got {module!r}", "module")
        return ModelSpec(module=module, origin=c.origin,
                         seq_len=c.int("seq_len", required=True, maximum=_lim(c, "seq_len")),
                         vocab=c.int("vocab", required=True, maximum=_lim(c, "vocab")))
    arch = c.choice("arch", ARCHS)
    def size(key: str, required: bool = False) -> int:
        return c.int(key, None if required else 0, required=required, maximum=_lim(c, key))

    dims = TransformerDims(
        arch=arch, layers=size("layers", True), hidden=size("hidden", True),
        heads=size("heads", True), seq_len=size("seq_len", True),
        vocab=size("vocab", True), kv_heads=size("kv_heads"),
        ffn_hidden=size("ffn_hidden"), head_dim=size("head_dim"),
        decoder_layers=size("decoder_layers"), max_positions=size("max_positions"),
        tie_embeddings=c.bool("tie_embeddings", arch != "llama"),
        dropout=c.bool("dropout", arch != "llama"),
        mlm_predictions=size("mlm_predictions"), name=c.str("name", "") or "")
    return ModelSpec(dims=dims)


def _check_dim_limits(d: TransformerDims, c: Checker) -> None:
    """The size limits for dimensions read from elsewhere (a Hugging Face config)."""
    for key in ("layers", "decoder_layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden",
                "seq_len", "vocab", "max_positions"):
        limit = LIMITS[f"model.{key}"]
        if getattr(d, key) > limit:
            raise c.error(f"{key} = {getattr(d, key):,} is more than partita's limit of {limit:,}",
                          "hf_config")


def _parse_cluster(c: Checker) -> ClusterSpec:
    c.only(CLUSTER_KEYS)
    if c.has("gpus") == c.has("nodes"):
        raise c.error("expected exactly one of gpus or nodes")
    return ClusterSpec(system=c.str("system", required=True),
                       gpus=c.int("gpus", maximum=_lim(c, "gpus")),
                       nodes=c.int("nodes", maximum=_lim(c, "nodes")),
                       inter_node_gbps=c.number("inter_node_gbps", maximum=MAX_GBPS),
                       intra_node_gbps=c.number("intra_node_gbps", maximum=MAX_GBPS),
                       gpus_per_node=c.int("gpus_per_node", maximum=_lim(c, "gpus_per_node")))


def _parse_training(c: Checker) -> TrainingSpec:
    c.only(TRAINING_KEYS)
    return TrainingSpec(global_batch=c.int("global_batch", required=True,
                                           maximum=_lim(c, "global_batch")),
                        micro_batch=c.int("micro_batch", 1, maximum=_lim(c, "micro_batch")),
                        precision=c.choice("precision", PRECISIONS, "bf16"),
                        recompute=c.choice("recompute", RECOMPUTE, "none"),
                        optimizer=c.choice("optimizer", OPTIMIZERS, "adam"),
                        attention=c.choice("attention", ATTENTION, "flash"),
                        framework=c.choice("framework", FRAMEWORKS, "megatron"),
                        launch_blocking=c.bool("launch_blocking", False),
                        fused_elementwise=c.bool("fused_elementwise", True),
                        attention_softmax_fp32=_softmax_fp32(c),
                        fused_cross_entropy=c.bool("fused_cross_entropy", False),
                        recompute_num_layers=_recompute_num_layers(c),
                        recompute_early_stop=c.bool("recompute_early_stop", None),
                        grad_reduce_dtype=c.choice("grad_reduce_dtype", REDUCE_DTYPES, "auto"),
                        norm_kernel=c.choice("norm_kernel", NORM_FORMS, "fused"),
                        rope_kernel=c.choice("rope_kernel", ROPE_FORMS, "fused"),
                        attention_unpad=_attention_unpad(c),
                        optimizer_impl=_optimizer_impl(c),
                        fp8_recipe=_fp8_recipe(c))


def _recompute_num_layers(c: Checker) -> int | None:
    """training.recompute_num_layers: blocks per model chunk recomputed (Megatron-LM's block
    method); only with recompute full, whose default is every block."""
    n = c.int("recompute_num_layers", None, minimum=1, maximum=_lim(c, "recompute_num_layers"))
    recompute = c.mapping.get("recompute", "none")
    if n is not None and recompute != "full":
        raise c.error(f"only with recompute full (recompute is {recompute}: it names how many "
                      f"blocks of each chunk full recompute re-runs), got {n}", "recompute_num_layers")
    return n


def _optimizer_impl(c: Checker) -> str:
    """training.optimizer_impl: apex-fp16-optimizer is FP16_Optimizer around FusedAdam, fp16 only."""
    impl = c.choice("optimizer_impl", OPTIMIZER_IMPLS, "fused")
    if impl == "apex-fp16-optimizer":
        for key, want, got in (("precision", "fp16", c.mapping.get("precision", "bf16")),
                               ("optimizer", "adam", c.mapping.get("optimizer", "adam"))):
            if got != want:
                raise c.error(f"apex-fp16-optimizer wraps apex's FusedAdam in fp16 training "
                              f"(training.{key} {want}), but training.{key} is {got}",
                              "optimizer_impl")
    return impl


def _fp8_recipe(c: Checker) -> str:
    """training.fp8_recipe: a scaling recipe of fp8 training, so only with precision fp8."""
    recipe = c.choice("fp8_recipe", FP8_RECIPES, "delayed")
    precision = c.mapping.get("precision", "bf16")
    if c.mapping.get("fp8_recipe") is not None and precision != "fp8":
        raise c.error(f"a scaling recipe of fp8 training (training.precision fp8), but "
                      f"training.precision is {precision}", "fp8_recipe")
    return recipe


def _attention_unpad(c: Checker) -> str:
    """training.attention_unpad: only around a flash kernel (attention flash, flash2 or flash1),
    the variable-length kernel the unpadded q, k and v go to."""
    form = c.choice("attention_unpad", UNPAD_FORMS, "none")
    attention = c.mapping.get("attention", "flash")
    if form != "none" and attention not in FLASH_KERNELS:
        raise c.error(f"only with attention flash, flash2 or flash1 (attention is {attention}: "
                      f"stored-score attention takes the padded batch), got {form}",
                      "attention_unpad")
    return form


def _softmax_fp32(c: Checker) -> bool:
    """training.attention_softmax_fp32: only where the softmax is a kernel of its own or Megatron's
    fused one (attention eager or unfused); a flash kernel computes it inside."""
    value = c.bool("attention_softmax_fp32", False)
    attention = c.mapping.get("attention", "flash")
    if value and attention not in ("eager", "unfused"):
        raise c.error(f"only with attention eager or unfused (attention is {attention}: the flash "
                      f"kernel computes the softmax inside), got true", "attention_softmax_fp32")
    return value


def _parse_parallel(c: Checker) -> ParallelSpec:
    c.only(PARALLEL_KEYS)
    schedule = c.choice("schedule", SCHEDULES, "1f1b")
    layout, stages = _parse_layout(c)
    virtual = c.int("virtual_stages", 1, maximum=_lim(c, "virtual_stages"))
    if layout is not None:
        chunks = len(stages) // c.int("pipeline", 1, maximum=_lim(c, "pipeline"))
        if c.has("virtual_stages") and virtual != chunks:
            raise c.error(f"the layout has {len(stages)} chunks, {chunks} per pipeline rank; "
                          f"virtual_stages says {virtual}", "virtual_stages")
        virtual = chunks
    if virtual > 1 and schedule != "interleaved-1f1b":
        raise c.error(f"only for schedule interleaved-1f1b (schedule is {schedule}), got {virtual}",
                      "virtual_stages")
    zero = c.int("zero", 0, minimum=0)
    if zero > 3:
        raise c.error(f"expected 0, 1, 2 or 3, got {zero}", "zero")
    return ParallelSpec(
        tensor=c.int("tensor", 1, maximum=_lim(c, "tensor")),
        pipeline=c.int("pipeline", 1, maximum=_lim(c, "pipeline")),
        data=c.int("data", 1, maximum=_lim(c, "data")),
        context=c.int("context", 1, maximum=_lim(c, "context")),
        sequence_parallel=c.bool("sequence_parallel", False),
        schedule=schedule, virtual_stages=virtual, zero=zero,
        overlap_grad_reduce=c.bool("overlap_grad_reduce", True),
        overlap_param_gather=c.bool("overlap_param_gather", True),
        tp_comm_overlap=c.bool("tp_comm_overlap", False),
        grad_reduce=c.choice("grad_reduce", GRAD_REDUCE, "auto"),
        stages=stages, layout=layout, data_shard=_data_shard(c, zero),
        cp_comm_type=c.choice("cp_comm_type", CP_COMM_TYPES, "p2p"))


def _data_shard(c: Checker, zero: int) -> int | None:
    """parallel.data_shard: ZeRO's shard group, a divisor of `data`; only with a ZeRO stage."""
    n = c.int("data_shard", None, maximum=_lim(c, "data"))
    if n is None:
        return None
    if zero < 1:
        raise c.error(f"only with zero 1, 2 or 3 (zero is {zero}: nothing is sharded), got {n}",
                      "data_shard")
    data = c.int("data", None, maximum=_lim(c, "data"))
    if data is not None and data % n:           # without data, `partita plan` keeps to divisors
        raise c.error(f"must divide parallel.data ({data}), got {n}", "data_shard")
    return n


def _parse_layout(c: Checker) -> tuple[str | None, tuple[tuple[int, int], ...] | None]:
    """(parallel.layout, the block ranges it gives), or (None, parallel.stages): one of the two."""
    if not c.has("layout"):
        return None, _parse_stages(c)
    if c.has("stages"):
        raise c.error("give parallel.layout or parallel.stages, not both", "layout")
    text = c.mapping["layout"]
    if not isinstance(text, str) or not text.strip():
        raise c.error(f"expected a Megatron-Core layout string such as \"E|t*4|t*4|t*4L\", "
                      f"got {text!r}", "layout")
    if not c.has("pipeline"):
        raise c.error("needs parallel.pipeline (the layout's chunks are spread over its ranks)",
                      "layout")
    try:
        return text, layout_stages(text, c.int("pipeline", 1, maximum=_lim(c, "pipeline")))
    except LayoutError as exc:
        raise c.error(str(exc), "layout") from None


def _parse_stages(c: Checker) -> tuple[tuple[int, int], ...] | None:
    if not c.has("stages"):
        return None
    raw = c.mapping["stages"]
    if not isinstance(raw, list) or not raw:
        raise c.error("expected a list of [start, stop) layer ranges", "stages")
    out = []
    for i, item in enumerate(raw):
        ok = (isinstance(item, (list, tuple)) and len(item) == 2
              and all(isinstance(x, int) and not isinstance(x, bool) for x in item)
              and item[1] <= 2 * LIMITS["model.layers"])
        if not ok or not 0 <= item[0] <= item[1]:
            raise c.error(f"entry {i}: expected [start, stop) with 0 <= start <= stop (a chunk "
                          f"may hold no block), got {item!r}",
                          "stages")
        out.append((int(item[0]), int(item[1])))
    return tuple(out)


# The archs whose blocks have the layer each eager form replaces: RMSNorm (Llama; T5's LayerNorm
# is an RMSNorm) and rotary embeddings (Llama).
EAGER_ARCHS = {"norm_kernel": ("llama", "t5"), "rope_kernel": ("llama",)}


def fp8_recipe_problem(training: TrainingSpec, gpu) -> str | None:
    """Why `gpu` cannot run training.fp8_recipe, or None: MXFP8's block-scaled GEMMs need tensor
    cores that apply an E8M0 scale per 32 elements, which Blackwell's have and Hopper's lack
    (Transformer Engine v2.8 transformer_engine/pytorch/fp8.py `check_mxfp8_support`: "Device compute
    capability 10.0 or higher required for MXFP8 execution"); a catalog GPU says its generation in
    `arch`."""
    if training.precision != "fp8" or training.fp8_recipe != "mxfp8":
        return None
    arch = gpu.extra.get("arch")
    if arch in BLOCK_SCALED_ARCHS:
        return None
    return (f"training.fp8_recipe: mxfp8 needs a GPU whose tensor cores run block-scaled fp8 "
            f"(catalog arch {' or '.join(BLOCK_SCALED_ARCHS)}, e.g. b200), but {gpu.name} is "
            + (f"of arch {arch!r}" if arch else "without an arch in the catalog (its entry's "
               "`arch: blackwell` says it is one)") + "; use fp8_recipe delayed or current")


def check_kernel_forms(training: TrainingSpec, dims: TransformerDims | None,
                       where: str = "") -> None:
    """training.norm_kernel / rope_kernel: an eager form only where the model has that layer
    (GPT's and BERT's LayerNorm is torch's one native kernel even in eager PyTorch; they have no
    RoPE), and not for a profiled module, whose kernels its profile times; nor
    training.attention_unpad, nor a per-tensor training.optimizer_impl."""
    for key, archs in EAGER_ARCHS.items():
        form = getattr(training, key)
        if form == "fused":
            continue
        arch = "a model.module" if dims is None else f"arch {dims.arch}"
        if dims is None or dims.arch not in archs:
            raise PartitaError(f"{where}training.{key}: {form} is for arch {' or '.join(archs)} "
                               f"(the {'RMSNorm' if key == 'norm_kernel' else 'rotary embedding'} "
                               f"it replaces), not {arch}; remove the key or set it to fused")
    if training.optimizer_impl != "fused" and dims is None:
        raise PartitaError(f"{where}training.optimizer_impl: {training.optimizer_impl} goes "
                           f"through the model's parameter tensors one by one, which a "
                           f"model.module's profile does not list; remove the key")
    if training.attention_unpad != "none" and dims is None:
        raise PartitaError(f"{where}training.attention_unpad: {training.attention_unpad} is for "
                           f"a model given by its "
                           f"dimensions, not a model.module, whose profile times its own kernels; "
                           f"remove the key")


def check_plan(s: Scenario, gpus: int, dims: TransformerDims | None = None) -> None:
    """The consistency rules of the contract, for a scenario whose GPU count is known."""
    p, t = s.parallel, s.training
    if p is None:
        return
    where = f"{s.origin}: " if s.origin else ""

    def fail(msg: str) -> PartitaError:
        return PartitaError(where + msg)

    if p.gpus != gpus:
        model = p.tensor * p.pipeline * p.context
        hint = (f"; for data parallelism over the rest set parallel.data: {gpus // model}"
                if gpus % model == 0 else "")
        raise fail(f"parallel: tensor*pipeline*context*data = {p.tensor}*{p.pipeline}*{p.context}*"
                   f"{p.data} = {p.gpus}, but cluster has {gpus} GPUs{hint}")
    if p.data % p.shard:
        raise fail(f"parallel.data_shard ({p.data_shard}) must divide parallel.data ({p.data})")
    if t.global_batch % (t.micro_batch * p.data):
        raise fail(f"training.global_batch ({t.global_batch}) must be divisible by "
                   f"micro_batch*data ({t.micro_batch}*{p.data} = {t.micro_batch * p.data})")
    m = t.global_batch // (t.micro_batch * p.data)
    actions = p.pipeline * p.virtual_stages * m
    if actions > MAX_PIPELINE_ACTIONS:
        raise fail(f"parallel: pipeline*virtual_stages*micro-batches = {p.pipeline}*{p.virtual_stages}"
                   f"*{m} = {actions:,} pipeline steps, more than partita's limit of "
                   f"{MAX_PIPELINE_ACTIONS:,}; use a larger training.micro_batch")
    if p.schedule == "interleaved-1f1b" and p.pipeline > 1 and m % p.pipeline:
        raise fail(f"parallel.schedule interleaved-1f1b needs micro-batches per replica ({m}) "
                   f"to be a multiple of pipeline ({p.pipeline})")
    if t.optimizer_impl == "apex-fp16-optimizer" and p.zero:
        raise fail(f"training.optimizer_impl apex-fp16-optimizer keeps every fp32 master weight "
                   f"and Adam state on each rank (ZeRO 0), but parallel.zero is {p.zero}; use "
                   f"optimizer_impl fused")
    dims = dims if dims is not None else _dims_or_none(s)
    if dims is not None:
        check_dims(dims, p, fail)


def _dims_or_none(s: Scenario) -> TransformerDims | None:
    if s.model.kind in ("dims", "preset"):
        return s.model.resolve()
    return None


def tensor_ok(d: TransformerDims, t: int) -> bool:
    """Whether tensor parallelism of degree `t` splits the model: the attention heads and the FFN
    width divide by it, and the k/v heads divide it or it them (Megatron-LM's GQA split)."""
    return (d.heads % t == 0 and d.ffn_hidden % t == 0
            and (d.kv_heads % t == 0 or t % d.kv_heads == 0))


def tensor_degrees(d: TransformerDims) -> list[int]:
    """Every tensor-parallel degree that splits the model (`tensor_ok`)."""
    return [t for t in range(1, d.heads + 1) if tensor_ok(d, t)]


def check_dims(d: TransformerDims, p: ParallelSpec, fail) -> None:
    """The parallel degrees against the model's layers, heads, FFN width and sequence; `fail(msg)`
    makes the error (the caller's prefix: file and section)."""
    chunks = p.pipeline * p.virtual_stages
    if p.layout is not None and p.stages[-1][1] != d.total_layers:
        raise fail(f"parallel.layout has {p.stages[-1][1]} transformer blocks (t), but the model has "
                   f"{d.total_layers} layers")
    if p.stages is not None:
        check_stages(p.stages, chunks, d.total_layers, fail)
    elif d.total_layers < chunks:
        raise fail(f"parallel: pipeline*virtual_stages ({p.pipeline}*{p.virtual_stages} = {chunks}) "
                   f"exceeds the model's {d.total_layers} layers; an even split needs a layer per "
                   "chunk (use a smaller parallel.pipeline, or name the chunks with parallel.stages "
                   "or parallel.layout)")
    # uneven counts are fine: without parallel.stages, planner.stages.with_default_stages splits
    # them by the planner's balanced split
    valid = f"; valid parallel.tensor: {', '.join(map(str, tensor_degrees(d)))}"
    if d.heads % p.tensor:
        raise fail(f"model.heads ({d.heads}) must be divisible by parallel.tensor ({p.tensor})"
                   + valid)
    if d.kv_heads % p.tensor and p.tensor % d.kv_heads:
        raise fail(f"model.kv_heads ({d.kv_heads}) and parallel.tensor ({p.tensor}): one must "
                   "divide the other" + valid)
    if d.ffn_hidden % p.tensor:
        raise fail(f"model.ffn_hidden ({d.ffn_hidden}) must be divisible by parallel.tensor "
                   f"({p.tensor})" + valid)
    if d.seq_len % p.context:
        raise fail(f"model.seq_len ({d.seq_len}) must be divisible by parallel.context ({p.context})")
    if p.sequence_parallel and (d.seq_len // p.context) % p.tensor:
        raise fail(f"sequence_parallel: seq_len/context ({d.seq_len // p.context}) must be "
                   f"divisible by parallel.tensor ({p.tensor})")


def check_stages(stages, chunks: int, layers: int, fail) -> None:
    if len(stages) != chunks:
        raise fail(f"parallel.stages has {len(stages)} ranges, expected pipeline*virtual_stages = {chunks}")
    expect = 0
    for i, (a, b) in enumerate(stages):
        if a != expect:
            raise fail(f"parallel.stages[{i}] starts at layer {a}, expected {expect} "
                       "(ranges must be contiguous and cover every layer)")
        expect = b
    if expect != layers:
        raise fail(f"parallel.stages ends at layer {expect}, but the model has {layers} layers")
