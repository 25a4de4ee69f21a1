"""The training loop of one rank of `partita run`, and the single-process reference it must match.

`run_rank(job, rank, local_rank)` builds this rank's chunks, wraps them for tensor and data
parallelism, drives torch's pipeline schedule for `job.steps` optimizer steps and, on rank 0,
writes metrics.jsonl, trace.json and result.json. `reference_run` trains the same model on the
same batches in one process with plain gradient accumulation: the numerics tests hold a pipelined
run to it.

Per step: every micro-batch loss is a mean over its tokens; the schedule scales the summed
gradients by 1/m (torch's scale_grads) and data parallelism averages over the replicas, so the
gradient is that of the mean loss over the global batch, as in the reference.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from partita.executor.context import apply_context_parallel, local_tokens, sequence_shard
from partita.executor.data import DataSpec, TokenStream, replica_samples
from partita.executor.launch import RESULT_FILE, Job
from partita.executor.measure import StepRecorder, memory_report, summarize, write_outputs
from partita.executor.parallel import (TiedGradients, apply_data_parallel,
                                       apply_sequence_parallel, apply_tensor_parallel,
                                       average_gradients, build_mesh, reduce_partial_gradients)
from partita.executor.plan import TORCH_SCHEDULES, ExecPlan, execution_plan
from partita.executor.precision import LossScaler
from partita.executor.stages import Chunk, build_chunks, build_module_chain
from partita.planner.scenario import Scenario, load_scenario

SGD_MOMENTUM = 0.9


def make_optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Adam (no weight decay) or SGD with momentum, the two the scenario names."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM)
    return torch.optim.Adam(params, lr=lr)


def load_plan(path: str, world: int) -> tuple[Scenario, ExecPlan]:
    scenario = load_scenario(path)
    return scenario, execution_plan(scenario, world)


class RankRun:
    """One rank's share of the run: its chunks, pipeline stages, schedule and optimizer."""

    def __init__(self, job: Job, rank: int, local_rank: int):
        self.job, self.rank = job, rank
        self.scenario, self.plan = load_plan(job.scenario, job.world)
        self.device = torch.device(f"cuda:{local_rank}" if job.backend == "nccl" else "cpu")
        self.me = self.plan.coords(rank)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.plan.precision == "tf32"
            torch.backends.cudnn.allow_tf32 = self.plan.precision == "tf32"
        mesh, replicas = build_mesh(self.plan, self.device.type)
        stages = self.plan.stages_of(self.me.pp)
        self.chunks, groups, self.loss_fn = build_chunks(
            self.plan, self.scenario.model, stages, self.device, job.seed)
        shard = (sequence_shard(mesh["cp"].get_group(), self.plan.context, self.me.cp)
                 if self.plan.context > 1 else None)
        for chunk in self.chunks:
            if shard is not None:
                apply_context_parallel(chunk, shard)
            if self.plan.sequence_parallel:
                apply_sequence_parallel(chunk, mesh["tp"])
            elif self.plan.tensor > 1:
                apply_tensor_parallel(chunk, mesh["tp"])
            if self.plan.replicas > 1:
                apply_data_parallel(chunk, replicas, self.plan.data_parallel)
        # ZeRO-0's gradient all-reduce over data x context (a 2-D mesh: hybrid sharding, ZeRO >= 1)
        self.dp_group = replicas.get_group() if replicas.ndim == 1 else None
        self.tied = TiedGradients(self.plan, groups, rank)
        self.pipe = [pipeline_stage(chunk, self.plan, self.device, mesh["pp"].get_group())
                     for chunk in self.chunks]
        self.scaler = LossScaler(self.plan.precision)
        self.schedule = make_schedule(self.plan, self.pipe, self.scaler.scaled(self.loss_fn))
        self.params = [p for chunk in self.chunks for p in chunk.parameters()]
        self.optimizer = make_optimizer(self.plan.optimizer, self.params, job.lr)
        self.fault = _fault_hook()
        self.recorder = StepRecorder(rank, self.device.type, on_phase=self.fault)
        for stage in self.pipe:
            self.recorder.instrument(stage)
        self.stream = TokenStream(DataSpec(self.plan.arch, self.plan.seq_len, self.plan.vocab,
                                           job.seed, job.data))
        self.first = any(s.is_first for s in self.pipe)
        self.last = any(s.is_last for s in self.pipe)

    def step(self, step: int) -> float:
        """One optimizer step (1-based); the mean loss over the global batch."""
        first, count = replica_samples(step - 1, self.plan.global_batch, self.plan.data, self.me.dp)
        ids, targets = (local_tokens(torch.from_numpy(a), self.plan.context, self.me.cp).to(self.device)
                        for a in self.stream.batch(first, count))
        dist.barrier()
        self.recorder.start_step(step)
        self.optimizer.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets, "losses": losses} if self.last else {}
        self.schedule.step(*((ids,) if self.first else ()), **kwargs)
        if self.plan.data_parallel == "all-reduce":
            for chunk in self.chunks:      # one span per chunk, named as the simulator's
                with self.recorder.span("dp", f"{chunk.stage}REDUCE_GRAD", "comm"):
                    average_gradients(list(chunk.parameters()), self.dp_group, self.plan.replicas)
        if self.tied.entries:
            with self.recorder.span("tied", "TIED_ALLREDUCE", "comm"):
                self.tied.sync(self.chunks)
        if self.plan.sequence_parallel:
            reduce_partial_gradients(self.params)
        scale = self.scaler.scale
        found_inf = self.scaler.unscale(_local_grads(self.params), self.device)
        self.fault(step, "optimizer")
        with self.recorder.span("optimizer", "optimizer", "optimizer"):
            if not found_inf:
                self.optimizer.step()
        self.scaler.update(found_inf)
        self.recorder.end_step()
        return self._global_loss(losses, scale)

    def _global_loss(self, losses: list[torch.Tensor], scale: float = 1.0) -> float:
        """Mean micro-batch loss over all replicas (summed over ranks: others add 0). Context
        ranks hold equal numbers of each sequence's tokens, so their mean is the sequence's."""
        mine = 0.0
        if self.last and self.me.tp == 0:
            mine = sum(float(l.detach()) for l in losses) / len(losses) / self.plan.replicas / scale
        total = torch.tensor([mine], dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return float(total.item())


def _local_grads(params: list[nn.Parameter]) -> list[torch.Tensor]:
    """The local shards of the gradients (DTensor or plain), to unscale in place."""
    return [g.to_local() if hasattr(g, "to_local") else g
            for g in (p.grad for p in params) if g is not None]


def pipeline_stage(chunk: Chunk, plan: ExecPlan, device: torch.device, group):
    from torch.distributed.pipelining import PipelineStage
    return PipelineStage(chunk, chunk.stage, plan.stages, device, group=group)


def make_schedule(plan: ExecPlan, stages: list, loss_fn):
    import torch.distributed.pipelining as pipelining
    cls = getattr(pipelining, TORCH_SCHEDULES[plan.schedule])
    single = plan.schedule in ("gpipe", "1f1b")
    return cls(stages[0] if single else stages, n_microbatches=plan.microbatches, loss_fn=loss_fn)


def _fault_hook():
    """executor.faults.maybe_inject_fault (PARTITA_FAULT_AT_STEP), a no-op when unset."""
    from partita.executor.faults import maybe_inject_fault
    return maybe_inject_fault


def run_rank(job: Job, rank: int, local_rank: int) -> None:
    run = RankRun(job, rank, local_rank)
    start = _resume(run) if job.checkpoint_dir else 0
    losses = []
    for step in range(start + 1, job.steps + 1):
        losses.append(run.step(step))
        if rank == 0:
            print(f"step {step}/{job.steps}  loss {losses[-1]:.6f}  "
                  f"{run.recorder.records[-1].wall_s:.4f} s", file=sys.stderr, flush=True)
        if job.checkpoint_dir and job.checkpoint_every and step % job.checkpoint_every == 0:
            _save(run, step)
    records = _gather(run.recorder.records, rank)
    weights = full_weights(run) if job.save_weights else None
    if rank == 0:
        _finish(run, records, losses, weights)
    dist.barrier()      # nobody tears its process group down while another still talks


def _resume(run: RankRun) -> int:
    """The step to continue after: the latest checkpoint's, on --resume or a torchrun restart."""
    from partita.executor.checkpoint import latest_checkpoint, load_checkpoint, plan_fingerprint
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    if not (run.job.resume or restarted):
        return 0
    step = latest_checkpoint(run.job.checkpoint_dir, fingerprint=plan_fingerprint(run.scenario))
    if step is None:
        return 0
    extra = load_checkpoint(run.job.checkpoint_dir, step, run.chunks, run.optimizer)
    if "loss_scale" in extra:
        run.scaler.load_state_dict(extra["loss_scale"])
    return step


def _save(run: RankRun, step: int) -> None:
    from partita.executor.checkpoint import plan_fingerprint, save_checkpoint
    save_checkpoint(run.job.checkpoint_dir, step, run.chunks, run.optimizer,
                    fingerprint=plan_fingerprint(run.scenario),
                    extra={"step": step, "seed": run.job.seed, "data": run.job.data,
                           "loss_scale": run.scaler.state_dict()})


def _gather(obj, rank: int) -> list | None:
    out = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def full_weights(run: RankRun) -> dict[str, torch.Tensor] | None:
    """The whole model's parameters under the model's own names, on rank 0 (CPU tensors)."""
    mine = {}
    for chunk in run.chunks:
        for name, p in chunk.named_parameters(remove_duplicate=False):
            value = p.full_tensor() if hasattr(p, "full_tensor") else p
            mine[chunk.model_name(name)] = value.detach().cpu()
    if run.me.dp or run.me.tp or run.me.cp:   # full_tensor() above is collective; one copy is enough
        mine = {}
    parts = _gather(mine, run.rank)
    return None if parts is None else {k: v for part in parts for k, v in part.items()}


def _finish(run: RankRun, records: list, losses: list[float], weights) -> None:
    summary = summarize(records, losses, run.plan.tokens_per_step)
    out = Path(run.job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "scenario": run.scenario.name or run.job.scenario, "world": run.plan.world,
        "backend": run.job.backend, "device": run.device.type, "plan": run.plan.to_dict(),
        "steps": list(summary.steps), "step_times_s": list(summary.step_times_s),
        "median_step_time_s": summary.median_step_time_s, "warmup_steps": summary.warmup_steps,
        "tokens_per_s": summary.tokens_per_s, "tokens_per_step": run.plan.tokens_per_step,
        "predicted_step_time_s": run.job.predicted_step_time_s, "host_load": run.job.host_load,
        "losses": list(summary.losses), "final_loss": summary.losses[-1] if summary.losses else None,
        "peak_memory_bytes": list(summary.peak_memory_bytes), "seed": run.job.seed,
        "lr": run.job.lr, "data": run.job.data or "synthetic", "torch": torch.__version__,
        "out_dir": str(out), "notes": run.plan.notes(),
        "memory": memory_report(summary, run.device.type,
                                [run.plan.coords(r).pp for r in range(run.plan.world)],
                                run.job.predicted_memory_bytes),
    }
    if run.scaler.enabled:
        result["loss_scale"] = run.scaler.state_dict()
    if summary.steps:
        write_outputs(out, summary, {"scenario": result["scenario"]})
    if weights is not None:
        torch.save(weights, run.job.save_weights)
    (out / RESULT_FILE).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def reference_run(scenario: Scenario, *, steps: int, seed: int = 0, lr: float = 1e-3,
                  data: str | None = None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training in one process, without any parallelism: (losses, final weights)."""
    plan = execution_plan(scenario, scenario.parallel.gpus)
    if plan.module is not None:
        names, layers, loss_fn = build_module_chain(scenario.model, torch.device("cpu"), seed)
        chunk = Chunk(0, layers, names, recompute=plan.recompute, precision=plan.precision,
                      device_type="cpu", plain=(names[0],),
                      recompute_num_layers=plan.recompute_num_layers)
    else:
        from partita.planner.models import build_model
        model = build_model(scenario.model.resolve(), seed=seed)
        loss_fn = model.loss
        chunk = Chunk(0, model.pipeline_layers(), model.layer_names(), recompute=plan.recompute,
                      precision=plan.precision, device_type="cpu",
                      recompute_num_layers=plan.recompute_num_layers)
    optimizer = make_optimizer(plan.optimizer, list(chunk.parameters()), lr)
    scaler = LossScaler(plan.precision)
    scaled_loss = scaler.scaled(loss_fn)
    stream = TokenStream(DataSpec(plan.arch, plan.seq_len, plan.vocab, seed, data))
    n = plan.global_batch // plan.micro_batch
    losses = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(n):
            ids, targets = (torch.from_numpy(a) for a in
                            stream.batch(step * plan.global_batch + k * plan.micro_batch, plan.micro_batch))
            loss = scaled_loss(chunk(ids), targets)
            loss.backward()
            total += float(loss.detach()) / scaler.scale
        for p in chunk.parameters():
            if p.grad is not None:
                p.grad.div_(n)
        found_inf = scaler.unscale([p.grad for p in chunk.parameters() if p.grad is not None],
                                   torch.device("cpu"))
        if not found_inf:
            optimizer.step()
        scaler.update(found_inf)
        losses.append(total / n)
    weights = {name: p.detach().clone()
               for name, p in chunk.named_parameters(remove_duplicate=False)}
    return losses, {chunk.model_name(k): v for k, v in weights.items()}
