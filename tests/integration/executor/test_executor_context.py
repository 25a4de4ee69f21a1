"""Context parallelism trains as one process does (fp32, CPU, gloo).

Each case runs `partita run` with context 2 (executor/context.py: all-gather keys and values,
load-balanced positions) for 5 steps and holds its losses and final weights to `reference_run` at
1e-6 relative, with the 1e-9 absolute floor of tests/integration/executor/test_executor_numerics.py for GPT's
k-projection bias, whose gradient is mathematically zero. Only summation order differs: each rank's
loss is the mean over its half of every sequence, and gradients average over data x context.

The pieces are pinned by tests/unit/executor/test_context.py.
"""
from __future__ import annotations

import pytest

from executor_runs import assert_weights_close, run_shipped_and_reference

STEPS = 5
RTOL = 1e-6
ATOL = 1e-9

CASES = {
    # GPT: learned positions, tied embedding, causal mask by position; 2 processes
    "gpt-cp2": ("tiny-gpt-interleaved.yaml",
                {"cluster": {"gpus": 2}, "parallel": {"pipeline": 1, "virtual_stages": 1,
                 "context": 2, "schedule": "1f1b", "zero": 0}, "training": {"optimizer": "sgd"}}),
    # Llama: rotary positions of the rank's chunks, grouped-query k/v gathered, the shards cross
    # a stage boundary; ZeRO-1 (FSDP2) over the data x context group; 2 stages x context 2
    "llama-cp2-pp2": ("tiny-llama-pp2-dp2.yaml",
                      {"parallel": {"data": 1, "context": 2, "zero": 1, "schedule": "gpipe"},
                       "training": {"optimizer": "sgd"}}),
    # Llama: tensor 2 with sequence parallelism inside each context rank's half; 4 processes
    "llama-cp2-tp2-sp": ("tiny-llama-pp2-dp2.yaml",
                         {"parallel": {"pipeline": 1, "data": 1, "context": 2, "tensor": 2,
                          "sequence_parallel": True, "zero": 0, "schedule": "1f1b"},
                          "training": {"optimizer": "sgd"}}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_context_parallel_run_equals_one_process(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))
    base, changes = CASES[case]
    result, got, want_losses, want = run_shipped_and_reference(base, changes, tmp_path, capsys,
                                                               steps=STEPS)
    assert result["plan"]["context"] == 2
    print(case, [abs(a - b) / b for a, b in zip(result["losses"], want_losses)])
    assert result["losses"] == pytest.approx(want_losses, rel=RTOL, abs=0)
    assert_weights_close(got, want, rtol=RTOL, atol=ATOL)
