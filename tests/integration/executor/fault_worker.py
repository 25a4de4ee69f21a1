"""A torchrun worker for the recovery tests: a 2-stage MLP pipeline (Schedule1F1B, Adam, fp32, gloo)
that checkpoints with executor.checkpoint every K steps, resumes from the newest checkpoint on start,
and can be killed mid-step through executor.faults (`PARTITA_FAULT_AT_STEP`).

    python -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 1 \
        tests/integration/executor/fault_worker.py --steps 6 --checkpoint-dir CK \
        --checkpoint-every 1 --out OUT

Writes OUT/rank<R>.pt (the stage's final weights) and OUT/attempts.jsonl (one line per attempt from
rank 0: torchrun's restart count and the step it resumed from), which the tests compare against an
uninterrupted run. The batches depend only on the step number, so a resumed run sees the same data.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from partita.executor.checkpoint import (latest_checkpoint, load_checkpoint, plan_fingerprint,
                                 save_checkpoint)
from partita.executor.faults import maybe_inject_fault
from partita.planner.scenario import parse_scenario

IN, WIDTH, OUT = 16, 32, 8
MICROBATCHES, MICRO_BATCH = 4, 2
SCENARIO = {
    "name": "fault-worker",
    "model": {"module": "tests.integration.executor.fault_worker:build_model", "seq_len": 1,
              "vocab": IN},
    "cluster": {"system": "local", "gpus": 2},
    "training": {"global_batch": MICROBATCHES * MICRO_BATCH, "micro_batch": MICRO_BATCH,
                 "precision": "fp32", "optimizer": "adam"},
    "parallel": {"pipeline": 2, "schedule": "1f1b"},
}


def build_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(),
                         nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, OUT))


def stage_module(rank: int) -> nn.Sequential:
    layers = list(build_model())                   # every rank builds the same weights
    cut = 4                                        # stage 0: layers [0, 4), stage 1: [4, 7)
    return nn.Sequential(*(layers[:cut] if rank == 0 else layers[cut:]))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    rows = MICROBATCHES * MICRO_BATCH
    return torch.randn(rows, IN, generator=gen), torch.randn(rows, OUT, generator=gen)


def fault_hooks(module: nn.Module, current: list[int]) -> None:
    """Offer a fault in every micro-batch's forward and backward of the current step."""
    def on_forward(_module, _inputs, output):
        maybe_inject_fault(current[0], "forward")
        if output.requires_grad:
            output.register_hook(lambda grad: maybe_inject_fault(current[0], "backward"))
    module.register_forward_hook(on_forward)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    module = stage_module(rank)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=nn.functional.mse_loss)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    fingerprint = plan_fingerprint(parse_scenario(SCENARIO, origin="fault_worker"))
    start = resume(args.checkpoint_dir, module, optimizer, fingerprint)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        with open(out / "attempts.jsonl", "a", encoding="utf-8") as fh:
            attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
            fh.write(json.dumps({"attempt": attempt, "resumed_from": start or None}) + "\n")
    current = [0]
    fault_hooks(module, current)
    for step in range(start + 1, args.steps + 1):
        current[0] = step
        x, y = batch(step)
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        maybe_inject_fault(step, "optimizer")
        optimizer.step()
        optimizer.zero_grad()
        if args.checkpoint_dir and step % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint_dir, step, [module], optimizer,
                            fingerprint=fingerprint, extra={"step": step})
    torch.save(module.state_dict(), out / f"rank{rank}.pt")
    dist.destroy_process_group()


def resume(directory: str | None, module: nn.Module, optimizer, fingerprint: str) -> int:
    """The step to continue after: the newest complete checkpoint's, or 0."""
    if not directory:
        return 0
    step = latest_checkpoint(directory, fingerprint=fingerprint)
    if step is None:
        return 0
    extra = load_checkpoint(directory, step, [module], optimizer, fingerprint=fingerprint)
    if extra["step"] != step:
        raise RuntimeError(f"checkpoint {step} carries step {extra['step']}")
    return step


if __name__ == "__main__":
    main()
