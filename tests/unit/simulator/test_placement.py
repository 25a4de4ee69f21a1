"""Rank placement: Megatron order (tp fastest, pp slowest) and the node span of each group."""
from partita.simulator.placement import GroupShape, Placement


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


def test_hybrid_sharding_groups_a_node_and_its_replicas_across_nodes():
    """data 32 sharded by 8 (FSDP HYBRID_SHARD on nodes of 8): the shard group is one node, the
    replica group one rank on each of the 4 nodes, with the 8 groups of a node sharing its NICs."""
    pl = Placement(tensor=1, context=1, data=32, pipeline=1, gpus_per_node=8)
    assert pl.shard_group(8) == GroupShape(8, 8, 1, 1)
    assert pl.replica_group(8) == GroupShape(4, 1, 4, 8)
    assert pl.shard_group(32) == pl.dp_group()
    tp2 = Placement(tensor=2, context=1, data=16, pipeline=1, gpus_per_node=8)
    assert tp2.shard_group(4) == GroupShape(4, 4, 1, 1)          # 4 DP ranks x TP 2 = one node
    assert tp2.replica_group(4) == GroupShape(4, 1, 4, 8)
