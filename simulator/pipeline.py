"""Timing a pipeline schedule: `simulate_pipeline(schedule, costs) -> PipelineTimeline`.

Each rank runs its compute actions in list order on one compute lane. F(s, mb) waits for the
activation of F(s-1, mb) (its finish plus the transfer), B or I(s, mb) for the gradient of B or
I(s+1, mb); the last stage's backward follows its own F, W follows its own I, stage 0's F waits for
nothing. A finished F or B/I hands its tensor to the next stage at once when that stage is on the
same rank, or else queues a transfer on the sending rank's send lane, so sending never blocks
compute (unless the costs say sends block, as DeepSpeed's pipeline engine's do: then the rank's
next compute action waits for its send to finish).

[Note: transfers] A rank's outgoing transfers are served one at a time in the order its compute
produced them (a GPU's NVLink or NIC egress is shared by all its peers: two concurrent sends at
half bandwidth each end when two sends in a row would). This also serializes the transfers on each
link between a pair of ranks. Every order in the model, compute and send, is therefore fixed by the
schedule, so each time is a max-plus expression of the inputs: shorter compute or transfer times
can never lengthen the step, and same input gives the same output. Receiving is not a resource;
the "recv" spans show where a rank's compute sat waiting for a tensor still in flight (the exposed
pipeline communication), which is also what an executor sees when it waits on a posted irecv.

The timeline also carries, per stage, when its last backward finished (its data-parallel gradient
reduction may start then) and the peak number of micro-batches with live activations.

`compile_schedule` reduces a schedule to its compute actions and peaks once; `simulator.step`
keeps the compiled form of each schedule it builds, so a sweep times costs, not list walking.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from partita.planner.errors import PartitaError
from partita.planner.schedule import (COMPUTE_KINDS, ComputationType, Schedule, peak_inflight,
                              peak_inflight_by_rank, validate)
from partita.simulator.events import EventLoop
from partita.simulator.result import Span

_F, _B, _I, _W = 0, 1, 2, 3
_CODE = {ComputationType.FORWARD: _F, ComputationType.FULL_BACKWARD: _B,
         ComputationType.BACKWARD_INPUT: _I, ComputationType.BACKWARD_WEIGHT: _W}
_CAT = ("forward", "backward", "backward-input", "backward-weight")


@dataclass(frozen=True)
class PipelineCosts:
    """Seconds per micro-batch for each stage (model chunk) and each stage boundary.

    `backward_weight_s` is the W part of the full backward B; I = B - W. Boundary k sits between
    stages k and k+1: `activation_s[k]` moves F's output from k to k+1, `gradient_s[k]` moves the
    input gradient from k+1 back to k, and `same_node[k]` says whether the two ranks share a node.
    `blocking_sends`: a send holds the sending rank's compute lane until it completes, as
    DeepSpeed's pipeline engine sends (deepspeed/runtime/pipe/p2p.py: `send(..., async_op=False)`
    asserts async_op is False and calls the synchronous dist.send, or dist.broadcast before
    torch 1.8), so the next compute action waits for the transfer.
    """
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    backward_weight_s: tuple[float, ...]
    activation_s: tuple[float, ...]
    gradient_s: tuple[float, ...]
    same_node: tuple[bool, ...]
    blocking_sends: bool = False

    def __post_init__(self) -> None:
        stages = len(self.forward_s)
        if stages < 1:
            raise ValueError("PipelineCosts needs at least one stage")
        for name, size in (("forward_s", stages), ("backward_s", stages),
                           ("backward_weight_s", stages), ("activation_s", stages - 1),
                           ("gradient_s", stages - 1), ("same_node", stages - 1)):
            values = tuple(getattr(self, name))
            object.__setattr__(self, name, values)
            if len(values) != size:
                raise ValueError(f"PipelineCosts.{name} has {len(values)} entries, expected {size}")
            if name != "same_node":
                _check_seconds(name, values)
        for k, (b, w) in enumerate(zip(self.backward_s, self.backward_weight_s)):
            if w > b:
                raise ValueError(f"PipelineCosts: stage {k} backward_weight_s ({w}) exceeds "
                                 f"backward_s ({b})")

    @property
    def num_stages(self) -> int:
        return len(self.forward_s)

    @property
    def backward_input_s(self) -> tuple[float, ...]:
        return tuple(b - w for b, w in zip(self.backward_s, self.backward_weight_s))

    @classmethod
    def uniform(cls, stages: int, forward_s: float, backward_s: float, *,
                weight_s: float | None = None, activation_s: float = 0.0,
                gradient_s: float | None = None, same_node: bool = True) -> PipelineCosts:
        """Identical stages; W defaults to half of B, the gradient transfer to the activation's."""
        w = backward_s / 2 if weight_s is None else weight_s
        g = activation_s if gradient_s is None else gradient_s
        return cls((forward_s,) * stages, (backward_s,) * stages, (w,) * stages,
                   (activation_s,) * (stages - 1), (g,) * (stages - 1), (same_node,) * (stages - 1))


def _check_seconds(name: str, values: tuple[float, ...]) -> None:
    for k, value in enumerate(values):
        if not 0 <= value < math.inf:
            raise ValueError(f"PipelineCosts.{name}[{k}] must be finite and >= 0, got {value}")


@dataclass(frozen=True)
class PipelineTimeline:
    """One simulated pipeline step in seconds; per-rank tuples by rank, per-stage ones by stage."""
    makespan_s: float
    busy_s: tuple[float, ...]             # compute time per rank
    recv_wait_s: tuple[float, ...]        # compute idle waiting for a tensor in flight, per rank
    send_s: tuple[float, ...]             # time on each rank's send lane
    last_backward_s: tuple[float, ...]    # per stage: finish of its last B or W
    peak_inflight: tuple[int, ...]        # per stage: most micro-batches between F and B/W
    peak_inflight_rank: tuple[int, ...]   # per rank, summed over its stages
    num_microbatches: int
    spans: tuple[Span, ...] = field(default=(), repr=False)

    @property
    def num_ranks(self) -> int:
        return len(self.busy_s)

    @property
    def num_stages(self) -> int:
        return len(self.last_backward_s)

    @property
    def idle_s(self) -> tuple[float, ...]:
        """Bubble time per rank: the step minus the rank's compute."""
        return tuple(self.makespan_s - b for b in self.busy_s)

    @property
    def bubble_fraction(self) -> float:
        """1 - mean busy / makespan (0 for an empty step)."""
        if self.makespan_s <= 0:
            return 0.0
        return 1.0 - sum(self.busy_s) / len(self.busy_s) / self.makespan_s


@dataclass(frozen=True)
class CompiledSchedule:
    """A schedule reduced to what timing it needs, computed once per (schedule, p, m, v).

    `ops[r]` holds rank r's compute actions in order as (code, stage, micro-batch, slot): code
    0-3 is F, B, I, W and slot the dependency it waits on (see `_Run`). The peaks are
    `peak_inflight` and `peak_inflight_by_rank` of the schedule. Nothing here depends on costs, so
    a planner sweeping costs over one schedule shares it.
    """
    ops: tuple[tuple[tuple[int, int, int, int], ...], ...]
    num_stages: int
    num_microbatches: int
    peak_inflight: tuple[int, ...]
    peak_inflight_rank: tuple[int, ...]

    @property
    def num_ranks(self) -> int:
        return len(self.ops)


def compile_schedule(schedule: Schedule, stages: int) -> CompiledSchedule:
    """`schedule`'s compute actions for `stages` model chunks (a multiple of its ranks)."""
    p = len(schedule)
    if p == 0 or stages % p:
        raise PartitaError(f"costs describe {stages} stages, not a multiple of the "
                           f"schedule's {p} ranks")
    m = _num_microbatches(schedule)
    size = stages * m
    ops = []
    for r in range(p):
        out = []
        for a in schedule[r]:
            if a is None or a.kind not in COMPUTE_KINDS:
                continue
            code, s, mb = _CODE[a.kind], a.stage, a.microbatch
            if not 0 <= s < stages or mb is None or not 0 <= mb < m:
                raise PartitaError(f"action {a} is outside the {stages} stages and "
                                   f"{m} micro-batches of the costs")
            slot = (0 if code == _F else 1 if code != _W else 2) * size + s * m + mb
            out.append((code, s, mb, slot))
        ops.append(tuple(out))
    per_stage, per_rank = peak_inflight(schedule), peak_inflight_by_rank(schedule)
    return CompiledSchedule(tuple(ops), stages, m,
                            tuple(per_stage.get(s, 0) for s in range(stages)),
                            tuple(per_rank.get(r, 0) for r in range(p)))


def simulate_pipeline(schedule: Schedule | CompiledSchedule, costs: PipelineCosts, *,
                      trace: bool = False, check: bool = True) -> PipelineTimeline:
    """Time `schedule` (compute actions; comm actions and bubbles are ignored) with `costs`.

    `check=False` skips `validate` in hot loops; a schedule that cannot finish still raises.
    A `CompiledSchedule` comes from `compile_schedule`, which does not validate.
    """
    if isinstance(schedule, CompiledSchedule):
        compiled = schedule
        if compiled.num_stages != costs.num_stages:
            raise PartitaError(f"costs describe {costs.num_stages} stages, the compiled "
                               f"schedule {compiled.num_stages}")
    else:
        compiled = compile_schedule(schedule, costs.num_stages)
        if check:
            validate(schedule, compiled.num_ranks, compiled.num_microbatches,
                     costs.num_stages // compiled.num_ranks)
    run = _Run(compiled, costs, trace)
    run.go()
    return run.timeline()


def _num_microbatches(schedule: Schedule) -> int:
    top = -1
    for actions in schedule.values():
        for a in actions:
            if a is not None and a.kind in COMPUTE_KINDS and a.microbatch is not None:
                top = max(top, a.microbatch)
    if top < 0:
        raise PartitaError("schedule has no compute actions")
    return top + 1


class _Run:
    """The state of one simulation. Dependency slots: [F input | B/I input | W input] x (stage, mb)."""

    def __init__(self, compiled: CompiledSchedule, costs: PipelineCosts, trace: bool):
        self.compiled, self.costs, self.trace = compiled, costs, trace
        self.p, self.m = compiled.num_ranks, compiled.num_microbatches
        self.stages = costs.num_stages
        size = self.stages * self.m
        self.size = size
        self.ready = [-1.0] * (3 * size)          # when the input of the slot exists
        self.sent = [-1.0] * (3 * size)           # when its producer finished (if transferred)
        self.waiter = [-1] * (3 * size)
        for mb in range(self.m):
            self.ready[mb] = 0.0                  # stage 0's F waits for nothing
        self.ops = compiled.ops
        self.durations = (costs.forward_s, costs.backward_s, costs.backward_input_s,
                          costs.backward_weight_s)
        self.pos = [0] * self.p
        self.lane_free = [0.0] * self.p
        self.send_free = [0.0] * self.p
        self.busy = [0.0] * self.p
        self.recv_wait = [0.0] * self.p
        self.send_busy = [0.0] * self.p
        self.last_bwd = [0.0] * self.stages
        self.spans: list[Span] = []
        self.activation_s, self.gradient_s = costs.activation_s, costs.gradient_s
        self.blocking = costs.blocking_sends
        self.loop = EventLoop()

    def go(self) -> None:
        for r in range(self.p):
            if self.ops[r]:
                self._try_start(r)
        self.loop.run()
        stuck = [r for r in range(self.p) if self.pos[r] < len(self.ops[r])]
        if stuck:
            heads = "; ".join(f"rank {r} waits at {self._name(self.ops[r][self.pos[r]])}"
                              for r in stuck[:4])
            raise PartitaError(f"pipeline simulation stalled ({heads}); validate() the schedule "
                               "for the reason")

    def _try_start(self, r: int) -> None:
        op = self.ops[r][self.pos[r]]
        slot = op[3]
        t = self.ready[slot]
        if t < 0:
            self.waiter[slot] = r
            return
        free = self.lane_free[r]
        if t > free:
            produced = self.sent[slot]
            if produced >= 0 and t > (free if free > produced else produced):
                self._recv_wait(r, op[0], op[1], op[2], free if free > produced else produced, t)
            free = t
        self.loop.at(free + self.durations[op[0]][op[1]], self._finish, r, free)

    def _finish(self, r: int, start: float) -> None:
        ops = self.ops[r]
        pos = self.pos[r]
        op = ops[pos]
        code, s, mb = op[0], op[1], op[2]
        end = self.loop.now
        self.busy[r] += self.durations[code][s]
        if self.trace:
            self.spans.append(Span(r, "compute", self._name(op), start, end, _CAT[code]))
        pos += 1
        self.pos[r] = pos
        self.lane_free[r] = end
        key = s * self.m + mb
        if code == _F:
            self._forward_done(r, s, mb, key, end)
        elif code != _W:
            self._input_grad_done(r, s, mb, key, end, code)
        if code == _B or code == _W:
            if end > self.last_bwd[s]:
                self.last_bwd[s] = end
        if pos < len(ops):
            self._try_start(r)

    def _forward_done(self, r: int, s: int, mb: int, key: int, end: float) -> None:
        if s == self.stages - 1:
            self._deliver(self.size + key, end, -1.0)          # the loss: backward may start
        elif (s + 1) % self.p == r:
            self._deliver(key + self.m, end, -1.0)
        else:
            self._transfer(r, s, mb, end, True)

    def _input_grad_done(self, r: int, s: int, mb: int, key: int, end: float, code: int) -> None:
        if code == _I:
            self._deliver(2 * self.size + key, end, -1.0)      # W may run now
        if s == 0:
            return
        if (s - 1) % self.p == r:
            self._deliver(self.size + key - self.m, end, -1.0)
        else:
            self._transfer(r, s, mb, end, False)

    def _transfer(self, r: int, s: int, mb: int, end: float, forward: bool) -> None:
        if forward:
            boundary, dur, slot = s, self.activation_s[s], (s + 1) * self.m + mb
        else:
            boundary, dur, slot = s - 1, self.gradient_s[s - 1], self.size + (s - 1) * self.m + mb
        free = self.send_free[r]
        t0 = end if end > free else free
        t1 = t0 + dur
        self.send_free[r] = t1
        self.send_busy[r] += dur
        if self.blocking and t1 > self.lane_free[r]:
            self.lane_free[r] = t1                    # a synchronous send holds the compute lane
        if self.trace and dur > 0:
            kind = "SEND_F" if forward else "SEND_B"
            self.spans.append(Span(r, "send", f"{s}{kind}{mb}", t0, t1, self._link_cat(boundary)))
        self._deliver(slot, t1, end)

    def _deliver(self, slot: int, t: float, produced: float) -> None:
        self.ready[slot] = t
        self.sent[slot] = produced
        q = self.waiter[slot]
        if q >= 0:
            self.waiter[slot] = -1
            self._try_start(q)

    def _recv_wait(self, r: int, code: int, s: int, mb: int, t0: float, t1: float) -> None:
        self.recv_wait[r] += t1 - t0
        if self.trace:
            name = f"{s}RECV_F{mb}" if code == _F else f"{s}RECV_B{mb}"
            boundary = s - 1 if code == _F else s
            self.spans.append(Span(r, "recv", name, t0, t1, self._link_cat(boundary)))

    def _link_cat(self, boundary: int) -> str:
        return "pp-intra-node" if self.costs.same_node[boundary] else "pp-inter-node"

    @staticmethod
    def _name(op: tuple) -> str:
        code, s, mb = op[0], op[1], op[2]
        return f"{s}{'FBIW'[code]}{mb}"

    def timeline(self) -> PipelineTimeline:
        spans = sorted(self.spans, key=lambda x: (x.rank, x.lane, x.start_s, x.end_s, x.name))
        return PipelineTimeline(
            makespan_s=max(max(self.lane_free), max(self.send_free)),
            busy_s=tuple(self.busy), recv_wait_s=tuple(self.recv_wait),
            send_s=tuple(self.send_busy), last_backward_s=tuple(self.last_bwd),
            peak_inflight=self.compiled.peak_inflight,
            peak_inflight_rank=self.compiled.peak_inflight_rank,
            num_microbatches=self.m, spans=tuple(spans))
