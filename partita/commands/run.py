"""`partita run FILE [--steps N] [--backend gloo|nccl] [--json] ...`: execute the scenario's plan for real.

    partita run tiny-gpt-pp2 --steps 10                 # 2 processes on this machine (gloo)
    partita run plan.yaml --backend nccl --json         # cluster: {system: local, gpus: 8}, on GPUs
    partita run plan.yaml --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29500   # on each node

Everything is checked before a process starts (the scenario and its plan, the token file, the
checkpoint directory, the backend); then torchrun runs `executor.worker` on every rank and this
prints the measured step times next to the simulator's prediction. Outputs go to --out DIR
(default ./partita-run/<name>/): metrics.jsonl, trace.json, result.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from partita.commands import add_catalog_option, catalog_from_args
from partita.planner.errors import PartitaError
from partita.planner.units import GIB


MAX_SEED = 2**32 - 1       # numpy's and every torch generator's range
MAX_LR = 10.0              # far above any learning rate that trains; above it, a typo


def _whole(minimum: int, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value
    return parse


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= MAX_LR:          # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be > 0 and <= {MAX_LR:g}, got {text}")
    return value


_positive = _whole(1)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="execute a scenario's plan under torchrun and measure it",
                       description=__doc__.splitlines()[0])
    p.add_argument("file", metavar="FILE", help="scenario file (YAML/JSON) or a shipped example's name")
    p.add_argument("--steps", type=_positive, default=10,
                   help="train up to this optimizer step (default 10; with --resume, the total)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="gloo: CPU processes (default); nccl: one CUDA GPU per process")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="DIR", help="output directory (default ./partita-run/<name>)")
    p.add_argument("--data", metavar="TOKENS", help="token file: uint16 .bin (nanoGPT) or 1-D .npy "
                                                    "(default: seeded synthetic tokens)")
    p.add_argument("--seed", type=_whole(0, MAX_SEED), default=0,
                   help="weights and synthetic data seed, 0 to 2**32-1 (default 0)")
    p.add_argument("--lr", type=_rate, default=1e-3, help="learning rate (default 1e-3)")
    p.add_argument("--save-weights", metavar="FILE",
                   help="write the trained weights (the model's own parameter names) with torch.save")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="save / resume checkpoints here")
    p.add_argument("--checkpoint-every", type=_positive, metavar="K",
                   help="save after steps K, 2K, ... (needs --checkpoint-dir)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    g = p.add_argument_group("torchrun rendezvous (several machines)")
    g.add_argument("--nnodes", type=_positive, help="machines taking part (run this on each)")
    g.add_argument("--node-rank", type=_whole(0), default=0, help="this machine's index (default 0)")
    g.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="rendezvous address")
    g.add_argument("--rdzv-backend", default="c10d", help="rendezvous backend (default c10d)")
    g.add_argument("--rdzv-id", default="partita", help="rendezvous job id (default partita)")
    g.add_argument("--max-restarts", type=_whole(0), default=0,
                   help="torchrun restarts after a failure; with --checkpoint-dir a restart resumes")
    add_catalog_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from partita.executor.launch import Job, launch
    from partita.planner.scenario import find_scenario_file, load_scenario

    path = find_scenario_file(args.file)
    scenario = load_scenario(path)
    gpus, nproc, rdzv = placement(scenario, args)
    plan = _plan(scenario, gpus)
    _check_backend(args.backend, nproc)
    _check_host_memory(scenario, plan, nproc, args.backend)
    out = Path(args.out or Path("partita-run") / (scenario.name or path.stem))
    _check_files(args, plan)
    _check_outputs(args, out)
    _check_checkpoints(args, scenario)
    predicted, note, predicted_memory = predict(scenario, args)
    for line in plan.notes() + ([note] if note else []):
        print(f"note: {line}", file=sys.stderr)
    job = Job(scenario=str(path.resolve()), world=gpus, steps=args.steps, backend=args.backend,
              seed=args.seed, lr=args.lr, data=str(Path(args.data).resolve()) if args.data else None,
              out_dir=str(out), checkpoint_dir=args.checkpoint_dir,
              checkpoint_every=args.checkpoint_every or 0, resume=args.resume,
              save_weights=args.save_weights, predicted_step_time_s=predicted,
              predicted_memory_bytes=predicted_memory)
    result = launch(job, nproc, rdzv)
    if result is None:
        print(f"this node's ranks finished; rank 0 (node 0) has the results in {out}", file=sys.stderr)
        return 0
    if args.json:
        print(json.dumps(result))
    else:
        print(format_table(result))
    return 0


def _plan(scenario, gpus: int):
    from partita.executor.plan import execution_plan
    return execution_plan(scenario, gpus)


def placement(scenario, args: argparse.Namespace):
    """(processes in all, processes on this machine, rendezvous) for the scenario's cluster."""
    from partita.executor.launch import Rendezvous
    c, where = scenario.cluster, f"{scenario.origin}: " if scenario.origin else ""
    local = c.system.lower() == "local"
    if local and args.nnodes is None:
        if c.gpus is None:
            raise PartitaError(f"{where}cluster: system local needs gpus: N (the number of "
                               "processes to start on this machine)")
        return c.gpus, c.gpus, Rendezvous(max_restarts=args.max_restarts)
    if local:
        raise PartitaError(f"{where}cluster.system is local (this machine), but --nnodes "
                           f"{args.nnodes} asks for several; name the nodes' system instead")
    hw = catalog_from_args(args).resolve_cluster(c, scenario.origin)
    if args.nnodes is None:
        raise PartitaError(
            f"{where}cluster.system is {c.system!r}, not 'local': launching here would run "
            f"{hw.gpus} processes on this one machine. To try the plan here, use cluster: "
            f"{{system: local, gpus: {hw.gpus}}}; to run it on {hw.nodes} x {c.system}, run "
            f"`partita run {scenario.origin or 'FILE'} --backend nccl --nnodes {hw.nodes} "
            "--node-rank I --rdzv-endpoint HOST:PORT` on each node")
    if hw.gpus % args.nnodes:
        raise PartitaError(f"{where}{hw.gpus} GPUs do not split evenly over --nnodes {args.nnodes}")
    rdzv = Rendezvous(nnodes=args.nnodes, node_rank=args.node_rank, endpoint=args.rdzv_endpoint,
                      backend=args.rdzv_backend, run_id=args.rdzv_id, max_restarts=args.max_restarts)
    return hw.gpus, hw.gpus // args.nnodes, rdzv


def _check_backend(backend: str, nproc: int) -> None:
    if backend != "nccl":
        return
    import torch
    have = torch.cuda.device_count()
    if have < nproc:
        raise PartitaError(f"--backend nccl runs one process per CUDA GPU: {nproc} needed on this "
                           f"machine, {have} found; use --backend gloo for CPU processes")


def _check_host_memory(scenario, plan, nproc: int, backend: str) -> None:
    """CPU processes hold every weight and its gradient in this machine's memory: refuse a plan
    whose lower bound (weights + gradients at the training precision, no optimizer state, no
    activations) exceeds the memory available now, instead of letting the workers be OOM-killed."""
    if backend != "gloo":
        return
    from partita.planner.costmodel import element_bytes, total_params
    available = _available_bytes()
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
    weights = model_bytes * (1 if plan.zero >= 3 else plan.data)    # ZeRO-3: sharded over data
    grads = model_bytes * (1 if plan.zero >= 2 else plan.data)      # ZeRO-2: gradients too
    need = (weights + grads) * nproc / plan.world                   # this machine's share
    if need > available:
        where = f"{scenario.origin}: " if scenario.origin else ""
        raise PartitaError(f"{where}model: {nproc} CPU processes need at least {need / GIB:,.1f} GiB "
                           f"for weights and gradients alone, and this machine has "
                           f"{available / GIB:,.1f} GiB available; use a smaller model")


def _available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else None (no check)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_files(args: argparse.Namespace, plan) -> None:
    from partita.executor.data import DataSpec, check_token_file
    if args.data:
        check_token_file(DataSpec(plan.arch, plan.seq_len, plan.vocab, args.seed, args.data))


def _check_outputs(args: argparse.Namespace, out: Path) -> None:
    """Where the results go must be writable before training starts, so that a finished run is
    never lost to a bad path (and an existing weights file is not overwritten)."""
    flag = "--out" if args.out else "output directory"
    if out.exists() and not out.is_dir():
        raise PartitaError(f"{flag} {out}: exists and is not a directory (--out names a directory "
                           "for metrics.jsonl, trace.json and result.json)")
    _check_writable(flag, out if out.is_dir() else _existing_parent(out))
    if args.save_weights:
        weights = Path(args.save_weights)
        if weights.is_dir():
            raise PartitaError(f"--save-weights {weights}: is a directory; give a file name "
                               f"(e.g. {weights / 'weights.pt'})")
        if weights.exists() or weights.is_symlink():
            raise PartitaError(f"--save-weights {weights}: already exists; remove it or choose "
                               "another file name (partita does not overwrite it)")
        if not weights.resolve().parent.is_dir():
            raise PartitaError(f"--save-weights {args.save_weights}: no such directory "
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
    import os
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PartitaError(f"{flag}: cannot write in {directory} (permission denied)")


def _check_checkpoints(args: argparse.Namespace, scenario) -> None:
    """Refuse before launch what would fail or overwrite a checkpoint later."""
    if not args.checkpoint_dir:
        for flag, given in (("--checkpoint-every", args.checkpoint_every), ("--resume", args.resume)):
            if given:
                raise PartitaError(f"{flag} needs --checkpoint-dir DIR")
        return
    from partita.executor.checkpoint import latest_checkpoint, plan_fingerprint
    where = Path(args.checkpoint_dir)
    if where.exists() and not where.is_dir():
        raise PartitaError(f"--checkpoint-dir {where}: exists and is not a directory")
    latest = latest_checkpoint(where, fingerprint=plan_fingerprint(scenario))
    if latest is not None and not args.resume:
        raise PartitaError(f"--checkpoint-dir {where} already holds step {latest} of this plan; "
                           "pass --resume to continue from it, or choose another directory")
    if args.resume and latest is None:
        raise PartitaError(f"--resume: no intact checkpoint of this plan in {where} to resume "
                           "from; run without --resume to start afresh")
    if args.resume and latest is not None and latest >= args.steps:
        raise PartitaError(f"--resume: the latest checkpoint is step {latest}, already at --steps "
                           f"{args.steps}; ask for more steps")


def predict(scenario, args: argparse.Namespace) -> tuple[float | None, str | None, list | None]:
    """The simulator's step time and memory per pipeline stage, or (None, why, None) when this
    machine has no calibration."""
    from partita.executor.measure import predicted_stage_memory
    from partita.simulator.step import simulate
    catalog = catalog_from_args(args)
    if scenario.cluster.system.lower() != "local":
        result = simulate(scenario, catalog)
        return result.step_time_s, None, predicted_stage_memory(result)
    if "local" not in catalog.system_names():
        return None, ("no prediction: this machine is not calibrated (no catalog system "
                      "'local'); run `partita calibrate` first"), None
    try:
        result = simulate(scenario, catalog)
    except PartitaError as exc:
        return None, f"no prediction ({exc}); run `partita calibrate` to measure this machine", None
    return result.step_time_s, None, predicted_stage_memory(result)


def memory_lines(r: dict) -> list[str]:
    from partita.executor.measure import format_memory
    return format_memory(r.get("memory"))


def format_table(r: dict) -> str:
    p = r["plan"]
    lines = [f"{r['scenario']}: {r['world']} processes ({r['backend']}, {r['device']})  "
             f"TP {p['tensor']} x PP {p['pipeline']} x DP {p['data']}, {p['schedule']}"
             + (f" (v={p['virtual_stages']})" if p["virtual_stages"] > 1 else "")
             + (f", ZeRO-{p['zero']}" if p["zero"] else "")
             + f", {p['microbatches']} micro-batches of {p['micro_batch']}",
             f"  {'step':>5}  {'loss':>10}  {'time s':>9}  {'tokens/s':>10}"]
    tokens = r["tokens_per_step"]
    for i, (step, loss, t) in enumerate(zip(r["steps"], r["losses"], r["step_times_s"])):
        warm = "  (warm-up)" if i < r["warmup_steps"] else ""
        lines.append(f"  {step:>5}  {loss:>10.5f}  {t:>9.4f}  {tokens / t:>10.1f}{warm}")
    pred = r["predicted_step_time_s"]
    versus = (f"   predicted {pred:.4f} s (measured / predicted {r['median_step_time_s'] / pred:.2f})"
              if pred else "   predicted: none")
    lines += [f"  median step time {r['median_step_time_s']:.4f} s{versus}",
              f"  throughput       {r['tokens_per_s']:.1f} tokens/s",
              *memory_lines(r),
              f"  outputs in {r['out_dir']}: metrics.jsonl, trace.json, result.json"]
    return "\n".join(lines)
