"""`partita calibrate`: measure this machine and describe it as the catalog system `local`.

N processes (the N of `cluster: {system: local, gpus: N}`) start at once on this machine, each with
the CPU threads one of N would get (or one CUDA device each), and run executor.microbench: matmul
rates by size and precision, copy bandwidth by size, a GPT block's elementwise kernels by size,
attention, the smallest op's time, a send/recv ping-pong and an all-reduce by message size. From
these executor/machine_files.py writes two documents:

- the catalog entry (planner/catalog.py's format): GPU `local-cpu` (or `local-cuda`) with the
  measured matmul rate as its peak (`measured_matmul_tflops`), copy bandwidth, memory per
  process; system `local` (kind local, gpus_per_node N) whose intra-node link has the measured
  send/recv bandwidth and per-step latency;
- the calibration overlay (simulator/calibration.py's format): that GPU's matmul efficiency curve
  (measured points against the best rate), memory efficiency by size (the elementwise kernels'
  rate against the best copy rate: on a CPU these kernels are not bound by memory, so a plain copy
  would flatter them), attention efficiencies and op floor, and the `local` link tier (latencies
  and half-bandwidth size).

[Note: fitting the link] The simulator's model of one message of S bytes (simulator/network.py) is
    p2p(S)        = base + step + S / (bw * ramp(S)),   ramp(S) = S / (S + n_half)
    allreduce(S)  = base + 2(N-1) step + c + 2(N-1)/N * S / (bw * ramp(S))    (ring, one node)
For S >> n_half, p2p(S) = base + step + (S + n_half) / bw: a line whose slope gives bw (least
squares over the messages of at least 1 MiB) and whose intercept, less the measured small-message
latency (base + step), gives n_half / bw (Hockney's n_1/2). The small all-reduce adds 2N-3 steps
to the small send/recv, which gives the step latency and then base; where that would make base
negative, step is the send's latency. c, the per-collective overhead, is the median over the
all-reduces of 1 KiB to 256 KiB of what they took beyond the ring's latency and transfer: gloo's ring
(gloo/allreduce.cc `ring`) cuts any buffer into at least 2N segments and runs a send/recv round per
segment, 4(N-1) rounds each waiting on the process group's communication thread; a 4-byte
all-reduce has one non-empty segment and skips the rest, so it is no measure of c (the simulator
charges a buffer of fewer than 2N elements its share of c: simulator/network.py
`_call_overhead`). The all-reduces of 1 MiB and more then give the ring's transfer rate against a
send's (the median ratio, at most 1: gloo reduces each segment and copies on the CPU between its
sends): `collective_efficiency`. Efficiency is 1: bw is what was achieved, not a wire rate.
"""
from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from partita.planner.errors import PartitaError
from partita.planner.units import GIB, KIB, MIB

CPU_PRECISIONS = ("fp32", "bf16")
CUDA_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


@dataclass(frozen=True)
class Machine:
    hostname: str
    date: str
    device: str                      # cpu | cuda
    device_name: str
    processes: int
    threads: int                     # per process (CPU)
    memory_bytes: int                # per process: host memory / N, or the CUDA device's
    host_memory_bytes: int
    vcpus: int
    torch_version: str
    backend: str                     # gloo | nccl

    @property
    def source(self) -> str:
        return f"partita calibrate {self.date} on {self.hostname}"

    @property
    def gpu_name(self) -> str:
        return f"local-{self.device}"


@dataclass(frozen=True)
class LinkFit:
    """The `local` link in the simulator's terms (see [Note: fitting the link])."""
    bytes_per_s: float
    step_latency_s: float
    base_latency_s: float
    half_bandwidth_bytes: float
    p2p_small_s: float
    allreduce_small_s: float
    collective_overhead_s: float = 0.0     # per collective call beyond the ring's steps
    collective_efficiency: float = 1.0     # the ring all-reduce's transfer rate / a send's


@dataclass(frozen=True)
class Calibrated:
    machine: Machine
    matmul: dict[str, list[list[float]]]   # precision -> [[m, n, k, FLOP/s], ...]
    copy: list[list[float]]                # [[bytes moved, bytes/s], ...]
    elementwise: list[list[float]]         # [[tokens, hidden, forward s, forward+backward s], ...]
    attention: dict[str, Any]              # shape, forward_s, forward_backward_s
    op_floor_s: float
    p2p: list[list[float]]                 # [[bytes, one-way s], ...]; empty for one process
    allreduce: list[list[float]]           # [[bytes per rank, s], ...]
    link: LinkFit | None
    op_dispatch_s: float = 0.0             # host seconds to issue one op (microbench.op_dispatch)
    # executor.hostbench: host seconds per kernel of a GPT block pass ({forward_per_kernel_s,
    # backward_per_kernel_s, forward_kernels, backward_kernels}) and per parameter tensor of an
    # optimizer step, by optimizer; empty where not measured
    block_host: dict[str, float] = field(default_factory=dict)
    optimizer_step_per_tensor_s: dict[str, float] = field(default_factory=dict)
    # executor.pipeline_fit: host seconds per pipeline action, by schedule (CPU, >= 2 processes)
    pipeline_action_s: dict[str, float] = field(default_factory=dict)
    # executor.hostbench.handoff_stall: [[compute s, stall s], ...] (CPU, >= 2 processes)
    handoff_stall: list[list[float]] = field(default_factory=list)

    def best_flops(self, precision: str) -> float:
        return max(rate for *_, rate in self.matmul[precision])

    @property
    def memory_bytes_per_s(self) -> float:
        """The best copy rate (in cache on a CPU); the efficiency curve scales it down by size."""
        return max(rate for _, rate in self.copy)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def threads_per_process(processes: int) -> int:
    """CPU threads for one of `processes` processes sharing this machine (at least 1)."""
    return max(1, (os.cpu_count() or 1) // processes)


# ---------------------------------------------------------------- measuring

def calibrate(processes: int, *, quick: bool = False, device: str | None = None) -> Calibrated:
    """Measure with `processes` processes on `device` (default: cuda if available, else cpu)."""
    import torch
    machine = describe_machine(processes, device or ("cuda" if torch.cuda.is_available() else "cpu"))
    plan = make_plan(machine, quick)
    ranks = _spawn(plan, processes)
    return combine(machine, ranks)


def describe_machine(processes: int, device: str) -> Machine:
    import torch
    if processes < 1:
        raise PartitaError(f"--gpus: expected a number of processes >= 1, got {processes}")
    host_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise PartitaError("--device cuda: no CUDA device is visible (torch "
                               f"{torch.__version__}); use --device cpu")
        count = torch.cuda.device_count()
        if processes > count:
            raise PartitaError(f"--gpus {processes}: this machine has {count} CUDA device(s); "
                               "NCCL needs one device per process")
        props = torch.cuda.get_device_properties(0)
        name, memory, threads, backend = props.name, props.total_memory, 1, "nccl"
    elif device == "cpu":
        name, memory = _cpu_name(), host_memory // processes
        threads, backend = threads_per_process(processes), "gloo"
    else:
        raise PartitaError(f"--device: expected cpu or cuda, got {device!r}")
    return Machine(hostname=socket.gethostname(), date=dt.date.today().isoformat(), device=device,
                   device_name=name, processes=processes, threads=threads, memory_bytes=int(memory),
                   host_memory_bytes=int(host_memory), vcpus=os.cpu_count() or 1,
                   torch_version=torch.__version__, backend=backend)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def make_plan(machine: Machine, quick: bool):
    """Sizes and timing for the device: `quick` takes a few seconds, the full plan under a minute
    on 2 CPU cores."""
    import torch
    from partita.executor.microbench import Plan
    if machine.device == "cuda":
        precisions = [p for p in CUDA_PRECISIONS if _cuda_supports(p)]
        sizes = [512, 2048] if quick else [256, 512, 1024, 2048, 4096, 8192]
        copies = [MIB, 64 * MIB] if quick else [MIB, 16 * MIB, 256 * MIB, GIB]
        tokens, hidden = ([1024, 16384] if quick else [256, 1024, 4096, 16384]), 1024
        attention = (4, 16, 1024, 64)
    else:
        native_bf16 = (torch.backends.mkldnn.is_available()
                       and torch.ops.mkldnn._is_mkldnn_bf16_supported())
        precisions = ["fp32"] + (["bf16"] if native_bf16 and not quick else [])
        sizes = [64, 256] if quick else [32, 64, 128, 256, 512, 1024, 2048]
        copies = [MIB, 16 * MIB] if quick else [64 * 1024, MIB, 8 * MIB, 64 * MIB, 256 * MIB]
        tokens, hidden = ([64, 1024] if quick else [16, 64, 256, 1024, 4096]), 256
        attention = (2, 4, 128, 32)
    messages = [4, 256 * 1024, MIB, 4 * MIB] if quick else [4, 1024, 64 * 1024, 256 * 1024, MIB,
                                                             4 * MIB, 16 * MIB, 64 * MIB]
    return Plan(device=machine.device, backend=machine.backend, threads=machine.threads,
                matmul_sizes={p: sizes for p in precisions}, copy_bytes=copies,
                elementwise_tokens=tokens, elementwise_hidden=hidden,
                message_bytes=messages, attention_shape=attention,
                min_s=0.005 if quick else 0.05, repeats=3 if quick else 5)


def _cuda_supports(precision: str) -> bool:
    import torch
    major, _ = torch.cuda.get_device_capability(0)
    return {"fp32": True, "tf32": major >= 8, "fp16": major >= 7,
            "bf16": torch.cuda.is_bf16_supported()}[precision]


def _spawn(plan, processes: int) -> list[dict]:
    """Run `python -m partita.executor.microbench` as ranks 0..N-1 at once; their results, by rank."""
    import json
    import subprocess
    import sys
    from partita.executor.microbench import plan_to_json
    with tempfile.TemporaryDirectory(prefix="partita-calibrate-") as tmp:
        plan_file = Path(tmp, "plan.json")
        plan_file.write_text(plan_to_json(plan), encoding="utf-8")
        procs = [subprocess.Popen([sys.executable, "-m", "partita.executor.microbench", "--rank", str(r),
                                   "--world", str(processes), "--plan", str(plan_file),
                                   "--store", f"{tmp}/store", "--out", tmp],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(processes)]
        outputs = [p.communicate()[0] for p in procs]
        for r, (proc, text) in enumerate(zip(procs, outputs)):
            if proc.returncode != 0:
                raise RuntimeError(f"calibration rank {r} failed with status {proc.returncode}:\n"
                                   f"{text[-3000:]}")
        return [json.loads(Path(tmp, f"rank{r}.json").read_text(encoding="utf-8"))
                for r in range(processes)]


# ---------------------------------------------------------------- combining and fitting

def combine(machine: Machine, ranks: list[dict]) -> Calibrated:
    """Device figures: the mean over the ranks (all ran at once); links: rank 0's timings."""
    def mean_rows(rows_by_rank: list[list[list[float]]]) -> list[list[float]]:
        return [row[:-1] + [sum(r[i][-1] for r in rows_by_rank) / len(rows_by_rank)]
                for i, row in enumerate(rows_by_rank[0])]

    matmul = {p: mean_rows([r["matmul"][p] for r in ranks]) for p in ranks[0]["matmul"]}
    attention = dict(ranks[0]["attention"])
    for key in ("forward_s", "forward_backward_s"):
        attention[key] = sum(r["attention"][key] for r in ranks) / len(ranks)
    p2p, allreduce = ranks[0].get("p2p", []), ranks[0].get("allreduce", [])
    elementwise = [row[:2] + [sum(r["elementwise"][i][j] for r in ranks) / len(ranks)
                              for j in (2, 3)]
                   for i, row in enumerate(ranks[0]["elementwise"])]
    # A measured matmul is a kernel too: the floor (the shortest kernel) cannot exceed the
    # fastest of them, or the simulator would predict that matmul slower than it ran.
    fastest = min(2.0 * m * n * k / rate for rows in matmul.values() for m, n, k, rate in rows)
    link = fit_link(p2p, allreduce, machine.processes) if p2p else None
    return Calibrated(machine=machine, matmul=matmul, copy=mean_rows([r["copy"] for r in ranks]),
                      elementwise=elementwise,
                      attention=attention,
                      op_floor_s=min(sum(r["op_floor_s"] for r in ranks) / len(ranks), fastest),
                      p2p=p2p, allreduce=allreduce,
                      link=link,
                      op_dispatch_s=_mean(ranks, "op_dispatch_s"),
                      block_host={k: _mean([r.get("block_host", {}) for r in ranks], k)
                                  for k in ranks[0].get("block_host", {})},
                      optimizer_step_per_tensor_s={
                          k: _mean([r.get("optimizer_step_per_tensor_s", {}) for r in ranks], k)
                          for k in ranks[0].get("optimizer_step_per_tensor_s", {})},
                      pipeline_action_s=_pipeline_actions(ranks[:2 * (len(ranks) // 2)], link),
                      handoff_stall=mean_rows([r["handoff_stall"]
                                               for r in ranks[:2 * (len(ranks) // 2)]])
                      if ranks[0].get("handoff_stall") else [])


def _pipeline_actions(paired: list[dict], link: LinkFit | None) -> dict[str, float]:
    """Host seconds per action of each timed schedule (executor.pipeline_fit), from the paired
    ranks' timings averaged, each stage-to-stage transfer a small send's one-way time."""
    from partita.executor.pipeline_fit import action_seconds
    timed = [r["pipeline_timings"] for r in paired if r.get("pipeline_timings")]
    if not timed or link is None:
        return {}
    out = {}
    for name, first in timed[0].items():
        runs = [t[name] for t in timed]
        mean = dict(first, step_s=[sum(r["step_s"][i] for r in runs) / len(runs)
                                   for i in range(len(first["step_s"]))],
                    forward_s=sum(r["forward_s"] for r in runs) / len(runs),
                    backward_s=sum(r["backward_s"] for r in runs) / len(runs))
        out[name] = action_seconds(name, mean, link.p2p_small_s)
    return out


def _mean(results: list[dict], key: str) -> float:
    """The mean of `key` over the ranks' results (0 where a rank lacks it)."""
    return sum(r.get(key, 0.0) for r in results) / len(results)


OVERHEAD_BYTES = (KIB, 256 * KIB)    # all-reduce sizes that give the per-collective overhead


def fit_link(p2p: list[list[float]], allreduce: list[list[float]], world: int) -> LinkFit:
    """Bandwidth, latencies and n_1/2 from the measurements ([Note: fitting the link])."""
    large = [(s, t) for s, t in p2p if s >= MIB] or sorted(p2p)[-2:]
    bw, intercept = _line(large)
    p2p_small, ar_small = min(p2p)[1], min(allreduce)[1]
    base, step = _latencies(p2p_small, ar_small, world)
    ring = base + 2 * (world - 1) * step
    excess = [t - ring - 2 * (world - 1) / world * s / bw for s, t in allreduce
              if OVERHEAD_BYTES[0] <= s <= OVERHEAD_BYTES[1]]
    overhead = max(0.0, statistics.median(excess) if excess else ar_small - ring)
    n_half = max(0.0, (intercept - p2p_small) * bw)

    from partita.simulator.network import LL_BANDWIDTH_FRACTION

    def transfer(s: float) -> float:        # the ring's transfer at a send's rate (network.py)
        ramp = s / (s + n_half) if n_half > 0 else 1.0
        return 2 * (world - 1) / world * s / (bw * max(ramp, LL_BANDWIDTH_FRACTION))
    rates = [transfer(s) / (t - ring - overhead) for s, t in allreduce
             if s >= MIB and t > ring + overhead]
    efficiency = min(1.0, statistics.median(rates)) if rates and world > 1 else 1.0
    return LinkFit(bytes_per_s=bw, step_latency_s=step, base_latency_s=base,
                   half_bandwidth_bytes=n_half, p2p_small_s=p2p_small, allreduce_small_s=ar_small,
                   collective_overhead_s=overhead if world > 1 else 0.0,
                   collective_efficiency=efficiency)


def _latencies(p2p_small: float, ar_small: float, world: int) -> tuple[float, float]:
    """(base, step) with base + step = p2p and base + 2(N-1) step = all-reduce. When that needs a
    negative base (the all-reduce is more than 2(N-1) times a send: torch's gloo process group
    hands every collective to a worker thread and waits for it, which a send does not), base is 0
    and step = p2p: sends stay exact, and the rest of the small all-reduce is the link's
    per-collective overhead (`LinkFit.collective_overhead_s`, set by `fit_link`)."""
    if world < 2:
        return p2p_small, 0.0
    step = (ar_small - p2p_small) / (2 * world - 3)
    if step <= 0:                    # noise on a busy machine: the all-reduce timed below a send;
        return p2p_small / 2, p2p_small / 2     # split the send between the two terms
    if step > p2p_small:
        return 0.0, p2p_small
    return p2p_small - step, step


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """t = a + s / bw by least squares on relative error (weights 1/t^2, so that 1 MiB counts as
    much as 64 MiB); returns (bw, a). One point or no rising slope: bw = s / t, a = 0."""
    if len(points) >= 2:
        w = [1.0 / (t * t) for _, t in points]
        sw = sum(w)
        ms = sum(wi * s for wi, (s, _) in zip(w, points)) / sw
        mt = sum(wi * t for wi, (_, t) in zip(w, points)) / sw
        var = sum(wi * (s - ms) ** 2 for wi, (s, _) in zip(w, points))
        slope = sum(wi * (s - ms) * (t - mt) for wi, (s, t) in zip(w, points)) / var if var else 0.0
        if slope > 0:
            return 1.0 / slope, mt - slope * ms
    s, t = max(points)
    return s / t, 0.0
