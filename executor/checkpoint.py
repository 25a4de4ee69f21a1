"""Checkpoints of a (pipelined, data-parallel) run with torch.distributed.checkpoint, saved atomically.

Layout under a checkpoint directory DIR (a file system every rank sees, as DCP's FileSystemWriter needs):

    DIR/step-000010/                 complete: DCP shard files + .metadata + manifest.json
    DIR/step-000012.tmp-<uuid>/      being written, or torn by a crash: never taken for a checkpoint

All ranks call `save_checkpoint`; each writes its shards into the tmp directory, then rank 0 writes
`manifest.json` (plan fingerprint, step, world size, each rank's state key, the caller's `extra`, every
file with its size and SHA-256) and renames the directory to its final name (one atomic `rename`). A
directory counts as a checkpoint only if it has the final name and a manifest whose files are all
there with their sizes, so a kill at any point leaves either the previous checkpoints or a complete
new one. Before a checkpoint is loaded every file's SHA-256 is checked against the manifest: a
damaged one (altered bytes, same size) is never unpickled; `latest_checkpoint` passes over it to
the newest intact checkpoint and says so on stderr.

Model and optimizer state go through `torch.distributed.checkpoint.state_dict` (get_state_dict /
set_state_dict), so plain modules and FSDP2 (`fully_shard`) modules both work; the CPU (and CUDA)
random-number state of every rank is saved and restored too, so dropout resumes exactly.

[Note: state keys] DCP takes tensors saved under the same key on several ranks to be one tensor
(replicas: written once; DTensors: shards of it, which must cover it). A rank's stage modules are
keyed by their position in its own `model_parts` ("0.weight", ...), the same names on pipeline rank 0
and pipeline rank 1, so each rank's state sits under a `state_key`. By default it is `ranks<R>`, R the
lowest rank of the device meshes the rank's DTensor parameters live on (the ranks holding the same
stage modules, sharded by FSDP2 or tensor parallelism), or the rank itself when it has no DTensors:
right for plain modules, for FSDP2 and for resuming the same plan (the fingerprint guarantees the same
layout). Ranks holding unsharded replicas of the same modules may pass one shared key to store them once.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import uuid
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_state_dict, set_model_state_dict,
                                                     set_state_dict)

from partita.executor.faults import maybe_inject_fault
from partita.planner.errors import PartitaError

FORMAT = "partita-checkpoint/2"     # /2: files carry their SHA-256
MANIFEST = "manifest.json"
_FINAL = re.compile(r"^step-(\d{6,})$")
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

Optimizers = torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None


# ---------------------------------------------------------------- plan fingerprint

def plan_fingerprint(scenario) -> str:
    """`<12 hex digits> (<plan in brief>)`: a hash of everything that fixes the checkpoint's layout.

    Covers the model shape, the parallel degrees, schedule, ZeRO stage (and data_shard, when set)
    and stage ranges, and the micro-batching, precision and optimizer; not the cluster name,
    recompute or overlap switches, which change neither the saved tensors nor what a step computes.
    """
    facts = _plan_facts(scenario)
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]
    return f"{digest} ({_plan_summary(facts)})"


def _plan_facts(scenario) -> dict[str, Any]:
    p, t = scenario.parallel, scenario.training
    if p is None:
        raise PartitaError(f"{scenario.origin or 'scenario'}: no parallel section to checkpoint; "
                           f"run `partita plan {scenario.origin or 'FILE'} -o planned.yaml` "
                           "to choose one")
    dims = scenario.model.resolve()
    model = {k: v for k, v in dims.to_dict().items() if k not in ("name", "dropout")} \
        if dims is not None \
        else scenario.model.to_dict()
    brief = (f"{dims.name or dims.arch} L{dims.total_layers} H{dims.hidden} S{dims.seq_len}"
             if dims is not None else f"{scenario.model.module} S{scenario.model.seq_len}")
    parallel = {"tensor": p.tensor, "pipeline": p.pipeline, "data": p.data, "context": p.context,
                "schedule": p.schedule, "virtual_stages": p.virtual_stages, "zero": p.zero,
                "stages": [list(s) for s in p.stages] if p.stages else None}
    if p.data_shard is not None:
        parallel["data_shard"] = p.data_shard
    return {"model": model, "model_brief": brief, "parallel": parallel,
            "training": {"global_batch": t.global_batch, "micro_batch": t.micro_batch,
                         "microbatches": t.global_batch // (t.micro_batch * p.data),
                         "precision": t.precision, "optimizer": t.optimizer}}


def _plan_summary(facts: dict[str, Any]) -> str:
    p, t = facts["parallel"], facts["training"]
    virtual = f" x{p['virtual_stages']}" if p["virtual_stages"] > 1 else ""
    stages = json.dumps(p["stages"]) if p["stages"] else "even"
    shard = f" shard{p['data_shard']}" if "data_shard" in p else ""
    return (f"{facts['model_brief']}; tp{p['tensor']} pp{p['pipeline']} dp{p['data']} "
            f"cp{p['context']} {p['schedule']}{virtual} zero{p['zero']}{shard}; stages {stages}; "
            f"batch {t['global_batch']} = {t['microbatches']} x {t['micro_batch']} x dp; "
            f"{t['precision']} {t['optimizer']}")


# ---------------------------------------------------------------- save

def save_checkpoint(directory: str | Path, step: int, model_parts: Sequence[nn.Module],
                    optimizer: Optimizers, *, fingerprint: str, extra: dict[str, Any],
                    state_key: str | None = None) -> Path:
    """Save this rank's model parts and optimizer as checkpoint `step`; every rank must call it.

    `extra` (JSON values: data position, losses so far, ...) goes into the manifest and comes back
    from `load_checkpoint`. Returns DIR/step-NNNNNN once it is complete on disk, on every rank.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a whole number >= 0, got {step!r}")
    extra_text = _json_or_fail(extra)
    directory = Path(directory)
    _make_dir(directory)
    rank, world = _rank(), _world()
    final = directory / f"step-{step:06d}"
    tmp = directory / _from_rank0(f"{final.name}.tmp-{uuid.uuid4().hex}")
    tmp.mkdir(exist_ok=True)
    key = state_key or default_state_key(model_parts)
    with _quiet():
        dcp.save(_live_state(model_parts, optimizer, key), checkpoint_id=tmp, no_dist=world == 1)
    keys = _gather(key)
    maybe_inject_fault(step, "checkpoint")
    if rank == 0:
        manifest = {"format": FORMAT, "step": step, "fingerprint": fingerprint, "world_size": world,
                    "state_keys": keys, "extra": json.loads(extra_text), "torch": torch.__version__,
                    "files": _file_digests(tmp)}
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        _publish(tmp, final)
        _remove_stale(directory)
    _barrier()
    return final


def default_state_key(model_parts: Sequence[nn.Module]) -> str:
    """`ranks<R>`, R the lowest rank among those this rank's parameters are sharded or replicated over.

    DTensor parameters (FSDP2, tensor parallel) live on a device mesh; every rank of that mesh holds
    the same modules, so they share one key and their shards form one tensor. Without DTensors the
    group is this rank alone.
    """
    group = {_rank()}
    for module in model_parts:
        for tensor in [*module.parameters(), *module.buffers()]:
            mesh = getattr(tensor, "device_mesh", None)
            if mesh is not None:
                group.update(int(r) for r in mesh.mesh.flatten().tolist())
    return f"ranks{min(group)}"


def _live_state(model_parts: Sequence[nn.Module], optimizer: Optimizers, key: str) -> dict[str, Any]:
    """The DCP state dict of this rank: {key: {model, optim}, rng: {rank<R>: ...}} (tensors shared)."""
    container = nn.ModuleList(model_parts)
    if optimizer is None:
        model_sd, optim_sd = get_model_state_dict(container, options=_OPTIONS), {}
    else:
        model_sd, optim_sd = get_state_dict(container, optimizer, options=_OPTIONS)
    return {key: {"model": model_sd, "optim": optim_sd}, "rng": {f"rank{_rank()}": _rng_state()}}


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _publish(tmp: Path, final: Path) -> None:
    """Rename tmp to final; an older checkpoint of the same step is moved aside first, then removed."""
    old = None
    if final.exists():
        old = final.with_name(f"{final.name}.old-{uuid.uuid4().hex}")
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale(directory: Path) -> None:
    """Torn directories of earlier attempts (every rank is past them now)."""
    for entry in directory.iterdir():
        if entry.is_dir() and entry.name.startswith("step-") and (".tmp-" in entry.name
                                                                  or ".old-" in entry.name):
            shutil.rmtree(entry, ignore_errors=True)


# ---------------------------------------------------------------- find and load

def latest_checkpoint(directory: str | Path, *, fingerprint: str, verify: bool = True) -> int | None:
    """The step of the newest intact checkpoint in `directory`, or None if there is none.

    With `verify` (the default) every file's SHA-256 is checked; a newer checkpoint that is
    damaged is passed over with a note on stderr (printed by the launching process, not by each
    rank). Raises PartitaError if the checkpoint found was saved by a different plan.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return None
    steps = sorted((int(m.group(1)) for m in map(_FINAL.match, os.listdir(directory)) if m),
                   reverse=True)
    skipped: list[str] = []
    for step in steps:
        path = directory / f"step-{step:06d}"
        problem = checkpoint_problem(path, verify=verify)
        if problem is None:
            manifest = read_manifest(path)
            _check_fingerprint(manifest, fingerprint, path)
            _note_skipped(skipped, f"resuming from step {step}")
            return step
        skipped.append(f"{path}: {problem}")
    _note_skipped(skipped, "no intact checkpoint left")
    return None


def _note_skipped(skipped: list[str], outcome: str) -> None:
    if skipped and not _distributed():
        for line in skipped:
            print(f"note: {line}; passed over ({outcome})", file=sys.stderr, flush=True)


def checkpoint_problem(path: str | Path, *, verify: bool = True) -> str | None:
    """Why `path` is not an intact checkpoint (torn, damaged, another format), or None if it is."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest is None:
        return f"not a complete checkpoint (no valid {MANIFEST} of format {FORMAT} with all its files)"
    if verify:
        for name, entry in manifest["files"].items():
            if _sha256(path / name) != entry["sha256"]:
                return f"{name} does not match the SHA-256 in its {MANIFEST} (the file is damaged)"
    return None


def load_checkpoint(directory: str | Path, step: int, model_parts: Sequence[nn.Module],
                    optimizer: Optimizers, *, state_key: str | None = None,
                    fingerprint: str | None = None) -> dict[str, Any]:
    """Restore model parts, optimizer and RNG state from checkpoint `step`; returns its `extra`.

    Every rank must call it, with the same parts and the same `state_key` as when saving.
    """
    path = Path(directory) / f"step-{step:06d}"
    problem = checkpoint_problem(path)
    if problem is not None:
        raise PartitaError(f"{path}: {problem}")
    manifest = read_manifest(path)
    if fingerprint is not None:
        _check_fingerprint(manifest, fingerprint, path)
    rank, world = _rank(), _world()
    if manifest["world_size"] != world:
        raise PartitaError(f"{path}: saved by {manifest['world_size']} processes, this run has {world}")
    key = state_key or default_state_key(model_parts)
    if manifest["state_keys"][rank] != key:
        raise PartitaError(f"{path}: rank {rank} saved its state as {manifest['state_keys'][rank]!r}, "
                           f"loading asks for {key!r}")
    state = _live_state(model_parts, optimizer, key)
    with _quiet():
        dcp.load(state, checkpoint_id=path, no_dist=world == 1)
    _restore(model_parts, optimizer, state[key])
    _set_rng(state["rng"][f"rank{rank}"])
    return manifest["extra"]


def _restore(model_parts: Sequence[nn.Module], optimizer: Optimizers, state: dict[str, Any]) -> None:
    container = nn.ModuleList(model_parts)
    if optimizer is None:
        set_model_state_dict(container, state["model"], options=_OPTIONS)
    else:
        set_state_dict(container, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=_OPTIONS)


def _set_rng(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def read_manifest(path: str | Path) -> dict[str, Any] | None:
    """The manifest of a complete checkpoint directory; None if it is torn or not a checkpoint."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    needed = ("format", "step", "fingerprint", "world_size", "state_keys", "extra", "files")
    if not isinstance(manifest, dict) or any(k not in manifest for k in needed) \
            or manifest["format"] != FORMAT:
        return None
    files = manifest["files"]
    if not isinstance(files, dict):
        return None
    for name, entry in files.items():
        file = path / name
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                or ".." in Path(name).parts or Path(name).is_absolute():
            return None
        if not file.is_file() or file.stat().st_size != entry.get("bytes"):
            return None
    return manifest


def _check_fingerprint(manifest: dict[str, Any], fingerprint: str, path: Path) -> None:
    if manifest["fingerprint"] != fingerprint:
        raise PartitaError(f"{path} belongs to another plan: it was saved by plan "
                           f"{manifest['fingerprint']}, this run is plan {fingerprint}; resume with "
                           "the scenario that saved it, or use another checkpoint directory")


# ---------------------------------------------------------------- files and collectives

def _json_or_fail(extra: dict[str, Any]) -> str:
    try:
        return json.dumps(extra, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"checkpoint extra must hold JSON values only: {exc}") from None


def _make_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PartitaError(f"{directory}: cannot create the checkpoint directory "
                           f"({exc.strerror or exc})") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PartitaError(f"{directory}: checkpoint directory is not writable")


def _file_digests(root: Path) -> dict[str, dict[str, Any]]:
    return {str(p.relative_to(root)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(root.rglob("*")) if p.is_file()}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _quiet() -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process, which is what we mean."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _world() -> int:
    return dist.get_world_size() if _distributed() else 1


def _from_rank0(value: str) -> str:
    if not _distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather(value: str) -> list[str]:
    if not _distributed():
        return [value]
    out: list[Any] = [None] * _world()
    dist.all_gather_object(out, value)
    return out


def _barrier() -> None:
    if _distributed():
        dist.barrier()
