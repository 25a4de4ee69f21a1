"""`executor.preflight.as_executed`: a GPU run's prediction prices the executor's own kernels."""
from __future__ import annotations

from partita.executor.preflight import as_executed, predict
from partita.planner.catalog import load_catalog
from partita.planner.scenario import parse_scenario
from partita.simulator.step import simulate


def _doc(arch: str, system: str = "hgx-h200") -> dict:
    dims = {"arch": arch, "layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024,
            "vocab": 32000}
    if arch == "llama":
        dims["ffn_hidden"] = 2816
    return {"name": f"{arch}-run", "model": dims, "cluster": {"system": system, "gpus": 1},
            "training": {"global_batch": 8, "micro_batch": 4, "precision": "bf16",
                         "framework": "megatron", "fused_cross_entropy": True},
            "parallel": {"pipeline": 1}}


def test_llama_runs_eager_norm_and_rotate_half_rope_with_unfused_elementwise():
    t = as_executed(parse_scenario(_doc("llama"))).training
    assert (t.norm_kernel, t.rope_kernel) == ("eager", "rotate-half")
    assert t.fused_elementwise is False and t.fused_cross_entropy is False


def test_gpt_keeps_its_native_layer_norm_and_has_no_rope():
    """partita's GPT block launches the fused block's kernels (biases inside the matmuls, no
    dropout), so it is priced fused; it has no dropout and its full recompute stops early."""
    s = as_executed(parse_scenario(_doc("gpt")))
    t = s.training
    assert (t.norm_kernel, t.rope_kernel) == ("fused", "fused")
    assert t.fused_elementwise is True and t.fused_cross_entropy is False
    assert t.recompute_early_stop is True and s.model.resolve().dropout is False


def test_a_gpu_prediction_is_the_executed_scenario_and_slower_than_the_framework_one():
    catalog = load_catalog()
    s = parse_scenario(_doc("llama"))
    time_s, note, _ = predict(s, None)
    assert note is None
    assert time_s == simulate(as_executed(s), catalog).step_time_s
    assert time_s > simulate(s, catalog).step_time_s


def test_context_parallelism_is_priced_as_the_executor_runs_it():
    """executor/context.py all-gathers the keys and values (Llama 3's form), so a GPU run with
    context parallelism is priced that way whatever the scenario names; without it, p2p stays."""
    doc = _doc("llama")
    doc["cluster"]["gpus"] = 2
    doc["parallel"] = {"pipeline": 1, "context": 2}
    s = parse_scenario(doc)
    assert s.parallel.cp_comm_type == "p2p"
    assert as_executed(s).parallel.cp_comm_type == "all_gather"
    assert as_executed(parse_scenario(_doc("llama"))).parallel.cp_comm_type == "p2p"


def test_a_module_model_is_returned_unchanged():
    doc = _doc("gpt")
    doc["model"] = {"module": "toy.py:Toy", "seq_len": 16, "vocab": 64}
    s = parse_scenario(doc)
    assert as_executed(s) is s
