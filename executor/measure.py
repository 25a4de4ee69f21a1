"""Measuring a run: per-step wall time, tokens/s, peak memory, and a span for every pipeline action.

`StepRecorder` wraps the compute entry points of each `PipelineStage` (forward_one_chunk,
backward_one_chunk, backward_weight_one_chunk, perform_reduce_grad), so every schedule torch offers
is timed the same way, and names the spans with torch's (and the simulator's) action text: "2F0"
is stage 2's forward of micro-batch 0, "1B3" a full backward, "1I3" / "1W3" the input / weight
halves of a zero-bubble backward. Waiting for a peer's activation is outside the spans, so a rank's
idle time is the gaps between them. Times are seconds from the start of the step, which every rank
enters through a barrier. On CUDA the spans are CUDA events, read once at the end of the step.

Pipeline communication gets spans with the simulator's names and lanes (simulator/pipeline.py):
on the "recv" lane, "2RECV_F0" is the time stage 2 waited for micro-batch 0's activation and
"2RECV_B0" for its gradient, from the start to the end of the schedule's wait; on the "send" lane,
"1SEND_F0" is stage 1's send of that activation and "2SEND_B0" stage 2's send of the gradient,
from posting the send to the end of the wait that saw it complete (torch offers no completion
time of its own, so a send span is an upper bound of its transfer). The ops are named where each
stage makes them (get_fwd_send_ops, ...) and timed where every schedule posts and waits for them
(torch.distributed.pipelining.schedules._batch_p2p / _wait_batch_p2p). The gradient reduction of
parameters tied across pipeline ranks has its own "tied" lane ("TIED_ALLREDUCE"), the
data-parallel reduction the "dp" lane, the optimizer the "optimizer" lane.

`summarize` and `write_outputs` turn every rank's records into metrics.jsonl (one line per step),
and trace.json (the last step, as simulator.trace writes a simulated one).
"""
from __future__ import annotations

import inspect
import json
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from partita.planner.units import GIB
from partita.simulator.result import Span

# fault-injection phase (executor/faults.py) of each action category
PHASE_OF = {"forward": "forward", "backward": "backward", "backward-input": "backward"}


@dataclass(frozen=True)
class StepRecord:
    """One rank's view of one optimizer step."""
    rank: int
    step: int                      # 1-based
    wall_s: float
    spans: tuple[Span, ...]
    peak_memory_bytes: int | None  # CUDA only: torch.cuda.max_memory_allocated over the step
    peak_reserved_bytes: int | None = None   # CUDA only: max_memory_reserved (the caching allocator)


class _CpuClock:
    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start, mark) -> float:
        return mark - start

    def sync(self) -> None:
        pass


class _CudaClock:
    def __init__(self, torch):
        self.torch = torch

    def mark(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, start, mark) -> float:
        return start.elapsed_time(mark) / 1e3

    def sync(self) -> None:
        self.torch.cuda.synchronize()


class StepRecorder:
    """Collects spans of one rank, step by step. `on_phase(step, phase)` runs before each action
    (the run loop passes fault injection there)."""

    def __init__(self, rank: int, device_type: str,
                 on_phase: Callable[[int, str], None] | None = None):
        import torch
        self.torch = torch
        self.rank = rank
        self.cuda = device_type == "cuda"
        self.clock = _CudaClock(torch) if self.cuda else _CpuClock()
        self.on_phase = on_phase
        self.step = 0
        self._start: Any = None
        self._wall_start = 0.0
        self._open: list[tuple[str, str, str, Any, Any]] = []   # lane, name, cat, start, end
        self.records: list[StepRecord] = []

    def instrument(self, stage) -> None:
        """Time this PipelineStage's compute actions (instance attributes shadow the methods)."""
        sid = stage.stage_index
        self._wrap(stage, "forward_one_chunk", lambda a: (f"{sid}F{a['fwd_chunk_id']}", "forward"))
        self._wrap(stage, "backward_one_chunk", lambda a: (
            f"{sid}{'B' if a.get('full_backward', True) else 'I'}{a['bwd_chunk_id']}",
            "backward" if a.get("full_backward", True) else "backward-input"))
        self._wrap(stage, "backward_weight_one_chunk",
                   lambda a: (f"{sid}W{a['bwd_chunk_id']}", "backward-weight"))
        self._wrap(stage, "perform_reduce_grad", lambda a: (f"{sid}REDUCE_GRAD", "comm"), lane="dp")
        for method, kind in (("get_fwd_send_ops", "SEND_F"), ("get_bwd_send_ops", "SEND_B"),
                             ("get_fwd_recv_ops", "RECV_F"), ("get_bwd_recv_ops", "RECV_B")):
            self._name_ops(stage, method, f"{sid}{kind}")
        self._patch_p2p()

    def _name_ops(self, stage, method: str, prefix: str) -> None:
        original = getattr(stage, method)

        def named(chunk_id, *args, **kwargs):
            ops = original(chunk_id, *args, **kwargs)
            for op in ops:
                op.partita_name = f"{prefix}{chunk_id}"
            return ops

        setattr(stage, method, named)

    def _patch_p2p(self) -> None:
        """Time every schedule's posting of and waiting for the named P2P ops (once per process)."""
        import torch.distributed.pipelining.schedules as schedules
        if getattr(schedules._batch_p2p, "partita_recorder", None) is self:
            return
        # torch's own functions, also when an earlier recorder of this process patched them
        post = getattr(schedules._batch_p2p, "partita_original", schedules._batch_p2p)
        wait = getattr(schedules._wait_batch_p2p, "partita_original", schedules._wait_batch_p2p)
        posted: dict[int, tuple[list, Any, list[str]]] = {}

        def batch_p2p(p2p_ops, desc=None):
            start = self.clock.mark()
            works = post(p2p_ops, desc=desc)
            names = [n for n in (getattr(op, "partita_name", None) for op in p2p_ops) if n]
            if names:
                posted[id(works)] = (works, start, names)
            return works

        def wait_batch_p2p(works):
            entry = posted.pop(id(works), None)
            start = self.clock.mark()
            wait(works)
            if entry is not None:
                end = self.clock.mark()
                for name in entry[2]:
                    if "RECV" in name:
                        self._open.append(("recv", name, "comm", start, end))
                    else:
                        self._open.append(("send", name, "comm", entry[1], end))

        batch_p2p.partita_recorder = self
        batch_p2p.partita_original, wait_batch_p2p.partita_original = post, wait
        schedules._batch_p2p, schedules._wait_batch_p2p = batch_p2p, wait_batch_p2p

    def _wrap(self, stage, method: str, label: Callable[[dict], tuple[str, str]],
              lane: str = "compute") -> None:
        original = getattr(stage, method)
        signature = inspect.signature(original)

        def timed(*args, **kwargs):
            name, cat = label(signature.bind(*args, **kwargs).arguments)
            if self.on_phase is not None and cat in PHASE_OF:
                self.on_phase(self.step, PHASE_OF[cat])
            with self.span(lane, name, cat):
                return original(*args, **kwargs)

        setattr(stage, method, timed)

    @contextmanager
    def span(self, lane: str, name: str, cat: str = ""):
        start = self.clock.mark()
        try:
            yield
        finally:
            self._open.append((lane, name, cat, start, self.clock.mark()))

    def start_step(self, step: int) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()
        self.clock.sync()
        self.step = step
        self._open = []
        self._wall_start = time.perf_counter()
        self._start = self.clock.mark()

    def end_step(self) -> StepRecord:
        self.clock.sync()
        wall = time.perf_counter() - self._wall_start
        spans = tuple(Span(rank=self.rank, lane=lane, name=name, cat=cat,
                           start_s=self.clock.seconds(self._start, a),
                           end_s=self.clock.seconds(self._start, b))
                      for lane, name, cat, a, b in self._open)
        peak = int(self.torch.cuda.max_memory_allocated()) if self.cuda else None
        reserved = int(self.torch.cuda.max_memory_reserved()) if self.cuda else None
        record = StepRecord(rank=self.rank, step=self.step, wall_s=wall, spans=spans,
                            peak_memory_bytes=peak, peak_reserved_bytes=reserved)
        self.records.append(record)
        return record


@dataclass(frozen=True)
class RunSummary:
    """What rank 0 reports: one entry per step, over all ranks."""
    steps: tuple[int, ...]
    step_times_s: tuple[float, ...]       # slowest rank's wall time of each step
    losses: tuple[float, ...]
    tokens_per_step: int
    warmup_steps: int
    peak_memory_bytes: tuple[int | None, ...]   # per rank, over all steps (CUDA only)
    step_peak_memory_bytes: tuple[int | None, ...] = ()   # per step, the largest over ranks
    peak_reserved_bytes: tuple[int | None, ...] = ()      # per rank, over all steps (CUDA only)
    spans: dict[int, tuple[Span, ...]] = field(default_factory=dict)   # step -> spans of all ranks

    @property
    def steady_times_s(self) -> tuple[float, ...]:
        """Step times after the warm-up (the first step builds communicators and buffers)."""
        return self.step_times_s[self.warmup_steps:] or self.step_times_s

    @property
    def median_step_time_s(self) -> float:
        return statistics.median(self.steady_times_s)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.median_step_time_s


def summarize(per_rank: list[list[StepRecord]], losses: list[float], tokens_per_step: int) -> RunSummary:
    """Join every rank's records; a step takes as long as its slowest rank."""
    steps = tuple(r.step for r in per_rank[0])
    times = tuple(max(records[i].wall_s for records in per_rank) for i in range(len(steps)))
    peaks = tuple(_largest(r.peak_memory_bytes for r in records) for records in per_rank)
    reserved = tuple(_largest(r.peak_reserved_bytes for r in records) for records in per_rank)
    step_peaks = tuple(_largest(records[i].peak_memory_bytes for records in per_rank)
                       for i in range(len(steps)))
    spans = {step: tuple(s for records in per_rank for s in records[i].spans)
             for i, step in enumerate(steps)}
    return RunSummary(steps=steps, step_times_s=times, losses=tuple(losses),
                      tokens_per_step=tokens_per_step, warmup_steps=1 if len(steps) > 1 else 0,
                      peak_memory_bytes=peaks, step_peak_memory_bytes=step_peaks, spans=spans,
                      peak_reserved_bytes=reserved)


def _largest(values) -> int | None:
    return max((v for v in values if v is not None), default=None)


CPU_MEMORY_NOTE = ("memory not measured: torch tracks peak allocations on CUDA only, and a CPU "
                   "process's resident size would count the interpreter and libraries too")


def memory_report(summary: RunSummary, device_type: str, pipeline_rank: list[int],
                  predicted: list[int] | None) -> dict[str, Any]:
    """result.json's "memory": per rank, the measured peaks (CUDA) next to the simulator's
    prediction for the rank's pipeline stage (None when the run had no prediction)."""
    measured = device_type == "cuda"
    ranks = []
    for rank, pp in enumerate(pipeline_rank):
        ranks.append({
            "rank": rank, "pipeline_rank": pp,
            "peak_allocated_bytes": summary.peak_memory_bytes[rank] if measured else None,
            "peak_reserved_bytes": summary.peak_reserved_bytes[rank] if measured else None,
            "predicted_bytes": predicted[pp] if predicted else None})
    return {"measured": measured, "note": None if measured else CPU_MEMORY_NOTE, "ranks": ranks}


def predicted_stage_memory(result) -> list[int] | None:
    """The simulator's memory of each pipeline rank (SimResult.details["stage_memory_bytes"]:
    one dict of bytes by kind per rank), summed; None if this simulator does not report it."""
    stages = result.details.get("stage_memory_bytes")
    return None if stages is None else [int(sum(kinds.values())) for kinds in stages]


def format_memory(memory: dict[str, Any] | None) -> list[str]:
    """The run table's memory lines."""
    if not memory:
        return []
    predicted = any(r["predicted_bytes"] is not None for r in memory["ranks"])
    if not memory["measured"]:
        lines = [f"  {memory['note']}"]
        if predicted:
            per_stage = sorted({(r["pipeline_rank"], r["predicted_bytes"]) for r in memory["ranks"]})
            lines.append("  predicted memory per stage: " + ", ".join(
                f"stage {pp} {b / GIB:.2f} GiB" for pp, b in per_stage))
        return lines
    lines = [f"  {'rank':>5}  {'stage':>5}  {'peak alloc GiB':>14}  {'reserved GiB':>12}  "
             f"{'predicted GiB':>13}"]
    for r in memory["ranks"]:
        pred = r["predicted_bytes"]
        pred_text = f"{pred / GIB:13.2f}" if pred is not None else f"{'none':>13}"
        lines.append(f"  {r['rank']:>5}  {r['pipeline_rank']:>5}  "
                     f"{r['peak_allocated_bytes'] / GIB:14.2f}  "
                     f"{r['peak_reserved_bytes'] / GIB:12.2f}  {pred_text}")
    return lines


def step_lines(summary: RunSummary) -> list[dict[str, Any]]:
    """metrics.jsonl: one object per step, with every rank's spans."""
    lines = []
    for i, step in enumerate(summary.steps):
        t = summary.step_times_s[i]
        lines.append({"step": step, "step_time_s": t, "tokens_per_s": summary.tokens_per_step / t,
                      "loss": summary.losses[i], "warmup": i < summary.warmup_steps,
                      "peak_memory_bytes": summary.step_peak_memory_bytes[i],
                      "spans": [asdict(s) for s in summary.spans[step]]})
    return lines


def write_outputs(out_dir: Path, summary: RunSummary, metadata: dict[str, Any]) -> None:
    """metrics.jsonl and trace.json (the last step) under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "metrics.jsonl", "w", encoding="utf-8") as fh:
        for line in step_lines(summary):
            fh.write(json.dumps(line) + "\n")
    from partita.simulator.trace import write_trace
    last = summary.steps[-1]
    write_trace(sorted(summary.spans[last], key=lambda s: (s.rank, s.start_s)),
                out_dir / "trace.json", metadata={**metadata, "step": last, "measured": True})
