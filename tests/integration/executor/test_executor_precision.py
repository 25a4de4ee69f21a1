"""fp16 (autocast + dynamic loss scaling) and bf16 (autocast) runs train as one process does with
the same precision (CPU, gloo).

A 2-stage pipeline of the tiny Llama (2 gloo processes, 1F1B, 4 micro-batches, Adam) trains 5
steps; its losses and final weights are compared with `reference_run` at the same precision. Each
micro-batch's forward and backward run the same autocast kernels on the same shapes in both, the
loss scale is a power of two (scaling and unscaling are exact) and without data or tensor
parallelism the fp32 gradients are added in the same order: measured on torch 2.13 CPU, losses and
weights are bit-identical (0 relative difference). Tolerance: 1e-6 relative, as in fp32 -- not the
fp16 / bf16 unit roundoff (4.9e-4 / 3.9e-3), which would hide a wrong scale or a missed unscale.
That autocast ran is checked too: the weights differ from an fp32 run's by over 100x the tolerance
(measured: 4.4e-3 relative for fp16, 6.5e-3 for bf16, largest tensor).

With tensor and sequence parallelism the reduced-precision arithmetic itself differs (partial
GEMMs rounded before they are added); that case has its own, stated tolerances (TP_RTOL below).
"""
from __future__ import annotations

import pytest
import torch
import yaml

from partita.executor.precision import INIT_SCALE, LossScaler
from partita.executor.train import reference_run
from partita.planner.paths import SCENARIOS_DIR
from partita.planner.scenario import load_scenario

from executor_runs import assert_weights_close, run_and_reference

STEPS = 5
RTOL = {"fp16": 1e-6, "bf16": 1e-6}
ATOL = 1e-9


def test_loss_scaler_skips_and_backs_off_on_overflow_and_grows_after_clean_steps(monkeypatch):
    scaler = LossScaler("fp16")
    grads = [torch.tensor([INIT_SCALE, 2 * INIT_SCALE])]
    assert not scaler.unscale(grads, torch.device("cpu")) and grads[0].tolist() == [1.0, 2.0]
    assert scaler.scaled(lambda o, t: o - t)(torch.tensor(3.0), torch.tensor(1.0)) == 2 * INIT_SCALE
    assert scaler.unscale([torch.tensor([1.0, float("inf")])], torch.device("cpu"))
    scaler.update(True)
    assert scaler.scale == INIT_SCALE / 2 and scaler.skipped == 1
    monkeypatch.setattr("partita.executor.precision.GROWTH_INTERVAL", 3)
    for _ in range(3):
        scaler.update(False)
    assert scaler.scale == INIT_SCALE
    bf16 = LossScaler("bf16")
    assert not bf16.enabled and bf16.scale == 1.0 and not bf16.unscale(grads, torch.device("cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_pipeline_equals_one_process(precision, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))
    doc = yaml.safe_load((SCENARIOS_DIR / "tiny-llama-pp2-dp2.yaml").read_text())
    doc["cluster"]["gpus"] = 2
    doc["parallel"].update(data=1, zero=0)
    doc["training"].update(precision=precision, global_batch=8)
    result, got, want_losses, want = run_and_reference(doc, tmp_path, capsys, steps=STEPS)
    assert result["plan"]["precision"] == precision
    doc["training"]["precision"] = "fp32"
    (tmp_path / "fp32.yaml").write_text(yaml.safe_dump(doc))
    _, fp32 = reference_run(load_scenario(tmp_path / "fp32.yaml"), steps=STEPS)
    # autocast really ran: the weights leave fp32's by far more than the tolerance
    away = max(((fp32[n] - w).norm() / w.norm()).item() for n, w in want.items())
    print(precision, "max relative weight difference from fp32", away)
    assert away > 100 * RTOL[precision]
    if precision == "fp16":
        assert result["loss_scale"] == {"scale": 2.0 ** 16, "clean_steps": STEPS, "skipped": 0}
    assert result["losses"] == pytest.approx(want_losses, rel=RTOL[precision], abs=0)
    assert_weights_close(got, want, rtol=RTOL[precision], atol=ATOL)


# With tensor (and sequence) parallelism the reduced-precision arithmetic itself changes: a
# row-parallel projection's output is two partial GEMMs, each rounded to fp16 / bf16, added after
# the all-reduce (reduce-scatter), where one process rounds one fp32-accumulated GEMM once. Each
# such output element can differ by one unit in the last place (2^-11 fp16, 2^-8 bf16), so the
# runs are compared at tolerances derived from that, measured on torch 2.13 CPU (GPT tp 2 with
# sequence parallelism, SGD, 5 steps):
# - loss per step: fp16 8.8e-7 relative, bf16 1.8e-5 -> tolerance 1e-5 / 1e-4;
# - weights (|diff| / |w| per tensor): worst are the zero-initialised q-projection biases, whose
#   norm after 5 steps is only their accumulated update, fp16 9.0e-4, bf16 8.9e-3 -> 5e-3 / 3e-2;
#   the k-projection bias (mathematically zero gradient, norm ~3e-9) is covered by the absolute
#   floor 1e-8.
TP_RTOL = {"fp16": (1e-5, 5e-3), "bf16": (1e-4, 3e-2)}
TP_ATOL = 1e-8


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_tensor_sequence_parallel_within_rounding(precision, tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))
    doc = yaml.safe_load((SCENARIOS_DIR / "tiny-gpt-pp2.yaml").read_text())
    doc["parallel"].update(pipeline=1, tensor=2, sequence_parallel=True)
    doc["training"].update(precision=precision, optimizer="sgd")
    result, got, want_losses, want = run_and_reference(doc, tmp_path, capsys, steps=STEPS)
    loss_rtol, weight_rtol = TP_RTOL[precision]
    assert result["losses"] == pytest.approx(want_losses, rel=loss_rtol, abs=0)
    assert_weights_close(got, want, rtol=weight_rtol, atol=TP_ATOL)
