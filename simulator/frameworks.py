"""Framework profiles: how a training framework (Megatron-LM, DeepSpeed, PyTorch FSDP) runs the
mechanisms the cost model prices, as data (data/frameworks.yaml) rather than branches on its name.

One frozen record per framework, as Megatron-Core keeps one config dataclass per subsystem
(`DistributedDataParallelConfig`): which pipeline sends block, how ZeRO-3 gathers parameters, which
extra gradient buffers and per-micro-batch passes it runs. Numbers per framework (the fitted
reserved buffers in fitted_memory.yaml; a kernel or ZeRO-3 collective fraction a user's own
training.yaml may set, none shipped) stay in data/calibration and are looked up there by the
framework's name.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

from partita.planner.documents import Checker, load_document
from partita.planner.enums import FRAMEWORKS
from partita.planner.errors import PartitaError
from partita.planner.paths import DATA_DIR

FRAMEWORKS_FILE = DATA_DIR / "frameworks.yaml"
ZERO3_GATHERS = ("flat", "per_tensor")

LOSS_FORMS = ("vocab_parallel", "torch")     # the cross-entropy forms (simulator/memory.py)

@dataclass(frozen=True, kw_only=True)
class FrameworkProfile:
    """What the cost model needs to know about one framework (keys: see data/frameworks.yaml)."""

    name: str
    blocking_sends: bool
    zero3_gather: str                       # flat | per_tensor
    zero3_persistence_threshold_params: int
    zero3_regather_on_recompute: bool
    zero3_list_collectives_without_prefetch: bool
    bf16_fp32_gradient_copy: bool
    bf16_microbatch_gradient_accumulation: bool
    loss: str                               # vocab_parallel | torch
    recompute_early_stop: bool              # full recompute halts at the last tensor saved
    dp_collectives_per_block: bool          # the data-parallel reduction and ZeRO-1/2 gather run
                                            # one collective per block (FSDP's wrapped units)


FLAGS = tuple(f.name for f in fields(FrameworkProfile) if f.name != "name")


def _profile(c: Checker, name: str) -> FrameworkProfile:
    c.only(FLAGS + ("source",))
    if isinstance(c.mapping.get("source"), dict):
        sources = c.sub("source")
        sources.only(FLAGS)
        missing = [key for key in FLAGS if not sources.str(key)]
    else:
        missing = [] if c.str("source") else list(FLAGS)
    if missing:
        raise c.error(f"no source for {', '.join(missing)}", "source")
    for key in FLAGS:
        if not c.has(key):
            raise c.error("missing required key", key)
    return FrameworkProfile(
        name=name,
        blocking_sends=c.bool("blocking_sends", False),
        zero3_gather=c.choice("zero3_gather", ZERO3_GATHERS),
        zero3_persistence_threshold_params=c.int("zero3_persistence_threshold_params", minimum=0),
        zero3_regather_on_recompute=c.bool("zero3_regather_on_recompute", False),
        zero3_list_collectives_without_prefetch=c.bool("zero3_list_collectives_without_prefetch", False),
        bf16_fp32_gradient_copy=c.bool("bf16_fp32_gradient_copy", False),
        bf16_microbatch_gradient_accumulation=c.bool("bf16_microbatch_gradient_accumulation", False),
        loss=c.choice("loss", LOSS_FORMS),
        recompute_early_stop=c.bool("recompute_early_stop", False),
        dp_collectives_per_block=c.bool("dp_collectives_per_block", False))


@lru_cache(maxsize=4)
def _load(path: str, mtime: int) -> dict[str, FrameworkProfile]:
    top = Checker(load_document(path), "", path)
    top.only(("frameworks",))
    section = top.sub("frameworks")
    section.only(FRAMEWORKS)
    return {name: _profile(section.sub(name), name) for name in section.mapping}


def load_frameworks(path: str | Path = FRAMEWORKS_FILE) -> dict[str, FrameworkProfile]:
    path = Path(path)
    return _load(str(path), path.stat().st_mtime_ns)


def framework_profile(name: str, path: str | Path = FRAMEWORKS_FILE) -> FrameworkProfile:
    """The profile of `training.framework` `name`."""
    profiles = load_frameworks(path)
    if name not in profiles:
        raise PartitaError(f"{path}: frameworks.{name}: no profile for training.framework {name!r} "
                           f"(profiles: {', '.join(profiles)})")
    return profiles[name]
