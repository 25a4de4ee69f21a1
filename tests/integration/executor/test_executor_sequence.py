"""Sequence parallelism with tensor parallelism trains as one process does (fp32, CPU, gloo).

Each case runs `partita run` with tensor 2 and sequence_parallel for 5 steps and holds its losses
and final weights to `reference_run` at 1e-6 relative (the L2 norm of each weight tensor's
difference against the tensor's norm, with the 1e-9 absolute floor of
test_executor_numerics.py for GPT's k-projection bias, whose gradient is mathematically
zero). As with tensor parallelism alone, only summation order differs: the reduce-scatter adds
the same partial sums as the all-reduce did, and each norm's weight gradient is the sum of the
ranks' sequence shards.
"""
from __future__ import annotations

import pytest


from executor_runs import assert_weights_close, run_shipped_and_reference

pytestmark = pytest.mark.slow

STEPS = 5
RTOL = 1e-6
ATOL = 1e-9

CASES = {
    # GPT: tied embedding, LayerNorm, learned positions; one stage on 2 processes
    "gpt-tp2-sp": ("tiny-gpt-interleaved.yaml",
                   {"cluster": {"gpus": 2}, "parallel": {"pipeline": 1, "virtual_stages": 1,
                    "tensor": 2, "schedule": "1f1b", "sequence_parallel": True},
                    "training": {"optimizer": "sgd"}}),
    # Llama: rotary positions over the whole sequence, RMSNorm, sequence shards cross the stage
    # boundary; 2 stages x tensor 2 = 4 processes
    "llama-tp2-sp-pp2": ("tiny-llama-pp2-dp2.yaml",
                         {"parallel": {"data": 1, "tensor": 2, "zero": 0, "schedule": "gpipe",
                          "sequence_parallel": True}, "training": {"optimizer": "sgd"}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sequence_parallel_run_equals_one_process(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))
    base, changes = CASES[case]
    result, got, want_losses, want = run_shipped_and_reference(base, changes, tmp_path, capsys,
                                                               steps=STEPS)
    assert result["plan"]["sequence_parallel"] is True and result["plan"]["tensor"] == 2
    print(case, [abs(a - b) / b for a, b in zip(result["losses"], want_losses)])
    assert result["losses"] == pytest.approx(want_losses, rel=RTOL, abs=0)
    assert_weights_close(got, want, rtol=RTOL, atol=ATOL)
