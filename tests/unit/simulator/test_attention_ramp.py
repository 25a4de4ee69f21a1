"""Flash attention's efficiency by sequence length, head dimension and mask (simulator.attentionramp)
and how the calibration and the compute model use it."""
from __future__ import annotations

import pytest
import yaml

from partita.planner.catalog import load_catalog
from partita.planner.errors import PartitaError
from partita.simulator.attentionramp import ramp_from_tflops
from partita.simulator.calibration import load_calibration
from partita.simulator.compute import attention_flops, attention_time

# FlashAttention-2's forward + backward TFLOP/s on A100 80GB SXM4 (data/calibration/compute.yaml)
FA2_A100_CAUSAL_HD64 = {512: 88, 1024: 119, 2048: 140, 4096: 156, 8192: 165, 16384: 171}
FA2_A100_BEST = 203


@pytest.fixture(scope="module")
def shipped():
    return load_calibration(include_local=False)


def test_ramp_is_relative_to_the_best_point_and_held_beyond_the_ends():
    ramp = ramp_from_tflops({"causal_hd64": [(512, 50), (2048, 100)], "causal_hd128": [(512, 100), (2048, 200)],
                             "full_hd64": [(512, 100), (2048, 100)], "full_hd128": [(512, 200), (2048, 200)]})
    assert ramp(2048, 128, True) == 1.0 and ramp(512, 128, True) == 0.5
    assert ramp(100, 128, True) == 0.5 and ramp(1e6, 128, True) == 1.0       # held flat
    assert ramp(1024, 128, True) == pytest.approx(0.75)                     # linear in log(seq)
    assert ramp(2048, 64, True) == 0.5 and ramp(2048, 32, True) == 0.5      # head dim held below 64
    assert ramp(2048, 256, True) == 1.0                                     # ... and above 128
    assert ramp(2048, 90.5, True) == pytest.approx(0.75, rel=1e-3)          # log2 between 64 and 128
    assert ramp(512, 64, False) == 0.5


def test_a100_forward_plus_backward_runs_at_flashattention2s_measured_rate(shipped):
    """The A100's long-sequence efficiencies times the ramp give back FA2's benchmark, point by
    point: forward (1 unit of work) and backward (2.5) together at the published TFLOP/s."""
    gpu = load_catalog().gpu("a100-80gb")
    batch, heads, d = 8, 16, 64
    for seq, tflops in FA2_A100_CAUSAL_HD64.items():
        flops = attention_flops(batch, heads, seq, seq, d)
        t = (attention_time(flops, True, gpu, "bf16", shipped, seq_len=seq, head_dim=d)
             + attention_time(flops, True, gpu, "bf16", shipped, backward=True, seq_len=seq, head_dim=d))
        achieved = 3.5 * 0.5 * flops / t                  # FA2's count: causal half, bwd 2.5x fwd
        assert achieved == pytest.approx(tflops * 1e12, rel=0.01), seq


def test_short_sequences_and_small_heads_run_slower_per_flop(shipped):
    gpu = load_catalog().gpu("h100-80gb")

    def per_flop(seq, d, causal=True):
        flops = attention_flops(1, 8, seq, seq, d)
        return attention_time(flops, causal, gpu, "bf16", shipped, seq_len=seq, head_dim=d) / flops

    assert per_flop(512, 128) > per_flop(4096, 128) > per_flop(16384, 128)
    assert per_flop(2048, 64) > per_flop(2048, 128)
    # without a shape the long-sequence efficiency applies (callers that do not know the shape)
    flops = attention_flops(1, 8, 16384, 16384, 128)
    assert attention_time(flops, False, gpu, "bf16", shipped) == pytest.approx(
        attention_time(flops, False, gpu, "bf16", shipped, seq_len=16384, head_dim=128))


def test_ramps_are_inherited_by_like_and_default_but_not_by_a_gpu_measured_at_one_shape(tmp_path, shipped):
    assert shipped.gpu("h200-141gb").attention_ramp == shipped.gpu("h100-80gb").attention_ramp
    assert shipped.gpu("a100-40gb").attention_ramp is not None
    assert shipped.gpu("k80").attention_ramp == shipped.default.attention_ramp is not None
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump({"gpus": {"local-cpu": {
        "attention_forward_efficiency": 0.2, "attention_backward_efficiency": 0.3}}}))
    local = load_calibration(path, include_local=False).gpu("local-cpu")
    assert local.attention_ramp is None
    assert local.attention_efficiency(False, 512, 64, True) == 0.2


CURVES = ("causal_hd64", "causal_hd128", "full_hd64", "full_hd128")


@pytest.mark.parametrize("ramp, missing", [("attention_by_seq_tflops", "full_hd128"),
                                           ("flash_by_seq_tflops", "causal_hd64")])
def test_a_ramp_missing_a_curve_is_an_error_naming_the_key(tmp_path, ramp, missing):
    path = tmp_path / "bad.yaml"
    curves = {c: [[512, 10]] for c in CURVES if c != missing}
    path.write_text(yaml.safe_dump({"gpus": {"x": {ramp: {"peak_tflops": 100, **curves}}}}))
    with pytest.raises(PartitaError, match=rf"gpus\.x\.{ramp}\.{missing}"):
        load_calibration(path, include_local=False)


def test_fp32_matmuls_run_on_the_cuda_cores_of_tensor_core_gpus():
    from partita.simulator.compute import cuda_core_matmul
    cat = load_catalog()
    assert all(cuda_core_matmul(cat.gpu(n), "fp32") for n in ("v100-16gb", "a100-80gb", "h100-80gb", "l4"))
    assert not cuda_core_matmul(cat.gpu("a100-80gb"), "tf32")       # TF32 runs on the tensor cores
    assert not cuda_core_matmul(cat.gpu("h100-80gb"), "bf16")
    assert not cuda_core_matmul(cat.gpu("k80"), "fp32")             # no tensor cores at all


def test_flashattention2_on_h100_runs_at_its_published_rate_and_hoppers_kernels_faster(shipped):
    """`training.attention: flash2` on H100 gives FlashAttention-2's forward + backward benchmark
    at its best point (338 TFLOP/s, FA2_BENCH, within 1%); `flash` (FlashAttention-3 / cuDNN) runs
    the same work 1.6-1.7x faster; on A100, where FlashAttention-2 is the best kernel, the two
    are the same."""
    h100, a100 = (load_catalog().gpu(n) for n in ("h100-80gb", "a100-80gb"))
    seq, d = 16384, 128
    flops = attention_flops(1, 16, seq, seq, d)

    def both(gpu, kernel):
        g = shipped.gpu(gpu.name)
        return sum(flops / (gpu.peak("bf16") * g.attention_efficiency(b, seq, d, False, kernel))
                   * (2.5 if b else 1.0) for b in (False, True))
    assert 3.5 * flops / both(h100, "flash2") == pytest.approx(338e12, rel=0.01)
    assert 1.6 < both(h100, "flash2") / both(h100, "flash") < 1.7
    assert both(a100, "flash2") == both(a100, "flash")
    assert shipped.gpu("h200-141gb").flash2_forward == shipped.gpu("h100-80gb").flash2_forward


def test_a_scenarios_attention_kernel_reaches_the_step_time():
    from partita.planner.scenario import parse_scenario
    from partita.simulator.step import simulate
    doc = {"name": "k", "model": {"arch": "gpt", "layers": 4, "hidden": 2048, "heads": 16,
                                  "seq_len": 8192, "vocab": 32000},
           "cluster": {"system": "dgx-h100", "gpus": 8},
           "training": {"global_batch": 8, "micro_batch": 1, "precision": "bf16"},
           "parallel": {"tensor": 1, "pipeline": 1, "data": 8}}
    fast = simulate(parse_scenario(doc), load_catalog())
    doc["training"]["attention"] = "flash2"
    slow = simulate(parse_scenario(doc), load_catalog())
    assert slow.step_time_s > 1.1 * fast.step_time_s
    assert slow.peak_memory_bytes == fast.peak_memory_bytes          # neither stores the scores


FA1_A100_CAUSAL_HD64 = {512: 58, 1024: 70, 2048: 77, 4096: 87, 8192: 92, 16384: 97}


def test_flashattention1_on_a100_runs_at_its_published_rate(shipped):
    """`training.attention: flash1` on A100 gives FlashAttention (v1)'s forward + backward rate of
    the same benchmark figure (causal, head dim 64: 58-97 TFLOP/s against FlashAttention-2's
    88-171); another GPU runs it at the same fraction of its own FlashAttention-2's best rate."""
    cat = load_catalog()
    a100, h100 = cat.gpu("a100-80gb"), cat.gpu("h100-80gb")
    d = 64

    def rate(gpu, seq, kernel):
        g = shipped.gpu(gpu.name)
        flops = attention_flops(1, 16, seq, seq, d)
        t = sum(flops / 2 / (gpu.peak("bf16") * g.attention_efficiency(b, seq, d, True, kernel))
                * (2.5 if b else 1.0) for b in (False, True))
        return 3.5 * flops / 2 / t
    for seq in (512, 2048, 16384):
        v1, v2 = rate(a100, seq, "flash1"), rate(a100, seq, "flash2")
        assert v1 / v2 == pytest.approx(FA1_A100_CAUSAL_HD64[seq] / FA2_A100_CAUSAL_HD64[seq],
                                        rel=0.01)
        assert rate(h100, seq, "flash1") / rate(a100, seq, "flash1") == pytest.approx(
            rate(h100, 16384, "flash2") / rate(a100, 16384, "flash2") / (
                shipped.gpu("h100-80gb").attention_ramp(16384, d, True)
                / shipped.gpu("a100-80gb").attention_ramp(16384, d, True)), rel=0.01)


def test_flash1_needs_its_rates_beside_flashattention2s(tmp_path):
    bad = tmp_path / "cal.yaml"
    bad.write_text(yaml.safe_dump({"default": {"flash1_by_seq_tflops": {
        "peak_tflops": 312, "causal_hd64": [[512, 58]], "causal_hd128": [[512, 55]],
        "full_hd64": [[512, 91]], "full_hd128": [[512, 76]]}}}))
    with pytest.raises(PartitaError, match="flash1_by_seq_tflops: needs attention_by_seq_tflops"):
        load_calibration(bad)


def test_hoppers_own_flash_kernel_ramps_as_cudnn_measured_and_flash2_keeps_its_ramp(shipped):
    """`flash` on H100 (and H200, `like` it) takes cuDNN's ramp measured on an H200
    (compute.yaml, flash_by_seq_tflops): forward + backward at 2k tokens, head dim 128, causal
    within 5% of the 388 TFLOP/s measured there; at 512 tokens it keeps a smaller share of its
    16k rate than FlashAttention-2 (`flash2`, whose ramp is unchanged) does."""
    h100 = load_catalog().gpu("h100-80gb")
    g = shipped.gpu("h100-80gb")
    assert shipped.gpu("h200-141gb").flash_ramp == g.flash_ramp is not None
    assert shipped.gpu("a100-80gb").flash_ramp is None

    def tflops(seq, kernel, causal=True):
        """Forward + backward TFLOP/s as the benchmark counts them (causal FLOPs halved)."""
        flops = attention_flops(1, 16, seq, seq, 128) * (0.5 if causal else 1.0)
        t = sum(flops / (h100.peak("bf16") * g.attention_efficiency(b, seq, 128, causal, kernel))
                * (2.5 if b else 1.0) for b in (False, True))
        return 3.5 * flops / t / 1e12
    assert tflops(2048, "flash") == pytest.approx(388.3, rel=0.05)
    assert tflops(512, "flash") / tflops(16384, "flash") < tflops(512, "flash2") / tflops(16384, "flash2")
    assert g.attention_ramp(512, 128, True) == pytest.approx(163 / 338)      # FlashAttention-2's


def test_a_bad_flash_ramp_in_the_local_overlay_is_one_error_line_and_exit_1(tmp_path, monkeypatch,
                                                                          capsys):
    """`partita simulate` with a calibration overlay whose flash_by_seq_tflops has a negative rate:
    one `error:` line naming the file and the key path, exit 1, no traceback."""
    from partita.cli import main
    home = tmp_path / "home"
    home.mkdir()
    (home / "calibration-local.yaml").write_text(yaml.safe_dump({"gpus": {"h100-80gb": {
        "flash_by_seq_tflops": {"peak_tflops": 989, "causal_hd64": [[512, -3]],
                                "causal_hd128": [[512, 10]], "full_hd64": [[512, 10]],
                                "full_hd128": [[512, 10]]}}}}))
    monkeypatch.setenv("PARTITA_HOME", str(home))
    monkeypatch.delenv("PARTITA_CATALOG", raising=False)
    assert main(["simulate", "gpt3-175b-a100"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert "calibration-local.yaml: gpus.h100-80gb.flash_by_seq_tflops.causal_hd64" in err[0]
