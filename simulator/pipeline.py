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

`compile_schedule` reduces a schedule to its compute actions, where each one's output goes, and
its peaks, once; `simulator.step` keeps the compiled form of each schedule it builds, so a sweep
times costs, not list walking. The timing itself (`_Run`) is one event per compute action on the
event core, its finish, which hands the output on and starts the rank's next action.
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

    `ops[r]` holds rank r's compute actions in order as (code, stage, micro-batch, slot, cost,
    W slot, next slot, link, backward stage): code 0-3 is F, B, I, W, slot the dependency it waits
    on (see `_Run`), cost its index in `_Run.cost_s`, the rest where its output goes (`_outputs`).
    The peaks are `peak_inflight` and `peak_inflight_by_rank` of the schedule. Nothing here depends
    on costs, so a planner sweeping costs over one schedule shares it.
    """
    ops: tuple[tuple[tuple[int, ...], ...], ...]
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
            code = None if a is None else _CODE.get(a.kind)      # None: not a compute action
            if code is None:
                continue
            s, mb = a.stage, a.microbatch
            if not 0 <= s < stages or mb is None or not 0 <= mb < m:
                raise PartitaError(f"action {a} is outside the {stages} stages and "
                                   f"{m} micro-batches of the costs")
            slot = (0 if code == _F else 1 if code != _W else 2) * size + s * m + mb
            out.append((code, s, mb, slot, code * stages + s)
                       + _outputs(code, s, mb, r, p, stages, m))
        ops.append(tuple(out))
    per_stage, per_rank = peak_inflight(schedule), peak_inflight_by_rank(schedule)
    return CompiledSchedule(tuple(ops), stages, m,
                            tuple(per_stage.get(s, 0) for s in range(stages)),
                            tuple(per_rank.get(r, 0) for r in range(p)))


def _outputs(code: int, s: int, mb: int, r: int, p: int, stages: int,
             m: int) -> tuple[int, int, int, int]:
    """Where the output of action (code, s, mb) on rank r goes: (W slot, next slot, link, stage).

    The W slot is I's own W input (else -1). The next slot is the input F's activation or B/I's
    gradient feeds (-1: none, stage 0's backward or W); link is the transfer it crosses, -1 when
    the consumer is on the same rank: forward over boundary k is link k, backward over boundary k
    is link stages - 1 + k (see `_Run.link_s`). Stage is s for B and W, whose finish may be the
    stage's last backward, else -1.
    """
    size = stages * m
    w_slot = 2 * size + s * m + mb if code == _I else -1
    last = s if code in (_B, _W) else -1
    if code == _F:
        if s == stages - 1:
            return w_slot, size + s * m + mb, -1, last       # the loss: backward may start
        return w_slot, (s + 1) * m + mb, (-1 if (s + 1) % p == r else s), last
    if code == _W or s == 0:
        return w_slot, -1, -1, last
    return (w_slot, size + (s - 1) * m + mb, (-1 if (s - 1) % p == r else stages - 1 + s - 1),
            last)


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
    """The state of one simulation. Dependency slots: [F input | B/I input | W input] x (stage, mb).

    One event per compute action: its finish (`_finish`). A rank has at most one action in
    flight, so when it started is kept per rank (`start`) and the event carries only the rank.
    """

    __slots__ = ("compiled", "costs", "trace", "p", "m", "ready", "sent", "waiter", "ops",
                 "cost_s", "link_s", "pos", "start", "lane_free", "send_free", "busy", "recv_wait",
                 "send_busy", "last_bwd", "spans", "blocking", "loop")

    def __init__(self, compiled: CompiledSchedule, costs: PipelineCosts, trace: bool):
        self.compiled, self.costs, self.trace = compiled, costs, trace
        self.p, self.m = compiled.num_ranks, compiled.num_microbatches
        size = costs.num_stages * self.m
        self.ready = [-1.0] * (3 * size)          # when the input of the slot exists
        self.sent = [-1.0] * (3 * size)           # when its producer finished (if transferred)
        self.waiter = [-1] * (3 * size)
        for mb in range(self.m):
            self.ready[mb] = 0.0                  # stage 0's F waits for nothing
        self.ops = compiled.ops
        # seconds of action (code, s) at code * stages + s, of a transfer at its link
        self.cost_s = (costs.forward_s + costs.backward_s + costs.backward_input_s
                       + costs.backward_weight_s)
        self.link_s = costs.activation_s + costs.gradient_s
        self.pos = [0] * self.p
        self.start = [0.0] * self.p
        self.lane_free = [0.0] * self.p
        self.send_free = [0.0] * self.p
        self.busy = [0.0] * self.p
        self.recv_wait = [0.0] * self.p
        self.send_busy = [0.0] * self.p
        self.last_bwd = [0.0] * costs.num_stages
        self.spans: list[Span] = []
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
        """Start rank r's next action if its input exists, else leave r waiting for it.

        `_finish` holds a copy of this for the rank whose action just ended (the hot path)."""
        op = self.ops[r][self.pos[r]]
        slot = op[3]
        t = self.ready[slot]
        if t < 0:
            self.waiter[slot] = r
            return
        free = self.lane_free[r]
        if t > free:
            produced = self.sent[slot]
            if produced >= 0:
                waited = free if free > produced else produced
                if t > waited:
                    self.recv_wait[r] += t - waited
                    if self.trace:
                        self._recv_span(r, op, waited, t)
            free = t
        self.start[r] = free
        self.loop.at(free + self.cost_s[op[4]], self._finish, r)

    def _finish(self, r: int) -> None:
        """Rank r's action ends now: hand its output on (see `_outputs`), start r's next action."""
        ops = self.ops[r]
        pos = self.pos[r]
        op = ops[pos]
        _, _, _, _, cost, w_slot, slot, link, stage = op
        end = self.loop.now
        self.busy[r] += self.cost_s[cost]
        if self.trace:
            self.spans.append(Span(r, "compute", self._name(op), self.start[r], end,
                                   _CAT[op[0]]))
        pos += 1
        self.pos[r] = pos
        free = end                      # when r's compute lane is free again
        ready = self.ready
        if w_slot >= 0:                 # I: its W may run now
            ready[w_slot] = end
            self.sent[w_slot] = -1.0
            q = self.waiter[w_slot]     # none in a valid schedule: W runs on I's rank, r
            if q >= 0:
                self.waiter[w_slot] = -1
                self._try_start(q)
        if slot >= 0:
            if link < 0:                # same rank, or the loss
                ready[slot] = end
                self.sent[slot] = -1.0
            else:
                dur = self.link_s[link]
                t0 = self.send_free[r]
                if end > t0:
                    t0 = end
                t1 = t0 + dur
                self.send_free[r] = t1
                self.send_busy[r] += dur
                if self.blocking and t1 > end:
                    free = t1                         # a synchronous send holds the compute lane
                if self.trace and dur > 0:
                    self._send_span(r, op, t0, t1)
                ready[slot] = t1
                self.sent[slot] = end
            self.lane_free[r] = free
            q = self.waiter[slot]
            if q >= 0:
                self.waiter[slot] = -1
                self._try_start(q)
        else:
            self.lane_free[r] = end
        if stage >= 0 and end > self.last_bwd[stage]:
            self.last_bwd[stage] = end
        if pos == len(ops):
            return
        op = ops[pos]                   # r's next action: `_try_start`, inline
        slot = op[3]
        t = ready[slot]
        if t < 0:
            self.waiter[slot] = r
            return
        if t > free:
            produced = self.sent[slot]
            if produced >= 0:
                waited = free if free > produced else produced
                if t > waited:
                    self.recv_wait[r] += t - waited
                    if self.trace:
                        self._recv_span(r, op, waited, t)
            free = t
        self.start[r] = free
        self.loop.at(free + self.cost_s[op[4]], self._finish, r)

    def _send_span(self, r: int, op: tuple, t0: float, t1: float) -> None:
        code, s, mb = op[0], op[1], op[2]
        if code == _F:
            self.spans.append(Span(r, "send", f"{s}SEND_F{mb}", t0, t1, self._link_cat(s)))
        else:
            self.spans.append(Span(r, "send", f"{s}SEND_B{mb}", t0, t1, self._link_cat(s - 1)))

    def _recv_span(self, r: int, op: tuple, t0: float, t1: float) -> None:
        code, s, mb = op[0], op[1], op[2]
        if code == _F:
            self.spans.append(Span(r, "recv", f"{s}RECV_F{mb}", t0, t1, self._link_cat(s - 1)))
        else:
            self.spans.append(Span(r, "recv", f"{s}RECV_B{mb}", t0, t1, self._link_cat(s)))

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
