"""Megatron's rank order (planner/ranks.py) and its two consumers: the simulator's placement and
the executor's plan and device mesh agree with it on a table of (tp, cp, dp, pp) shapes."""
import numpy as np
import pytest

from partita.executor.plan import Coords, ExecPlan
from partita.planner.errors import PartitaError
from partita.planner.ranks import RankGenerator
from partita.simulator.placement import Placement

# (tp, cp, dp, pp): powers of two, as real plans on 4- and 8-GPU nodes are
SHAPES = [(1, 1, 1, 1), (2, 1, 2, 2), (8, 1, 8, 4), (2, 2, 2, 2), (4, 2, 1, 2), (1, 4, 4, 1),
          (2, 1, 16, 1), (1, 1, 2, 8), (1, 2, 2, 4)]


def test_megatron_example_groups():
    """initialize_model_parallel's docstring (megatron/core/parallel_state.py): 16 GPUs, tp 2, pp 4
    (so dp 2) give these tensor, pipeline and data groups."""
    rg = RankGenerator(tp=2, dp=2, pp=4)
    assert rg.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert rg.groups("pp") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert rg.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]


@pytest.mark.parametrize("shape", SHAPES)
def test_rank_and_coords_are_inverse_and_groups_partition_the_world(shape):
    tp, cp, dp, pp = shape
    rg = RankGenerator(tp=tp, cp=cp, dp=dp, pp=pp)
    assert rg.rank(tp=tp - 1, cp=cp - 1, dp=dp - 1, pp=pp - 1) == rg.world - 1
    for r in range(rg.world):
        c = rg.coords(r)
        assert rg.rank(**c) == r
        assert r == c["tp"] + tp * (c["cp"] + cp * (c["dp"] + dp * c["pp"]))
    for token in ("tp", "cp", "dp", "pp", "tp-cp", "dp-pp"):
        groups = rg.groups(token)
        assert sorted(r for g in groups for r in g) == list(range(rg.world))


def _span(group: list[int], per_node: int) -> tuple[int, int]:
    """(GPUs of the group on its fullest node, nodes it spans) counted from its rank list."""
    nodes = [r // per_node for r in group]
    return max(nodes.count(n) for n in set(nodes)), len(set(nodes))


@pytest.mark.parametrize("gpus_per_node", [4, 8])
@pytest.mark.parametrize("shape", SHAPES)
def test_simulator_placement_agrees(shape, gpus_per_node):
    tp, cp, dp, pp = shape
    rg = RankGenerator(tp=tp, cp=cp, dp=dp, pp=pp)
    pl = Placement(tensor=tp, context=cp, data=dp, pipeline=pp, gpus_per_node=gpus_per_node)
    for dim, group in (("tp", pl.tp_group()), ("cp", pl.cp_group()), ("dp", pl.dp_group())):
        for ranks in rg.groups(dim):
            assert (group.per_node, group.nodes) == _span(ranks, gpus_per_node), (dim, ranks)
    for ranks in rg.groups("pp"):
        same = tuple(a // gpus_per_node == b // gpus_per_node for a, b in zip(ranks, ranks[1:]))
        assert pl.pp_neighbours_same_node() == same


def _exec_plan(tp: int, dp: int, pp: int) -> ExecPlan:
    return ExecPlan(name="t", arch="gpt", world=tp * dp * pp, tensor=tp, pipeline=pp, data=dp,
                    schedule="1f1b", virtual_stages=1, chunks=tuple((i, i + 1) for i in range(pp)),
                    blocks=pp, global_batch=dp, micro_batch=1, seq_len=8, vocab=16, zero=0,
                    precision="fp32", recompute="none", optimizer="adam")


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] == 1])
def test_executor_plan_and_mesh_agree(shape):
    tp, _, dp, pp = shape
    rg, plan = RankGenerator(tp=tp, dp=dp, pp=pp), _exec_plan(tp, dp, pp)
    for r in range(plan.world):
        c = rg.coords(r)
        assert plan.coords(r) == Coords(pp=c["pp"], dp=c["dp"], tp=c["tp"])
        assert plan.rank_of(plan.coords(r)) == r
    # the executor's own groups (executor/parallel.py TiedGradients: vary one coordinate)
    along = {"tp": lambda c, i: Coords(pp=c.pp, dp=c.dp, tp=i),
             "dp": lambda c, i: Coords(pp=c.pp, dp=i, tp=c.tp),
             "pp": lambda c, i: Coords(pp=i, dp=c.dp, tp=c.tp)}
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    for dim, move in along.items():
        groups = sorted({tuple(plan.rank_of(move(plan.coords(r), i)) for i in range(sizes[dim]))
                         for r in range(plan.world)})
        assert [list(g) for g in groups] == rg.groups(dim)
    # torch's init_device_mesh numbers ranks row-major over the mesh shape
    names, mesh_shape = plan.ranks.mesh(("pp", "dp", "tp"))
    assert names == ("pp", "dp", "tp")
    mesh = np.arange(plan.world).reshape(mesh_shape)
    for dim in names:
        axis = names.index(dim)
        slices = np.moveaxis(mesh, axis, -1).reshape(-1, mesh_shape[axis])
        assert sorted(s.tolist() for s in slices) == rg.groups(dim)


def test_bad_order_and_sizes_are_errors():
    with pytest.raises(PartitaError, match="tp, cp, dp, pp"):
        RankGenerator(order="tp-dp-pp")
    with pytest.raises(PartitaError, match="tp must be a positive integer"):
        RankGenerator(tp=0)
    with pytest.raises(PartitaError, match="needs cp = 1"):
        RankGenerator(cp=2).mesh(("pp", "dp", "tp"))


def test_another_order_moves_the_strides():
    rg = RankGenerator(tp=2, cp=1, dp=4, pp=2, order="tp-cp-pp-dp")
    assert (rg.stride("tp"), rg.stride("pp"), rg.stride("dp")) == (1, 2, 4)
    assert rg.mesh() == (("dp", "pp", "cp", "tp"), (4, 2, 1, 2))
