"""Unpadding around a variable-length flash kernel (`training.attention_unpad`): the op stream of
flash-attn's bert_padding.unpad_input, its bytes, the host's waits for the GPU, the memory and the
scenario key."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from partita.planner.activations import block_activation_bytes
from partita.planner.catalog import load_catalog
from partita.planner.hardware import GPU
from partita.planner.modelspec import TransformerDims
from partita.planner.scenario import parse_scenario
from partita.simulator import unpad
from partita.simulator.calibration import load_calibration
from partita.simulator.compute import layer_times, unpad_gather_times, unpad_times
from partita.simulator.host import HostCosts
from partita.simulator.step import simulate

H100 = GPU("h100-80gb", "H100", 80 * 2**30, 3.35e12,
           {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12})


@pytest.fixture(scope="module")
def shipped():
    return load_calibration(include_local=False)


# aten ops that only make views or metadata (no kernel, no copy)
VIEWS = {"view", "_reshape_alias", "reshape", "expand", "unsqueeze", "squeeze", "slice", "select",
         "detach", "alias", "t", "transpose", "as_strided", "lift_fresh", "_unsafe_view"}


def test_the_op_list_is_the_aten_stream_of_unpad_input(aten_ops):
    """`unpad.UNPAD_CALL` lists what flash-attn's unpad_input (as benchmarks/bench_host_dispatch.py
    writes it, op for op) runs: a reduction, nonzero, max, the scalar read, cumsum, pad, gather."""
    from benchmarks.bench_host_dispatch import unpad_input
    x = torch.randn(2, 8, 4, requires_grad=True)
    mask = torch.ones(2, 8, dtype=torch.bool)
    ops = [o for o in aten_ops(lambda: unpad_input(x, mask)) if o not in VIEWS]
    names = {"sum": "sum", "nonzero": "nonzero", "max": "max", "_local_scalar_dense": "item",
             "cumsum": "cumsum", "constant_pad_nd": "pad", "gather": "gather"}
    assert [names.get(o, o) for o in ops] == [op.name for op in unpad.UNPAD_CALL]
    assert [op.waits for op in unpad.UNPAD_CALL] == [False, True, False, True, False, False, False]


def test_six_waits_split_a_block_forward_into_windows_that_end_at_the_flash_kernel():
    windows = unpad.sync_windows((1e-4, 2e-4, 3e-4), 1e-6, "per-tensor")
    assert [ops for ops, _ in windows] == [2, 5, 2, 5, 2, 4]
    # q's gather runs after q's .item(), k's after k's, v's in the last window before the kernel
    assert [dev for _, dev in windows] == pytest.approx(
        [1e-6, 1e-4 + 4e-6, 1e-6, 2e-4 + 4e-6, 1e-6, 3e-4 + 2e-6])
    for form in unpad.FORMS:
        windows = unpad.sync_windows((1e-4, 2e-4, 3e-4), 1e-6, form)
        assert sum(ops for ops, _ in windows) + unpad.ahead_ops(form) - 1 == (
            len(unpad.forward_ops(form)) + unpad.PAD_FORWARD_KERNELS)
    assert unpad.forward_kernels("per-tensor") == 3 * 6 + 2
    assert unpad.small_forward_kernels("per-tensor") == 15


def test_hugging_faces_form_takes_the_indices_once_and_waits_twice():
    """transformers' _upad_input: _get_unpad_data once per layer, then q, k and v gathered."""
    windows = unpad.sync_windows((1e-4, 2e-4, 3e-4), 1e-6, "per-layer")
    assert [ops for ops, _ in windows] == [2, 6]            # max, .item(); cumsum, pad, 3 gathers,
    assert [dev for _, dev in windows] == pytest.approx([1e-6, 6e-4 + 2e-6])   # the flash kernel
    assert unpad.forward_kernels("per-layer") == 5 + 3 + 2
    assert unpad.small_forward_kernels("per-layer") == 5


def test_bytes_count_q_k_v_and_the_output_with_grouped_kv_heads():
    d = TransformerDims(arch="llama", layers=2, hidden=4096, heads=32, kv_heads=8,
                        ffn_hidden=11008, seq_len=2048, vocab=32000)
    b = unpad.unpad_bytes(d, 2, tp=2, cp=1, element_bytes=2)
    tokens = 2 * 2048
    q, kv = tokens * 16 * 128, tokens * 4 * 128
    assert b.gathers == (4 * q, 4 * kv, 4 * kv)
    assert b.pad_forward == (2 * q, 4 * q)
    assert b.backward == (4 * q, 2 * q, 4 * q, 2 * kv, 4 * kv, 2 * kv, 4 * kv)


def test_unpadding_adds_memory_traffic_to_the_block_and_nothing_else(shipped):
    d = TransformerDims(arch="gpt", layers=2, hidden=2048, heads=16, seq_len=2048, vocab=50368,
                        dropout=False)
    plain = layer_times(d, 4, 1, False, 1, "bf16", "full", H100, shipped, attention="flash2")
    padded = layer_times(d, 4, 1, False, 1, "bf16", "full", H100, shipped, attention="flash2",
                         attention_unpad="per-tensor")
    f, b = unpad_times(d, 4, 1, 1, "bf16", H100, shipped.gpu(H100.name), "per-tensor")
    assert padded.fwd_s == pytest.approx(plain.fwd_s + f) and padded.bwd_s == pytest.approx(
        plain.bwd_s + b)
    assert padded.recompute_s == pytest.approx(plain.recompute_s + f)      # the forward again
    for key in ("gemm_fwd", "attention_fwd", "attention_bwd", "gemm_bwd_weight"):
        assert padded.parts[key] == plain.parts[key]
    # about 18 bytes per token and hidden unit forward (q, k, v gathered; the output padded)
    elements = 4 * 2048 * 2048
    assert sum(unpad_gather_times(d, 4, 1, 1, "bf16", H100, shipped.gpu(H100.name))) < f
    assert 18 * elements / 3.35e12 < f < 2 * 18 * elements / 3.35e12


def test_the_host_stall_is_the_windows_host_time_beyond_their_device_work():
    host = HostCosts(op_dispatch_s=60e-6, launch_s=2e-6, launch_blocking_wait_s=7e-6,
                     unpad_op_dispatch_fraction=0.5)
    assert host.unpad_op_s == pytest.approx(32e-6)
    windows = ((2, 1e-6), (5, 1e-3))                 # the second one's gather outlasts the host
    assert host.sync_stall(windows, blocking=False) == pytest.approx(7e-6 + 64e-6 - 1e-6 + 7e-6)
    assert host.sync_stall(windows, blocking=True) == 0.0
    assert dataclasses.replace(host, synchronous=True).sync_stall(windows, False) == 0.0


def _doc(**training) -> dict:
    return {"name": "unpad",
            "model": {"arch": "gpt", "layers": 24, "hidden": 2048, "heads": 16, "seq_len": 2048,
                      "vocab": 50368, "dropout": False},
            "cluster": {"system": "dgx-h100", "gpus": 8},
            "training": {"global_batch": 96, "micro_batch": 12, "framework": "fsdp",
                         "attention": "flash2", **training},
            "parallel": {"tensor": 1, "pipeline": 1, "data": 8, "zero": 3}}


def test_a_step_with_unpadding_pays_its_traffic_and_its_waits():
    cat = load_catalog()
    plain = simulate(parse_scenario(_doc()), cat)
    padded = simulate(parse_scenario(_doc(attention_unpad="per-tensor")), cat)
    shared = simulate(parse_scenario(_doc(attention_unpad="per-layer")), cat)
    blocking = simulate(parse_scenario(_doc(attention_unpad="per-tensor", launch_blocking=True)),
                        cat)
    assert plain.step_time_s < shared.step_time_s < padded.step_time_s
    assert padded.step_time_s > plain.step_time_s
    assert padded.breakdown_s["host"] > plain.breakdown_s.get("host", 0.0)
    assert padded.breakdown_s["compute"] > plain.breakdown_s["compute"]
    # 1b-class GPT at 24k tokens per micro-batch: a few percent, not a constant
    assert 0.02 < padded.step_time_s / plain.step_time_s - 1 < 0.15
    assert blocking.step_time_s > padded.step_time_s
    recomputed = simulate(parse_scenario(_doc(attention_unpad="per-tensor", recompute="full")),
                          cat)
    plain_full = simulate(parse_scenario(_doc(recompute="full")), cat)
    assert (recomputed.breakdown_s["host"] - plain_full.breakdown_s.get("host", 0.0)
            > padded.breakdown_s["host"] - plain.breakdown_s.get("host", 0.0))


def test_memory_keeps_one_more_attention_output_per_block():
    d = TransformerDims(arch="gpt", layers=2, hidden=2048, heads=16, seq_len=2048, vocab=50368,
                        dropout=False)
    base = block_activation_bytes(d, 4, tp=2)
    assert block_activation_bytes(d, 4, tp=2, attention_unpad=True) - base == 2 * 4 * 2048 * 1024
    cat = load_catalog()
    a = simulate(parse_scenario(_doc()), cat).peak_memory_gib
    b = simulate(parse_scenario(_doc(attention_unpad="per-layer")), cat).peak_memory_gib
    assert b > a


def test_scenario_key_round_trips_and_bad_uses_are_one_error_line(simulate_error,
                                                                  training_key_round_trip):
    for form in ("per-tensor", "per-layer"):
        assert training_key_round_trip(_doc(attention_unpad=form), "attention_unpad") == (
            form, form, True)
    assert training_key_round_trip(_doc(), "attention_unpad") == ("none", "none", False)
    eager = _doc(attention_unpad="per-tensor")
    eager["training"]["attention"] = "eager"
    for doc, words in ((_doc(attention_unpad=True), "none, per-tensor, per-layer"),
                       (eager, "only with attention flash, flash2 or flash1")):
        err = simulate_error(doc)
        assert "training.attention_unpad" in err and words in err


def test_the_llm_foundry_flash2_rows_map_with_unpadding(dev_scenarios):
    assert dev_scenarios["MPT-17"].training.attention_unpad == "per-tensor"
    assert dev_scenarios["MPT-23"].training.attention_unpad == "none"         # triton's kernel
