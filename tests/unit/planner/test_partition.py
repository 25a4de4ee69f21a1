"""The ILP stage partitioner: optimal on chains (against an exact DP), graphs, memory, errors."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partita.planner.errors import PartitaError
from partita.planner.layergraph import inflight, plan_problem, transformer_graph
from partita.planner.modelspec import TransformerDims, preset_dims
from partita.planner.partition import solve
from partita.planner.partition_dp import exact_chain
from partita.planner.partition_problem import Layer, LayerGraph, PartitionProblem, Tie, evaluate
from partita.planner.scenario import ParallelSpec, TrainingSpec
from partita.planner.stages import balanced_stages, min_max_ranges, with_default_stages
from partita.planner.units import GIB

GB = 1e9


def layers(times, state=None, act=None, out=None):
    n = len(times)
    state = state or [1.0] * n
    act = act or [0.0] * n
    out = out or [0.0] * n
    return [Layer(name=f"l{i}", time_s=t, state_bytes=s * GB, activation_bytes=a * GB,
                  output_bytes=o * GB) for i, (t, s, a, o) in enumerate(zip(times, state, act, out))]


def problem(graph, k, *, cap=1e6, v=1, inflight_=None, **kw):
    chunks = k * v
    return PartitionProblem(graph=graph, stages=k, virtual_stages=v, capacity_bytes=cap * GB,
                            link_bytes_per_s=1.0 * GB, inflight=inflight_ or (1.0,) * chunks, **kw)


@st.composite
def chain_instances(draw):
    n = draw(st.integers(2, 10))
    k = draw(st.integers(1, min(n, 4)))
    times = draw(st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n))
    state = draw(st.lists(st.floats(0.0, 3.0), min_size=n, max_size=n))
    act = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    out = draw(st.lists(st.floats(0.0, 0.5), min_size=n, max_size=n))
    held = tuple(float(k - c) for c in range(k))         # 1F1B: p - rank micro-batches
    cap = draw(st.floats(2.0, 25.0))
    return problem(LayerGraph.chain(layers(times, state, act, out)), k, cap=cap, inflight_=held)


@settings(max_examples=40, deadline=None)
@given(chain_instances())
def test_ilp_optimum_equals_the_exact_dp_on_chains(pr):
    try:
        dp = exact_chain(pr)
    except PartitaError:
        with pytest.raises(PartitaError, match="needs .* GiB"):
            solve(pr)
        return
    ilp = solve(pr)
    assert ilp.status == "optimal"
    assert ilp.max_time_s == pytest.approx(dp.max_time_s, rel=1e-6, abs=1e-9)
    assert ilp.max_memory_bytes <= pr.capacity_bytes * (1 + 1e-9)
    # the ILP's reported numbers are the split's own (recomputed in plain arithmetic)
    times, mems = evaluate(pr, ilp.ranges)
    assert max(times) == pytest.approx(ilp.max_time_s)


def test_ranges_are_contiguous_non_empty_and_cover_every_layer():
    pr = problem(LayerGraph.chain(layers([1, 2, 3, 4, 5, 6, 7])), 3)
    split = solve(pr)
    assert split.ranges[0][0] == 0 and split.ranges[-1][1] == 7
    assert all(a < b for a, b in split.ranges)
    assert all(split.ranges[i][1] == split.ranges[i + 1][0] for i in range(2))
    assert split.solver == "HiGHS" and split.gap == 0.0
    assert split.ranges == ((0, 4), (4, 6), (6, 7))     # 10 | 11 | 7: the min-max is 11


def test_cbc_fallback_gives_the_same_optimum():
    graph = LayerGraph.chain(layers([3, 1, 4, 1, 5, 9, 2, 6]))
    a = solve(problem(graph, 3))
    b = solve(problem(graph, 3, solver="cbc"))
    assert b.solver.startswith("CBC")
    assert a.max_time_s == pytest.approx(b.max_time_s)


def test_memory_binds_and_moves_the_split():
    graph = LayerGraph.chain(layers([1] * 6, state=[1, 1, 1, 1, 1, 5]))
    free = solve(problem(graph, 2))
    assert free.ranges == ((0, 3), (3, 6))
    tight = solve(problem(graph, 2, cap=7.5))     # the last stage cannot hold 3 layers (7 GB) ...
    assert tight.ranges == ((0, 3), (3, 6)) or max(tight.rank_memory_bytes) <= 7.5 * GB
    tighter = solve(problem(graph, 2, cap=6.5))   # ... so layer 3 and 4 move to stage 0
    assert tighter.ranges == ((0, 4), (4, 6)) or tighter.ranges == ((0, 5), (5, 6))
    assert max(tighter.rank_memory_bytes) <= 6.5 * GB


def test_optimize_memory_balances_memory():
    graph = LayerGraph.chain(layers([1, 1, 1, 1], state=[4, 1, 1, 1]))
    speed = solve(problem(graph, 2))
    memory = solve(problem(graph, 2, optimize="memory"))
    assert speed.ranges == ((0, 2), (2, 4))
    assert memory.ranges == ((0, 1), (1, 4))
    assert memory.max_memory_bytes < speed.max_memory_bytes


def test_infeasible_names_the_stage_its_need_capacity_and_remedies():
    graph = LayerGraph.chain(layers([1] * 4, state=[10] * 4))
    with pytest.raises(PartitaError) as err:
        solve(problem(graph, 2, cap=15))
    msg = str(err.value)
    assert "stage 0 needs 18.6 GiB" in msg and "capacity is 14.0 GiB" in msg
    assert "more pipeline stages" in msg and "recompute" in msg and "ZeRO" in msg


def test_more_chunks_than_layers_is_an_error():
    with pytest.raises(PartitaError, match="only 3 layers"):
        solve(problem(LayerGraph.chain(layers([1, 1, 1])), 4))


def test_skip_connection_is_paid_at_every_boundary_it_crosses():
    base = layers([1, 1, 1, 1], out=[1, 1, 1, 0])
    chain = LayerGraph.chain(base)
    skip = LayerGraph(layers=tuple(base), edges=chain.edges + ((0, 3),))
    assert chain.cut_bytes() == [GB, GB, GB]
    assert skip.cut_bytes() == [GB, 2 * GB, 2 * GB]   # layer 0's output rides to layer 3
    with pytest.raises(PartitaError, match="does not go forward"):
        LayerGraph(layers=tuple(base), edges=((2, 1),))


def test_tied_layers_apart_cost_a_copy_on_the_later_rank():
    base = layers([1, 1, 1, 1], state=[2, 1, 1, 1])
    graph = LayerGraph.chain(base, ties=(Tie(first=0, second=3, state_bytes=2 * GB, sync_s=0.5),))
    pr = problem(graph, 2)
    split = solve(pr)
    times, mems = evaluate(pr, split.ranges)
    assert mems[1] == pytest.approx(sum(l.state_bytes for l in base[split.ranges[1][0]:]) + 2 * GB)
    assert max(times) == pytest.approx(split.max_time_s)


def test_t5_graph_pays_the_encoder_output_across_decoder_boundaries():
    dims = preset_dims("t5-3b")
    t = TrainingSpec(global_batch=512, micro_batch=4)
    par = ParallelSpec(pipeline=8, data=8)
    g = transformer_graph(dims, t, par, peak_flops=312e12, link_bytes_per_s=25e9)
    cut = g.cut_bytes()
    enc = dims.layers
    assert cut[enc + 3] == pytest.approx(2 * cut[3])     # decoder boundary: hidden + encoder out
    assert g.layers[enc + 1].time_s > 1.2 * g.layers[1].time_s   # cross-attention costs more
    split = solve(plan_problem(dims, t, par, memory_bytes=40 * 2**30, peak_flops=312e12,
                               link_bytes_per_s=25e9, time_limit_s=20))
    sizes = [b - a for a, b in split.ranges]
    assert sum(sizes[:4]) > sum(sizes[4:])          # decoder blocks are dearer: fewer per stage


def test_virtual_stages_put_each_chunk_on_rank_c_mod_p():
    graph = LayerGraph.chain(layers([1.0] * 12))
    split = solve(problem(graph, 2, v=3))
    assert len(split.ranges) == 6 and len(split.rank_time_s) == 2
    assert split.rank_time_s[0] == pytest.approx(6.0)


def test_inflight_per_schedule():
    assert inflight("1f1b", 4, 1, 8) == (4.0, 3.0, 2.0, 1.0)
    assert inflight("gpipe", 2, 1, 8) == (8.0, 8.0)
    # rank 0: p(1 + (p-1)/(pv)) = 2.5 micro-batches (Narayanan et al. 2021, Sec. 2.2.2)
    assert inflight("interleaved-1f1b", 2, 2, 8)[:2] == (2.5, 1.5)


def test_balanced_split_for_uneven_counts():
    assert min_max_ranges([1.0] * 10, 3) == ((0, 3), (3, 6), (6, 10)) or \
        max(b - a for a, b in min_max_ranges([1.0] * 10, 3)) == 4
    dims = TransformerDims(arch="gpt", layers=70, hidden=1024, heads=16, seq_len=2048, vocab=50000)
    ranges = balanced_stages(dims, 12)
    assert ranges[0][0] == 0 and ranges[-1][1] == 70 and len(ranges) == 12
    assert ranges[-1][1] - ranges[-1][0] < 6            # the head's stage holds fewer blocks
    even = ParallelSpec(pipeline=4)
    assert with_default_stages(even, TransformerDims(arch="gpt", layers=8, hidden=64, heads=4,
                                                     seq_len=16, vocab=128)) is even


def test_a_time_limit_returns_the_best_found_with_its_gap():
    """The status is read before any value: an integer-feasible stop (time limit) is reported as
    such, with HiGHS's MIP gap; no solution at all is an error naming the limit."""
    import pulp

    from partita.planner.ilp_solver import run_solver

    class Info:
        mip_gap = 0.0421

    class FakeHighs:
        def getInfo(self):
            return Info()

    class Model:
        def __init__(self, status, sol):
            self.status, self.sol_status, self.solverModel = status, sol, FakeHighs()

        def solve(self, solver):
            return self.status

    pr = problem(LayerGraph.chain(layers([1, 1, 1])), 2, time_limit_s=0.5)
    status, name, gap = run_solver(Model(pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible),
                                       pr, pulp)
    assert (status, name, gap) == ("time limit 0.5 s, best found", "HiGHS", 0.0421)
    with pytest.raises(PartitaError, match="found no split within 0.5 s"):
        run_solver(Model(pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound), pr, pulp)


def test_the_planner_modules_import_neither_the_simulator_nor_pulp_at_load():
    import subprocess
    import sys
    code = ("import sys\nimport partita.planner.search, partita.planner.partition, "
            "partita.planner.planspec, partita.planner.refine, partita.commands.plan\n"
            "print(sorted({m.split('.')[0] if not m.startswith('partita') else m.rsplit('.', 1)[0]"
            " for m in sys.modules if m.startswith(('partita.simulator', 'pulp', 'torch'))}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_profiled_module_splits_by_its_own_layers():
    from partita.planner.costmodel import analytic_profile
    from partita.planner.layergraph import profile_graph
    dims = TransformerDims(arch="gpt", layers=6, hidden=256, heads=4, seq_len=128, vocab=50000)
    prof = analytic_profile(dims, micro_batch=2, precision="bf16")     # embedding, 6 blocks, head
    t, par = TrainingSpec(global_batch=8, micro_batch=2), ParallelSpec(pipeline=3)
    g = profile_graph(prof, t, par, peak_flops=1e14)
    assert [l.name for l in g.layers] == [l.name for l in prof.layers]
    split = solve(problem(g, 3))
    assert len(split.ranges) == 3 and split.ranges[-1][1] == 8
    assert split.ranges[-1][1] - split.ranges[-1][0] <= 2    # the big LM head stands almost alone


def _random_problem(seed: int, optimize: str) -> PartitionProblem:
    import random
    rng = random.Random(seed)
    n, p = rng.randint(4, 8), rng.choice([2, 3, 4])
    layers = tuple(Layer(name=f"l{i}", time_s=rng.uniform(0.5, 2), state_bytes=rng.uniform(0.1, 1) * GIB,
                         activation_bytes=rng.uniform(0.01, 0.2) * GIB,
                         output_bytes=rng.uniform(1e6, 1e8)) for i in range(n))
    ties = ((Tie(first=0, second=n - 1, state_bytes=rng.uniform(0.1, 0.5) * GIB, sync_s=0.01),)
            if rng.random() < 0.7 else ())
    graph = LayerGraph(layers=layers, edges=tuple((i, i + 1) for i in range(n - 1)), ties=ties)
    return PartitionProblem(graph=graph, stages=p, capacity_bytes=37.3 * GIB, link_bytes_per_s=25e9,
                            inflight=tuple(float(p - c) for c in range(p)), optimize=optimize)


def test_memory_mode_splits_whatever_fits():
    """`optimize: memory` once found no split for problems that fit many times over (7 layers on
    4 stages, 2 GiB of 37 GiB): its second solve bounded memory tighter than the first solve's
    integrality tolerance. Every problem of this family now splits, at the least peak memory."""
    for seed in range(200):
        speed = solve(_random_problem(seed, "speed"))
        memory = solve(_random_problem(seed, "memory"))
        assert max(memory.rank_memory_bytes) <= max(speed.rank_memory_bytes) * (1 + 1e-6) + 1e-6 * GIB


def test_blocks_carry_the_share_of_recompute_of_some_blocks_per_chunk():
    """recompute_num_layers N: an even split of 24 blocks into 4 chunks recomputes N of 6 per
    chunk, so each block of the graph carries N/6 of a recomputed forward and of the saving."""
    dims = TransformerDims(arch="gpt", layers=24, hidden=1024, heads=16, seq_len=1024, vocab=32000)
    par = ParallelSpec(pipeline=4, data=2)

    def graph(recompute, n=None):
        t = TrainingSpec(global_batch=64, micro_batch=2, recompute=recompute, recompute_num_layers=n)
        return transformer_graph(dims, t, par, peak_flops=312e12, link_bytes_per_s=25e9).layers[5]

    none, full, some = graph("none"), graph("full"), graph("full", 2)
    assert some.time_s == pytest.approx(none.time_s + (full.time_s - none.time_s) / 3)
    assert some.activation_bytes == pytest.approx(
        none.activation_bytes - (none.activation_bytes - full.activation_bytes) / 3)
    assert graph("full", 6).time_s == pytest.approx(full.time_s)


def test_blocks_carry_the_op_policys_recompute_and_saved_outputs():
    """recompute selective-op: each block re-runs the share of its linear FLOPs the op policy
    recomputes and keeps what it saves (planner.activations), per TP rank."""
    from partita.planner import inventory
    from partita.planner.activations import block_activation_bytes
    dims = TransformerDims(arch="llama", layers=8, hidden=1024, heads=16, kv_heads=4,
                           ffn_hidden=2816, seq_len=1024, vocab=32000)
    par = ParallelSpec(tensor=2, pipeline=2, data=2)

    def graph(recompute):
        t = TrainingSpec(global_batch=64, micro_batch=2, recompute=recompute)
        return transformer_graph(dims, t, par, peak_flops=312e12, link_bytes_per_s=25e9).layers[3]

    none, op, full = graph("none"), graph("selective-op"), graph("full")
    share = inventory.op_policy_gemm_share(dims)
    assert 0.3 < share < 0.6
    assert op.time_s - none.time_s == pytest.approx(share * (full.time_s - none.time_s))
    assert op.activation_bytes == pytest.approx(
        block_activation_bytes(dims, 2, recompute="selective-op") / 2)
    assert full.activation_bytes < op.activation_bytes < none.activation_bytes


@pytest.mark.parametrize("recompute", ["selective", "selective-op"])
def test_a_profiled_module_refuses_selective_recompute(recompute):
    """A profile has layers but no block structure: the graph refuses what it cannot price."""
    from partita.planner.costmodel import analytic_profile
    from partita.planner.layergraph import profile_graph
    dims = TransformerDims(arch="gpt", layers=2, hidden=64, heads=4, seq_len=32, vocab=500)
    prof = analytic_profile(dims, micro_batch=2, precision="bf16")
    full = TrainingSpec(global_batch=8, micro_batch=2, recompute="full")
    assert len(profile_graph(prof, full, ParallelSpec(pipeline=2), peak_flops=1e14).layers) == 4
    t = TrainingSpec(global_batch=8, micro_batch=2, recompute=recompute)
    with pytest.raises(PartitaError, match=f"training.recompute = {recompute}: .*use none or full"):
        profile_graph(prof, t, ParallelSpec(pipeline=2), peak_flops=1e14)
