"""The ILP stage partitioner: layers of a model graph -> contiguous pipeline chunks.

    from partita.planner.partition import LayerGraph, Layer, PartitionProblem, solve
    graph = LayerGraph.chain([Layer(name=f"b{i}", time_s=1.0, state_bytes=1e9,
                                    activation_bytes=1e8, output_bytes=1e7) for i in range(24)])
    split = solve(PartitionProblem(graph=graph, stages=4, capacity_bytes=40e9,
                                   link_bytes_per_s=25e9, inflight=(4, 3, 2, 1)))
    split.ranges        # ((0, 6), (6, 12), ...) layer ranges [start, stop) per chunk

The model is a DAG whose layers are listed in a topological order (the order the profile gives);
every chunk is a contiguous range of that order, as Megatron, torch.distributed.pipelining and
`parallel.stages` require, so every edge goes to the same or a later chunk. A tensor whose
consumers lie beyond a boundary crosses it (a skip connection or the T5 encoder output crosses
every boundary between its producer and its last consumer) and is paid at each boundary it crosses.
Tied parameters (tied embeddings) placed on different pipeline ranks cost their state twice and a
gradient all-reduce once per step (Megatron's embedding group), charged to the later rank.

Chunk c of p*v runs on pipeline rank c % p (looped placement). The formulation (cumulative
assignment, Sec. 3 of Tarnawski et al. 2020, "Efficient Algorithms for Device Placement of DNN
Graph Operators", NeurIPS, adapted to min-max with memory):
    y[i,c] = 1 iff layer i sits in chunk <= c          (y[i,c] >= y[i,c-1], y[i+1,c] <= y[i,c])
    x[i,c] = y[i,c] - y[i,c-1]                          layer i is in chunk c
    z[i,c] = y[i,c] - y[i+1,c]                          boundary c lies right after layer i
    time(r)   = sum_{c on r} sum_i x[i,c] t_i + (bytes over boundary c and c-1) / link + ties
    memory(r) = fixed + sum_{c on r} sum_i x[i,c] (state_i + inflight_c act_i) + tied copies
`optimize: speed` minimises max_r time(r) (with virtual stages the slowest chunk: a rank runs its
v chunks in turn, so each round's critical path passes through the slowest; Narayanan et al. 2021,
Sec. 2.2) subject to memory(r) <= capacity; `optimize: memory`
minimises max_r memory(r) and then, at that memory, the time. The solution is checked by
`evaluate()` in plain arithmetic, and `partition_dp.exact_chain()` gives the same optimum by
dynamic programming (the property test holds them equal).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from partita.planner.enums import OPTIMIZE
from partita.planner.errors import PartitaError
from partita.planner.units import GIB


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
    times, mems = [0.0] * p, list(_fixed(problem))
    bounds = [b - 1 for _, b in ranges[:-1]]
    send = [_link(problem, cut[k]) for k in bounds]
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
    send = [_link(problem, cut[b - 1]) for _, b in ranges[:-1]]
    return [sum(g.layers[i].time_s for i in range(a, b)) + (send[c] if c < len(send) else 0.0)
            + (send[c - 1] if c > 0 else 0.0) for c, (a, b) in enumerate(ranges)]


def _fixed(problem: PartitionProblem) -> tuple[float, ...]:
    return problem.fixed_bytes or (0.0,) * problem.stages


def _link(problem: PartitionProblem, nbytes: float) -> float:
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


def solve(problem: PartitionProblem) -> Partition:
    """The optimal split (or the best found within the time limit, with its gap)."""
    check(problem)
    import pulp
    started = time.perf_counter()
    upper = _upper_bound(problem) if problem.optimize == "speed" else None
    from partita.planner.ilp_solver import run_solver as _run
    model, y, T, M = _build(problem, pulp, upper)
    if problem.optimize == "speed":
        model.setObjective(T)
        status, name, gap = _run(model, problem, pulp)
    else:
        model.setObjective(M)
        status, name, gap = _run(model, problem, pulp)
        best_m = M.value()
        model += M <= best_m * (1 + 1e-7) + 1e-9, "memory_at_its_minimum"
        model.setObjective(T)
        status, name, gap = _run(model, problem, pulp)
    ranges = _ranges(problem, y)
    times, mems = evaluate(problem, ranges)
    return Partition(ranges=ranges, rank_time_s=tuple(times), rank_memory_bytes=tuple(mems),
                     solver=name, status=status, gap=gap, solve_s=time.perf_counter() - started)


def _upper_bound(problem: PartitionProblem) -> float | None:
    """The max rank time of a feasible greedy split (None if it does not fit): an upper bound
    on the optimum, from which `_build` fixes the layers no optimal split can move."""
    g, k = problem.graph, problem.chunks
    times = [layer.time_s for layer in g.layers]
    n = len(times)
    lo, hi = max(times), sum(times)
    best = None
    for _ in range(40):                      # bisection on the chunk budget, greedy fill
        mid = (lo + hi) / 2
        ranges, start, acc = [], 0, 0.0
        for i, t in enumerate(times):
            left = n - i                     # layers i.. still to place
            need = k - len(ranges) - 1       # chunks still to open after this one
            if i > start and (acc + t > mid or left <= need) and need > 0:
                ranges.append((start, i))
                start, acc = i, 0.0
            acc += t
        ranges.append((start, n))
        if len(ranges) == k and all(a < b for a, b in ranges) and acc <= mid:
            hi, best = mid, tuple(ranges)
        else:
            lo = mid
    if best is None:
        return None
    rank_t, rank_m = evaluate(problem, best)
    if max(rank_m) > problem.capacity_bytes:
        return None
    return max(rank_t) if problem.virtual_stages == 1 else max(chunk_times(problem, best))


def _windows(times: list[float], k: int, upper: float | None) -> tuple[list[int], list[int]]:
    """Per boundary c < k-1: (fewest, most) layers the chunks <= c can hold when every chunk
    computes at most `upper` seconds and is not empty."""
    n = len(times)
    fewest = [c + 1 for c in range(k - 1)]
    most = [n - (k - 1 - c) for c in range(k - 1)]
    if upper is None:
        return fewest, most
    limit = upper * (1 + 1e-9)
    pos = 0
    for c in range(k - 1):                       # forward: as far as c+1 chunks reach
        acc = 0.0
        start = pos
        while pos < n and (pos == start or acc + times[pos] <= limit):
            acc += times[pos]
            pos += 1
        most[c] = min(most[c], pos)
    pos = n
    for c in range(k - 2, -1, -1):               # backward: k-1-c chunks after boundary c
        acc = 0.0
        start = pos
        while pos > 0 and (pos == start or acc + times[pos - 1] <= limit):
            acc += times[pos - 1]
            pos -= 1
        fewest[c] = max(fewest[c], pos)
    return fewest, most


def _build(problem: PartitionProblem, pulp, upper: float | None = None):
    g, p, k = problem.graph, problem.stages, problem.chunks
    n = len(g.layers)
    cut = g.cut_bytes()
    model = pulp.LpProblem("partition", pulp.LpMinimize)
    var = getattr(model, "add_variable", None) or pulp.LpVariable     # PuLP >= 3.3 / older
    # y[i][c] for c < k-1 (chunk k-1 is the last: y = 1 there for every layer). With an upper
    # bound U on the optimum no chunk computes more than U, so boundary c lies between the
    # furthest point k-1-c chunks of at most U can reach back from the end and the furthest
    # point c+1 such chunks reach from the start: outside that window y is fixed.
    times = [layer.time_s for layer in g.layers]
    first, last = _windows(times, k, upper)
    y = []
    for i in range(n):
        row = []
        for c in range(k - 1):
            lo = 1 if i < first[c] else 0        # layer i must be in a chunk <= c
            hi = 0 if i >= last[c] else 1        # layer i cannot be in a chunk <= c
            if lo > hi:
                lo, hi = 0, 1
            row.append(var(f"y_{i}_{c}", lowBound=lo, upBound=hi, cat="Integer"))
        y.append(row)

    def Y(i, c):
        if c < 0:
            return 0
        return 1 if c >= k - 1 else y[i][c]

    def X(i, c):
        return Y(i, c) - Y(i, c - 1)

    for i in range(n):
        for c in range(1, k - 1):
            model += y[i][c] >= y[i][c - 1], f"monotone_{i}_{c}"
    for i in range(n - 1):
        for c in range(k - 1):
            model += y[i + 1][c] <= y[i][c], f"contiguous_{i}_{c}"
    for c in range(k - 1):
        # chunk c is not empty: layer c is at the earliest in chunk... the first c+1 layers may
        # fill chunks 0..c; at least c+1 layers sit in chunks <= c and at least k-1-c beyond.
        model += y[c][c] == 1, f"chunk_{c}_reaches_layer_{c}"
        model += y[n - (k - 1 - c)][c] == 0, f"chunks_after_{c}_keep_{k - 1 - c}_layers"
    for c in range(k):
        model += pulp.lpSum(X(i, c) for i in range(n)) >= 1, f"chunk_{c}_not_empty"
    T = var("max_rank_time_s", lowBound=0, upBound=upper)
    M = var("max_rank_memory_gib", lowBound=0)
    # Per-boundary seconds: sum over the layer it follows of z[i,c] * link(cut[i]).
    # z[i,c] = y[i,c] - y[i+1,c] is 1 for exactly one i per boundary c < k-1.
    sends = [pulp.lpSum(_link(problem, cut[i]) * (y[i][c] - y[i + 1][c]) for i in range(n - 1))
             for c in range(k - 1)]
    sep = []
    for t_i, t in enumerate(g.ties):
        s = var(f"tie_{t_i}_apart", lowBound=0, upBound=1, cat="Integer")
        if p > 1:
            for c in range(k - 1):      # apart if some boundary lies between them ...
                model += s >= Y(t.first, c) - Y(t.second, c), f"tie_{t_i}_apart_at_{c}"
        sep.append(s)
    time_r = [[] for _ in range(p)]
    mem_r = [[] for _ in range(p)]
    fixed = [f / GIB for f in _fixed(problem)]
    for c in range(k):
        r = c % p
        time_r[r].append(pulp.lpSum(g.layers[i].time_s * X(i, c) for i in range(n)))
        if c < k - 1:
            time_r[r].append(sends[c])
        if c > 0:
            time_r[r].append(sends[c - 1])
        mem_r[r].append(pulp.lpSum((g.layers[i].state_bytes + problem.inflight[c]
                                    * g.layers[i].activation_bytes) / GIB * X(i, c)
                                   for i in range(n)))
    for t_i, t in enumerate(g.ties):     # ... and then the second's rank holds the copy
        if p == 1:
            break
        for r in range(p):
            on_r = var(f"tie_{t_i}_copy_on_rank_{r}", lowBound=0)
            second_here = pulp.lpSum(X(t.second, c) for c in range(r, k, p))
            model += on_r >= sep[t_i] + second_here - 1, f"tie_{t_i}_copy_rank_{r}"
            mem_r[r].append(t.state_bytes / GIB * on_r)
            time_r[r].append(t.sync_s * on_r)
    cap = problem.capacity_bytes / GIB
    for c in range(k if problem.virtual_stages > 1 else 0):
        chunk_t = [pulp.lpSum(g.layers[i].time_s * X(i, c) for i in range(n))]
        chunk_t += [sends[c]] if c < k - 1 else []
        chunk_t += [sends[c - 1]] if c > 0 else []
        model += pulp.lpSum(chunk_t) <= T, f"chunk_{c}_time"
    for r in range(p):
        if problem.virtual_stages == 1:
            model += pulp.lpSum(time_r[r]) <= T, f"rank_{r}_time"
        model += pulp.lpSum(mem_r[r]) + fixed[r] <= M, f"rank_{r}_memory"
        model += pulp.lpSum(mem_r[r]) + fixed[r] <= cap, f"rank_{r}_memory_fits"
    return model, y, T, M


def _ranges(problem: PartitionProblem, y) -> tuple[tuple[int, int], ...]:
    n, k = len(problem.graph.layers), problem.chunks
    out, start = [], 0
    for c in range(k - 1):
        stop = sum(1 for i in range(n) if y[i][c].value() is not None and y[i][c].value() > 0.5)
        out.append((start, stop))
        start = stop
    out.append((start, n))
    return tuple(out)


def _infeasible(problem: PartitionProblem) -> PartitaError:
    """Name the rank that cannot fit, its need at the memory-balanced split and what would help."""
    from partita.planner.partition_dp import exact_chain
    if problem.virtual_stages == 1 and not problem.graph.ties:
        lean = exact_chain(problem, optimize="memory", capacity=float("inf"))
        need_by_rank = lean.rank_memory_bytes
    else:                                   # the even split: an upper bound on the leanest need
        from partita.planner.stages import min_max_ranges
        ranges = min_max_ranges([1.0] * len(problem.graph.layers), problem.chunks)
        need_by_rank = evaluate(problem, ranges)[1]
    lean_need = need_by_rank
    r = max(range(problem.stages), key=lambda i: lean_need[i])
    need = lean_need[r]
    return PartitaError(
        f"no split into {problem.stages} pipeline stages"
        + (f" x {problem.virtual_stages} virtual" if problem.virtual_stages > 1 else "")
        + f" fits: stage {r} needs {need / GIB:.1f} GiB even at the most memory-balanced split, "
        f"capacity is {problem.capacity_bytes / GIB:.1f} GiB usable per GPU; it would fit with more "
        "pipeline stages, a smaller micro-batch, recompute (selective or full), ZeRO sharding, more "
        "tensor parallelism or a GPU with more memory")
