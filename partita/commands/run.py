"""`partita run FILE [--steps N] [--backend gloo|nccl] [--json] ...`: execute the scenario's plan for real.

    partita run tiny-gpt-pp2 --steps 10                 # 2 processes on this machine (gloo)
    partita run plan.yaml --backend nccl --json         # cluster: {system: local, gpus: 8}, on GPUs
    partita run plan.yaml --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29500   # on each node

Everything is checked before a process starts (executor.preflight: the scenario and its plan,
the token file, the checkpoint directory, the backend); then torchrun runs `executor.worker` on
every rank and this prints the measured step times next to the simulator's prediction. Outputs go
to --out DIR (default ./partita-run/<name>/): metrics.jsonl, trace.json, result.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from partita.commands import add_catalog_option, catalog_file


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
    from partita.executor.launch import launch
    from partita.executor.preflight import prepare_run

    prepared = prepare_run(request(args))
    for line in prepared.notes:
        print(f"note: {line}", file=sys.stderr)
    result = launch(prepared.job, prepared.nproc, prepared.rendezvous)
    if result is None:
        print(f"this node's ranks finished; rank 0 (node 0) has the results in {prepared.out}",
              file=sys.stderr)
        return 0
    if args.json:
        print(json.dumps(result))
    else:
        print(format_table(result))
    return 0


def request(args: argparse.Namespace):
    """The parsed command line as the executor's RunRequest."""
    from partita.executor.preflight import RunRequest
    return RunRequest(file=args.file, steps=args.steps, backend=args.backend, out=args.out,
                      data=args.data, seed=args.seed, lr=args.lr, save_weights=args.save_weights,
                      checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                      resume=args.resume, nnodes=args.nnodes, node_rank=args.node_rank,
                      rdzv_endpoint=args.rdzv_endpoint, rdzv_backend=args.rdzv_backend,
                      rdzv_id=args.rdzv_id, max_restarts=args.max_restarts,
                      catalog=catalog_file(args))


def format_table(r: dict) -> str:
    from partita.executor.measure import format_memory
    p = r["plan"]
    lines = [f"{r['scenario']}: {r['world']} processes ({r['backend']}, {r['device']})  "
             f"TP {p['tensor']} x PP {p['pipeline']} x CP {p.get('context', 1)} x DP {p['data']}, "
             f"{p['schedule']}"
             + (f" (v={p['virtual_stages']})" if p["virtual_stages"] > 1 else "")
             + (f", ZeRO-{p['zero']}" if p["zero"] else "")
             + (f" in shards of {p['data_shard']}" if p.get("data_shard") else "")
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
              *format_memory(r.get("memory")),
              f"  outputs in {r['out_dir']}: metrics.jsonl, trace.json, result.json"]
    return "\n".join(lines)
