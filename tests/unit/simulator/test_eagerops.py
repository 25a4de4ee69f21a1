"""Eager RMSNorm and RoPE (training.norm_kernel: eager; rope_kernel: complex, rotate-half, matrix):
bytes and kernels by hand, their place in a block's time, memory and host cost, the archs they
apply to, and bad data files."""
from __future__ import annotations

import pytest
import yaml

from partita.planner.activations import block_activation_bytes
from partita.planner.catalog import load_catalog
from partita.planner.errors import PartitaError
from partita.planner.modelspec import TransformerDims
from partita.planner.scenario import parse_scenario
from partita.simulator import eagerops
from partita.simulator.compute import layer_times
from partita.simulator.host import forward_kernels
from partita.simulator.step import simulate
from test_compute import FLAT, make_gpu, write  # noqa: F401  (flat fixture's data)
from partita.simulator.calibration import load_calibration

LLAMA = TransformerDims(arch="llama", layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816,
                        seq_len=512, vocab=32000)
T5 = TransformerDims(arch="t5", layers=2, decoder_layers=2, hidden=512, heads=8, seq_len=128,
                     vocab=32128)


@pytest.fixture
def flat(tmp_path):
    return load_calibration(write(tmp_path, FLAT), include_local=False)


def test_extra_bytes_by_hand():
    """Two norms over tokens x hidden and RoPE over q and k (16 + 4 heads of 64), each moving the
    measured bytes per element in place of the fused 2e forward, 4e backward."""
    forms = eagerops.eager_forms()
    norm, rope = forms["rmsnorm_fp32_ops"], forms["rope_complex_fp32"]
    tokens, e = 2 * 512, 2
    norms = 2 * tokens * 1024
    qk = tokens * (16 + 4) * 64
    f, b = eagerops.extra_bytes(LLAMA, 2, 1, 1, False, False, e, norm="eager", rope="complex")
    assert f == pytest.approx(norms * (norm.forward_bytes - 2 * e) + qk * (rope.forward_bytes - 2 * e))
    assert b == pytest.approx(norms * (norm.backward_bytes - 4 * e)
                              + qk * (rope.backward_bytes - 4 * e))
    assert eagerops.extra_bytes(LLAMA, 2, 1, 1, False, False, e, norm="fused", rope="fused") == (0, 0)
    # tensor parallelism shards the heads; sequence parallelism the norms' tokens
    f_tp, _ = eagerops.extra_bytes(LLAMA, 2, 2, 1, True, False, e, norm="eager", rope="complex")
    assert f_tp == pytest.approx(norms / 2 * (norm.forward_bytes - 2 * e)
                                 + tokens * (8 + 2) * 64 * (rope.forward_bytes - 2 * e))
    # a T5 decoder block has three norms and no RoPE
    f_dec, _ = eagerops.extra_bytes(T5, 1, 1, 1, False, True, e, norm="eager", rope="complex")
    assert f_dec == pytest.approx(3 * 128 * 512 * (norm.forward_bytes - 2 * e))


@pytest.mark.parametrize("rope, form", [("complex", "rope_complex_fp32"),
                                        ("rotate-half", "rope_rotate_half"),
                                        ("matrix", "rope_matrix_fp32")])
def test_each_rope_form_prices_its_own_measurement(rope, form):
    f = eagerops.eager_forms()[form]
    qk = 1024 * (16 + 4) * 64
    fwd, bwd = eagerops.extra_bytes(LLAMA, 2, 1, 1, False, False, 2, norm="fused", rope=rope)
    assert (fwd, bwd) == pytest.approx((qk * (f.forward_bytes - 4), qk * (f.backward_bytes - 8)))
    assert eagerops.extra_forward_kernels(LLAMA, False, norm="fused", rope=rope) == (
        2 * f.forward_kernels)


def test_eager_forms_move_the_elementwise_time_only(flat):
    gpu = make_gpu(peak=1e30, bw=1e12)                 # only memory-bound kernels show
    fused = layer_times(LLAMA, 2, 1, False, 1, "bf16", "none", gpu, flat)
    eager = layer_times(LLAMA, 2, 1, False, 1, "bf16", "none", gpu, flat, norm_kernel="eager",
                        rope_kernel="complex")
    f, b = eagerops.extra_bytes(LLAMA, 2, 1, 1, False, False, 2, norm="eager", rope="complex")
    assert eager.parts["elementwise_fwd"] - fused.parts["elementwise_fwd"] == pytest.approx(f / 1e12)
    assert eager.parts["elementwise_bwd"] - fused.parts["elementwise_bwd"] == pytest.approx(b / 1e12)
    for key in ("gemm_fwd", "gemm_bwd_input", "attention_fwd", "attention_bwd"):
        assert eager.parts[key] == fused.parts[key]
    # full recompute re-runs the eager forward too
    full = layer_times(LLAMA, 2, 1, False, 1, "bf16", "full", gpu, flat, norm_kernel="eager")
    assert full.recompute_s == pytest.approx(full.fwd_s)


def test_eager_kernels_for_the_host():
    forms = eagerops.eager_forms()
    n = eagerops.extra_forward_kernels(LLAMA, False, norm="eager", rope="complex")
    assert n == 2 * (forms["rmsnorm_fp32_ops"].forward_kernels - 1) + 2 * forms[
        "rope_complex_fp32"].forward_kernels
    assert eagerops.extra_forward_kernels(T5, True, norm="eager", rope="fused") == 3 * (
        forms["rmsnorm_fp32_ops"].forward_kernels - 1)
    assert forward_kernels(decoder=False, tensor=1, attention="flash") > 0


def test_eager_norm_keeps_its_fp32_input():
    kept = block_activation_bytes(LLAMA, 2, precision="bf16")
    eager = block_activation_bytes(LLAMA, 2, precision="bf16", eager_norm=True)
    assert eager - kept == 4 * 2 * (2 * 512) * 1024          # fp32, two norms, tokens x hidden


def scenario(arch: str, **training):
    model = {"arch": arch, "layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024}
    if arch == "llama":
        model["ffn_hidden"] = 688
    if arch == "t5":
        model["decoder_layers"] = 2
    return parse_scenario({"model": model, "cluster": {"system": "dgx-h100", "gpus": 8},
                           "training": {"global_batch": 16, "micro_batch": 2, **training},
                           "parallel": {"data": 8}})


def test_simulated_step_grows_with_the_eager_forms():
    catalog = load_catalog()
    base = simulate(scenario("llama"), catalog)
    eager = simulate(scenario("llama", norm_kernel="eager", rope_kernel="complex"), catalog)
    assert eager.step_time_s > base.step_time_s
    assert (eager.memory_breakdown_bytes["activations"]
            > base.memory_breakdown_bytes["activations"])
    t5 = simulate(scenario("t5", norm_kernel="eager"), catalog)
    assert t5.step_time_s > simulate(scenario("t5"), catalog).step_time_s


@pytest.mark.parametrize("arch, key, message", [
    ("gpt", "norm_kernel", "training.norm_kernel: eager is for arch llama or t5 (the RMSNorm it "
                           "replaces), not arch gpt"),
    ("bert", "norm_kernel", "not arch bert"),
    ("t5", "rope_kernel", "training.rope_kernel: complex is for arch llama (the rotary embedding"),
])
def test_eager_forms_only_where_the_layer_exists(arch, key, message):
    with pytest.raises(PartitaError) as err:
        simulate(scenario(arch, **{key: "eager" if key == "norm_kernel" else "complex"}),
                 load_catalog())
    assert message in str(err.value)


def test_plan_refuses_an_eager_form_the_model_lacks_before_searching(tmp_path):
    from partita.planner.search import plan
    doc = scenario("gpt", norm_kernel="eager").to_dict()
    del doc["parallel"]
    with pytest.raises(PartitaError, match="training.norm_kernel: eager is for arch llama or t5"):
        plan(doc, catalog=load_catalog(),
             evaluate=lambda s: pytest.fail("searched a plan for a refused scenario"))


def test_bad_choice_names_the_key_and_choices():
    with pytest.raises(PartitaError) as err:
        scenario("llama", norm_kernel="triton")
    assert "training.norm_kernel" in str(err.value) and "fused" in str(err.value)
    s = scenario("llama", norm_kernel="eager", rope_kernel="complex")
    assert parse_scenario(s.to_dict()) == s
    assert "norm_kernel" not in scenario("llama").to_dict()["training"]


@pytest.mark.parametrize("change, message", [
    ({"rmsnorm_fp32_ops": {"forward_bytes_per_element": 51.7, "backward_bytes_per_element": 112.2}},
     "rmsnorm_fp32_ops.forward_kernels: missing required key"),
    ({"rope_complex_fp32": {"forward_bytes_per_element": -1, "backward_bytes_per_element": 1,
                            "forward_kernels": 3}},
     "rope_complex_fp32.forward_bytes_per_element: must be > 0, got -1"),
    ({"rmsnorm_fp32_op": {}}, "unknown key; did you mean 'rmsnorm_fp32_ops'?"),
])
def test_bad_eager_file_names_the_key(tmp_path, change, message):
    doc = yaml.safe_load(eagerops.EAGER_FILE.read_text())["measured"]
    doc.update(change)
    path = tmp_path / "eager.yaml"
    path.write_text(yaml.safe_dump({"measured": doc}))
    with pytest.raises(PartitaError) as err:
        eagerops.eager_forms(path)
    assert message in str(err.value) and str(path) in str(err.value)
