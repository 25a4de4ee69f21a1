"""What every rank of `partita run` does, derived from a scenario before anything is launched.

`execution_plan(scenario, gpus)` checks that the plan can be executed here (the scenario's own
consistency rules, then what the executor and torch's pipeline schedules need) and returns an
`ExecPlan`: degrees, the block range of every model chunk (pipeline stage), which chunks each
pipeline rank holds, and micro-batching. No torch here, so the command line can reject a bad plan
in milliseconds.

Rank order is Megatron-LM's (tensor fastest, pipeline slowest; megatron/core/parallel_state.py
RankGenerator), the same as simulator/placement.py: rank = tp + T * (dp + D * pp).
"""
from __future__ import annotations

from dataclasses import dataclass

from partita.planner.errors import PartitaError
from partita.planner.scenario import Scenario, check_plan
from partita.planner.stages import chunk_ranges, with_default_stages

# torch.distributed.pipelining schedule class for each scenario schedule name.
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "zero-bubble": "ScheduleInterleavedZeroBubble",   # ZB1P (Qi et al. 2023), one chunk per rank: ZB-H1
}
EXECUTED_PRECISIONS = ("fp32", "tf32", "bf16")


@dataclass(frozen=True)
class Coords:
    """Where one rank sits in the (pipeline, data, tensor) grid."""
    pp: int
    dp: int
    tp: int


@dataclass(frozen=True)
class ExecPlan:
    name: str
    arch: str
    world: int
    tensor: int
    pipeline: int
    data: int
    schedule: str
    virtual_stages: int
    chunks: tuple[tuple[int, int], ...]   # block range [start, stop) of every model chunk (stage)
    blocks: int                           # transformer blocks in the model
    global_batch: int
    micro_batch: int
    seq_len: int
    vocab: int
    zero: int
    precision: str
    recompute: str
    optimizer: str

    @property
    def microbatches(self) -> int:
        """Micro-batches per optimizer step per pipeline replica."""
        return self.global_batch // (self.micro_batch * self.data)

    @property
    def stages(self) -> int:
        return len(self.chunks)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def coords(self, rank: int) -> Coords:
        tp = rank % self.tensor
        dp = rank // self.tensor % self.data
        return Coords(pp=rank // (self.tensor * self.data), dp=dp, tp=tp)

    def rank_of(self, c: Coords) -> int:
        return c.tp + self.tensor * (c.dp + self.data * c.pp)

    def stages_of(self, pp_rank: int) -> tuple[int, ...]:
        """The model chunks pipeline rank `pp_rank` holds: r, r + p, r + 2p, ... (looped placement)."""
        return tuple(range(pp_rank, self.stages, self.pipeline))

    def layers_of(self, stage: int) -> tuple[int, ...]:
        """Indices into the model's pipeline_layers() ([embedding, block..., head]) of one chunk."""
        start, stop = self.chunks[stage]
        first = (0,) if stage == 0 else ()
        last = (self.blocks + 1,) if stage == self.stages - 1 else ()
        return first + tuple(range(start + 1, stop + 1)) + last

    @property
    def data_parallel(self) -> str:
        """How the data-parallel replicas are kept in step (executor/parallel.py):
        "none" (data 1), "all-reduce" (ZeRO-0), "fsdp" (ZeRO-1/2: parameters gathered from
        forward to backward) or "fsdp-reshard" (ZeRO-3: gathered per layer and freed again)."""
        if self.data == 1:
            return "none"
        if self.zero == 0:
            return "all-reduce"
        return "fsdp-reshard" if self.zero == 3 and self.schedule != "zero-bubble" else "fsdp"

    def notes(self) -> list[str]:
        """Where the run differs from the plan as written, for the user."""
        out = []
        if self.data > 1 and self.zero == 1:
            out.append("ZeRO-1 runs as FSDP2 without resharding after forward (ZeRO-2 like: "
                       "gradients sharded too)")
        if self.data > 1 and self.zero == 3 and self.schedule == "zero-bubble":
            out.append("ZeRO-3 with zero-bubble keeps parameters gathered from forward to the "
                       "weight backward (ZeRO-2 like): FSDP2 resharding between the input and "
                       "weight halves of the backward gives wrong gradients on torch 2.13")
        return out

    def to_dict(self) -> dict:
        return {"data_parallel": self.data_parallel, "tensor": self.tensor, "pipeline": self.pipeline, "data": self.data,
                "schedule": self.schedule, "virtual_stages": self.virtual_stages,
                "stages": [list(c) for c in self.chunks], "microbatches": self.microbatches,
                "micro_batch": self.micro_batch, "global_batch": self.global_batch,
                "zero": self.zero, "precision": self.precision, "recompute": self.recompute,
                "optimizer": self.optimizer}


def execution_plan(scenario: Scenario, gpus: int) -> ExecPlan:
    """The per-rank plan of `scenario` on `gpus` processes; PartitaError if it cannot run."""
    where = f"{scenario.origin}: " if scenario.origin else ""
    p, t = scenario.parallel, scenario.training
    if p is None:
        raise PartitaError(f"{where}no parallel section to execute; run `partita plan "
                           f"{scenario.origin or 'FILE'} -o planned.yaml` to choose one")
    dims = scenario.model.resolve()
    if dims is None:
        raise PartitaError(f"{where}model.module: partita run executes transformer models (dims, "
                           "preset or hf_config), not an arbitrary module: it needs the layer chain "
                           "and loss of planner.models")
    check_plan(scenario, gpus, dims)
    _check_executable(scenario, dims, where)
    p = with_default_stages(p, dims)          # uneven layer counts: the simulator's balanced split
    chunks = tuple(tuple(c) for c in chunk_ranges(dims.total_layers, p))   # the simulator's split
    return ExecPlan(
        name=scenario.name, arch=dims.arch, world=gpus, tensor=p.tensor, pipeline=p.pipeline,
        data=p.data, schedule=p.schedule, virtual_stages=p.virtual_stages, chunks=tuple(chunks),
        blocks=dims.total_layers, global_batch=t.global_batch, micro_batch=t.micro_batch,
        seq_len=dims.seq_len, vocab=dims.vocab, zero=p.zero, precision=t.precision,
        recompute=t.recompute, optimizer=t.optimizer)


def _check_executable(s: Scenario, dims, where: str) -> None:
    """What the executor (not the scenario format) cannot do, each with what to change."""
    p, t = s.parallel, s.training
    m = s.microbatches()
    if p.context > 1:
        raise PartitaError(f"{where}parallel.context: partita run does not execute context "
                           f"parallelism (got {p.context}; valid: 1); fold it into data or tensor")
    if p.sequence_parallel and p.tensor > 1:
        raise PartitaError(f"{where}parallel.sequence_parallel: partita run executes tensor "
                           "parallelism without sequence parallelism; set it to false")
    if t.precision not in EXECUTED_PRECISIONS:
        raise PartitaError(f"{where}training.precision {t.precision}: partita run executes "
                           f"{', '.join(EXECUTED_PRECISIONS)} (fp16 would need loss scaling, fp8 "
                           "Transformer Engine); use bf16 or fp32")
    if p.tensor > 1 and dims.kv_heads % p.tensor:
        raise PartitaError(f"{where}parallel.tensor ({p.tensor}) must divide model.kv_heads "
                           f"({dims.kv_heads}) for partita run: it shards k/v heads, it does "
                           "not replicate them")
    if p.schedule == "1f1b" and m < p.pipeline:
        raise PartitaError(f"{where}schedule 1f1b needs micro-batches per replica ({m}) >= "
                           f"pipeline ({p.pipeline}); raise training.global_batch or use gpipe")
    rounds = max(1, m // p.pipeline)
    if p.schedule in ("interleaved-1f1b", "zero-bubble") and m % rounds:
        raise PartitaError(f"{where}schedule {p.schedule} needs micro-batches per replica ({m}) "
                           f"to be a multiple of max(1, m // pipeline) = {rounds}")
