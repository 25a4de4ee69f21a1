"""Transformer Engine's fp8 casts (simulator.fp8casts): the bytes and kernels of one block counted
by hand from TE v1.9's kernels, their time in `layer_times`, the fp8 all-gathers of sequence
parallelism, and that bf16 steps are untouched."""
from __future__ import annotations

import pytest
import yaml

from partita.planner.catalog import load_catalog
from partita.planner.errors import PartitaError
from partita.planner.hardware import GPU
from partita.planner.modelspec import TransformerDims, preset_dims
from partita.planner.scenario import parse_scenario
from partita.simulator import fp8casts
from partita.simulator.calibration import load_calibration
from partita.simulator.compute import layer_times
from partita.simulator.memory import pipeline_memory
from partita.simulator.network import Group, build_topology, collective
from partita.simulator.step import simulate

FLAT = {  # every efficiency 1, no kernel floor: an elementwise kernel takes bytes / bandwidth
    "default": {"matmul_shape_by_ideal_us": [[1e-3, 1.0], [1e6, 1.0]],
                "matmul_plateau_efficiency": 1.0,
                "memory_efficiency_by_mb": [[1e-3, 1.0], [1e6, 1.0]],
                "attention_forward_efficiency": 1.0, "attention_backward_efficiency": 1.0,
                "kernel_floor_us": 0.0},
}
GPT = TransformerDims(arch="gpt", layers=4, hidden=1024, heads=16, seq_len=512, vocab=32000)
LLAMA = TransformerDims(arch="llama", layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816,
                        seq_len=512, vocab=32000)
BW = 1e12
GPU8 = GPU("test-gpu", "test-gpu", 80 * 2**30, BW,
           {"bf16": 100e12, "fp16": 100e12, "fp8": 200e12, "fp32": 12.5e12})


@pytest.fixture
def flat(tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(FLAT))
    return load_calibration(path, include_local=False)


def test_gpt_block_without_sequence_parallelism_by_hand():
    m, h, f = 2 * 512, 1024, 4 * 1024            # tokens of micro-batch 2; GPT's MLP is 4h
    c = fp8casts.block_casts(GPT, 2)
    # forward: only the attention output projection casts (cast + transpose, 2 + 1 + 1 bytes);
    # the norms before QKV and the MLP, and the GELU, write fp8 (1 byte) instead of bf16 (2)
    assert c.forward_kernel_bytes == (4 * m * h,)
    assert c.forward_saved_bytes == m * h + m * h + m * f
    # backward, in block order: QKV's input transpose and output-gradient cast-transpose; the
    # projection's gradient; the MLP up's input transpose (its gradient cast is fused into the
    # GELU's backward); the MLP down's input transpose and gradient
    assert c.backward_kernel_bytes == (2 * m * h, 4 * m * 3 * h, 4 * m * h, 2 * m * h,
                                       2 * m * f, 4 * m * h)
    assert (c.forward_kernels, c.backward_kernels) == (1, 6)


def test_llama_block_with_sequence_parallelism_by_hand():
    tp, m, h, f = 2, 512, 1024, 2816 // 2
    qkv = (16 // tp + 2 * 4 // tp) * 64          # q, k and v heads of this rank, head dim 64
    c = fp8casts.block_casts(LLAMA, 1, tp=tp, sp=True)
    # forward: the projection's input (full tokens, this rank's hidden slice) is cast without
    # its transpose; the norms write fp8 on their own m / tp rows, SwiGLU on all m
    assert c.forward_kernel_bytes == (3 * m * h // tp,)
    assert c.forward_saved_bytes == m // tp * h + m // tp * h + m * f
    # backward: a row-parallel layer's gradient is cast on its m / tp rows, gathered, then
    # transposed; SwiGLU's gradient (2f wide) is cast and transposed after dswiglu
    assert c.backward_kernel_bytes == (
        2 * m * h, 4 * m * qkv,                       # QKV
        2 * m * h // tp, 3 * m // tp * h, 2 * m * h,  # projection: input transpose, gradient
        2 * m * h, 4 * m * 2 * f,                     # MLP up (gate and up)
        2 * m * f, 3 * m // tp * h, 2 * m * h)        # MLP down
    assert (c.forward_kernels, c.backward_kernels) == (1, 10)


def test_current_scaling_gpt_block_by_hand():
    m, h, f = 2 * 512, 1024, 4 * 1024
    A, S = fp8casts.AMAX, fp8casts.SCALE               # amax read (2 bytes) and the scale kernel
    c = fp8casts.block_casts(GPT, 2, recipe="current")
    # forward: every input cast waits for its amax and scale; the norms and the GELU write bf16
    # and are cast after them (no bytes saved)
    assert c.forward_kernel_bytes == (A * m * h, S, 3 * m * h,          # QKV's normed input
                                      A * m * h, S, 4 * m * h,          # projection: cast-transpose
                                      A * m * h, S, 3 * m * h,          # MLP up's normed input
                                      A * m * f, S, 3 * m * f)          # the GELU's output
    assert c.forward_saved_bytes == 0
    # backward: the delayed recipe's kernels with an amax and a scale before every gradient cast,
    # and the GELU's backward no longer fused with the MLP up's gradient cast
    assert c.backward_kernel_bytes == (2 * m * h, A * m * 3 * h, S, 4 * m * 3 * h,
                                       A * m * h, S, 4 * m * h,
                                       2 * m * h, A * m * f, S, 4 * m * f,
                                       2 * m * f, A * m * h, S, 4 * m * h)
    assert (c.forward_tp_amax_reductions, c.backward_tp_amax_reductions) == (0, 0)


def test_current_scaling_reduces_amaxes_of_sequence_parallel_gathers_only():
    c = fp8casts.block_casts(LLAMA, 1, tp=2, sp=True, recipe="current")
    # forward: QKV's and MLP up's normed inputs are gathered; backward: the projection's and MLP
    # down's output gradients
    assert (c.forward_tp_amax_reductions, c.backward_tp_amax_reductions) == (2, 2)
    assert fp8casts.block_casts(LLAMA, 1, tp=2, sp=False, recipe="current"
                                ).forward_tp_amax_reductions == 0
    assert fp8casts.block_casts(LLAMA, 1, tp=2, sp=True).forward_tp_amax_reductions == 0
    with pytest.raises(PartitaError, match="training.fp8_recipe: expected one of delayed, "
                                           "current, mxfp8, got 'mx'"):
        fp8casts.block_casts(LLAMA, 1, recipe="mx")


def test_current_scaling_costs_the_amax_passes_and_tp_reductions():
    delayed, current = _step("fp8", True), _step("fp8", True, recipe="current")
    assert current.breakdown_s["compute"] > delayed.breakdown_s["compute"]
    # llama2-7b: 32 blocks at TP 8, 16 micro-batches; 2 + 2 amax all-reduces of 4 bytes per block
    topo = build_topology(load_catalog().system("dgx-h100"), load_calibration())
    amax = collective("allreduce", "auto", 4.0, Group(8, 8), topo)
    assert current.breakdown_s["tp_comm"] - delayed.breakdown_s["tp_comm"] == pytest.approx(
        16 * 32 * 4 * amax)
    assert "fp8_amax" not in current.breakdown_s        # no per-pass reduction of delayed scaling


def test_t5_decoder_casts_its_cross_attention_too():
    t5 = TransformerDims(arch="t5", layers=2, hidden=512, heads=8, seq_len=256, vocab=32128)
    enc = fp8casts.block_casts(t5, 1)
    dec = fp8casts.block_casts(t5, 1, decoder=True)
    assert enc.forward_kernels == 1                   # the self-attention output projection
    assert dec.forward_kernels == 3                   # + the cross-attention kv and output
    assert dec.backward_kernels > enc.backward_kernels


def test_layer_times_adds_the_casts_to_fp8_elementwise_work_only(flat):
    for dims, tp, sp in ((GPT, 1, False), (LLAMA, 2, True)):
        c = fp8casts.block_casts(dims, 2, tp=tp, sp=sp)
        fp8 = layer_times(dims, 2, tp, sp, 1, "fp8", "none", GPU8, flat).parts
        bf16 = layer_times(dims, 2, tp, sp, 1, "bf16", "none", GPU8, flat).parts
        # same element bytes for the bf16 activations; the difference is the casts, at BW
        fwd = (sum(c.forward_kernel_bytes) - c.forward_saved_bytes) / BW
        bwd = sum(c.backward_kernel_bytes) / BW
        assert fp8["elementwise_fwd"] - bf16["elementwise_fwd"] == pytest.approx(fwd)
        assert fp8["elementwise_bwd"] - bf16["elementwise_bwd"] == pytest.approx(bwd)
        assert bwd > 0 and fwd + bwd > 0           # the forward can save: the norms write fp8
        # fp8 GEMMs run at twice the peak
        assert fp8["gemm_fwd"] == pytest.approx(bf16["gemm_fwd"] / 2)


def test_full_recompute_runs_the_forward_casts_again(flat):
    lt = layer_times(GPT, 2, 1, False, 1, "fp8", "full", GPU8, flat)
    assert lt.recompute_s == pytest.approx(lt.fwd_s)


def test_scaled_exchange_moves_half_the_all_gather_bytes():
    ag = lambda n: 1e-5 + n / 1e11                       # noqa: E731  latency + bytes / bandwidth
    rs = lambda n: 2e-5 + n / 1e11                       # noqa: E731
    n = 1e8
    assert fp8casts.scaled_exchange(n, ag, rs) == pytest.approx(
        (ag(n / 2) + rs(n)) / (ag(n) + rs(n)))
    assert 0.75 < fp8casts.scaled_exchange(n, ag, rs) < 1.0   # latency does not halve
    assert fp8casts.scaled_exchange(0.0, lambda n: 0.0, lambda n: 0.0) == 1.0


def _step(precision: str, sp: bool, recipe: str | None = None):
    training = {"global_batch": 16, "micro_batch": 1, "precision": precision}
    if recipe:
        training["fp8_recipe"] = recipe
    doc = {"name": "llama-tp", "model": {"preset": "llama2-7b"},
           "cluster": {"system": "dgx-h100", "gpus": 8},
           "training": training,
           "parallel": {"tensor": 8, "pipeline": 1, "data": 1, "sequence_parallel": sp}}
    return simulate(parse_scenario(doc), load_catalog())


def test_sequence_parallel_fp8_all_gathers_cut_tp_comm():
    bf16_sp, fp8_sp = _step("bf16", True), _step("fp8", True)
    bf16, fp8 = _step("bf16", False), _step("fp8", False)
    assert fp8_sp.breakdown_s["tp_comm"] < 0.95 * bf16_sp.breakdown_s["tp_comm"]
    # without sequence parallelism TE all-reduces bf16 outputs: the same bytes as bf16 training
    assert fp8.breakdown_s["tp_comm"] == pytest.approx(bf16.breakdown_s["tp_comm"])
    # the casts are device work: fp8's elementwise share of compute is larger than bf16's
    assert fp8.step_time_s < bf16.step_time_s


def test_casts_cost_the_host_their_launches_alone():
    from partita.simulator.host import HostCosts
    host = HostCosts(op_dispatch_s=50e-6, launch_s=3e-6, launch_blocking_wait_s=7e-6)
    # launched from inside an op already dispatched: the launch, not another op's dispatch
    assert host.exposed(0.0, 0, False, launched=10) == pytest.approx(10 * 3e-6)
    assert host.exposed(0.0, 2, False, launched=10) == pytest.approx(2 * 53e-6 + 10 * 3e-6)
    assert host.exposed(1.0, 2, False, launched=10) == 0.0          # hidden behind the device
    # CUDA_LAUNCH_BLOCKING: each launch also waits for its kernel
    assert host.exposed(1.0, 0, True, launched=10) == pytest.approx(10 * (3e-6 + 7e-6))


def test_cached_fp8_weights_by_hand():
    h = 1024
    # GPT: QKV h x 3h, projection h x h, MLP 4h x h twice = 12 h^2 weights a block; 1 + 1 bytes
    assert fp8casts.weight_cache_bytes(GPT, 1, 4) == 2 * 4 * 12 * h * h
    assert fp8casts.weight_cache_bytes(GPT, 2, 4) == 2 * 4 * 12 * h * h / 2
    # Llama with 4 KV heads of 64: QKV h x (16 + 8) x 64, projection h x h, MLP 3 x h x 2816
    llama = h * 24 * 64 + h * h + 3 * h * 2816
    assert fp8casts.weight_cache_bytes(LLAMA, 1, 3) == 2 * 3 * llama


def test_fp8_memory_holds_the_cached_weights():
    d = preset_dims("llama2-7b")
    doc = {"name": "m", "model": {"preset": "llama2-7b"},
           "cluster": {"system": "dgx-h100", "gpus": 8},
           "training": {"global_batch": 16, "micro_batch": 1, "precision": "fp8"},
           "parallel": {"tensor": 4, "pipeline": 2, "data": 1}}
    cal = load_calibration()
    s = parse_scenario(doc)
    fp8 = pipeline_memory(d, s.training, s.parallel, cal)
    assert [m.details["fp8_weight_cache"] for m in fp8] == [
        pytest.approx(fp8casts.weight_cache_bytes(d, 4, 16))] * 2     # 16 blocks a stage at TP 4
    bf16 = parse_scenario(doc | {"training": {**doc["training"], "precision": "bf16"}})
    assert all("fp8_weight_cache" not in m.details
               for m in pipeline_memory(d, bf16.training, bf16.parallel, cal))
    # under ZeRO-3 the copies are sharded as the weights are
    z3 = parse_scenario(doc | {"parallel": {"tensor": 2, "pipeline": 1, "data": 4, "zero": 3}})
    (m,) = pipeline_memory(d, z3.training, z3.parallel, cal)
    assert m.details["fp8_weight_cache"] == pytest.approx(fp8casts.weight_cache_bytes(d, 2, 32) / 4)


# ---- MXFP8 (training.fp8_recipe: mxfp8, TE v2.8's MXFP8BlockScaling) ----

MX = 2 + 2 + 2 / 32            # read bf16, write row- and column-wise fp8 with an E8M0 scale per 32


def test_mxfp8_gpt_block_without_sequence_parallelism_by_hand():
    m, h, f = 2 * 512, 1024, 4 * 1024
    c = fp8casts.block_casts(GPT, 2, recipe="mxfp8")
    # forward: the norms write bf16 and are quantized after (QKV's and MLP up's inputs), the
    # projection's input is quantized; the GELU writes MXFP8 itself, 2 + 2/32 bytes for bf16's 2
    assert c.forward_kernel_bytes == (MX * m * h, MX * m * h, MX * m * h)
    assert c.forward_saved_bytes == pytest.approx(-(2 / 32) * m * f)
    # backward: only the output gradients (QKV's, the projection's, MLP down's; MLP up's is fused
    # into the GELU's backward): both directions are written, so nothing is transposed
    assert c.backward_kernel_bytes == (MX * m * 3 * h, MX * m * h, MX * m * h)
    assert (c.forward_tp_amax_reductions, c.backward_tp_amax_reductions) == (0, 0)


def test_mxfp8_llama_block_with_sequence_parallelism_by_hand():
    tp, m, h, f = 2, 512, 1024, 2816 // 2
    qkv = (16 // tp + 2 * 4 // tp) * 64
    c = fp8casts.block_casts(LLAMA, 1, tp=tp, sp=True, recipe="mxfp8")
    # forward: the norm outputs are quantized on the rank's own rows before the gather; the
    # projection's input (every row, heads split) is quantized whole; SwiGLU writes MXFP8
    assert c.forward_kernel_bytes == (MX * m / tp * h, MX * m * (h // tp), MX * m / tp * h)
    # backward: QKV's gradient on every row; the row-parallel gradients on the rank's rows before
    # their gather; MLP up's (gate and up) gradient after the bf16 dswiglu
    assert c.backward_kernel_bytes == (MX * m * qkv, MX * m / tp * h, MX * m * 2 * f,
                                       MX * m / tp * h)


def test_mxfp8_gathers_scales_forward_and_both_directions_backward():
    assert fp8casts.gathered_bytes("delayed") == fp8casts.gathered_bytes("current",
                                                                         backward=True) == 1
    assert fp8casts.gathered_bytes("mxfp8") == 1 + 1 / 32
    assert fp8casts.gathered_bytes("mxfp8", backward=True) == 2 + 2 / 32
    ag = lambda n: n / 1e11                              # noqa: E731
    n = 1e8
    # backward, MXFP8's all-gather moves more than bf16's, its reduce-scatter as much
    assert fp8casts.scaled_exchange(n, ag, ag, fp8casts.gathered_bytes("mxfp8", backward=True)
                                    ) == pytest.approx((2 + 2 / 32) / 2 / 2 + 0.5)


def test_mxfp8_weight_copies_carry_their_scales():
    h = 1024
    assert fp8casts.weight_cache_bytes(GPT, 1, 4, recipe="mxfp8") == pytest.approx(
        2 * (1 + 1 / 32) * 4 * 12 * h * h)


def _b200_step(recipe: str):
    doc = {"name": "llama-tp-b200", "model": {"preset": "llama2-7b"},
           "cluster": {"system": "p6-b200.48xlarge", "gpus": 8},
           "training": {"global_batch": 16, "micro_batch": 1, "precision": "fp8",
                        "fp8_recipe": recipe},
           "parallel": {"tensor": 8, "pipeline": 1, "data": 1, "sequence_parallel": True}}
    return simulate(parse_scenario(doc), load_catalog())


def test_mxfp8_step_on_blackwell_has_no_amax_reductions_and_gathers_more():
    delayed, mx = _b200_step("delayed"), _b200_step("mxfp8")
    assert delayed.breakdown_s["fp8_amax"] > 0 and "fp8_amax" not in mx.breakdown_s
    # the backward gathers both directions: more TP bytes than delayed scaling's fp8 gathers
    assert mx.breakdown_s["tp_comm"] > delayed.breakdown_s["tp_comm"]
    assert mx.peak_memory_bytes > delayed.peak_memory_bytes      # the weights' scales


def test_mxfp8_needs_a_blackwell_gpu():
    doc = {"name": "h100-mx", "model": {"preset": "llama2-7b"},
           "cluster": {"system": "dgx-h100", "gpus": 8},
           "training": {"global_batch": 16, "micro_batch": 1, "precision": "fp8",
                        "fp8_recipe": "mxfp8"},
           "parallel": {"tensor": 8, "pipeline": 1, "data": 1}}
    with pytest.raises(PartitaError, match="^training.fp8_recipe: mxfp8 needs a GPU whose tensor "
                                           "cores run block-scaled fp8 .* h100-80gb is of arch "
                                           "'hopper'"):
        simulate(parse_scenario(doc), load_catalog())


def test_mxfp8_on_a_users_catalog_gpu_follows_its_arch(tmp_path):
    """A GPU added by --catalog runs MXFP8 when its entry says `arch: blackwell`; without an arch
    the error names the key that would say so."""
    def catalog(arch: str | None):
        gpu = {"name": "my-b300", "family": "b200", "memory_gib": 270, "mem_bw_GBps": 8000,
               "peak_dense_tflops": {"bf16": 2250, "fp8": 4500}, "nvlink_unidir_GBps": 900,
               "source": ["test"]} | ({"arch": arch} if arch else {})
        node = {"name": "my-node", "kind": "onprem", "gpu": "my-b300", "gpus_per_node": 8,
                "intra_node": {"kind": "nvswitch", "unidir_GBps": 900, "latency_us": 3},
                "inter_node": {"kind": "none"}, "vcpus": 224, "host_memory_gib": 4096,
                "price": {"on_demand_usd_per_hour": None, "sagemaker_usd_per_hour": None,
                          "spot_usd_per_hour": None, "date": "2026-12-01", "sagemaker_date": None,
                          "region": None, "source": ["none"]},
                "source": ["test"]}
        path = tmp_path / f"cat-{arch}.yaml"
        path.write_text(yaml.safe_dump({"gpus": [gpu], "systems": [node]}))
        return load_catalog(path)
    doc = {"name": "mx", "model": {"preset": "llama2-7b"}, "cluster": {"system": "my-node", "gpus": 8},
           "training": {"global_batch": 16, "micro_batch": 1, "precision": "fp8",
                        "fp8_recipe": "mxfp8"},
           "parallel": {"tensor": 8, "pipeline": 1, "data": 1}}
    assert simulate(parse_scenario(doc), catalog("blackwell")).step_time_s > 0
    with pytest.raises(PartitaError, match="my-b300 is without an arch in the catalog \\(its "
                                           "entry's `arch: blackwell` says it is one\\)"):
        simulate(parse_scenario(doc), catalog(None))
