"""The stage-partition problem and its arithmetic: a layer graph, a problem, a split, its cost.

The model is a DAG whose layers are listed in a topological order (the order the profile gives);
every chunk is a contiguous range of that order, as Megatron, torch.distributed.pipelining and
`parallel.stages` require, so every edge goes to the same or a later chunk. A tensor whose
consumers lie beyond a boundary crosses it (`LayerGraph.cut_bytes`) and is paid at each boundary it
crosses. Tied parameters (tied embeddings) placed on different pipeline ranks cost their state twice
and a gradient all-reduce once per step (Megatron's embedding group), charged to the later rank.
Chunk c of p*v runs on pipeline rank c % p (looped placement).

`evaluate(problem, ranges)` gives a split's time and memory per rank in plain arithmetic: the model
that the ILP (`partition.solve`) and the dynamic programme (`partition_dp.exact_chain`) optimise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from partita.planner.enums import OPTIMIZE
from partita.planner.errors import PartitaError


@dataclass(frozen=True, kw_only=True)
class Layer:
    name: str
    time_s: float                  # forward + backward + recompute of one micro-batch
    state_bytes: float             # weights, gradients, optimizer state held for this layer
    activation_bytes: float        # kept for backward per micro-batch in flight
    output_bytes: float            # the tensor it passes on (paid where it crosses a boundary)


@dataclass(frozen=True, kw_only=True)
class Tie:
    """Parameters of layer `first` reused by layer `second` (tied embeddings)."""
    first: int
    second: int
    state_bytes: float             # the copy the second rank holds when they are apart
    sync_s: float = 0.0            # gradient all-reduce per micro-batch (per step / micro-batches)


@dataclass(frozen=True, kw_only=True)
class LayerGraph:
    layers: tuple[Layer, ...]
    edges: tuple[tuple[int, int], ...]          # (producer, consumer), producer < consumer
    ties: tuple[Tie, ...] = ()

    @classmethod
    def chain(cls, layers, ties=()) -> "LayerGraph":
        layers = tuple(layers)
        return cls(layers=layers, edges=tuple((i, i + 1) for i in range(len(layers) - 1)),
                   ties=tuple(ties))

    def __post_init__(self):
        n = len(self.layers)
        for a, b in self.edges:
            if not 0 <= a < b < n:
                raise PartitaError(f"layer graph: edge ({a}, {b}) does not go forward in the "
                                   f"layer order (0..{n - 1})")

    def cut_bytes(self) -> list[float]:
        """Bytes crossing the boundary right after layer k, for k = 0..n-2: every tensor produced
        at or before k and consumed after k (once per tensor, however many consumers)."""
        n = len(self.layers)
        last = {}
        for a, b in self.edges:
            last[a] = max(last.get(a, a), b)
        diff = [0.0] * (n + 1)
        for a, b in last.items():
            diff[a] += self.layers[a].output_bytes
            diff[b] -= self.layers[a].output_bytes
        out, run = [], 0.0
        for k in range(n - 1):
            run += diff[k]
            out.append(run)
        return out


@dataclass(frozen=True, kw_only=True)
class PartitionProblem:
    graph: LayerGraph
    stages: int                                  # pipeline ranks p
    capacity_bytes: float                        # usable per GPU, headroom already taken off
    link_bytes_per_s: float                      # p2p between neighbouring ranks
    inflight: tuple[float, ...]                  # micro-batches of activations held, per chunk
    virtual_stages: int = 1
    fixed_bytes: tuple[float, ...] = ()          # per rank, besides the layers (default 0)
    link_latency_s: float = 0.0
    optimize: str = "speed"
    time_limit_s: float = 60.0
    solver: str = "highs"                        # highs | cbc

    @property
    def chunks(self) -> int:
        return self.stages * self.virtual_stages


@dataclass(frozen=True, kw_only=True)
class Partition:
    ranges: tuple[tuple[int, int], ...]          # per chunk [start, stop)
    rank_time_s: tuple[float, ...]
    rank_memory_bytes: tuple[float, ...]
    solver: str                                  # what solved it ("HiGHS", "CBC", "dp")
    status: str                                  # "optimal" | "time limit, best found"
    gap: float = 0.0                             # relative MIP gap (0 when optimal)
    solve_s: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def max_time_s(self) -> float:
        return max(self.rank_time_s)

    @property
    def max_memory_bytes(self) -> float:
        return max(self.rank_memory_bytes)


def evaluate(problem: PartitionProblem, ranges) -> tuple[list[float], list[float]]:
    """(time per rank, memory per rank) of a split, in plain arithmetic (the ILP's own model)."""
    g, p = problem.graph, problem.stages
    cut = g.cut_bytes()
    owner = {}
    for c, (a, b) in enumerate(ranges):
        for i in range(a, b):
            owner[i] = c
    times, mems = [0.0] * p, list(rank_fixed_bytes(problem))
    bounds = [b - 1 for _, b in ranges[:-1]]
    send = [send_s(problem, cut[k]) for k in bounds]
    for c, (a, b) in enumerate(ranges):
        r = c % p
        times[r] += sum(g.layers[i].time_s for i in range(a, b))
        times[r] += (send[c] if c < len(send) else 0.0) + (send[c - 1] if c > 0 else 0.0)
        mems[r] += sum(g.layers[i].state_bytes + problem.inflight[c] * g.layers[i].activation_bytes
                       for i in range(a, b))
    for t in g.ties:
        r1, r2 = owner[t.first] % p, owner[t.second] % p
        if r1 != r2:
            mems[r2] += t.state_bytes
            times[r2] += t.sync_s
    return times, mems


def chunk_times(problem: PartitionProblem, ranges) -> list[float]:
    """Seconds per micro-batch of each chunk: its layers and the sends across its boundaries."""
    g, cut = problem.graph, problem.graph.cut_bytes()
    send = [send_s(problem, cut[b - 1]) for _, b in ranges[:-1]]
    return [sum(g.layers[i].time_s for i in range(a, b)) + (send[c] if c < len(send) else 0.0)
            + (send[c - 1] if c > 0 else 0.0) for c, (a, b) in enumerate(ranges)]


def rank_fixed_bytes(problem: PartitionProblem) -> tuple[float, ...]:
    return problem.fixed_bytes or (0.0,) * problem.stages


def send_s(problem: PartitionProblem, nbytes: float) -> float:
    if nbytes <= 0:
        return 0.0
    return problem.link_latency_s + nbytes / problem.link_bytes_per_s


def check(problem: PartitionProblem) -> None:
    n, k = len(problem.graph.layers), problem.chunks
    if problem.stages < 1 or problem.virtual_stages < 1:
        raise PartitaError(f"parallel.pipeline ({problem.stages}) and virtual_stages "
                           f"({problem.virtual_stages}) must be >= 1")
    if k > n:
        raise PartitaError(f"parallel: pipeline*virtual_stages = {k} chunks but the model has only "
                           f"{n} layers to split; use at most {n} chunks")
    if len(problem.inflight) != k:
        raise PartitaError(f"partition: inflight has {len(problem.inflight)} entries, expected {k}")
    if problem.optimize not in OPTIMIZE:
        raise PartitaError(f"optimize: expected one of {', '.join(OPTIMIZE)}, "
                           f"got {problem.optimize!r}")
    if problem.solver not in ("highs", "cbc"):
        raise PartitaError(f"partition solver: expected highs or cbc, got {problem.solver!r}")
