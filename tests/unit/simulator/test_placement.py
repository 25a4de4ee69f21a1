"""Rank placement: Megatron order (tp fastest, pp slowest) and the node span of each group."""
from partita.simulator.placement import Placement


def test_tp8_fills_a_node_so_dp_is_one_rank_per_node():
    p = Placement(tensor=8, context=1, data=8, pipeline=16, gpus_per_node=8)
    assert p.tp_group().nodes == 1 and p.tp_group().n == 8
    dp = p.dp_group()
    assert (dp.n, dp.per_node, dp.nodes, dp.sharing) == (8, 1, 8, 8)
    assert p.pp_neighbours_same_node() == (False,) * 15
    assert p.nodes == 128


def test_pure_data_parallel_packs_nodes():
    p = Placement(tensor=1, context=1, data=32, pipeline=1, gpus_per_node=8)
    dp = p.dp_group()
    assert (dp.per_node, dp.nodes, dp.sharing) == (8, 4, 1)


def test_single_node_dp_is_intra_only():
    p = Placement(tensor=2, context=1, data=4, pipeline=1, gpus_per_node=8)
    assert p.dp_group().intra_only and p.dp_group().per_node == 4


def test_pipeline_neighbours_inside_a_node():
    p = Placement(tensor=1, context=1, data=2, pipeline=4, gpus_per_node=8)
    assert p.pp_neighbours_same_node() == (True, True, True)
    p = Placement(tensor=2, context=1, data=2, pipeline=4, gpus_per_node=8)
    assert p.pp_neighbours_same_node() == (True, False, True)
