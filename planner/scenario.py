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
from partita.planner.errors import PartitaError
from partita.planner.modelspec import ARCHS, ModelSpec, TransformerDims
from partita.planner.paths import SCENARIOS_DIR

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
RECOMPUTE = ("none", "selective", "full")
OPTIMIZERS = ("adam", "sgd")
GRAD_REDUCE = ("auto", "ring", "tree", "hierarchical", "parameter-server")

TOP_KEYS = ("name", "model", "cluster", "training", "parallel")
DIM_KEYS = ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab",
            "decoder_layers", "head_dim", "max_positions", "tie_embeddings", "name")
MODEL_KEYS = DIM_KEYS + ("preset", "hf_config", "module")
CLUSTER_KEYS = ("system", "gpus", "nodes", "inter_node_gbps", "gpus_per_node", "intra_node_gbps")
TRAINING_KEYS = ("global_batch", "micro_batch", "precision", "recompute", "optimizer", "attention",
                 "framework", "launch_blocking")
ATTENTION = ("flash", "unfused", "eager")
FRAMEWORKS = ("megatron", "deepspeed", "fsdp")
PARALLEL_KEYS = ("tensor", "pipeline", "data", "context", "sequence_parallel", "schedule",
                 "virtual_stages", "zero", "overlap_grad_reduce", "stages", "grad_reduce",
                 "overlap_param_gather", "tp_comm_overlap")


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
    attention: str = "flash"        # flash (fused, scores never stored) | unfused (stored scores)
                                    # | eager (stored scores, scale/mask/softmax/dropout unfused)
    framework: str = "megatron"     # megatron (Megatron-LM/-Core, NeMo) | deepspeed | fsdp (torch FSDP)
    launch_blocking: bool = False   # CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the kernel


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
    overlap_param_gather: bool = True                   # ZeRO-1/2 gather behind the next forward;
                                                        # ZeRO-3 gathers prefetched behind compute
    tp_comm_overlap: bool = False                       # TP collectives hidden behind GEMMs (TE userbuffers)
    grad_reduce: str = "auto"
    stages: tuple[tuple[int, int], ...] | None = None   # block ranges [start, stop) per model chunk

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
            raise PartitaError(f"{self.origin or 'scenario'}: no parallel section; "
                               "run `partita plan` to choose one")
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
            if p.stages is not None:
                par["stages"] = [list(s) for s in p.stages]
            out["parallel"] = par
        return out


def find_scenario_file(name: str | Path) -> Path:
    """A path as given, or the name of a shipped example in data/scenarios (with or without .yaml)."""
    path = Path(name)
    if path.exists():
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
    top = Checker(doc, "", origin)
    top.only(TOP_KEYS)
    name = top.str("name", "") or ""
    model = _parse_model(top.sub("model"))
    cluster = _parse_cluster(top.sub("cluster"))
    training = _parse_training(top.sub("training"))
    psec = top.sub("parallel", required=False)
    parallel = _parse_parallel(psec) if psec is not None else None
    scenario = Scenario(model=model, cluster=cluster, training=training, parallel=parallel,
                        name=name, origin=origin)
    if parallel is not None and cluster.gpus is not None:
        check_plan(scenario, cluster.gpus)
    return scenario


def _parse_model(c: Checker) -> ModelSpec:
    c.only(MODEL_KEYS)
    forms = [k for k in ("preset", "hf_config", "module") if c.has(k)]
    has_dims = c.has("arch")
    if len(forms) + has_dims != 1:
        given = forms + (["arch (transformer dims)"] if has_dims else [])
        raise c.error("expected exactly one of: transformer dims (arch, layers, ...), preset, "
                      f"hf_config, module; got {', '.join(given) if given else 'none'}")
    seq_len = c.int("seq_len")
    if forms == ["preset"]:
        c.only(("preset", "seq_len"))
        return ModelSpec(preset=c.str("preset"), seq_len=seq_len)
    if forms == ["hf_config"]:
        c.only(("hf_config", "seq_len"))
        cfg = c.sub("hf_config")
        return ModelSpec(hf_config=dict(cfg.mapping), seq_len=seq_len)
    if forms == ["module"]:
        c.only(("module", "seq_len", "vocab"))
        module = c.str("module")
        if ":" not in module:
            raise c.error(f"expected 'package.module:function', got {module!r}", "module")
        return ModelSpec(module=module, seq_len=c.int("seq_len", required=True),
                         vocab=c.int("vocab", required=True))
    arch = c.choice("arch", ARCHS)
    dims = TransformerDims(
        arch=arch, layers=c.int("layers", required=True), hidden=c.int("hidden", required=True),
        heads=c.int("heads", required=True), seq_len=c.int("seq_len", required=True),
        vocab=c.int("vocab", required=True), kv_heads=c.int("kv_heads", 0),
        ffn_hidden=c.int("ffn_hidden", 0), head_dim=c.int("head_dim", 0),
        decoder_layers=c.int("decoder_layers", 0), max_positions=c.int("max_positions", 0),
        tie_embeddings=c.bool("tie_embeddings", arch != "llama"), name=c.str("name", "") or "")
    return ModelSpec(dims=dims)


def _parse_cluster(c: Checker) -> ClusterSpec:
    c.only(CLUSTER_KEYS)
    if c.has("gpus") == c.has("nodes"):
        raise c.error("expected exactly one of gpus or nodes")
    return ClusterSpec(system=c.str("system", required=True), gpus=c.int("gpus"),
                       nodes=c.int("nodes"), inter_node_gbps=c.number("inter_node_gbps"),
                       intra_node_gbps=c.number("intra_node_gbps"),
                       gpus_per_node=c.int("gpus_per_node"))


def _parse_training(c: Checker) -> TrainingSpec:
    c.only(TRAINING_KEYS)
    return TrainingSpec(global_batch=c.int("global_batch", required=True),
                        micro_batch=c.int("micro_batch", 1),
                        precision=c.choice("precision", PRECISIONS, "bf16"),
                        recompute=c.choice("recompute", RECOMPUTE, "none"),
                        optimizer=c.choice("optimizer", OPTIMIZERS, "adam"),
                        attention=c.choice("attention", ATTENTION, "flash"),
                        framework=c.choice("framework", FRAMEWORKS, "megatron"),
                        launch_blocking=c.bool("launch_blocking", False))


def _parse_parallel(c: Checker) -> ParallelSpec:
    c.only(PARALLEL_KEYS)
    schedule = c.choice("schedule", SCHEDULES, "1f1b")
    virtual = c.int("virtual_stages", 1)
    if virtual > 1 and schedule != "interleaved-1f1b":
        raise c.error(f"only for schedule interleaved-1f1b (schedule is {schedule}), got {virtual}",
                      "virtual_stages")
    zero = c.int("zero", 0, minimum=0)
    if zero > 3:
        raise c.error(f"expected 0, 1, 2 or 3, got {zero}", "zero")
    return ParallelSpec(
        tensor=c.int("tensor", 1), pipeline=c.int("pipeline", 1), data=c.int("data", 1),
        context=c.int("context", 1), sequence_parallel=c.bool("sequence_parallel", False),
        schedule=schedule, virtual_stages=virtual, zero=zero,
        overlap_grad_reduce=c.bool("overlap_grad_reduce", True),
        overlap_param_gather=c.bool("overlap_param_gather", True),
        tp_comm_overlap=c.bool("tp_comm_overlap", False),
        grad_reduce=c.choice("grad_reduce", GRAD_REDUCE, "auto"),
        stages=_parse_stages(c))


def _parse_stages(c: Checker) -> tuple[tuple[int, int], ...] | None:
    if not c.has("stages"):
        return None
    raw = c.mapping["stages"]
    if not isinstance(raw, list) or not raw:
        raise c.error("expected a list of [start, stop) layer ranges", "stages")
    out = []
    for i, item in enumerate(raw):
        ok = (isinstance(item, (list, tuple)) and len(item) == 2
              and all(isinstance(x, int) and not isinstance(x, bool) for x in item))
        if not ok or not 0 <= item[0] < item[1]:
            raise c.error(f"entry {i}: expected [start, stop) with 0 <= start < stop, got {item!r}",
                          "stages")
        out.append((int(item[0]), int(item[1])))
    return tuple(out)


def check_plan(s: Scenario, gpus: int, dims: TransformerDims | None = None) -> None:
    """The consistency rules of the contract, for a scenario whose GPU count is known."""
    p, t = s.parallel, s.training
    if p is None:
        return
    where = f"{s.origin}: " if s.origin else ""

    def fail(msg: str) -> PartitaError:
        return PartitaError(where + msg)

    if p.gpus != gpus:
        raise fail(f"parallel: tensor*pipeline*context*data = {p.tensor}*{p.pipeline}*{p.context}*"
                   f"{p.data} = {p.gpus}, but cluster has {gpus} GPUs")
    if t.global_batch % (t.micro_batch * p.data):
        raise fail(f"training.global_batch ({t.global_batch}) must be divisible by "
                   f"micro_batch*data ({t.micro_batch}*{p.data} = {t.micro_batch * p.data})")
    m = t.global_batch // (t.micro_batch * p.data)
    if p.schedule == "interleaved-1f1b" and p.pipeline > 1 and m % p.pipeline:
        raise fail(f"parallel.schedule interleaved-1f1b needs micro-batches per replica ({m}) "
                   f"to be a multiple of pipeline ({p.pipeline})")
    dims = dims if dims is not None else _dims_or_none(s)
    if dims is not None:
        _check_dims(dims, p, fail)


def _dims_or_none(s: Scenario) -> TransformerDims | None:
    if s.model.kind in ("dims", "preset"):
        return s.model.resolve()
    return None


def _check_dims(d: TransformerDims, p: ParallelSpec, fail) -> None:
    chunks = p.pipeline * p.virtual_stages
    if p.stages is not None:
        check_stages(p.stages, chunks, d.total_layers, fail)
    elif d.total_layers % chunks and p.pipeline > 1:
        raise fail(f"model has {d.total_layers} layers, not divisible by pipeline*virtual_stages "
                   f"({p.pipeline}*{p.virtual_stages} = {chunks}); give parallel.stages explicitly")
    if d.total_layers < chunks:
        raise fail(f"pipeline*virtual_stages ({chunks}) exceeds the model's {d.total_layers} layers")
    if d.heads % p.tensor:
        raise fail(f"model.heads ({d.heads}) must be divisible by parallel.tensor ({p.tensor})")
    if d.kv_heads % p.tensor and p.tensor % d.kv_heads:
        raise fail(f"model.kv_heads ({d.kv_heads}) and parallel.tensor ({p.tensor}): one must "
                   "divide the other")
    if d.ffn_hidden % p.tensor:
        raise fail(f"model.ffn_hidden ({d.ffn_hidden}) must be divisible by parallel.tensor ({p.tensor})")
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
