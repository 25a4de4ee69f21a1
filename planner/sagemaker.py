"""SageMaker model-parallel library words in a scenario, mapped to partita's names.

A scenario may carry the `parameters` of SageMaker's model-parallel library (smdistributed
.modelparallel, the `smp_options` of an estimator's `distribution`) as a top-level `sagemaker:`
section. `translate(doc)` moves them into `parallel` / `training` before the document is checked:

- `partitions` / `pipeline_parallel_degree` -> `parallel.pipeline`
- `tensor_parallel_degree` -> `parallel.tensor`
- `microbatches` (per step per replica) -> `training.micro_batch` = global_batch / (microbatches *
  parallel.data); `partita plan` keeps the count fixed while it searches the data degree
- `pipeline: simple` -> `parallel.schedule: gpipe` (all forwards, then all backwards)
- `pipeline: interleaved` -> `parallel.schedule: 1f1b` (SMP's "interleaved" alternates forward and
  backward micro-batches; it is not Megatron's interleaving with virtual stages)
- `optimize: speed | memory` -> the ILP partitioner's objective (`partita plan`)
- `placement_strategy: cluster` -> partita's placement (tensor ranks innermost on one node, then
  context, data, pipeline); other strategies are not modelled and are an error
- `ddp: true | false` -> data parallelism allowed | `parallel.data` must be 1

A SageMaker value and a partita value for the same thing that disagree are an error naming both.
Source: "Configuration parameters of the SageMaker model parallelism library" (AWS SageMaker
Developer Guide, model-parallel-customize-config / smdistributed.modelparallel v1 parameters).
"""
from __future__ import annotations

import copy
from typing import Any

from partita.planner.enums import OPTIMIZE
from partita.planner.errors import PartitaError

KEYS = ("partitions", "pipeline_parallel_degree", "tensor_parallel_degree", "microbatches",
        "pipeline", "optimize", "placement_strategy", "ddp")
PIPELINE = {"simple": "gpipe", "interleaved": "1f1b"}


def translate(doc: Any, origin: str = "", *, searching: bool = False) -> tuple[Any, dict[str, Any]]:
    """(the document with partita's names, the SageMaker settings partita keeps apart: `optimize`,
    `microbatches`, `ddp`). A document without a `sagemaker:` section comes back unchanged.
    `searching`: for `partita plan`, where `microbatches` constrains the data degree it searches;
    otherwise `microbatches` needs `parallel.data` to give the micro-batch size."""
    if not isinstance(doc, dict) or "sagemaker" not in doc:
        return doc, {}
    where = f"{origin}: " if origin else ""
    sm = _parameters(doc, where)
    out = copy.deepcopy({k: v for k, v in doc.items() if k != "sagemaker"})
    par = out.setdefault("parallel", {})
    if not isinstance(par, dict):
        raise PartitaError(f"{where}parallel: expected a mapping")
    training = out.get("training") if isinstance(out.get("training"), dict) else {}
    _map_parallel(sm, par, where)
    kept = _kept(sm, par, where)
    if "microbatches" in sm:
        kept["microbatches"] = _microbatches(sm, par, training, where, searching=searching)
    if not par:
        del out["parallel"]
    return out, kept


def _parameters(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """The `sagemaker:` section, checked to be a mapping of known parameters."""
    sm = doc["sagemaker"]
    if not isinstance(sm, dict):
        raise PartitaError(f"{where}sagemaker: expected a mapping of model-parallel parameters "
                           f"({', '.join(KEYS)}), got {type(sm).__name__}")
    unknown = [k for k in sm if k not in KEYS]
    if unknown:
        raise PartitaError(f"{where}sagemaker.{unknown[0]}: unknown parameter (valid: "
                           f"{', '.join(KEYS)})")
    return sm


def _put(sm: dict[str, Any], par: dict[str, Any], sm_key: str, key: str, value: Any,
         where: str) -> None:
    """Set `parallel.key` from `sagemaker.sm_key`, unless the document gives another value."""
    if key in par and par[key] != value:
        raise PartitaError(f"{where}sagemaker.{sm_key} ({sm[sm_key]!r}) contradicts "
                           f"parallel.{key} ({par[key]!r}); give one of them")
    par[key] = value


def _map_parallel(sm: dict[str, Any], par: dict[str, Any], where: str) -> None:
    """The pipeline and tensor degrees and the schedule, into `parallel`."""
    for key in ("partitions", "pipeline_parallel_degree"):
        if key in sm:
            _put(sm, par, key, "pipeline", _positive(sm, key, where), where)
    if "tensor_parallel_degree" in sm:
        _put(sm, par, "tensor_parallel_degree", "tensor",
             _positive(sm, "tensor_parallel_degree", where), where)
    if "pipeline" in sm:
        if sm["pipeline"] not in PIPELINE:
            raise PartitaError(f"{where}sagemaker.pipeline: expected simple or interleaved, got "
                               f"{sm['pipeline']!r}")
        _put(sm, par, "pipeline", "schedule", PIPELINE[sm["pipeline"]], where)


def _kept(sm: dict[str, Any], par: dict[str, Any], where: str) -> dict[str, Any]:
    """`optimize` and `ddp`, kept apart (ddp: false also fixes parallel.data to 1); the
    placement strategy, checked."""
    kept: dict[str, Any] = {}
    if "optimize" in sm:
        if sm["optimize"] not in OPTIMIZE:
            raise PartitaError(f"{where}sagemaker.optimize: expected speed or memory, got "
                               f"{sm['optimize']!r}")
        kept["optimize"] = sm["optimize"]
    if "placement_strategy" in sm and sm["placement_strategy"] != "cluster":
        raise PartitaError(f"{where}sagemaker.placement_strategy: only 'cluster' is modelled "
                           f"(tensor ranks innermost on a node), got {sm['placement_strategy']!r}")
    if "ddp" in sm:
        if not isinstance(sm["ddp"], bool):
            raise PartitaError(f"{where}sagemaker.ddp: expected true or false, got {sm['ddp']!r}")
        kept["ddp"] = sm["ddp"]
        if not sm["ddp"]:
            _put(sm, par, "ddp", "data", 1, where)
    return kept


def _microbatches(sm: dict[str, Any], par: dict[str, Any], training: dict[str, Any], where: str,
                  *, searching: bool) -> int:
    """`microbatches`, checked; sets `training.micro_batch` where parallel.data and the global
    batch give it."""
    m = _positive(sm, "microbatches", where)
    if "data" in par and isinstance(training.get("global_batch"), int):
        per = training["global_batch"]
        if per % (m * par["data"]):
            raise PartitaError(f"{where}sagemaker.microbatches ({m}): training.global_batch "
                               f"({per}) is not divisible by microbatches*parallel.data "
                               f"({m}*{par['data']})")
        mb = per // (m * par["data"])
        if "micro_batch" in training and training["micro_batch"] != mb:
            raise PartitaError(f"{where}sagemaker.microbatches ({m}) contradicts "
                               f"training.micro_batch ({training['micro_batch']}): "
                               f"{m} micro-batches need micro_batch {mb}")
        training["micro_batch"] = mb
    elif not searching:
        raise PartitaError(f"{where}sagemaker.microbatches ({m}) needs parallel.data and "
                           "training.global_batch to give the micro-batch size; add "
                           "parallel.data, or run `partita plan` to search it")
    return m


def _positive(sm: dict[str, Any], key: str, where: str) -> int:
    value = sm[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PartitaError(f"{where}sagemaker.{key}: expected a positive integer, got {value!r}")
    return value
