"""What a training run's sustained fractions apply to (simulator/stagecosts.py `sustained`):
the GEMMs at the GPU family's fraction; a flash attention kernel at its own benchmark (Dao 2023,
Table 1: FlashAttention v1 and v2 runs differ by the kernels' benchmark times); unfused
attention, GEMMs and memory-bound kernels alike, at the family's fraction."""
from __future__ import annotations

from dataclasses import replace

import pytest

from partita.planner.catalog import load_catalog
from partita.planner.modelspec import TransformerDims
from partita.simulator.calibration import load_calibration
from partita.simulator.compute import layer_times
from partita.simulator.overheads import load_overheads
from partita.simulator.stagecosts import sustained

GPU = load_catalog().gpu("a100-80gb")


def _layer(attention: str):
    return layer_times(_dims(), 4, 1, False, 1, "bf16", "none", GPU, load_calibration(),
                       attention=attention)


def _dims():
    return TransformerDims(arch="gpt", layers=24, hidden=2048, heads=16, seq_len=8192, vocab=50264)


@pytest.mark.parametrize("attention", ["flash1", "flash2"])
def test_flash_kernels_keep_their_benchmark_and_gemms_take_the_family_fraction(attention):
    oh = replace(load_overheads(), sustained_by_family={"a100": 0.5})
    lt = _layer(attention)
    out = sustained(lt, oh, GPU, "bf16")
    p = lt.parts
    gemm_f, attn_f = p["gemm_fwd"], p["attention_fwd"]
    assert out.fwd_s == pytest.approx(lt.fwd_s + gemm_f)                 # GEMMs twice as long
    assert out.bwd_input_s == pytest.approx(lt.bwd_input_s + p["gemm_bwd_input"])
    assert attn_f > 0.1 * lt.fwd_s                  # attention is there, and unscaled
    # an attention fraction below 1 does slow the kernel
    slower = sustained(lt, replace(oh, attention_fraction=0.5), GPU, "bf16")
    assert slower.fwd_s == pytest.approx(out.fwd_s + attn_f)


def test_unfused_attention_takes_the_family_fraction_over_all_of_it():
    oh = replace(load_overheads(), sustained_by_family={"a100": 0.5})
    lt = _layer("unfused")
    p = lt.parts
    assert 0 < p["attention_matmul_fwd"] < p["attention_fwd"]           # GEMMs and softmax/dropout
    out = sustained(lt, oh, GPU, "bf16")
    assert out.fwd_s == pytest.approx(lt.fwd_s + p["gemm_fwd"] + p["attention_fwd"])
    assert out.bwd_input_s == pytest.approx(lt.bwd_input_s + p["gemm_bwd_input"]
                                            + p["attention_bwd"])
