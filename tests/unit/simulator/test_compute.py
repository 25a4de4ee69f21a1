"""Compute cost model and the calibration loader: hand-computed kernel times, FLOP bookkeeping,
sharding, recompute, and every bad-calibration path."""
from __future__ import annotations

import math

import pytest
import yaml

from partita.planner.errors import PartitaError
from partita.planner.hardware import GPU
from partita.planner.modelspec import TransformerDims, preset_dims
from partita.simulator.calibration import Curve, load_calibration
from partita.simulator.compute import (attention_flops, attention_time, block_gemms, block_matmul_flops,
                               elementwise_time, embedding_times, gemm_time, head_times, layer_times)
from partita.simulator.memory import block_parameters

FLAT = {  # every efficiency 1, no kernel floor: times are work / peak exactly
    "default": {"matmul_shape_by_ideal_us": [[1e-3, 1.0], [1e6, 1.0]],
                "matmul_plateau_efficiency": 1.0,
                "memory_efficiency_by_mb": [[1e-3, 1.0], [1e6, 1.0]],
                "attention_forward_efficiency": 1.0, "attention_backward_efficiency": 1.0,
                "kernel_floor_us": 0.0},
}


def write(tmp_path, doc, name="cal.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def flat(tmp_path):
    return load_calibration(write(tmp_path, FLAT), include_local=False)


@pytest.fixture
def shipped():
    return load_calibration(include_local=False)


def make_gpu(name="test-gpu", peak=100e12, bw=1e12, **peaks):
    return GPU(name, name, 80 * 2**30, bw, {"bf16": peak, "fp16": peak, "fp32": peak / 8, **peaks})


H100 = GPU("h100-80gb", "H100", 80 * 2**30, 3.35e12,
           {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "tf32": 494.5e12, "fp32": 67e12})
LLAMA = TransformerDims(arch="llama", layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816,
                        seq_len=512, vocab=32000)
GPT = TransformerDims(arch="gpt", layers=4, hidden=1024, heads=16, seq_len=512, vocab=32000)


# ---- kernels, computed by hand ----

def test_large_gemm_is_work_over_peak(flat):
    gpu = make_gpu(bw=1e18)                      # memory never binds
    n = 8192
    assert gemm_time(n, n, n, gpu, "bf16", flat) == pytest.approx(2 * n**3 / 100e12)


def test_skinny_gemm_is_memory_bound(flat):
    gpu = make_gpu(peak=1e18, bw=1e12)
    m, n, k = 1, 4096, 4096
    nbytes = (m * k + k * n + m * n) * 2
    assert gemm_time(m, n, k, gpu, "bf16", flat) == pytest.approx(nbytes / 1e12)


def test_tiny_kernels_take_the_floor(shipped):
    floor = shipped.gpu("h100-80gb").kernel_floor_s
    assert floor > 0
    assert gemm_time(8, 8, 8, H100, "bf16", shipped) == pytest.approx(floor)
    assert elementwise_time(64, H100, shipped) == pytest.approx(floor)


def test_elementwise_uses_the_memory_curve(shipped):
    nbytes = 50.3e6                               # an H100 measured point: 0.75 of 3.35 TB/s
    assert elementwise_time(nbytes, H100, shipped) == pytest.approx(nbytes / (3.35e12 * 0.75))


def test_h100_square_gemm_matches_its_measurement(shipped):
    n = 4096                                      # ZZC_79: 788.72 TFLOP/s
    assert 2 * n**3 / gemm_time(n, n, n, H100, "bf16", shipped) == pytest.approx(788.72e12)


def test_bigger_gemms_are_more_efficient_up_to_the_plateau(shipped):
    rates = [2 * n**3 / gemm_time(n, n, n, H100, "bf16", shipped) for n in (512, 1024, 2048, 4096)]
    assert rates == sorted(rates)
    assert rates[-1] < 989e12


def test_precision_without_data_uses_the_default_shape(shipped):
    g = shipped.gpu("h100-80gb")                  # fp8: only the MAMF plateau is known
    assert g.matmul_efficiency("fp8", 1.0) == pytest.approx(1402.6 / 1979)
    assert g.matmul_efficiency("fp8", 1e-6) < g.matmul_efficiency("fp8", 1e-3)


def test_a_measured_peak_is_not_discounted_twice(shipped):
    # a GPU whose datasheet peak is unknown: the catalog's peak is the best measured matmul rate
    measured = GPU("mystery", "mystery", 16 * 2**30, 1e18, {"fp32": 1e12}, datasheet_flops={"fp32": None},
                   measured_matmul_flops={"fp32": 1e12})
    datasheet = GPU("known", "known", 16 * 2**30, 1e18, {"fp32": 1e12})
    n = 16384                                     # far on the plateau
    assert gemm_time(n, n, n, measured, "fp32", shipped) == pytest.approx(2 * n**3 / 1e12)
    assert gemm_time(n, n, n, datasheet, "fp32", shipped) == pytest.approx(2 * n**3 / 1e12 / 0.811)


def test_attention_causal_half_and_backward_factor(flat):
    gpu = make_gpu()
    flops = attention_flops(2, 16, 1024, 1024, 64)
    assert flops == 4 * 2 * 16 * 1024 * 1024 * 64
    full = attention_time(flops, False, gpu, "bf16", flat)
    assert full == pytest.approx(flops / 100e12)
    assert attention_time(flops, True, gpu, "bf16", flat) == pytest.approx(full / 2)
    assert attention_time(flops, False, gpu, "bf16", flat, backward=True) == pytest.approx(2.5 * full)


def test_curve_interpolates_in_log_space():
    c = Curve((1.0, 100.0), (0.2, 0.8))
    assert c(10.0) == pytest.approx(0.5)
    assert c(0.01) == 0.2 and c(1e6) == 0.8


# ---- one block ----

def test_block_gemm_flops_are_two_per_weight_per_token():
    tokens = 3 * LLAMA.seq_len
    weights = block_parameters(LLAMA) - 2 * LLAMA.hidden          # less the two RMSNorm vectors
    gemms = sum(2 * g.m * g.n * g.k for g in block_gemms(LLAMA, 3))
    assert gemms == 2 * tokens * weights


@pytest.mark.parametrize("dims,decoder", [(GPT, False), (LLAMA, False), (preset_dims("t5-3b"), True),
                                          (preset_dims("bert-base"), False)])
def test_block_flops_agree_with_the_cost_model(dims, decoder):
    from partita.planner import costmodel
    kind = "decoder" if decoder else None
    theirs = sum(g.flops for g in costmodel.block_gemms(dims, 2, kind=kind))
    assert block_matmul_flops(dims, 2, decoder=decoder) == theirs


def test_block_matmul_flops_follow_narayanan():
    # Narayanan et al. 2021 eq. 3 per layer forward: 24 b s h^2 (1 + s / (6h)) for gpt
    b, s, h = 2, GPT.seq_len, GPT.hidden
    assert block_matmul_flops(GPT, b) == pytest.approx(24 * b * s * h * h * (1 + s / (6 * h)))


def test_tensor_parallel_splits_every_gemm(flat):
    gpu = make_gpu(bw=1e18)
    one = layer_times(GPT, 4, 1, False, 1, "bf16", "none", gpu, flat).parts
    four = layer_times(GPT, 4, 4, False, 1, "bf16", "none", gpu, flat).parts
    for key in ("gemm_fwd", "gemm_bwd_input", "gemm_bwd_weight", "attention_fwd"):
        assert four[key] == pytest.approx(one[key] / 4)


def test_backward_is_twice_forward_split_input_and_weight(flat):
    gpu = make_gpu(bw=1e18)
    t = layer_times(LLAMA, 2, 2, True, 1, "bf16", "none", gpu, flat)
    assert t.parts["gemm_bwd_input"] == pytest.approx(t.parts["gemm_fwd"])
    assert t.parts["gemm_bwd_weight"] == pytest.approx(t.parts["gemm_fwd"])
    assert t.bwd_s == pytest.approx(t.bwd_input_s + t.bwd_weight_s)
    assert t.bwd_weight_s == pytest.approx(t.parts["gemm_bwd_weight"])


def test_context_parallel_divides_tokens_and_attention(flat):
    gpu = make_gpu(bw=1e18)
    one = layer_times(GPT, 1, 1, False, 1, "bf16", "none", gpu, flat).parts
    two = layer_times(GPT, 1, 1, False, 2, "bf16", "none", gpu, flat).parts
    assert two["gemm_fwd"] == pytest.approx(one["gemm_fwd"] / 2)
    assert two["attention_fwd"] == pytest.approx(one["attention_fwd"] / 2)


def test_sequence_parallel_shrinks_norm_traffic(shipped):
    big = preset_dims("gpt3-175b")
    no_sp = layer_times(big, 1, 8, False, 1, "bf16", "none", H100, shipped)
    sp = layer_times(big, 1, 8, True, 1, "bf16", "none", H100, shipped)
    assert sp.parts["elementwise_fwd"] < no_sp.parts["elementwise_fwd"]
    assert sp.parts["gemm_fwd"] == no_sp.parts["gemm_fwd"]


def test_recompute_adds_forward_work(shipped):
    args = (GPT, 2, 1, False, 1, "bf16")
    none = layer_times(*args, "none", H100, shipped)
    sel = layer_times(*args, "selective", H100, shipped)
    full = layer_times(*args, "full", H100, shipped)
    assert none.recompute_s == 0
    assert sel.recompute_s == pytest.approx(sel.parts["attention_fwd"])
    assert full.recompute_s == pytest.approx(full.fwd_s)
    assert none.fwd_s == sel.fwd_s == full.fwd_s


@pytest.mark.parametrize("dims, redone", [(GPT, ("attn.k", "attn.o", "mlp.down")),
                                           (LLAMA, ("attn.k", "attn.o", "mlp.up"))])
def test_op_policy_recomputes_every_second_linear_and_the_elementwise_forward(flat, dims, redone):
    """torchtitan's op-level selective checkpointing: the recompute is the elementwise forward
    plus the 2nd, 4th, 6th linear, each its own GEMM (flat calibration: roofline times)."""
    from partita.planner import inventory
    t = layer_times(dims, 2, 1, False, 1, "bf16", "selective-op", H100, flat)
    linears = inventory.block_linears(dims, micro_batch=2)
    gemms = [g for g in linears if g.name in redone]
    assert [g.name for g in inventory.op_policy_split(linears)[1]] == list(redone)
    want = t.parts["elementwise_fwd"] + sum(gemm_time(g.m, g.n, g.k, H100, "bf16", flat)
                                            for g in gemms)
    assert sum(gemm_time(g.m, g.n, g.k, H100, "bf16", flat) for g in gemms) >= sum(
        g.flops for g in gemms) / H100.peak("bf16")
    assert t.recompute_s == pytest.approx(want, rel=1e-12)
    assert t.parts["recompute_gemm"] == pytest.approx(want - t.parts["elementwise_fwd"], rel=1e-12)
    full = layer_times(dims, 2, 1, False, 1, "bf16", "full", H100, flat)
    assert 0 < t.recompute_s < full.recompute_s and t.fwd_s == full.fwd_s


def test_op_policy_recompute_shards_with_tensor_parallelism(flat):
    big = TransformerDims(arch="llama", layers=2, hidden=8192, heads=64, kv_heads=8,
                          ffn_hidden=28672, seq_len=4096, vocab=32000)
    one = layer_times(big, 2, 1, False, 1, "bf16", "selective-op", H100, flat)
    four = layer_times(big, 2, 4, False, 1, "bf16", "selective-op", H100, flat)
    from partita.planner import inventory
    redone = inventory.op_policy_split(inventory.block_linears(big, micro_batch=2, tensor=4))[1]
    assert [g.n for g in redone] == [8 // 4 * 128, 8192, 28672 // 4]     # k, o, up on one rank
    assert four.parts["recompute_gemm"] == pytest.approx(
        sum(gemm_time(g.m, g.n, g.k, H100, "bf16", flat) for g in redone), rel=1e-12)
    assert four.parts["recompute_gemm"] < one.parts["recompute_gemm"] / 3


def test_t5_decoder_block_costs_more_than_encoder(shipped):
    t5 = preset_dims("t5-base")
    enc = layer_times(t5, 2, 1, False, 1, "bf16", "none", H100, shipped)
    dec = layer_times(t5, 2, 1, False, 1, "bf16", "none", H100, shipped, decoder=True)
    assert dec.fwd_s > enc.fwd_s and dec.bwd_s > enc.bwd_s


def test_embedding_and_head(shipped):
    emb = embedding_times(GPT, 2, 1, False, 1, "bf16", H100, shipped)
    head = head_times(GPT, 2, 1, False, 1, "bf16", H100, shipped)
    head_tp = head_times(GPT, 2, 4, False, 1, "bf16", H100, shipped)
    assert emb.fwd_s > 0 and emb.bwd_input_s == 0 and emb.bwd_weight_s == emb.bwd_s
    assert head.fwd_s > head_tp.fwd_s > 0
    assert head.bwd_s == pytest.approx(head.bwd_input_s + head.bwd_weight_s)


def test_fp32_training_is_slower_than_bf16(shipped):
    fast = layer_times(GPT, 2, 1, False, 1, "bf16", "none", H100, shipped)
    slow = layer_times(GPT, 2, 1, False, 1, "fp32", "none", H100, shipped)
    assert slow.fwd_s > 5 * fast.fwd_s


def test_same_input_same_output(shipped):
    a = layer_times(LLAMA, 2, 2, True, 2, "bf16", "selective", H100, shipped)
    b = layer_times(LLAMA, 2, 2, True, 2, "bf16", "selective", H100, shipped)
    assert a == b and a.parts == b.parts


def test_unsupported_precision_and_bad_recompute(shipped):
    v100 = GPU("v100-16gb", "V100", 16 * 2**30, 900e9, {"fp16": 125e12, "fp32": 15.7e12})
    with pytest.raises(PartitaError, match="precision 'bf16' is not supported by v100-16gb"):
        layer_times(GPT, 1, 1, False, 1, "bf16", "none", v100, shipped)
    with pytest.raises(PartitaError, match="training.recompute"):
        layer_times(GPT, 1, 1, False, 1, "bf16", "some", H100, shipped)


# ---- the calibration files ----

def test_every_shipped_gpu_has_curves_and_sources(shipped):
    for name, g in shipped.gpus.items():
        assert g.source, name
        assert 0 < g.matmul_efficiency("bf16", 1e-3) <= 1.0
        assert 0 < g.attention_forward <= 1 and 0 < g.attention_backward <= 1
    assert shipped.gpu("h200-141gb").matmul["bf16"] == shipped.gpu("h100-80gb").matmul["bf16"]
    assert shipped.gpu("h200-141gb").matmul_efficiency("fp8", 1.0) == pytest.approx(1453.4 / 1979)
    unknown = shipped.gpu("k80")                  # no data: the default curves, its own name
    assert unknown.name == "k80" and unknown.default_matmul == shipped.default.default_matmul


def test_override_merges_field_by_field(tmp_path, shipped):
    path = write(tmp_path, {"gpus": {"h100-80gb": {"attention_forward_efficiency": 0.3}}})
    cal = load_calibration(path, include_local=False)
    assert cal.gpu("h100-80gb").attention_forward == 0.3
    assert cal.gpu("h100-80gb").matmul == shipped.gpu("h100-80gb").matmul
    assert cal.gpu("a100-80gb") == shipped.gpu("a100-80gb")


def test_override_replaces_one_precision_whole(tmp_path, shipped):
    path = write(tmp_path, {"gpus": {"h100-80gb": {"matmul": {"bf16": {"peak_tflops": 989,
                                                                       "plateau_tflops": 494.5}}}}})
    cal = load_calibration(path, include_local=False)
    assert cal.gpu("h100-80gb").matmul_efficiency("bf16", 1.0) == pytest.approx(0.5)
    assert cal.gpu("h100-80gb").matmul["fp8"] == shipped.gpu("h100-80gb").matmul["fp8"]


def test_local_overlay_is_read_from_partita_home(tmp_path, monkeypatch):
    (tmp_path / "calibration-local.yaml").write_text(yaml.safe_dump({"gpus": {"local-cpu": {
        "matmul": {"fp32": {"peak_tflops": 1.0,
                            "measured_mnk_tflops": [[256, 256, 256, 0.2], [1024, 1024, 1024, 0.6]]}},
        "source": ["partita calibrate test"]}}}))
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path))
    cal = load_calibration()
    g = cal.gpu("local-cpu")
    assert g.matmul_efficiency("fp32", 2 * 1024**3 / 1e12) == pytest.approx(0.6)
    assert load_calibration(include_local=False).gpus.get("local-cpu") is None


BAD = [
    ({"gpus": {"h100-80gb": {"atention_forward_efficiency": 0.5}}},
     r"gpus\.h100-80gb\.atention_forward_efficiency: unknown key; did you mean 'attention_forward_efficiency'"),
    ({"gpus": {"x": {"matmul": {"bf16": {"plateau_tflops": 5}}}}},
     r"gpus\.x\.matmul\.bf16\.peak_tflops: missing required key"),
    ({"gpus": {"x": {"matmul": {"bf16": {"peak_tflops": 5, "measured_mnk_tflops": [[1, 2, 3]]}}}}},
     r"measured_mnk_tflops: entry 0: expected \[m, n, k, tflops\]"),
    ({"gpus": {"x": {"memory_efficiency_by_mb": [[10, 0.5], [1, 0.9]]}}},
     r"gpus\.x\.memory_efficiency_by_mb: x values must increase"),
    ({"gpus": {"x": {"like": "h100"}}}, r"gpus\.x\.like: unknown GPU in the calibration 'h100'"),
    ({"gpus": {"x": {"attention_forward_efficiency": "fast"}}},
     r"gpus\.x\.attention_forward_efficiency: expected a number, got 'fast'"),
    ({"gpus": {"x": {"attention_forward_efficiency": 7}}}, r"expected an efficiency"),
    ({"gpus": {"x": {"flash2_backward_efficiency": 7}}},
     r"gpus\.x\.flash2_backward_efficiency: .*expected an efficiency"),
    ({"tiers": {"local": {"collective_efficiency": 7}}},
     r"tiers\.local\.collective_efficiency: .*expected an efficiency"),
    ({"gpus": {"x": {"flash3_forward_efficiency": 0.5}}},
     r"gpus\.x\.flash3_forward_efficiency: unknown key; did you mean 'flash2_forward_efficiency'"),
    ({"gpus": {"x": {"matmul": {"bf17": {}}}}}, r"gpus\.x\.matmul\.bf17: unknown key"),
    ({"gpus": {"x": {"matmul": {"fp16": {"like_precision": "bf16"}}}}},
     r"gpus\.x\.matmul\.fp16\.like_precision: no measured data for 'bf16'"),
    ({"gpu": {}}, r"gpu: unknown key; did you mean 'gpus'"),
    ({"memory": {"framework_buffers_gib": {"deepspeeed": 1.0}}},
     r"memory\.framework_buffers_gib\.deepspeeed: unknown key; did you mean 'deepspeed'"),
    ({"memory": {"framework_buffers_gib": {"fsdp": "big"}}},
     r"memory\.framework_buffers_gib\.fsdp: expected a number, got 'big'"),
]


@pytest.mark.parametrize("doc,message", BAD)
def test_bad_calibration_files_name_file_and_key(tmp_path, doc, message):
    path = write(tmp_path, doc)
    with pytest.raises(PartitaError, match=message) as info:
        load_calibration(path, include_local=False)
    assert str(path) in str(info.value)


def test_missing_and_malformed_calibration_files(tmp_path):
    with pytest.raises(PartitaError, match="no such calibration file"):
        load_calibration(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [unclosed\n")
    with pytest.raises(PartitaError, match="invalid YAML"):
        load_calibration(bad, include_local=False)
    assert math.isfinite(load_calibration(include_local=False).default.kernel_floor_s)


def test_eager_attention_moves_each_score_through_every_unfused_kernel(flat):
    """Megatron-LM 2019's attention (scale, mask multiply, mask subtract, softmax and dropout as
    separate kernels) moves 10e + 1 bytes per score forward and 9e + 1 backward, the fused
    scale-mask-softmax 4e + 1 and 6e + 1: the difference is memory time, the GEMMs are the same."""
    gpu = make_gpu()
    dims = preset_dims("gpt2-medium")
    fused = layer_times(dims, 2, 1, False, 1, "bf16", "none", gpu, flat, attention="unfused")
    eager = layer_times(dims, 2, 1, False, 1, "bf16", "none", gpu, flat, attention="eager")
    scores = 2 * dims.heads * dims.seq_len ** 2
    hbm = gpu.memory_bandwidth_bytes_per_s
    assert eager.fwd_s - fused.fwd_s == pytest.approx(scores * (21 - 9) / hbm, rel=1e-9)
    assert eager.bwd_s - fused.bwd_s == pytest.approx(scores * (19 - 13) / hbm, rel=1e-9)


def test_eager_softmax_in_fp32_casts_and_doubles_the_chain(flat):
    """Megatron's torch softmax fallback with --attention-softmax-in-fp32 (and Hugging Face's eager
    attention): cast up (e + 4), scale, mask and softmax on 4-byte scores, cast down (4 + e), then
    the 16-bit dropout. Forward 4*8 + 6 + 6 + (2e + 1) = 49 bytes per score at e = 2 (21 without),
    backward (2e + 1) + 12 + 8 + 8 + 6 + 6 = 45 (19 without). In fp32 training there is no cast."""
    gpu = make_gpu()
    dims = preset_dims("gpt2-medium")
    plain = layer_times(dims, 2, 1, False, 1, "bf16", "none", gpu, flat, attention="eager")
    fp32 = layer_times(dims, 2, 1, False, 1, "bf16", "none", gpu, flat, attention="eager",
                       softmax_fp32=True)
    scores = 2 * dims.heads * dims.seq_len ** 2
    hbm = gpu.memory_bandwidth_bytes_per_s
    assert fp32.fwd_s - plain.fwd_s == pytest.approx(scores * (49 - 21) / hbm, rel=1e-9)
    assert fp32.bwd_s - plain.bwd_s == pytest.approx(scores * (45 - 19) / hbm, rel=1e-9)
    full = layer_times(dims, 2, 1, False, 1, "fp32", "none", gpu, flat, attention="eager")
    full_flag = layer_times(dims, 2, 1, False, 1, "fp32", "none", gpu, flat, attention="eager",
                            softmax_fp32=True)
    assert full_flag.fwd_s == full.fwd_s and full_flag.bwd_s == full.bwd_s


@pytest.mark.parametrize("dims, extra_per_token", [
    # GPT: bias add on the 4h MLP activation (2e * 4h) and, per residual sublayer, bias add and
    # dropout apart from the add: 4e + 1 bytes per element of h (two sublayers).
    (GPT, 2 * 2 * 4 * 1024 + 2 * (4 * 2 + 1) * 1024),
    # llama: no biases, no dropout: only SwiGLU's SiLU apart from its multiply (2e * ffn).
    (LLAMA, 2 * 2 * 2816),
])
def test_unfused_elementwise_moves_the_bytes_of_the_separate_kernels(flat, dims, extra_per_token):
    gpu = make_gpu()
    fused = layer_times(dims, 2, 1, False, 1, "bf16", "none", gpu, flat)
    unfused = layer_times(dims, 2, 1, False, 1, "bf16", "none", gpu, flat,
                          fused_elementwise=False)
    tokens = 2 * dims.seq_len
    hbm = gpu.memory_bandwidth_bytes_per_s
    extra = tokens * extra_per_token / hbm
    assert unfused.parts["elementwise_fwd"] - fused.parts["elementwise_fwd"] == pytest.approx(extra)
    assert unfused.parts["elementwise_bwd"] - fused.parts["elementwise_bwd"] == pytest.approx(2 * extra)
    assert unfused.parts["gemm_fwd"] == fused.parts["gemm_fwd"]


def test_fused_cross_entropy_reads_the_logits_once_each_way(flat):
    """The unfused loss moves 48 + 2e bytes per logit (fp32 chain, forward and backward); a fused
    kernel reads the logits in the forward (e) and reads and writes them in the backward (2e)."""
    gpu = make_gpu()
    unfused = head_times(GPT, 2, 1, False, 1, "bf16", gpu, flat)
    fused = head_times(GPT, 2, 1, False, 1, "bf16", gpu, flat, fused_loss=True)
    logits = 2 * GPT.seq_len * GPT.vocab
    hbm = gpu.memory_bandwidth_bytes_per_s
    assert unfused.fwd_s - fused.fwd_s == pytest.approx(logits * (2 + 36 - 2) / hbm, rel=1e-9)
    assert unfused.bwd_s - fused.bwd_s == pytest.approx(logits * (12 + 2 - 4) / hbm, rel=1e-9)
    assert fused.parts["gemm_fwd"] == unfused.parts["gemm_fwd"]


BERT = TransformerDims(arch="bert", layers=2, hidden=1024, heads=16, seq_len=128, vocab=30528)


def test_mlm_head_on_the_masked_positions_only(flat):
    """BERT's dense sequence output (DeepLearningExamples): the head's transform, projection and
    loss see `mlm_predictions` rows per sequence; the gather reads and writes those rows and its
    backward zero-fills the gradient of every position, then adds the rows back."""
    gpu = make_gpu(bw=1e18)                     # memory never binds: only the matmuls show
    gathered = BERT.__class__(**{**BERT.to_dict(), "mlm_predictions": 20})
    every = head_times(BERT, 4, 1, False, 1, "bf16", gpu, flat)
    masked = head_times(gathered, 4, 1, False, 1, "bf16", gpu, flat)
    assert masked.parts["gemm_fwd"] == pytest.approx(every.parts["gemm_fwd"] * 20 / 128)
    assert masked.parts["gemm_bwd_weight"] == pytest.approx(every.parts["gemm_bwd_weight"] * 20 / 128)
    gpu = make_gpu(peak=1e30)                    # now only the memory-bound kernels show
    every = head_times(BERT, 4, 1, False, 1, "bf16", gpu, flat)
    masked = head_times(gathered, 4, 1, False, 1, "bf16", gpu, flat)
    hbm, e, h = gpu.memory_bandwidth_bytes_per_s, 2, BERT.hidden
    rows, tokens = 4 * 20, 4 * 128
    scale = rows / tokens
    gather_f = 2 * e * rows * h / hbm
    gather_b = (e * tokens * h + 2 * e * rows * h) / hbm
    assert masked.parts["elementwise_fwd"] == pytest.approx(every.parts["elementwise_fwd"] * scale
                                                            + gather_f)
    assert masked.parts["elementwise_bwd"] == pytest.approx(every.parts["elementwise_bwd"] * scale
                                                            + gather_b)


def test_batched_attention_gemm_reads_every_heads_operand(flat):
    """A stored-score attention's Q K^T is one batched GEMM of micro-batch x heads matrices, each
    reading its own K: (s*hd + hd*s + s*s) elements per matrix, not one shared K."""
    gpu = make_gpu(peak=1e30)                    # memory-bound: time is bytes / bandwidth
    dims = BERT
    lt = layer_times(dims, 4, 1, False, 1, "bf16", "none", gpu, flat, attention="unfused")
    s, hd, batch, e = dims.seq_len, dims.head_dim, 4 * dims.heads, 2
    per_matrix = (s * hd + hd * s + s * s) + (s * s + s * hd + s * hd)     # Q K^T, then P V
    scores = batch * s * s
    kernels = scores * (2 * e + 2 * e + 1)                                  # softmax, dropout
    hbm = gpu.memory_bandwidth_bytes_per_s
    assert lt.parts["attention_fwd"] == pytest.approx((e * batch * per_matrix + kernels) / hbm)
