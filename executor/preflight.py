"""Everything `partita run` checks and decides before a process starts: `prepare_run(request)`.

A `RunRequest` holds the run's options (one field per `partita run` flag, named after it, so the
errors name the flags). `prepare_run` checks, in this order, the scenario and where its processes
go (`placement`: this machine, or torchrun's rendezvous across nodes), the plan the executor will
run, the backend (`nccl` needs a CUDA GPU per process), this machine's memory against the model
(gloo), the token file, the output directory and weights file (writable, nothing overwritten) and
the checkpoint directory (`--resume` against what it holds); then asks the simulator for the step
time and memory per stage to compare the measurement with (`predict`). It returns the `Job` for
`launch.launch` with the notes to show first. No torch import at load time.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from partita.executor.hostload import host_load, load_warning
from partita.executor.launch import Job, Rendezvous
from partita.executor.plan import ExecPlan, execution_plan
from partita.planner.catalog import load_catalog
from partita.planner.errors import PartitaError
from partita.planner.modelspec import ModelSpec
from partita.planner.profile import PARTIAL_RECOMPUTE
from partita.planner.scenario import Scenario, find_scenario_file, load_scenario
from partita.planner.units import GIB


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """A `partita run`: the scenario file and the options, named after the command's flags."""
    file: str                          # scenario file or a shipped example's name
    steps: int = 10                    # train up to this optimizer step (with resume, the total)
    backend: str = "gloo"              # gloo: CPU processes; nccl: one CUDA GPU per process
    out: str | None = None             # output directory (None: ./partita-run/<name>)
    data: str | None = None            # token file (None: seeded synthetic tokens)
    seed: int = 0
    lr: float = 1e-3
    save_weights: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    resume: bool = False
    nnodes: int | None = None          # None: this machine only
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    rdzv_id: str = "partita"
    max_restarts: int = 0
    catalog: str | None = None         # extra catalog file over the shipped one


@dataclass(frozen=True, kw_only=True)
class PreparedRun:
    """A checked run, ready for `launch(job, nproc, rendezvous)`."""
    job: Job
    nproc: int                         # processes on this machine
    rendezvous: Rendezvous
    out: Path                          # where rank 0 writes its outputs
    notes: tuple[str, ...]             # the plan's notes and why there is no prediction, if so


def prepare_run(request: RunRequest) -> PreparedRun:
    """Check everything about `request` and build its job; raise PartitaError at the first fault."""
    path = find_scenario_file(request.file)
    scenario = load_scenario(path)
    gpus, nproc, rdzv = placement(scenario, request)
    plan = execution_plan(scenario, gpus)
    check_backend(request.backend, nproc)
    check_host_memory(scenario, plan, nproc, request.backend)
    out = Path(request.out or Path("partita-run") / (scenario.name or path.stem))
    check_token_file(request, plan)
    check_outputs(request, out)
    check_checkpoints(request, scenario)
    predicted, note, predicted_memory = predict(scenario, request.catalog)
    load = host_load() if request.backend == "gloo" else None     # CPU processes share its cores
    busy = load_warning(load, nproc, "this run")
    job = Job(scenario=str(path.resolve()), world=gpus, steps=request.steps,
              backend=request.backend, seed=request.seed, lr=request.lr,
              data=str(Path(request.data).resolve()) if request.data else None,
              out_dir=str(out), checkpoint_dir=request.checkpoint_dir,
              checkpoint_every=request.checkpoint_every or 0, resume=request.resume,
              save_weights=request.save_weights, predicted_step_time_s=predicted,
              predicted_memory_bytes=predicted_memory,
              host_load=load.to_dict() if load is not None else None)
    return PreparedRun(job=job, nproc=nproc, rendezvous=rdzv, out=out,
                       notes=tuple(plan.notes() + [n for n in (note, busy) if n]))


def placement(scenario: Scenario, request: RunRequest) -> tuple[int, int, Rendezvous]:
    """(processes in all, processes on this machine, rendezvous) for the scenario's cluster."""
    c, where = scenario.cluster, f"{scenario.origin}: " if scenario.origin else ""
    local = c.system.lower() == "local"
    if local and request.nnodes is None:
        if c.gpus is None:
            raise PartitaError(f"{where}cluster: system local needs gpus: N (the number of "
                               "processes to start on this machine)")
        return c.gpus, c.gpus, Rendezvous(max_restarts=request.max_restarts)
    if local:
        raise PartitaError(f"{where}cluster.system is local (this machine), but --nnodes "
                           f"{request.nnodes} asks for several; name the nodes' system instead")
    hw = load_catalog(request.catalog).resolve_cluster(c, scenario.origin)
    if request.nnodes is None:
        raise PartitaError(
            f"{where}cluster.system is {c.system!r}, not 'local': launching here would run "
            f"{hw.gpus} processes on this one machine. To try the plan here, use cluster: "
            f"{{system: local, gpus: {hw.gpus}}}; to run it on {hw.nodes} x {c.system}, run "
            f"`partita run {scenario.origin or 'FILE'} --backend nccl --nnodes {hw.nodes} "
            "--node-rank I --rdzv-endpoint HOST:PORT` on each node")
    if hw.gpus % request.nnodes:
        raise PartitaError(f"{where}{hw.gpus} GPUs do not split evenly over --nnodes "
                           f"{request.nnodes}")
    rdzv = Rendezvous(nnodes=request.nnodes, node_rank=request.node_rank,
                      endpoint=request.rdzv_endpoint, backend=request.rdzv_backend,
                      run_id=request.rdzv_id, max_restarts=request.max_restarts)
    return hw.gpus, hw.gpus // request.nnodes, rdzv


def check_backend(backend: str, nproc: int) -> None:
    """nccl runs one process per CUDA GPU: this machine must have `nproc` of them."""
    if backend != "nccl":
        return
    import torch
    have = torch.cuda.device_count()
    if have < nproc:
        raise PartitaError(f"--backend nccl runs one process per CUDA GPU: {nproc} needed on this "
                           f"machine, {have} found; use --backend gloo for CPU processes")


def check_host_memory(scenario: Scenario, plan: ExecPlan, nproc: int, backend: str) -> None:
    """CPU processes hold every weight and its gradient in this machine's memory: refuse a plan
    whose lower bound (weights + gradients at the training precision, no optimizer state, no
    activations) exceeds the memory available now, instead of letting the workers be OOM-killed."""
    if backend != "gloo":
        return
    from partita.planner.costmodel import element_bytes, total_params
    available = available_bytes()
    if available is None:
        return
    dims = scenario.model.resolve()
    if dims is not None:
        params = total_params(dims)
    else:                                   # a `module:` model: count it on the meta device
        from partita.planner.profiler import profile_module
        params = profile_module(scenario.model, micro_batch=1,
                                precision=plan.precision).total_params
    model_bytes = params * element_bytes(plan.precision)
    copies = plan.shard_replicas                # sharded copies: one per shard group (data_shard)
    weights = model_bytes * (copies if plan.zero >= 3 else plan.data)   # ZeRO-3: sharded over data
    grads = model_bytes * (copies if plan.zero >= 2 else plan.data)     # ZeRO-2: gradients too
    need = (weights + grads) * nproc / plan.world                   # this machine's share
    if need > available:
        where = f"{scenario.origin}: " if scenario.origin else ""
        raise PartitaError(f"{where}model: {nproc} CPU processes need at least {need / GIB:,.1f} GiB "
                           f"for weights and gradients alone, and this machine has "
                           f"{available / GIB:,.1f} GiB available; use a smaller model")


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else None (no check)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_token_file(request: RunRequest, plan: ExecPlan) -> None:
    """The token file, if any, exists and holds tokens the model can read."""
    from partita.executor.data import DataSpec, check_token_file as check
    if request.data:
        check(DataSpec(plan.arch, plan.seq_len, plan.vocab, request.seed, request.data))


def check_outputs(request: RunRequest, out: Path) -> None:
    """Where the results go must be writable before training starts, so that a finished run is
    never lost to a bad path (and an existing weights file is not overwritten)."""
    flag = "--out" if request.out else "output directory"
    if out.exists() and not out.is_dir():
        raise PartitaError(f"{flag} {out}: exists and is not a directory (--out names a directory "
                           "for metrics.jsonl, trace.json and result.json)")
    _check_writable(flag, out if out.is_dir() else _existing_parent(out))
    if request.save_weights:
        weights = Path(request.save_weights)
        if weights.is_dir():
            raise PartitaError(f"--save-weights {weights}: is a directory; give a file name "
                               f"(e.g. {weights / 'weights.pt'})")
        if weights.exists() or weights.is_symlink():
            raise PartitaError(f"--save-weights {weights}: already exists; remove it or choose "
                               "another file name (partita does not overwrite it)")
        if not weights.resolve().parent.is_dir():
            raise PartitaError(f"--save-weights {request.save_weights}: no such directory "
                               f"{weights.resolve().parent}")
        _check_writable("--save-weights", weights.resolve().parent)


def _existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    if not path.is_dir():
        raise PartitaError(f"--out: {path} is a file, so no directory can be made under it")
    return path


def _check_writable(flag: str, directory: Path) -> None:
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PartitaError(f"{flag}: cannot write in {directory} (permission denied)")


def check_checkpoints(request: RunRequest, scenario: Scenario) -> None:
    """Refuse before launch what would fail or overwrite a checkpoint later."""
    if not request.checkpoint_dir:
        for flag, given in (("--checkpoint-every", request.checkpoint_every),
                            ("--resume", request.resume)):
            if given:
                raise PartitaError(f"{flag} needs --checkpoint-dir DIR")
        return
    from partita.executor.checkpoint import latest_checkpoint, plan_fingerprint
    where = Path(request.checkpoint_dir)
    if where.exists() and not where.is_dir():
        raise PartitaError(f"--checkpoint-dir {where}: exists and is not a directory")
    latest = latest_checkpoint(where, fingerprint=plan_fingerprint(scenario))
    if latest is not None and not request.resume:
        raise PartitaError(f"--checkpoint-dir {where} already holds step {latest} of this plan; "
                           "pass --resume to continue from it, or choose another directory")
    if request.resume and latest is None:
        raise PartitaError(f"--resume: no intact checkpoint of this plan in {where} to resume "
                           "from; run without --resume to start afresh")
    if request.resume and latest is not None and latest >= request.steps:
        raise PartitaError(f"--resume: the latest checkpoint is step {latest}, already at --steps "
                           f"{request.steps}; ask for more steps")


# The norm and RoPE forms of the executor's own models (planner/models/common.py): RMSNorm
# (Llama, T5) as fp32 PyTorch ops (`_RMSNormFunction`: x.float(), pow, mean, rsqrt, multiply, cast,
# weight multiply), Llama's RoPE as Hugging Face's x * cos + rotate_half(x) * sin.
EXECUTED_NORM = {"llama": "eager", "t5": "eager"}
EXECUTED_ROPE = {"llama": "rotate-half"}
# Archs whose executed block launches the fused block's kernels: partita's GPT block adds its
# biases inside the matmuls (addmm) and has no dropout, 12 kernels forward, the count of
# `host.forward_kernels` with Megatron's fusions (benchmarks/gpu_prediction.py prices it so).
EXECUTED_FUSED = ("gpt",)


def as_executed(scenario: Scenario) -> Scenario:
    """The scenario as the executor runs it on a GPU system: its models' kernels are eager
    PyTorch, whatever framework the scenario describes, so the simulator prices those, not the
    framework's fused ones: activation and residual add as separate kernels
    (`fused_elementwise: false`, but for the archs of EXECUTED_FUSED), the loss as
    F.cross_entropy's unfused chain, and the norm and RoPE forms of EXECUTED_NORM /
    EXECUTED_ROPE; no dropout (planner/models/common.py), and full
    recompute through torch.utils.checkpoint(use_reentrant=False), which stops early
    (executor/stages.py; `compute.early_stop_skip`); context parallelism in its all-gather
    form (`parallel.cp_comm_type: all_gather`, executor/context.py). On the NVIDIA H200 runs of
    data/validation/gpu/h200_kernels.json (`runs`: a GPT of 24 x 2048, one of 24 x 1024, a Llama
    of 16 x 2048) predicted / measured is 1.02, 0.92 and 0.96 so, 1.02, 0.92 and 0.89 with the
    scenarios' forms (README). A `local` system keeps the scenario's forms: its calibration
    (`partita calibrate`, executor.pipeline_fit) fits the work per pipeline action against the
    simulator run on them, so its predictions and its calibration share one convention. A
    model.module is the profiler's to time and is returned as it is."""
    dims = scenario.model.resolve()
    if dims is None:
        return scenario
    training = replace(scenario.training, fused_elementwise=dims.arch in EXECUTED_FUSED,
                       fused_cross_entropy=False,
                       norm_kernel=EXECUTED_NORM.get(dims.arch, "fused"),
                       rope_kernel=EXECUTED_ROPE.get(dims.arch, "fused"),
                       recompute_early_stop=True)
    model = ModelSpec(dims=replace(dims, dropout=False), origin=scenario.model.origin)
    parallel = scenario.parallel
    if parallel is not None and parallel.context > 1:
        # executor/context.py runs context parallelism in its all-gather form (Llama 3's)
        parallel = replace(parallel, cp_comm_type="all_gather")
    return replace(scenario, model=model, training=training, parallel=parallel)


def predict(scenario: Scenario, catalog_file: str | None
            ) -> tuple[float | None, str | None, list | None]:
    """The simulator's step time and memory per pipeline stage, or (None, why, None) when this
    machine has no calibration."""
    from partita.executor.measure import predicted_stage_memory
    from partita.simulator.step import simulate
    catalog = load_catalog(catalog_file)
    recompute = scenario.training.recompute
    if scenario.model.module is not None and recompute in PARTIAL_RECOMPUTE:
        # the executor checkpoints the module's layers by the policy; the simulator knows no
        # block structure of a module to price it by (simulator.profiled refuses it)
        return None, (f"no prediction: the simulator does not price recompute {recompute} of a "
                      "model.module (it has no known block structure)"), None
    if scenario.cluster.system.lower() != "local":
        result = simulate(as_executed(scenario), catalog)
        return result.step_time_s, None, predicted_stage_memory(result)
    if "local" not in catalog.system_names():
        return None, ("no prediction: this machine is not calibrated (no catalog system "
                      "'local'); run `partita calibrate` first"), None
    try:
        result = simulate(scenario, catalog)
    except PartitaError as exc:
        return None, f"no prediction ({exc}); run `partita calibrate` to measure this machine", None
    return result.step_time_s, None, predicted_stage_memory(result)
