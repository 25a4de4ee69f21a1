"""The ILP stage partitioner: layers of a model graph -> contiguous pipeline chunks.

    from partita.planner.partition import solve
    from partita.planner.partition_problem import Layer, LayerGraph, PartitionProblem
    graph = LayerGraph.chain([Layer(name=f"b{i}", time_s=1.0, state_bytes=1e9,
                                    activation_bytes=1e8, output_bytes=1e7) for i in range(24)])
    split = solve(PartitionProblem(graph=graph, stages=4, capacity_bytes=40e9,
                                   link_bytes_per_s=25e9, inflight=(4, 3, 2, 1)))
    split.ranges        # ((0, 6), (6, 12), ...) layer ranges [start, stop) per chunk

The problem (a layer DAG in topological order, contiguous chunks, tensors paid at every boundary
they cross, tied layers, looped placement) and its plain arithmetic are `partition_problem`.
Chunk c of p*v runs on pipeline rank c % p. The formulation (cumulative
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

from partita.planner.ilp_solver import run_solver
from partita.planner.partition_problem import (Partition, PartitionProblem, check, chunk_times,
                                               evaluate, rank_fixed_bytes, send_s)
from partita.planner.units import GIB

# `optimize: memory` solves twice: the least peak memory M*, then the fastest split with memory at
# most M* (1 + tol) + tol GiB. The MIP's reported M* can sit below the true minimum by the solver's
# integrality tolerance (HiGHS mip_feasibility_tolerance 1e-6) times a layer's GiB, so a tighter
# bound made the second solve infeasible; 1e-6 relative plus 1e-6 GiB (1 KiB) is far below any
# memory difference that matters.
MEMORY_SLACK = 1e-6


def solve(problem: PartitionProblem) -> Partition:
    """The optimal split (or the best found within the time limit, with its gap)."""
    check(problem)
    import pulp
    started = time.perf_counter()
    upper = _upper_bound(problem) if problem.optimize == "speed" else None
    model, y, T, M = _build(problem, pulp, upper)
    if problem.optimize == "speed":
        model.setObjective(T)
        status, name, gap = run_solver(model, problem, pulp)
    else:
        model.setObjective(M)
        status, name, gap = run_solver(model, problem, pulp)
        best_m = M.value()
        model += M <= best_m * (1 + MEMORY_SLACK) + MEMORY_SLACK, "memory_at_its_minimum"
        model.setObjective(T)
        status, name, gap = run_solver(model, problem, pulp)
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
    """The ILP: assignment variables, chunk order, the max rank time T and memory M (GiB)."""
    model = pulp.LpProblem("partition", pulp.LpMinimize)
    var = getattr(model, "add_variable", None) or pulp.LpVariable     # PuLP >= 3.3 / older
    y = _assignment(problem, var, upper)
    _add_chunk_order(model, pulp, problem, y)
    T = var("max_rank_time_s", lowBound=0, upBound=upper)
    M = var("max_rank_memory_gib", lowBound=0)
    sends = _boundary_sends(problem, pulp, y)
    apart = _ties_apart(model, var, problem, y)
    time_r, mem_r = _rank_terms(problem, pulp, y, sends)
    _add_tie_copies(model, var, pulp, problem, y, apart, time_r, mem_r)
    _add_limits(model, pulp, problem, y, sends, time_r, mem_r, T, M)
    return model, y, T, M


def _assignment(problem: PartitionProblem, var, upper: float | None) -> list[list]:
    """y[i][c] for c < k-1 (chunk k-1 is the last: y = 1 there for every layer). With an upper
    bound U on the optimum no chunk computes more than U, so boundary c lies between the furthest
    point k-1-c chunks of at most U can reach back from the end and the furthest point c+1 such
    chunks reach from the start: outside that window y is fixed."""
    k = problem.chunks
    times = [layer.time_s for layer in problem.graph.layers]
    first, last = _windows(times, k, upper)
    y = []
    for i in range(len(times)):
        row = []
        for c in range(k - 1):
            lo = 1 if i < first[c] else 0        # layer i must be in a chunk <= c
            hi = 0 if i >= last[c] else 1        # layer i cannot be in a chunk <= c
            if lo > hi:
                lo, hi = 0, 1
            row.append(var(f"y_{i}_{c}", lowBound=lo, upBound=hi, cat="Integer"))
        y.append(row)
    return y


def _upto(y, k: int, i: int, c: int):
    """y[i,c] with its fixed ends: 0 before the first chunk, 1 from the last chunk on."""
    if c < 0:
        return 0
    return 1 if c >= k - 1 else y[i][c]


def _in(y, k: int, i: int, c: int):
    """x[i,c] = y[i,c] - y[i,c-1]: layer i is in chunk c."""
    return _upto(y, k, i, c) - _upto(y, k, i, c - 1)


def _add_chunk_order(model, pulp, problem: PartitionProblem, y) -> None:
    """Chunks are contiguous, in order and not empty."""
    n, k = len(problem.graph.layers), problem.chunks
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
        model += pulp.lpSum(_in(y, k, i, c) for i in range(n)) >= 1, f"chunk_{c}_not_empty"


def _boundary_sends(problem: PartitionProblem, pulp, y) -> list:
    """Per-boundary seconds: sum over the layer it follows of z[i,c] * link(cut[i]).
    z[i,c] = y[i,c] - y[i+1,c] is 1 for exactly one i per boundary c < k-1."""
    n, cut = len(problem.graph.layers), problem.graph.cut_bytes()
    return [pulp.lpSum(send_s(problem, cut[i]) * (y[i][c] - y[i + 1][c]) for i in range(n - 1))
            for c in range(problem.chunks - 1)]


def _ties_apart(model, var, problem: PartitionProblem, y) -> list:
    """Per tie, a 0/1 variable that is 1 when some boundary lies between its two layers ..."""
    k = problem.chunks
    apart = []
    for t_i, t in enumerate(problem.graph.ties):
        s = var(f"tie_{t_i}_apart", lowBound=0, upBound=1, cat="Integer")
        if problem.stages > 1:
            for c in range(k - 1):
                model += (s >= _upto(y, k, t.first, c) - _upto(y, k, t.second, c),
                          f"tie_{t_i}_apart_at_{c}")
        apart.append(s)
    return apart


def _add_tie_copies(model, var, pulp, problem: PartitionProblem, y, apart, time_r, mem_r) -> None:
    """... and then the second layer's rank holds the copy and runs its gradient sync."""
    p, k = problem.stages, problem.chunks
    if p == 1:
        return
    for t_i, t in enumerate(problem.graph.ties):
        for r in range(p):
            on_r = var(f"tie_{t_i}_copy_on_rank_{r}", lowBound=0)
            second_here = pulp.lpSum(_in(y, k, t.second, c) for c in range(r, k, p))
            model += on_r >= apart[t_i] + second_here - 1, f"tie_{t_i}_copy_rank_{r}"
            mem_r[r].append(t.state_bytes / GIB * on_r)
            time_r[r].append(t.sync_s * on_r)


def _chunk_time(problem: PartitionProblem, pulp, y, sends, c: int) -> list:
    """Chunk c's seconds: its layers and the sends across the boundaries on both its sides."""
    g, k = problem.graph, problem.chunks
    terms = [pulp.lpSum(g.layers[i].time_s * _in(y, k, i, c) for i in range(len(g.layers)))]
    terms += [sends[c]] if c < k - 1 else []
    terms += [sends[c - 1]] if c > 0 else []
    return terms


def _rank_terms(problem: PartitionProblem, pulp, y, sends) -> tuple[list[list], list[list]]:
    """Per rank, the terms of its time (seconds) and of its layers' memory (GiB)."""
    g, p, k = problem.graph, problem.stages, problem.chunks
    time_r: list[list] = [[] for _ in range(p)]
    mem_r: list[list] = [[] for _ in range(p)]
    for c in range(k):
        time_r[c % p] += _chunk_time(problem, pulp, y, sends, c)
        mem_r[c % p].append(pulp.lpSum((g.layers[i].state_bytes + problem.inflight[c]
                                        * g.layers[i].activation_bytes) / GIB * _in(y, k, i, c)
                                       for i in range(len(g.layers))))
    return time_r, mem_r


def _add_limits(model, pulp, problem: PartitionProblem, y, sends, time_r, mem_r, T, M) -> None:
    """T bounds every chunk's time with virtual stages, else every rank's; M bounds every rank's
    memory, and every rank fits the capacity."""
    for c in range(problem.chunks if problem.virtual_stages > 1 else 0):
        model += pulp.lpSum(_chunk_time(problem, pulp, y, sends, c)) <= T, f"chunk_{c}_time"
    fixed = [f / GIB for f in rank_fixed_bytes(problem)]
    cap = problem.capacity_bytes / GIB
    for r in range(problem.stages):
        if problem.virtual_stages == 1:
            model += pulp.lpSum(time_r[r]) <= T, f"rank_{r}_time"
        model += pulp.lpSum(mem_r[r]) + fixed[r] <= M, f"rank_{r}_memory"
        model += pulp.lpSum(mem_r[r]) + fixed[r] <= cap, f"rank_{r}_memory_fits"


def _ranges(problem: PartitionProblem, y) -> tuple[tuple[int, int], ...]:
    n, k = len(problem.graph.layers), problem.chunks
    out, start = [], 0
    for c in range(k - 1):
        stop = sum(1 for i in range(n) if y[i][c].value() is not None and y[i][c].value() > 0.5)
        out.append((start, stop))
        start = stop
    out.append((start, n))
    return tuple(out)
