"""What every rank of `partita run` does, derived from a scenario before anything is launched.

`execution_plan(scenario, gpus)` checks that the plan can be executed here (the scenario's own
consistency rules, then what the executor and torch's pipeline schedules need) and returns an
`ExecPlan`: degrees, the block range of every model chunk (pipeline stage), which chunks each
pipeline rank holds, and micro-batching. No torch at import, so the command line can reject a bad
plan in milliseconds; only a `model.module` model is built (on the meta device) to count its layers.

A transformer model (dims, preset, hf_config) is cut by transformer blocks: chunk 0 also holds the
embedding, the last chunk the head (planner/stages.py). A `module:` model is cut by the layers of
`planner.models.layer_chain` (an nn.Sequential's children, or a module's `pipeline_layers()`),
the embedding and head counting as layers, as the simulator profiles and splits it
(simulator/profiled.py).

Rank order is Megatron-LM's, the same as the simulator's: planner/ranks.py `RankGenerator` (tensor
fastest, then context, data, pipeline slowest).
"""
from __future__ import annotations

from dataclasses import dataclass

from partita.planner.errors import PartitaError
from partita.planner.enums import EXECUTED_PRECISIONS
from partita.planner.ranks import RankGenerator
from partita.planner.scenario import Scenario, check_plan, check_stages
from partita.planner.stages import chunk_ranges, with_default_stages

# torch.distributed.pipelining schedule class for each scenario schedule name.
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "zero-bubble": "ScheduleInterleavedZeroBubble",   # ZB1P (Qi et al. 2023), one chunk per rank: ZB-H1
}


@dataclass(frozen=True)
class Coords:
    """Where one rank sits in the (pipeline, data, context, tensor) grid."""
    pp: int
    dp: int
    tp: int
    cp: int = 0


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
    module: str | None = None             # "pkg.mod:fn" of a `module:` model; None: a transformer
    sequence_parallel: bool = False       # with tensor > 1: activations sharded by sequence
    context: int = 1                      # context-parallel degree (executor/context.py)
    recompute_num_layers: int | None = None   # recompute full: blocks recomputed per chunk (the
                                              # first N); None: every block
    data_shard: int | None = None         # ZeRO shard group: this many consecutive data-parallel
                                          # ranks, replicated across the groups; None: all `data`

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

    @property
    def ranks(self) -> RankGenerator:
        return RankGenerator(tp=self.tensor, cp=self.context, dp=self.data, pp=self.pipeline)

    def coords(self, rank: int) -> Coords:
        c = self.ranks.coords(rank)
        return Coords(pp=c["pp"], dp=c["dp"], tp=c["tp"], cp=c["cp"])

    def rank_of(self, c: Coords) -> int:
        return self.ranks.rank(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp)

    @property
    def replicas(self) -> int:
        """Ranks that hold the same parameters and average their gradients: data x context."""
        return self.data * self.context

    @property
    def shard(self) -> int:
        """Data-parallel ranks one ZeRO shard group spans (`data_shard`, else all `data`)."""
        return self.data if self.data_shard is None else self.data_shard

    @property
    def shard_replicas(self) -> int:
        """Copies of each ZeRO shard (hybrid sharding): data / shard, 1 without `data_shard`."""
        return self.data // self.shard

    def shard_groups(self) -> list[list[int]]:
        """The ZeRO shard groups: per (pp, tp) and run of `shard` consecutive data-parallel ranks,
        those ranks times every context rank, ascending. Parameters are gathered and gradients
        reduce-scattered within one; without hybrid sharding it is the data x context group."""
        return sorted(sorted(self.rank_of(Coords(pp=pp, dp=g * self.shard + s, tp=tp, cp=cp))
                             for s in range(self.shard) for cp in range(self.context))
                      for pp in range(self.pipeline) for tp in range(self.tensor)
                      for g in range(self.shard_replicas))

    def replica_groups(self) -> list[list[int]]:
        """The ranks that hold the same ZeRO shard, one per shard group (the same index in each,
        the same tp, cp, pp), ascending: gradient shards are all-reduced over one."""
        return sorted([self.rank_of(Coords(pp=pp, dp=g * self.shard + s, tp=tp, cp=cp))
                       for g in range(self.shard_replicas)]
                      for pp in range(self.pipeline) for tp in range(self.tensor)
                      for s in range(self.shard) for cp in range(self.context))

    def stages_of(self, pp_rank: int) -> tuple[int, ...]:
        """The model chunks pipeline rank `pp_rank` holds: r, r + p, r + 2p, ... (looped placement)."""
        return tuple(range(pp_rank, self.stages, self.pipeline))

    def layers_of(self, stage: int) -> tuple[int, ...]:
        """Indices into the model's pipeline_layers() ([embedding, block..., head]) of one chunk;
        for a `module:` model, into its layer chain."""
        start, stop = self.chunks[stage]
        if self.module is not None:
            return tuple(range(start, stop))
        first = (0,) if stage == 0 else ()
        last = (self.blocks + 1,) if stage == self.stages - 1 else ()
        return first + tuple(range(start + 1, stop + 1)) + last

    @property
    def data_parallel(self) -> str:
        """How the data-parallel replicas are kept in step (executor/parallel.py):
        "none" (data x context 1), "all-reduce" (ZeRO-0), "fsdp" (ZeRO-1/2: parameters gathered
        from forward to backward) or "fsdp-reshard" (ZeRO-3: gathered per layer and freed again).
        Context-parallel ranks hold the same parameters as data-parallel ones: both average
        gradients, over one data x context group."""
        if self.replicas == 1:
            return "none"
        if self.zero == 0:
            return "all-reduce"
        return "fsdp-reshard" if self.zero == 3 and self.schedule != "zero-bubble" else "fsdp"

    def notes(self) -> list[str]:
        """Where the run differs from the plan as written, for the user."""
        out = []
        if self.replicas > 1 and self.zero == 1:
            out.append("ZeRO-1 runs as FSDP2 without resharding after forward (ZeRO-2 like: "
                       "gradients sharded too)")
        if self.replicas > 1 and self.zero == 3 and self.schedule == "zero-bubble":
            out.append("ZeRO-3 with zero-bubble keeps parameters gathered from forward to the "
                       "weight backward (ZeRO-2 like): FSDP2 resharding between the input and "
                       "weight halves of the backward gives wrong gradients on torch 2.13")
        return out

    def to_dict(self) -> dict:
        out = {"data_parallel": self.data_parallel, "tensor": self.tensor, "pipeline": self.pipeline, "data": self.data,
               "schedule": self.schedule, "virtual_stages": self.virtual_stages,
               "stages": [list(c) for c in self.chunks], "microbatches": self.microbatches,
               "micro_batch": self.micro_batch, "global_batch": self.global_batch,
               "zero": self.zero, "precision": self.precision, "recompute": self.recompute,
               "optimizer": self.optimizer, "module": self.module,
               "sequence_parallel": self.sequence_parallel, "context": self.context}
        if self.recompute_num_layers is not None:
            out["recompute_num_layers"] = self.recompute_num_layers
        if self.data_shard is not None:
            out["data_shard"] = self.data_shard
        return out


def execution_plan(scenario: Scenario, gpus: int) -> ExecPlan:
    """The per-rank plan of `scenario` on `gpus` processes; PartitaError if it cannot run."""
    where = f"{scenario.origin}: " if scenario.origin else ""
    p, t = scenario.parallel, scenario.training
    if p is None:
        raise PartitaError(f"{where}no parallel section to execute; run `partita plan "
                           f"{scenario.origin or 'FILE'} -o planned.yaml` to choose one")
    dims = scenario.model.resolve()
    if dims is None:
        return _module_plan(scenario, gpus, where)
    check_plan(scenario, gpus, dims)
    _check_executable(scenario, dims, where)
    p = with_default_stages(p, dims)          # uneven layer counts: the simulator's balanced split
    chunks = tuple(tuple(c) for c in chunk_ranges(dims.total_layers, p))   # the simulator's split
    return ExecPlan(
        name=scenario.name, arch=dims.arch, world=gpus, tensor=p.tensor, pipeline=p.pipeline,
        data=p.data, schedule=p.schedule, virtual_stages=p.virtual_stages, chunks=tuple(chunks),
        blocks=dims.total_layers, global_batch=t.global_batch, micro_batch=t.micro_batch,
        seq_len=dims.seq_len, vocab=dims.vocab, zero=p.zero, data_shard=p.data_shard,
        precision=t.precision, recompute=t.recompute, recompute_num_layers=t.recompute_num_layers,
        optimizer=t.optimizer, sequence_parallel=p.sequence_parallel and p.tensor > 1,
        context=p.context)


def module_layer_names(scenario: Scenario) -> list[str]:
    """The layer chain of a `module:` model, built on the meta device (imports torch). Without a
    `loss(output, targets)` of its own, the chain must turn (B, S) token ids into (B, S, vocab)
    logits: one micro-batch runs through it on the meta device to check, layer by layer."""
    import torch
    from partita.planner.models import build_from_spec, layer_chain
    m, where = scenario.model, f"{scenario.origin}: " if scenario.origin else ""
    model = build_from_spec(m, device="meta")
    chain = layer_chain(model)
    if callable(getattr(model, "loss", None)):
        return [name for name, _ in chain]
    x = torch.zeros((scenario.training.micro_batch, m.seq_len), dtype=torch.long, device="meta")
    for name, layer in chain:
        try:
            x = layer(x)
        except Exception as exc:  # the user's code: one line naming the layer
            raise PartitaError(f"{where}model.module: layer {name!r} ({type(layer).__name__}) "
                               f"failed on the meta device: {type(exc).__name__}: {exc}") from exc
        if not isinstance(x, torch.Tensor):
            raise PartitaError(f"{where}model.module: layer {name!r} returned "
                               f"{type(x).__name__}; pipeline layers pass one tensor on")
    want = (scenario.training.micro_batch, m.seq_len, m.vocab)
    if tuple(x.shape) != want:
        raise PartitaError(f"{where}model.module: {m.module} maps token ids (B, S) = "
                           f"{want[:2]} to {tuple(x.shape)}, expected logits (B, S, vocab) = "
                           f"{want}; or give the module a loss(output, targets) method")
    return [name for name, _ in chain]


def _module_plan(scenario: Scenario, gpus: int, where: str) -> ExecPlan:
    """A `module:` model: pipeline stages over its layer chain, data parallelism, no tensor split."""
    p, t, m = scenario.parallel, scenario.training, scenario.model
    check_plan(scenario, gpus)
    for key, value in (("tensor", p.tensor), ("context", p.context)):
        if value > 1:
            raise PartitaError(f"{where}parallel.{key} = {value}: a model given as model.module has "
                               "no known layer structure to split (valid: 1); give transformer "
                               "dims, a preset or an hf_config to use it")
    names = module_layer_names(scenario)
    chunks = p.pipeline * p.virtual_stages
    if chunks > len(names):
        raise PartitaError(f"{where}pipeline*virtual_stages ({chunks}) exceeds the module's "
                           f"{len(names)} layers ({', '.join(names)})")
    if p.stages is not None:
        check_stages(p.stages, chunks, len(names), lambda msg: PartitaError(
            f"{where}{msg} (the module's layers: {', '.join(names)})"))
    _check_executable(scenario, None, where)
    return ExecPlan(
        name=scenario.name, arch="module", world=gpus, tensor=1, pipeline=p.pipeline,
        data=p.data, schedule=p.schedule, virtual_stages=p.virtual_stages,
        chunks=tuple(tuple(c) for c in chunk_ranges(len(names), p)), blocks=len(names),
        global_batch=t.global_batch, micro_batch=t.micro_batch, seq_len=m.seq_len, vocab=m.vocab,
        zero=p.zero, data_shard=p.data_shard, precision=t.precision, recompute=t.recompute,
        recompute_num_layers=t.recompute_num_layers, optimizer=t.optimizer, module=m.module)


def _check_executable(s: Scenario, dims, where: str) -> None:
    """What the executor (not the scenario format) cannot do, each with what to change."""
    p, t = s.parallel, s.training
    if t.precision not in EXECUTED_PRECISIONS:
        raise PartitaError(f"{where}training.precision {t.precision}: partita run executes "
                           f"{', '.join(EXECUTED_PRECISIONS)} (fp8 needs Transformer Engine); "
                           "use bf16")
    if dims is None:
        return _check_schedule(s, where)
    if p.sequence_parallel and p.tensor > 1 and dims.arch == "t5":
        raise PartitaError(f"{where}parallel.sequence_parallel: partita run does not shard T5's "
                           "chain by sequence (its one tensor holds the encoder and decoder "
                           "halves side by side along the sequence, [Note: t5 chain]); set it "
                           "to false for arch t5")
    if p.context > 1 and dims.arch == "t5":
        raise PartitaError(f"{where}parallel.context = {p.context}: partita run does not shard "
                           "T5's chain by sequence (its one tensor holds the encoder and decoder "
                           "halves side by side along the sequence, [Note: t5 chain]); "
                           "valid for arch t5: 1")
    if p.context > 1 and dims.seq_len % (2 * p.context):
        raise PartitaError(f"{where}parallel.context = {p.context}: model.seq_len ({dims.seq_len}) "
                           f"must be a multiple of 2 x context ({2 * p.context}) for partita run: "
                           "each rank holds two equal chunks of every sequence (load balance)")
    if dims.mlm_predictions:
        raise PartitaError(f"{where}model.mlm_predictions = {dims.mlm_predictions}: partita run's "
                           "BERT runs its MLM head on every position (as Hugging Face's "
                           "BertForMaskedLM), not on gathered masked ones; remove the key to run "
                           "it (the prediction then times the head on every position too)")
    if p.tensor > 1 and dims.kv_heads % p.tensor:
        raise PartitaError(f"{where}parallel.tensor ({p.tensor}) must divide model.kv_heads "
                           f"({dims.kv_heads}) for partita run: it shards k/v heads, it does "
                           "not replicate them")
    _check_schedule(s, where)


def _check_schedule(s: Scenario, where: str) -> None:
    p, m = s.parallel, s.microbatches()
    if p.schedule == "1f1b" and m < p.pipeline:
        raise PartitaError(f"{where}schedule 1f1b needs micro-batches per replica ({m}) >= "
                           f"pipeline ({p.pipeline}); raise training.global_batch or use gpipe")
    rounds = max(1, m // p.pipeline)
    if p.schedule in ("interleaved-1f1b", "zero-bubble") and m % rounds:
        raise PartitaError(f"{where}schedule {p.schedule} needs micro-batches per replica ({m}) "
                           f"to be a multiple of max(1, m // pipeline) = {rounds}")
