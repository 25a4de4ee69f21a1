"""Host-side cost of a transformer block's operators: dispatch and kernel launch against device time.

Every kernel-launching PyTorch operator costs the host `op_dispatch_s` in the forward (Python,
module calls, dispatcher, autograd recording, the view and layout ops around it) and
`backward_op_dispatch_s` in the backward (the autograd engine's node), both measured per kernel on a
whole transformer block on a GPU machine's host (benchmarks/gpu_prediction.py --host; on `local`,
`partita calibrate` measures this machine's), and each kernel a launch (`launch_s`) before the GPU
can run it (data/calibration/host.yaml). Launches are asynchronous, so the host runs ahead while the
GPU works: a block pass costs max(device, host) and the host is exposed only where it is the
bottleneck (small models, small micro-batches). With CUDA_LAUNCH_BLOCKING=1
(`training.launch_blocking`) every launch waits for its kernel, so each kernel's host time and a
synchronisation wait (`launch_blocking_wait_s`) add to the device time. Where the host waits for the
GPU mid-block (flash-attn's unpadding: a nonzero's count, an `.item()`; `simulator.unpad`), the GPU
idles from each wait's return until the host has issued the ops up to the next one (`sync_stall`).
On a device whose kernels run inside the dispatching call (a CPU: `synchronous`, `partita calibrate`
on a machine without CUDA) nothing overlaps either: the host's time beyond the kernel's own adds to
it. An optimizer step costs the host `optimizer_step_per_tensor_s` per parameter tensor where the
optimizer loops over tensors (torch's single-tensor implementations, which torch picks for CPU
tensors); the multi-tensor and fused optimizers of GPU training launch a few kernels for all tensors
together and none is charged. Megatron-LM 2019's FP16_Optimizer loops over them pass by pass and
waits for the GPU twice per tensor (`simulator.fp16optimizer`), its ops at `optimizer_op_s` each;
the unpadding's at `unpad_op_s`: small functional ops, each a measured fraction of a block kernel's
dispatch. A pipeline schedule's own work per action (posting and waiting on sends and receives,
bookkeeping: `pipeline_action_s`, found by `partita calibrate` for each runtime of the executor's
torch.distributed.pipelining schedules, executor/pipeline_fit.py) adds to each stage's forward and
backward. On a machine whose cores are all busy computing (`partita calibrate` on a CPU with as many
processes as cores), each action's exchange also waits for the receiving process's communication
thread to get a core (gloo moves bytes on a thread of its own): until the scheduler preempts the
compute, up to a scheduler tick (4 ms at CONFIG_HZ=250). The wait grows with the compute the thread
competes with; `handoff_stall_s` holds it as measured by compute (executor.hostbench
`handoff_stall`) and an action of a schedule that exchanges as that benchmark does (FUSED_EXCHANGE)
pays it at its own compute time; for torch's multi-stage runtime the stall of its separate waits is
not told apart from its measured work per action (README, `local`).

Kernels per block forward (`forward_kernels`), counted from Megatron-LM's GPT block
(megatron/core/transformer/transformer_layer.py with its fused kernels): two layer norms, four GEMMs
(QKV, attention output, MLP in, MLP out), the attention core (one fused flash kernel, or batched
QK^T, the fused scale-mask-softmax, dropout and PV: four; eager, QK^T, scale, mask multiply,
mask subtract, softmax, dropout and PV: seven), the activation, two bias-dropout-add
residuals and two layout copies of q/k/v (split heads, transpose); one collective per tensor-parallel
all-reduce (two per forward, a T5 decoder three) or, with sequence parallelism, one all-gather and
one reduce-scatter each. A T5 decoder block adds its cross-attention (one layer norm, two GEMMs, the
attention core, one residual). The backward launches about two kernels per forward kernel (input
and weight gradients of every GEMM; elementwise backwards read two inputs): BACKWARD_KERNELS_PER_FORWARD.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from partita.planner.documents import Checker
from partita.planner.paths import CALIBRATION_DIR
from partita.planner.provenance import load_by_provenance

HOST_FILE = CALIBRATION_DIR / "host.yaml"
KEYS = ("op_dispatch_us", "backward_op_dispatch_us", "launch_us", "launch_blocking_wait_us",
        "unpad_op_dispatch_fraction", "optimizer_op_dispatch_fraction", "source")
BACKWARD_KERNELS_PER_FORWARD = 2
# The schedule whose measured work per action stands for another's: torch runs GPipe with 1F1B's
# runtime (PipelineScheduleSingle) and zero bubble with interleaved 1F1B's (PipelineScheduleMulti),
# torch/distributed/pipelining/schedules.py; `partita calibrate` times one of each.
RUNTIME_OF = {"gpipe": "1f1b", "zero-bubble": "interleaved-1f1b"}
# Schedules whose runtime (PipelineScheduleSingle) posts each action's send together with the next
# receive and waits on both right after the compute: the exchange `handoff_stall_s` times. The
# multi-stage runtime posts every send and receive as an action of its own, waited on just before
# the compute that needs it; its measured work per action stands alone (see handoff_stall).
FUSED_EXCHANGE = ("gpipe", "1f1b")
# The stack's own kernels per micro-batch, counted on partita's GPT (planner/models/gpt.py, the
# executor's model) with executor.hostbench.KernelCount: the embedding's word and position lookups,
# their sum and a layout copy; the head's final norm, logits GEMM and cross-entropy (log-softmax,
# NLL). Charged on a synchronous device; where launches are asynchronous the host issues them while
# the device still runs the blocks before (or after) them.
EMBEDDING_FORWARD_KERNELS = 4
HEAD_FORWARD_KERNELS = 4


@dataclass(frozen=True)
class HostCosts:
    op_dispatch_s: float = 0.0                    # per forward kernel (autograd recording)
    launch_s: float = 0.0
    launch_blocking_wait_s: float = 0.0
    backward_op_dispatch_s: float | None = None   # per backward kernel; None: = op_dispatch_s
    synchronous: bool = False                     # kernels run inside the call (a CPU device)
    # host time of an op of flash-attn's unpadding (simulator/unpad.py) per `op_dispatch_s`
    unpad_op_dispatch_fraction: float = 1.0
    # host time of a no-grad op of a per-tensor optimizer loop (simulator/fp16optimizer.py) per
    # `op_dispatch_s`
    optimizer_op_dispatch_fraction: float = 1.0
    # per forward or backward of a pipeline stage, by the schedule measured (RUNTIME_OF for the rest)
    pipeline_action_s: dict[str, float] = field(default_factory=dict, hash=False)
    # host seconds per parameter tensor of one optimizer step, by optimizer (adam, sgd)
    optimizer_step_per_tensor_s: dict[str, float] = field(default_factory=dict, hash=False)
    # ((compute seconds, stall seconds), ...): an exchange's wait after that much compute
    handoff_stall_s: tuple[tuple[float, float], ...] = ()

    @property
    def per_kernel_s(self) -> float:
        """Host seconds before one forward kernel can run: the op's dispatch and its launch."""
        return self.op_dispatch_s + self.launch_s

    @property
    def per_backward_kernel_s(self) -> float:
        """Host seconds before one backward kernel can run: the autograd engine's work for it
        and its launch."""
        b = self.op_dispatch_s if self.backward_op_dispatch_s is None else self.backward_op_dispatch_s
        return b + self.launch_s

    def exposed(self, device_s: float, kernels: float, blocking: bool,
                backward_kernels: float = 0.0, replayed: float = 0.0,
                launched: float = 0.0) -> float:
        """Seconds the host adds to `device_s` of GPU work made of `kernels` forward and
        `backward_kernels` backward launches, `replayed` forward ops dispatched again without
        a launch (a selective checkpoint's saved ops return their kept outputs), and `launched`
        kernels an op already dispatched launches from its own C++ code (Transformer Engine's
        fp8 casts inside its linear's autograd function: `simulator.fp8casts`), their launch
        alone."""
        host = (kernels * self.per_kernel_s + backward_kernels * self.per_backward_kernel_s
                + replayed * self.op_dispatch_s + launched * self.launch_s)
        if self.synchronous:
            return host
        if blocking:
            return host + (kernels + backward_kernels + launched) * self.launch_blocking_wait_s
        return max(0.0, host - device_s)

    @property
    def unpad_op_s(self) -> float:
        """Host seconds before one op of the unpadding can run on the GPU: its dispatch (a small
        functional op, `unpad_op_dispatch_fraction` of a block kernel's) and its launch."""
        return self.unpad_op_dispatch_fraction * self.op_dispatch_s + self.launch_s

    @property
    def optimizer_op_s(self) -> float:
        """Host seconds before one op of a per-tensor optimizer loop can run on the GPU: its
        dispatch (`optimizer_op_dispatch_fraction` of a block kernel's) and its launch."""
        return self.optimizer_op_dispatch_fraction * self.op_dispatch_s + self.launch_s

    def sync_stall(self, windows: Sequence[tuple[int, float]], blocking: bool) -> float:
        """Seconds the GPU idles around the host's waits for it (a nonzero's count, an .item()):
        after each wait the queue is empty, so a window of `ops` host-issued ops of the unpadding
        (`unpad_op_s` each) with `device_s` of GPU work between them lasts the wait's return
        (`launch_blocking_wait_s`, the same round trip) plus the longer of the two, of which the
        GPU runs only its work. Nothing where the host already waits on every kernel (a
        synchronous device, launches that block): `exposed` charges those ops in full."""
        if self.synchronous or blocking:
            return 0.0
        return sum(self.launch_blocking_wait_s + max(0.0, ops * self.unpad_op_s - device_s)
                   for ops, device_s in windows)

    def schedule_action_s(self, schedule: str) -> float:
        """Host seconds per action of `schedule`: its own measurement, else that of the schedule
        torch runs with the same runtime (RUNTIME_OF), else 0."""
        per = self.pipeline_action_s
        return per.get(schedule, per.get(RUNTIME_OF.get(schedule, schedule), 0.0))

    def pipeline_action(self, device_s: float, pipeline: int, schedule: str = "1f1b") -> float:
        """Seconds of one pipeline action (a micro-batch's forward or backward on one stage) whose
        stage work takes `device_s`, with `schedule`'s own host work per action beside it (after
        it on a synchronous device, with its exchange's hand-off stall); none without a
        pipeline."""
        if pipeline < 2:
            return device_s
        action = self.schedule_action_s(schedule)
        if self.synchronous:
            stall = self.handoff_stall(device_s) if schedule in FUSED_EXCHANGE else 0.0
            return device_s + action + stall
        return max(device_s, action)

    def handoff_stall(self, compute_s: float) -> float:
        """Seconds an exchange after `compute_s` of compute waits for the communication thread:
        `handoff_stall_s` interpolated linearly, from 0 at no compute, held after its last point."""
        pts = self.handoff_stall_s
        if not pts or compute_s <= 0.0:
            return 0.0
        x0, y0 = 0.0, 0.0
        for x1, y1 in pts:
            if compute_s <= x1:
                return y0 + (y1 - y0) * (compute_s - x0) / (x1 - x0)
            x0, y0 = x1, y1
        return y0

    def optimizer_step(self, optimizer: str, tensors: float, device_s: float) -> float:
        """Seconds of one optimizer step over `tensors` parameter tensors whose arithmetic takes
        `device_s`: the host's per-tensor work beside it (after it on a synchronous device)."""
        host = tensors * self.optimizer_step_per_tensor_s.get(optimizer, 0.0)
        return device_s + host if self.synchronous else max(device_s, host)


def attention_core_kernels(attention: str, *, decoder: bool = False) -> int:
    """Kernels of a block's attention core (see the module docstring): what selective recompute
    (Korthikanti et al. 2022, Sec. 5) launches again in the backward; a T5 decoder block has two
    cores, its self- and cross-attention."""
    core = {"flash": 1, "flash2": 1, "flash1": 1, "unfused": 4, "eager": 7}[attention]
    return 2 * core if decoder else core


def forward_kernels(*, decoder: bool, tensor: int, attention: str,
                    fused_elementwise: bool = True) -> int:
    """Kernels one block's forward launches (see the module docstring for the count). Without
    Megatron's elementwise fusions the MLP's bias add runs apart from its activation and each
    residual sublayer runs bias add, dropout and add as three kernels instead of one."""
    core = attention_core_kernels(attention)
    n = 2 + 4 + core + 1 + 2 + 2
    collectives = (3 if decoder else 2) if tensor > 1 else 0
    if decoder:
        n += 1 + 2 + core + 1
    if not fused_elementwise:
        n += 1 + 2 * (3 if decoder else 2)
    return n + collectives


@lru_cache(maxsize=4)
def _load(path: str, mtime: int) -> HostCosts:
    c = Checker(load_by_provenance(path), "", path)
    c.only(KEYS)
    values = {}
    for key in KEYS[:-1]:
        if key == "backward_op_dispatch_us" and key not in c.mapping:
            values[key] = None                            # as the forward's (op_dispatch_us)
            continue
        if key in ("unpad_op_dispatch_fraction", "optimizer_op_dispatch_fraction"):
            values[key] = c.number(key, 1.0, positive=True, maximum=100.0)
            continue
        value = c.number(key, 0.0, positive=False)
        if value < 0.0:
            raise c.error(f"must be >= 0, got {value}", key)
        values[key] = value * 1e-6
    return HostCosts(op_dispatch_s=values["op_dispatch_us"], launch_s=values["launch_us"],
                     launch_blocking_wait_s=values["launch_blocking_wait_us"],
                     backward_op_dispatch_s=values["backward_op_dispatch_us"],
                     unpad_op_dispatch_fraction=values["unpad_op_dispatch_fraction"],
                     optimizer_op_dispatch_fraction=values["optimizer_op_dispatch_fraction"])


def load_host_costs(path: str | Path = HOST_FILE) -> HostCosts:
    path = Path(path)
    return _load(str(path), path.stat().st_mtime_ns)
