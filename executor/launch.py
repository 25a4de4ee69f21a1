"""Starting the processes of `partita run` under torchrun and reading back what they produced.

`preflight.prepare_run` checks everything first; then `launch(job, rendezvous)` writes the job to a
temporary directory, runs

    python -m torch.distributed.run --standalone --nproc-per-node N -m partita.executor.worker --job JOB.json

(or, across machines, torchrun's rendezvous flags instead of --standalone), relays the workers'
output to stderr, and returns rank 0's result. A worker that meets bad input (a `PartitaError`)
writes its message to the temporary directory; the launcher raises it here, so the user sees one
`error:` line. No torch import here: torchrun runs in the child process.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from partita.planner.errors import PartitaError

RESULT_FILE = "result.json"
JOB_PREFIX = "partita-run-"          # + <launcher pid>-<random>: the temporary job folder
# [Note: restart store] With torchrun's default shared rendezvous store, workers restarted after a
# failure (--max-restarts) can read the dead attempt's gloo addresses and fail with "Gloo
# connectFullMesh failed ... Connection refused": 4 of 4 restarts under CPU contention on torch
# 2.13, 0 of 4 with a fresh store per attempt, which this variable asks for.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class Job:
    """Everything a worker needs, written as JSON for `executor.worker`."""
    scenario: str                  # path of the scenario file
    world: int                     # processes in all
    steps: int                     # the run ends after this optimizer step (1-based, total)
    backend: str = "gloo"
    seed: int = 0
    lr: float = 1e-3
    data: str | None = None        # token file; None: synthetic tokens
    out_dir: str = "partita-run"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    save_weights: str | None = None
    predicted_step_time_s: float | None = None
    predicted_memory_bytes: list[int] | None = None   # the simulator's, per pipeline stage (rank)
    host_load: dict | None = None  # this machine's load before launch (executor/hostload.py)
    error_dir: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_file(cls, path: str | Path) -> "Job":
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's multi-machine flags; `nnodes` None means one machine (--standalone)."""
    nnodes: int | None = None
    node_rank: int = 0
    endpoint: str | None = None
    backend: str = "c10d"
    run_id: str = "partita"
    max_restarts: int = 0

    @property
    def standalone(self) -> bool:
        return self.nnodes is None


def torchrun_command(job_path: Path, nproc_per_node: int, rdzv: Rendezvous) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc_per_node)]
    if rdzv.standalone:
        cmd.append("--standalone")
    else:
        cmd += ["--nnodes", str(rdzv.nnodes), "--node-rank", str(rdzv.node_rank),
                "--rdzv-backend", rdzv.backend, "--rdzv-id", rdzv.run_id]
        if rdzv.endpoint:
            cmd += ["--rdzv-endpoint", rdzv.endpoint]
    if rdzv.max_restarts:
        cmd += ["--max-restarts", str(rdzv.max_restarts)]
    return cmd + ["-m", "partita.executor.worker", "--job", str(job_path)]


def launch(job: Job, nproc_per_node: int, rdzv: Rendezvous, log: TextIO | None = None) -> dict | None:
    """Run the job; rank 0's result (None on a node that does not hold rank 0)."""
    log = log or sys.stderr
    out_dir = Path(job.out_dir)
    (out_dir / RESULT_FILE).unlink(missing_ok=True)
    _remove_orphans()
    with tempfile.TemporaryDirectory(prefix=f"{JOB_PREFIX}{os.getpid()}-") as tmp:
        job = Job(**{**asdict(job), "error_dir": tmp})
        job_path = Path(tmp) / "job.json"
        job_path.write_text(job.to_json(), encoding="utf-8")
        status = _stream(torchrun_command(job_path, nproc_per_node, rdzv), log)
        errors = sorted(Path(tmp).glob("error-rank*.txt"), key=lambda p: int(p.stem[10:]))
        if errors:
            raise PartitaError(errors[0].read_text(encoding="utf-8").strip())
    if status != 0:
        raise PartitaError(f"the run failed: torchrun exited with status {status} "
                           "(the workers' output is above)")
    result = out_dir / RESULT_FILE
    return json.loads(result.read_text(encoding="utf-8")) if result.exists() else None


def _remove_orphans() -> None:
    """Job folders of launchers that were killed outright (SIGKILL runs no clean-up): a folder
    is named after its launcher's process id and removed once that process is gone."""
    root = Path(tempfile.gettempdir())
    try:
        entries = list(root.glob(f"{JOB_PREFIX}*-*"))
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(JOB_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or not entry.is_dir() or entry.is_symlink():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue


def _die_with_parent() -> None:
    """In the torchrun child: be sent SIGTERM if the launcher dies, even by SIGKILL (Linux), so no
    workers outlive it; torchrun stops its workers on SIGTERM."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stream(cmd: list[str], log: TextIO) -> int:
    """Run `cmd`, copying its output line by line to `log`; its exit status. If this process is
    interrupted or terminated, torchrun is terminated too (it stops its workers)."""
    env = {**os.environ, **TORCHRUN_ENV}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env=env,
                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        for line in proc.stdout:
            log.write(line)
        return proc.wait()
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            proc.terminate()
            proc.wait()


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)
