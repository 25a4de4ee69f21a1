"""The exact optimum of a chain split by dynamic programming: the ILP's reference.

`exact_chain(problem)` solves the same model as `partition.solve` (min-max stage time with sends,
memory per stage within capacity) for one chunk per rank and no tied layers, in O(k n^2); the
property test holds the ILP's optimum equal to it on random chains. `infeasible(problem)` is the
partitioner's error when no split fits: it names the rank that cannot fit at the most
memory-balanced split (found by the same programme) and what would help.
"""
from __future__ import annotations

from partita.planner.errors import PartitaError
from partita.planner.partition_problem import (Partition, PartitionProblem, check, evaluate,
                                               rank_fixed_bytes, send_s)
from partita.planner.stages import min_max_ranges
from partita.planner.units import GIB


def exact_chain(problem: PartitionProblem, *, optimize: str | None = None,
                capacity: float | None = None) -> Partition:
    """The exact optimum by dynamic programming over boundaries (no virtual stages: one chunk per
    rank, ties ignored): best[c][j] = min over i of max(best[c-1][i], cost(c, i, j))."""
    check(problem)
    if problem.virtual_stages != 1 or problem.graph.ties:
        raise PartitaError("exact_chain: one chunk per rank and no tied layers only")
    g, k = problem.graph, problem.stages
    n = len(g.layers)
    cap = problem.capacity_bytes if capacity is None else capacity
    opt = optimize or problem.optimize
    cut = g.cut_bytes()
    pt, ps, pa = [0.0], [0.0], [0.0]
    for layer in g.layers:
        pt.append(pt[-1] + layer.time_s)
        ps.append(ps[-1] + layer.state_bytes)
        pa.append(pa[-1] + layer.activation_bytes)
    fixed = rank_fixed_bytes(problem)

    def cost(c, i, j):   # chunk c holds layers i..j-1
        mem = fixed[c] + ps[j] - ps[i] + problem.inflight[c] * (pa[j] - pa[i])
        t = pt[j] - pt[i] + (send_s(problem, cut[i - 1]) if i > 0 else 0.0) + (
            send_s(problem, cut[j - 1]) if j < n else 0.0)
        if mem > cap * (1 + 1e-12):
            return None
        return (t, mem) if opt == "speed" else (mem, t)

    inf = (float("inf"), float("inf"))
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    arg = [[-1] * (n + 1) for _ in range(k + 1)]
    best[0][0] = (0.0, 0.0)
    for c in range(1, k + 1):
        for j in range(c, n - (k - c) + 1):
            for i in range(c - 1, j):
                if best[c - 1][i] == inf:
                    continue
                cst = cost(c - 1, i, j)
                if cst is None:
                    continue
                val = (max(best[c - 1][i][0], cst[0]), max(best[c - 1][i][1], cst[1]))
                if val < best[c][j]:
                    best[c][j], arg[c][j] = val, i
    if best[k][n] == inf:
        raise infeasible(problem) if capacity is None else PartitaError("exact_chain: no split")
    ranges, j = [], n
    for c in range(k, 0, -1):
        i = arg[c][j]
        ranges.append((i, j))
        j = i
    ranges = tuple(reversed(ranges))
    times, mems = evaluate(problem, ranges)
    return Partition(ranges=ranges, rank_time_s=tuple(times), rank_memory_bytes=tuple(mems),
                     solver="dp", status="optimal")


def infeasible(problem: PartitionProblem) -> PartitaError:
    """Name the rank that cannot fit, its need at the memory-balanced split and what would help."""
    if problem.virtual_stages == 1 and not problem.graph.ties:
        lean = exact_chain(problem, optimize="memory", capacity=float("inf"))
        need_by_rank = lean.rank_memory_bytes
    else:                                   # the even split: an upper bound on the leanest need
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
