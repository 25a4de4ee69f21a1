"""The process torchrun starts for each rank of `partita run`: `python -m partita.executor.worker --job FILE`.

It reads the job, joins the process group (gloo on CPU, NCCL on CUDA device LOCAL_RANK), runs
`executor.train.run_rank` and leaves. Bad input met here (a checkpoint of another plan, a token
file that vanished) is written to the job's error directory for the launcher to report as one
`error:` line; anything else keeps its traceback, because it is a bug.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from partita.executor.launch import Job
from partita.planner.errors import PartitaError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m partita.executor.worker")
    parser.add_argument("--job", required=True, help="job file written by `partita run`")
    job = Job.from_file(parser.parse_args(argv).job)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    import torch
    import torch.distributed as dist
    from partita.executor.train import run_rank
    device = None
    if job.backend == "nccl":
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
    dist.init_process_group(job.backend, device_id=device)
    try:
        run_rank(job, rank, local_rank)
    except PartitaError as exc:
        if job.error_dir:
            Path(job.error_dir, f"error-rank{rank}.txt").write_text(str(exc), encoding="utf-8")
        print(f"rank {rank}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _exit(code: int) -> None:
    """Leave without running C++ static destructors: after a run with FSDP2 on gloo, about one
    exit in ten under CPU contention aborted there ("terminate called without an active
    exception", no Python frame left) although every file was written and the process group
    destroyed. Python's own buffers are flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
