"""Megatron-LM arguments as scenarios (validation.megatron_args) and the stored functional-test
goldens (data/validation/megatron_golden_memory.yaml) the memory benchmark compares against."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from partita.planner.scenario import parse_scenario
from partita.validation.megatron_args import Unexpressed, scenario

ROOT = Path(__file__).resolve().parents[3]
SPEC = importlib.util.spec_from_file_location("megatron_golden_memory",
                                              ROOT / "benchmarks" / "megatron_golden_memory.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)

SMALL = {"--num-layers": 12, "--hidden-size": 512, "--num-attention-heads": 8,
         "--seq-length": 1024, "--micro-batch-size": 4, "--global-batch-size": 32,
         "--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 2, "--bf16": True,
         "--log-params-norm": True, "--deterministic-mode": True, "--lr": 1.5e-4}


def doc(**extra):
    return scenario(SMALL | extra, gpus=8, system="dgx-h100", name="t")


def test_the_stored_7b_case_maps_as_its_arguments_say():
    case = next(c for c in bench.load()["cases"] if c["test_case"] == "gpt3_7b_tp1_pp4_memory_speed")
    d = scenario(case["args"], gpus=8, system="dgx-h100", name="7b")
    assert d["model"] == {"arch": "gpt", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                          "ffn_hidden": 16384, "seq_len": 8192, "vocab": 131200,
                          "tie_embeddings": False, "dropout": True}
    assert d["parallel"] == {"tensor": 1, "pipeline": 4, "data": 2, "context": 1,
                             "sequence_parallel": False, "zero": 1,
                             "schedule": "interleaved-1f1b", "virtual_stages": 8}
    assert d["training"]["attention"] == "flash"         # Transformer Engine, backend auto
    parse_scenario(d)


def test_shape_vocabulary_and_defaults():
    d = doc()
    assert d["model"]["vocab"] == 50432                    # GPT-2's 50,257 padded to 128 x TP 2
    assert d["model"]["ffn_hidden"] == 4 * 512 and d["model"]["arch"] == "gpt"
    assert d["parallel"]["data"] == 2 and d["training"]["precision"] == "bf16"
    swiglu = doc(**{"--swiglu": True})
    assert swiglu["model"]["arch"] == "llama" and swiglu["model"]["ffn_hidden"] == 1344
    assert doc(**{"--hidden-dropout": 0.0, "--attention-dropout": 0.0})["model"]["dropout"] is False


def test_attention_backend_and_implementation():
    assert doc()["training"]["attention"] == "flash"
    assert doc(**{"--attention-backend": "flash"})["training"]["attention"] == "flash2"
    assert doc(**{"--attention-backend": "unfused"})["training"]["attention"] == "unfused"
    assert doc(**{"--transformer-impl": "local"})["training"]["attention"] == "unfused"


def test_recompute_and_virtual_stages():
    d = doc(**{"--recompute-granularity": "full", "--recompute-method": "block",
               "--recompute-num-layers": 2})
    assert (d["training"]["recompute"], d["training"]["recompute_num_layers"]) == ("full", 2)
    assert doc(**{"--recompute-granularity": "selective"})["training"]["recompute"] == "selective"
    d = doc(**{"--num-layers-per-virtual-pipeline-stage": 2})
    assert (d["parallel"]["schedule"], d["parallel"]["virtual_stages"]) == ("interleaved-1f1b", 3)


@pytest.mark.parametrize("extra, named", [
    ({"--num-experts": 8}, "num-experts"),
    ({"--cross-entropy-loss-fusion": True}, "cross-entropy-loss-fusion"),
    ({"--fp8-format": "hybrid"}, "fp8-format"),
    ({"--tensor-model-parallel-size": 3}, "does not divide 8 GPUs"),
    ({"--tokenizer-type": "HuggingFaceTokenizer"}, "vocabulary is not stated"),
    ({"--recompute-granularity": "full", "--recompute-method": "uniform",
      "--recompute-num-layers": 2}, "recompute-method uniform"),
    ({"--cp-comm-type": "a2a"}, "cp-comm-type a2a"),
])
def test_what_a_scenario_cannot_state_is_named(extra, named):
    with pytest.raises(Unexpressed, match=named):
        doc(**extra)


def test_every_stored_case_maps_or_says_why():
    data = bench.load()
    assert data["gpus"] == 8 and data["source"].startswith("NVIDIA/Megatron-LM at ")
    mapped = 0
    for c in data["cases"]:
        assert c["platform"] in bench.PLATFORMS and c["max_allocated_bytes"] > 0
        assert not any("${" in str(v) for v in c["args"].values())     # no CI machine paths
        try:
            d = scenario(c["args"], gpus=8, system=bench.PLATFORMS[c["platform"]],
                         name=c["test_case"])
        except Unexpressed as e:
            assert str(e)
            continue
        parse_scenario(d)
        mapped += 1
    assert mapped >= 35


def test_evaluate_groups_cases_of_one_configuration():
    name = "gpt3_mcore_te_tp1_pp4_resume_torch_dist_swiglu"
    case = next(c for c in bench.load()["cases"] if c["test_case"] == name)
    twin = dict(case, test_case="twin", max_allocated_bytes=case["max_allocated_bytes"] + 2 * 2**30)
    bad = dict(case, test_case="moe", args=case["args"] | {"--num-experts": 8})
    rows, skipped = bench.evaluate({"gpus": 8, "cases": [case, twin, bad]})
    assert [r["cases"] for r in rows] == [[name, "twin"]]
    assert rows[0]["measured_gib"] == pytest.approx(case["max_allocated_bytes"] / 2**30 + 1.0)
    assert 0 < rows[0]["predicted_gib"] < 80
    assert skipped == [("moe", "unexpressed: num-experts")]


def test_extract_from_a_missing_git_directory_is_one_error_line(tmp_path, capsys):
    before = bench.DATA.read_bytes()
    assert bench.main(["--extract", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --extract {tmp_path / 'nowhere'}: ")
    assert bench.DATA.read_bytes() == before                # the stored cases are untouched
