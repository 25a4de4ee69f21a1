"""What a plan search keeps fixed and what it searches, read from a partial scenario.

`read_spec(scenario, catalog=..., systems=..., max_gpus=..., nodes=...)` takes a scenario path, a
document or a `Scenario`; keys the document gives under `parallel`, `training.micro_batch`,
`training.recompute` and `cluster` are fixed, the rest is searched. Contradictions between the
document and the search options (a system outside --systems, more GPUs than --max-gpus, fixed
degrees that cannot multiply to the GPU count, more stages than layers, a fixed tensor or context
degree that does not split the model, a fixed micro-batch that does not divide the batch) are a
`PartitaError` naming the key and what would be valid, before anything is searched.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from partita.planner.candidates import (SEARCHED_RECOMPUTE, SEARCHED_RECOMPUTE_FSDP, ZERO_ORDER,
                                        Layout, gpu_counts)
from partita.planner.documents import load_document
from partita.planner.enums import EXECUTED_PRECISIONS
from partita.planner.errors import PartitaError
from partita.planner.modelspec import TransformerDims
from partita.planner.sagemaker import translate
from partita.planner.scenario import (PARALLEL_KEYS, ParallelSpec, Scenario, check_dims,
                                      check_kernel_forms, find_scenario_file, parse_scenario)

VIRTUAL_CHOICES = (2, 3, 4, 6, 8)


@dataclass(frozen=True, kw_only=True)
class PlanSpec:
    scenario: Scenario                 # model, training and name; cluster/parallel are replaced
    dims: TransformerDims
    origin: str
    systems: tuple[str, ...]
    fixed: dict = field(hash=False)    # parallel keys the document gives (partita names)
    fixed_gpus: int | None = None
    fixed_nodes: int | None = None
    max_gpus: int | None = None
    fixed_micro_batch: bool = False
    fixed_recompute: bool = False
    microbatches: int | None = None    # SageMaker `microbatches`: per step per replica
    executable: bool = False           # only plans `partita run` executes
    optimize: str = "speed"

    @property
    def seq_len(self) -> int:
        return self.dims.seq_len

    def counts(self, system) -> list[int]:
        gpn = system.gpus_per_node
        if self.fixed_gpus is not None:
            return [self.fixed_gpus]
        if self.fixed_nodes is not None:
            return [self.fixed_nodes * gpn]
        counts = gpu_counts(gpn, self.max_gpus)
        if "pipeline" in self.fixed or "tensor" in self.fixed or "data" in self.fixed:
            need = 1
            for k in ("tensor", "pipeline", "context", "data"):
                need *= self.fixed.get(k, 1)
            counts = [g for g in counts if g % need == 0]
        return counts

    def micro_batches(self) -> tuple[int, ...] | None:
        """The fixed micro-batch, or None: every divisor of the per-replica batch up to 16."""
        return (self.scenario.training.micro_batch,) if self.fixed_micro_batch else None

    def recomputes(self) -> tuple[str, ...]:
        if self.fixed_recompute:
            return (self.scenario.training.recompute,)
        fsdp = self.scenario.training.framework == "fsdp"
        return SEARCHED_RECOMPUTE_FSDP if fsdp else SEARCHED_RECOMPUTE

    def zeros(self) -> tuple[int, ...]:
        return (self.fixed["zero"],) if "zero" in self.fixed else ZERO_ORDER

    def admits(self, lay: Layout) -> bool:
        shard = self.fixed.get("data_shard")
        if shard is not None and lay.data % shard:
            return False                     # a given ZeRO shard group must divide the replicas
        if self.executable:
            m = self.scenario.training.global_batch // (lay.micro_batch * lay.data)
            if self.dims.kv_heads % lay.tensor or m < lay.pipeline:
                return False                 # the executor shards k/v heads; 1F1B needs m >= p
            if self.dims.seq_len % (2 * lay.context):
                return False                 # each context rank holds two equal chunks
        if self.microbatches is None:
            return True
        return self.scenario.training.global_batch == self.microbatches * lay.micro_batch * lay.data

    def default_schedule(self, pipeline: int) -> str:
        s = self.fixed.get("schedule", "1f1b")
        return "1f1b" if s == "interleaved-1f1b" and "virtual_stages" not in self.fixed else s

    def schedules(self, lay: Layout, microbatches: int) -> list[tuple[str, int]]:
        """(schedule, virtual stages) to try for a layout."""
        if lay.pipeline == 1:
            return [(self.fixed.get("schedule", "1f1b"), 1)]
        names = ([self.fixed["schedule"]] if "schedule" in self.fixed
                 else ["gpipe", "1f1b", "zero-bubble", "interleaved-1f1b"])
        out = []
        for name in names:
            if name != "interleaved-1f1b":
                out.append((name, 1))
                continue
            vs = [self.fixed["virtual_stages"]] if "virtual_stages" in self.fixed else VIRTUAL_CHOICES
            for v in vs:
                if lay.pipeline * v <= self.dims.total_layers and microbatches % lay.pipeline == 0:
                    out.append((name, v))
        return out

    def reductions(self, lay: Layout, catalog) -> list[str]:
        """Data-parallel gradient reductions to try (a sharded optimizer always reduce-scatters)."""
        if "grad_reduce" in self.fixed:
            return [self.fixed["grad_reduce"]]
        if lay.data * lay.context == 1 or lay.zero >= 1:
            return ["auto"]
        out = ["auto", "ring"]
        if lay.nodes > 1:
            out.append("hierarchical")
            if catalog.system(lay.system).inter.kind == "efa":
                out.append("parameter-server")
        return out

    def no_layout_hint(self) -> str:
        gb = self.scenario.training.global_batch
        datas = [d for d in range(1, gb + 1) if gb % d == 0][:12]
        return (f"training.global_batch ({gb}) allows data degrees {', '.join(map(str, datas))}"
                f"{', ...' if len(datas) == 12 else ''}; the model has {self.dims.total_layers} "
                f"layers and {self.dims.heads} heads; allow more GPUs (--max-gpus, --nodes), "
                "a GPU with more memory (--systems) or fewer fixed fields")


def _document(scenario, origin: str | None = None) -> tuple[dict[str, Any], str]:
    if isinstance(scenario, Scenario):
        return scenario.to_dict(), scenario.origin or origin or "scenario"
    if isinstance(scenario, dict):
        return copy.deepcopy(scenario), origin or "scenario"
    path = find_scenario_file(scenario)
    return load_document(path), str(path)


def read_spec(scenario, *, catalog, systems=None, max_gpus=None, nodes=None,
              executable: bool = False, origin: str | None = None) -> PlanSpec:
    """`executable`: only plans `partita run` executes (no context or sequence parallelism for
    T5, context dividing seq_len / 2, tensor dividing the k/v heads, fp32/tf32/fp16/bf16); a
    fixed field that contradicts it is an error naming the key. `origin`: the name errors give a
    document passed as a mapping (a file read elsewhere)."""
    doc, origin = _document(scenario, origin)
    doc, kept = translate(doc, origin, searching=True)
    cluster, raw_par, raw_train = _sections(doc, origin)
    where = f"{origin}: "
    systems = _systems(cluster, systems, catalog, where)
    fixed_gpus, fixed_nodes = _gpu_count(cluster, catalog=catalog, systems=systems,
                                         max_gpus=max_gpus, nodes=nodes, where=where)
    base, dims = _base_scenario(doc, cluster, raw_par, systems=systems, origin=origin)
    fixed = {k: getattr(base.parallel, k) for k in raw_par} if raw_par else {}
    if "layout" in fixed:               # a layout fixes the chunks it names: stages and their count
        del fixed["layout"]
        fixed.update(stages=base.parallel.stages, virtual_stages=base.parallel.virtual_stages)
    if kept.get("ddp") is False:
        fixed["data"] = 1
    if executable:
        _fix_executable(fixed, base, dims, where)
    _check_fixed(fixed, dims, base.training.global_batch, fixed_gpus, where,
                 base.training.micro_batch if "micro_batch" in raw_train else None)
    check_kernel_forms(base.training, dims, where)
    scenario = base.with_parallel(None)
    return PlanSpec(scenario=scenario, dims=dims, origin=origin, systems=systems, fixed=fixed,
                    fixed_gpus=fixed_gpus, fixed_nodes=fixed_nodes, max_gpus=max_gpus,
                    fixed_micro_batch="micro_batch" in raw_train,
                    fixed_recompute="recompute" in raw_train,
                    microbatches=kept.get("microbatches"),
                    optimize=kept.get("optimize", "speed"), executable=executable)


def _sections(doc, origin: str) -> tuple[dict, dict, dict]:
    """The document's cluster, parallel and training mappings (empty where absent)."""
    if not isinstance(doc, dict):
        raise PartitaError(f"{origin}: expected a mapping at the top level")
    where = f"{origin}: "
    if not isinstance(doc.get("cluster") or {}, dict):
        raise PartitaError(f"{where}cluster: expected a mapping, got "
                           f"{type(doc['cluster']).__name__}")
    cluster = dict(doc.get("cluster") or {})
    raw_par = doc.get("parallel") or {}
    if not isinstance(raw_par, dict):
        raise PartitaError(f"{where}parallel: expected a mapping of {', '.join(PARALLEL_KEYS)}")
    raw_train = doc.get("training") if isinstance(doc.get("training"), dict) else {}
    return cluster, raw_par, raw_train


def _systems(cluster: dict, systems, catalog, where: str) -> tuple[str, ...]:
    """The systems to search: the document's, or --systems (which must then include the
    document's)."""
    if systems:
        systems = tuple(systems)
        for name in systems:
            try:
                catalog.system(name)
            except PartitaError as exc:                   # unknown, with suggestions
                raise PartitaError(f"--systems: {exc}") from None
        if "system" in cluster and cluster["system"] not in systems:
            raise PartitaError(f"{where}cluster.system ({cluster['system']}) is fixed by the "
                               f"scenario but --systems is {', '.join(systems)}; drop one of them "
                               "or include it")
        return systems
    if "system" in cluster:
        systems = (str(cluster["system"]),)
        catalog.system(systems[0])
        return systems
    raise PartitaError(f"{where}cluster.system: missing; give it or --systems a,b "
                       "(see `partita catalog list`)")


def _gpu_count(cluster: dict, *, catalog, systems, max_gpus, nodes,
               where: str) -> tuple[int | None, int | None]:
    """(fixed GPUs, fixed nodes): the document's gpus / nodes or --nodes; both None where the
    count is searched up to --max-gpus."""
    fixed_gpus, fixed_nodes = cluster.get("gpus"), cluster.get("nodes")
    for key, value in (("cluster.gpus", fixed_gpus), ("cluster.nodes", fixed_nodes),
                       ("--max-gpus", max_gpus), ("--nodes", nodes)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise PartitaError(f"{where}{key}: expected a positive integer, got {value!r}")
    if nodes is not None:
        if fixed_nodes is not None and fixed_nodes != nodes:
            raise PartitaError(f"{where}cluster.nodes ({fixed_nodes}) contradicts --nodes {nodes}")
        if fixed_gpus is not None:
            raise PartitaError(f"{where}cluster.gpus ({fixed_gpus}) is fixed; --nodes {nodes} "
                               "contradicts it (give one of them)")
        fixed_nodes = nodes
    if fixed_gpus is not None and max_gpus is not None and fixed_gpus > max_gpus:
        raise PartitaError(f"{where}cluster.gpus ({fixed_gpus}) exceeds --max-gpus {max_gpus}")
    if fixed_nodes is not None and max_gpus is not None:
        worst = max(catalog.system(s).gpus_per_node for s in systems) * fixed_nodes
        if worst > max_gpus:
            raise PartitaError(f"{where}cluster.nodes ({fixed_nodes}) gives {worst} GPUs, more "
                               f"than --max-gpus {max_gpus}")
    if fixed_gpus is None and fixed_nodes is None and max_gpus is None:
        raise PartitaError(f"{where}cluster.gpus: missing; give cluster.gpus or nodes, --nodes N "
                           "or --max-gpus N")
    return fixed_gpus, fixed_nodes


def _base_scenario(doc: dict, cluster: dict, raw_par: dict, *, systems,
                   origin: str) -> tuple[Scenario, TransformerDims]:
    """Model, training and name, parsed as a whole document with a placeholder cluster, and the
    model's transformer dimensions."""
    body = {k: v for k, v in doc.items() if k not in ("cluster", "parallel")}
    body["cluster"] = {k: v for k, v in cluster.items() if k not in ("gpus", "nodes", "system")}
    body["cluster"].update(system=systems[0], nodes=1)
    if raw_par:
        body["parallel"] = raw_par
    base = parse_scenario(body, origin=origin)
    dims = base.model.resolve()
    if dims is None:
        raise PartitaError(f"{origin}: model.module: partita plan searches transformer models "
                           "(dims, preset or hf_config); give parallel by hand for a module")
    return base, dims


def _fix_executable(fixed: dict, base: Scenario, dims: TransformerDims, where: str) -> None:
    """Fix what `partita run` needs in `fixed`, or name the fixed field that contradicts it."""
    # the executor runs sequence and context parallelism, except for T5, whose chained
    # encoder and decoder halves it does not shard by sequence
    refused = (("context", 1), ("sequence_parallel", False)) if dims.arch == "t5" else ()
    for key, value in refused:
        if fixed.get(key, value) != value:
            raise PartitaError(f"{where}parallel.{key} ({fixed[key]}) contradicts --executable: "
                               f"partita run executes only {key} {value}")
        fixed[key] = value
    if base.training.precision not in EXECUTED_PRECISIONS:
        raise PartitaError(f"{where}training.precision {base.training.precision} contradicts "
                           f"--executable: partita run executes {', '.join(EXECUTED_PRECISIONS)}")


def _check_fixed(fixed: dict, dims: TransformerDims, gb: int, fixed_gpus: int | None,
                 where: str, micro_batch: int | None = None) -> None:
    """The fixed degrees (and the fixed micro-batch, where the document gives one) against the
    model's heads, FFN width, sequence and layers, the global batch and the GPU count."""
    split = {k: fixed[k] for k in ("tensor", "context", "sequence_parallel") if k in fixed}
    if split:                        # the degrees that must split the model, as a scenario's must
        check_dims(dims, ParallelSpec(**split), lambda msg: PartitaError(f"{where}{msg}"))
    chunks = fixed.get("pipeline", 1) * fixed.get("virtual_stages", 1)
    if chunks > dims.total_layers:
        raise PartitaError(f"{where}parallel.pipeline*virtual_stages ({chunks}) exceeds the model's "
                           f"{dims.total_layers} layers; use at most {dims.total_layers} stages")
    if "data" in fixed and gb % fixed["data"]:
        raise PartitaError(f"{where}parallel.data ({fixed['data']}) does not divide "
                           f"training.global_batch ({gb}); valid data degrees: "
                           + ", ".join(str(d) for d in range(1, min(gb, 64) + 1) if gb % d == 0))
    degrees = [k for k in ("tensor", "pipeline", "context", "data") if k in fixed]
    prod = 1
    for k in degrees:
        prod *= fixed[k]
    if fixed_gpus is not None and all(k in fixed for k in ("tensor", "pipeline", "data")):
        if prod != fixed_gpus:
            raise PartitaError(f"{where}parallel: tensor*pipeline*context*data = {prod} but "
                               f"cluster.gpus is {fixed_gpus}; leave one of them out to search it")
    elif fixed_gpus is not None and fixed_gpus % prod:
        raise PartitaError(f"{where}parallel: {'*'.join(degrees)} = {prod} does not divide "
                           f"cluster.gpus ({fixed_gpus}); the degrees multiply to the GPU count")
    if micro_batch is not None:
        share = gb // fixed["data"] if "data" in fixed else gb
        if share % micro_batch:
            of = (f"training.global_batch / parallel.data ({gb} / {fixed['data']} = {share})"
                  if "data" in fixed else f"training.global_batch ({gb})")
            raise PartitaError(f"{where}training.micro_batch ({micro_batch}) does not divide {of}; "
                               "valid micro-batches: "
                               + ", ".join(str(m) for m in range(1, min(share, 64) + 1)
                                           if share % m == 0))
