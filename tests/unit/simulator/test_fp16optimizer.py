"""Megatron-LM 2019's FP16_Optimizer (`training.optimizer_impl: apex-fp16-optimizer`): its passes,
the per-tensor waits, the step it prices and the scenario key."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from partita.planner.catalog import load_catalog
from partita.planner.scenario import parse_scenario
from partita.simulator import fp16optimizer
from partita.simulator.host import HostCosts
from partita.simulator.step import simulate


def test_the_benchmarked_passes_are_the_modelled_ones_op_for_op(aten_ops):
    """benchmarks/bench_host_dispatch.py times FP16_Optimizer's per-tensor ops (the Adam kernel
    aside) to measure their host cost: the same ops, in the same passes, as `PASSES` counts."""
    from benchmarks.bench_host_dispatch import FP16_OPTIMIZER_OPS, fp16_optimizer_passes
    grads = [torch.ones(3, dtype=torch.float16)]
    master = [torch.ones(3)]
    master[0].grad = torch.zeros(3)
    seen = aten_ops(lambda: fp16_optimizer_passes(grads, master, 0.5))
    names = {"_to_copy": "float", "sum": "sum", "_local_scalar_dense": "item", "copy_": "copy_",
             "mul_": "mul_", "linalg_vector_norm": "norm"}
    assert [names.get(o, o) for o in seen] == list(FP16_OPTIMIZER_OPS)
    modelled = [p for p in fp16optimizer.PASSES if p.name != "adam"]
    assert sum(p.ops for p in modelled) == len(FP16_OPTIMIZER_OPS)
    assert [p.name for p in fp16optimizer.PASSES if p.waits] == ["overflow check", "norm"]


def test_bytes_per_parameter_against_the_fused_optimizers():
    from partita.simulator.dataparallel import ADAM_BYTES_PER_PARAM
    assert fp16optimizer.bytes_per_parameter(2) == 10 + 6 + 8 + 4 + 28 + 6 == 62
    assert fp16optimizer.bytes_per_parameter(2) - ADAM_BYTES_PER_PARAM == 28


def test_waiting_passes_go_tensor_by_tensor_and_the_rest_ahead():
    host = HostCosts(op_dispatch_s=100e-6, launch_s=0.0, launch_blocking_wait_s=5e-6,
                     optimizer_op_dispatch_fraction=0.1)                   # 10 us per op
    assert host.optimizer_op_s == pytest.approx(10e-6)
    per_byte = 1e-12
    big, small = 1e8, 1e3

    def step(sizes, h=host):
        return fp16optimizer.step_time(sizes, 2, h, lambda nbytes: nbytes * per_byte)

    # one big tensor: every pass device-bound, the two waits add their return
    assert step([big]) == pytest.approx(62 * big * per_byte + 2 * 5e-6)
    # a small one: host-bound, the waiting passes' ops in series (3 and 2 ops), the rest 4 ops
    assert step([small]) == pytest.approx((5e-6 + 30e-6) + 10e-6 * 2 + (5e-6 + 20e-6)
                                          + 10e-6 * 2)
    # many small tensors cost more than one tensor of their total size
    assert step([small] * 1000) > 10 * step([small * 1000])
    sync = dataclasses.replace(host, synchronous=True)
    assert step([big], sync) == pytest.approx(62 * big * per_byte + 9 * 10e-6)


def _doc(**training) -> dict:
    return {"name": "fp16-optimizer",
            "model": {"arch": "gpt", "layers": 40, "hidden": 1536, "heads": 16, "seq_len": 1024,
                      "vocab": 51200},
            "cluster": {"system": "dgx2-v100", "gpus": 8},
            "training": {"global_batch": 64, "micro_batch": 8, "precision": "fp16",
                         "recompute": "full", **training},
            "parallel": {"tensor": 1, "pipeline": 1, "data": 8}}


def test_a_step_with_megatron_2019s_optimizer_pays_its_passes_and_waits():
    cat = load_catalog()
    fused = simulate(parse_scenario(_doc()), cat)
    apex = simulate(parse_scenario(_doc(optimizer_impl="apex-fp16-optimizer")), cat)
    assert apex.breakdown_s["optimizer"] > 62 / 34 * fused.breakdown_s["optimizer"]
    assert apex.step_time_s - fused.step_time_s == pytest.approx(
        apex.breakdown_s["optimizer"] - fused.breakdown_s["optimizer"], rel=1e-6)


def test_scenario_key_round_trips_and_bad_uses_are_one_error_line(simulate_error,
                                                                  training_key_round_trip):
    apex = "apex-fp16-optimizer"
    assert training_key_round_trip(_doc(optimizer_impl=apex), "optimizer_impl") == (apex, apex, True)
    assert training_key_round_trip(_doc(), "optimizer_impl") == ("fused", "fused", False)
    bf16 = _doc(optimizer_impl="apex-fp16-optimizer")
    bf16["training"]["precision"] = "bf16"
    zero = _doc(optimizer_impl="apex-fp16-optimizer")
    zero["parallel"]["zero"] = 1
    cases = ((_doc(optimizer_impl="apex"), "fused, apex-fp16-optimizer"),
             (bf16, "training.precision is bf16"), (zero, "parallel.zero is 1"))
    for doc, words in cases:
        err = simulate_error(doc)
        assert "training.optimizer_impl" in err and words in err


def test_megatron_2019_rows_map_with_it(dev_scenarios):
    impls = {k: s.training.optimizer_impl for k, s in dev_scenarios.items()}
    assert {impls[k] for k in impls if k.startswith("SHO19")} == {"apex-fp16-optimizer"}
    assert {impls[k] for k in impls if k.startswith("NAR21")} == {"fused"}


def test_a_profiled_module_refuses_the_per_tensor_optimizer_and_the_unpadding():
    from partita.planner.errors import PartitaError
    from partita.planner.scenario import TrainingSpec, check_kernel_forms
    for training, key in ((TrainingSpec(global_batch=8, precision="fp16",
                                        optimizer_impl="apex-fp16-optimizer"),
                           "training.optimizer_impl"),
                          (TrainingSpec(global_batch=8, attention_unpad="per-tensor"),
                           "training.attention_unpad")):
        with pytest.raises(PartitaError, match=key):
            check_kernel_forms(training, None)
