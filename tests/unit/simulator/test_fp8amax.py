"""Transformer Engine's delayed-scaling amax reductions (simulator.fp8amax): one all-reduce per
chunk pass over the stage's tensor x context x data ranks, in the step's breakdown under fp8
only, and none where the group is one rank or the chunk holds no block."""
from __future__ import annotations

import pytest

from partita.planner.catalog import load_catalog
from partita.planner.scenario import parse_scenario
from partita.simulator import fp8amax
from partita.simulator.calibration import load_calibration
from partita.simulator.network import Group, build_topology, collective
from partita.simulator.step import simulate


def _doc(precision: str, *, gpus: int = 32, tensor: int = 4, pipeline: int = 2, data: int = 4,
         virtual: int = 1, layout: str | None = None) -> dict:
    parallel = {"tensor": tensor, "pipeline": pipeline, "data": data,
                "sequence_parallel": tensor > 1}
    if virtual > 1:
        parallel |= {"schedule": "interleaved-1f1b", "virtual_stages": virtual}
    if layout:
        parallel["layout"] = layout
    return {"name": "llama-fp8", "model": {"preset": "llama2-7b"},
            "cluster": {"system": "dgx-h100", "gpus": gpus},
            "training": {"global_batch": 64, "micro_batch": 1, "precision": precision},
            "parallel": parallel}


def _step(precision: str, **kw):
    return simulate(parse_scenario(_doc(precision, **kw)), load_catalog())


def _topo():
    return build_topology(load_catalog().system("dgx-h100"), load_calibration())


def test_the_group_is_a_stages_tensor_context_and_data_ranks():
    g = fp8amax.amax_group(4, 2, 8, 8)               # 64 consecutive ranks, 8 per node
    assert (g.ranks, g.ranks_per_node, g.nodes) == (64, 8, 8)
    assert fp8amax.amax_group(2, 1, 2, 8).nodes == 1  # 4 ranks fit in one node


def test_a_pass_costs_the_all_reduce_of_its_amaxes():
    topo, group = _topo(), fp8amax.amax_group(4, 1, 4, 8)
    fwd, bwd = fp8amax.reduction_times(32, group, topo)          # 8 blocks of 4 GEMMs
    assert fwd == collective("allreduce", "auto", 4.0 * 3 * 32, group, topo)
    assert bwd == collective("allreduce", "auto", 4.0 * 2 * 32, group, topo)
    assert fwd > 0 and bwd > 0
    assert fp8amax.reduction_times(0, group, topo) == (0.0, 0.0)
    assert fp8amax.reduction_times(32, Group(1, 1), topo) == (0.0, 0.0)


def test_each_micro_batch_pays_it_per_chunk_forward_and_backward():
    r = _step("fp8")
    # llama2-7b: 32 blocks over PP 2, so every chunk holds 16 blocks of 4 GEMMs per rank
    fwd, bwd = fp8amax.reduction_times(16 * 4, fp8amax.amax_group(4, 1, 4, 8), _topo())
    microbatches = 64 // 4
    assert r.breakdown_s["fp8_amax"] == pytest.approx(microbatches * (fwd + bwd))
    assert all(parts["fp8_amax"] == pytest.approx(fwd + bwd)
               for parts in r.details["chunk_parts_s"])
    # interleaving doubles the chunks on each rank and halves their blocks: twice the reductions
    r2 = _step("fp8", virtual=2)
    fwd2, bwd2 = fp8amax.reduction_times(8 * 4, fp8amax.amax_group(4, 1, 4, 8), _topo())
    assert r2.breakdown_s["fp8_amax"] == pytest.approx(2 * microbatches * (fwd2 + bwd2))


def test_bf16_and_a_single_rank_stage_make_none():
    assert "fp8_amax" not in _step("bf16").breakdown_s
    one = _step("fp8", gpus=2, tensor=1, pipeline=2, data=1)      # a stage of one rank
    assert "fp8_amax" not in one.breakdown_s


def test_a_chunk_without_blocks_makes_none():
    # Megatron-Core's layout string: the embedding alone on the first chunk, the head on the last
    r = _step("fp8", gpus=32, tensor=4, pipeline=4, data=2,
              layout="E|" + "t" * 11 + "|" + "t" * 11 + "|" + "t" * 10 + ",L")
    parts = r.details["chunk_parts_s"]
    assert "fp8_amax" not in parts[0]
    assert all(p["fp8_amax"] > 0 for p in parts[1:])


def test_current_scaling_makes_none():
    doc = _doc("fp8")
    doc["training"]["fp8_recipe"] = "current"
    assert "fp8_amax" not in simulate(parse_scenario(doc), load_catalog()).breakdown_s
