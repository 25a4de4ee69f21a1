"""Scenario documents: every key of the contract, its type and range, and the consistency rules."""
from __future__ import annotations

import json

import pytest
import yaml

from partita.cli import main
from partita.planner.errors import PartitaError
from partita.planner.scenario import load_scenario, parse_scenario
from partita.planner.paths import SCENARIOS_DIR

BASE = {
    "name": "t",
    "model": {"arch": "gpt", "layers": 8, "hidden": 256, "heads": 8, "seq_len": 128, "vocab": 1000},
    "cluster": {"system": "dgx-a100-80gb", "gpus": 8},
    "training": {"global_batch": 16, "micro_batch": 2, "precision": "bf16", "recompute": "none"},
    "parallel": {"tensor": 2, "pipeline": 2, "data": 2, "schedule": "1f1b"},
}


def doc(**changes):
    d = json.loads(json.dumps(BASE))
    for path, value in changes.items():
        keys = path.split("__")
        node = d
        for k in keys[:-1]:
            node = node[k]
        if value is _DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return d


_DELETE = object()


def test_shipped_examples_load():
    names = sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml"))
    assert {"gpt3-175b-a100", "llama2-70b-h100", "t5-3b-p4d", "gpt2-xl-p3"} <= set(names)
    for name in names:
        load_scenario(name)


def test_defaults_and_microbatches():
    s = parse_scenario(doc())
    assert s.parallel.context == 1 and s.parallel.zero == 0 and s.parallel.overlap_grad_reduce
    assert s.training.optimizer == "adam"
    assert s.microbatches() == 16 // (2 * 2)
    assert s.model.resolve().ffn_hidden == 1024


def test_yaml_and_json_are_the_same(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "a.json").write_text(json.dumps(BASE))
    assert load_scenario(tmp_path / "a.yaml") == load_scenario(tmp_path / "a.json")


def test_round_trip_to_dict():
    s = parse_scenario(doc(parallel__stages=[[0, 3], [3, 8]]))
    assert parse_scenario(s.to_dict()) == s
    s = parse_scenario(doc(training__framework="deepspeed"))
    assert s.training.framework == "deepspeed"
    assert parse_scenario(s.to_dict()) == s
    assert parse_scenario(doc()).training.framework == "megatron"
    s = parse_scenario(doc(training__attention="eager", training__fused_elementwise=False,
                           training__attention_softmax_fp32=True))
    assert not s.training.fused_elementwise and s.training.attention_softmax_fp32
    assert parse_scenario(s.to_dict()) == s
    plain = parse_scenario(doc()).to_dict()["training"]
    assert "fused_elementwise" not in plain and "attention_softmax_fp32" not in plain
    s = parse_scenario(doc(training__fused_cross_entropy=True))
    assert s.training.fused_cross_entropy and parse_scenario(s.to_dict()) == s
    assert "fused_cross_entropy" not in plain
    s = parse_scenario(doc(model__arch="bert", model__mlm_predictions=20))
    assert s.model.resolve().head_positions == 20 and parse_scenario(s.to_dict()) == s
    s = parse_scenario(doc(model__arch="llama", model__ffn_hidden=688, model__tie_embeddings=True,
                           model__max_positions=4096))
    assert parse_scenario(s.to_dict()) == s
    assert "mlm_predictions" not in parse_scenario(doc()).to_dict()["model"]


@pytest.mark.parametrize("changes, message", [
    ({"parallel__tensr": 2}, "parallel.tensr: unknown key; did you mean 'tensor'?"),
    ({"bogus": 1}, "bogus: unknown key"),
    ({"parallel__tensor": "eight"}, "parallel.tensor: expected an integer, got 'eight'"),
    ({"parallel__tensor": 0}, "parallel.tensor: must be >= 1, got 0"),
    ({"training__precision": "bf61"}, "training.precision: expected one of"),
    ({"parallel__schedule": "1f1f"}, "did you mean '1f1b'?"),
    ({"parallel__data": 4}, "= 16, but cluster has 8 GPUs; for data parallelism over the rest "
                            "set parallel.data: 2"),
    ({"training__global_batch": 10}, "global_batch (10) must be divisible by micro_batch*data"),
    ({"parallel__tensor": 8, "parallel__data": 1, "parallel__pipeline": 1, "model__heads": 4,
      "model__hidden": 256}, "model.heads (4) must be divisible by parallel.tensor (8)"),
    ({"parallel__pipeline": 2, "model__layers": 1}, "= 2) exceeds the model's 1 layers"),
    ({"parallel__stages": [[0, 3], [4, 8]]}, "parallel.stages[1] starts at layer 4, expected 3"),
    ({"parallel__stages": [[0, 8]]}, "parallel.stages has 1 ranges, expected pipeline*virtual_stages = 2"),
    ({"parallel__virtual_stages": 2}, "only for schedule interleaved-1f1b"),
    ({"parallel__schedule": "interleaved-1f1b", "parallel__virtual_stages": 2,
      "training__global_batch": 12, "training__micro_batch": 2}, "to be a multiple of pipeline"),
    ({"parallel__zero": 4}, "parallel.zero: expected 0, 1, 2 or 3, got 4"),
    ({"cluster__nodes": 1}, "cluster: expected exactly one of gpus or nodes"),
    ({"model__preset": "gpt2-xl"}, "expected exactly one of: transformer dims"),
    ({"model__arch": "rnn"}, "model.arch: expected one of gpt, llama, bert, t5"),
    ({"model__seq_len": _DELETE}, "model.seq_len: missing required key"),
    ({"training": _DELETE}, "training: missing required section"),
    ({"parallel__sequence_parallel": "yes"}, "parallel.sequence_parallel: expected true or false"),
    ({"training__attention": "flashy"}, "training.attention: expected one of flash, flash2, flash1, unfused"),
    ({"training__framework": "jax"}, "training.framework: expected one of megatron, deepspeed, fsdp"),
    ({"training__fused_elementwise": "no"}, "training.fused_elementwise: expected true or false"),
    ({"training__fused_cross_entropy": 1}, "training.fused_cross_entropy: expected true or false"),
    ({"training__attention": "eager", "training__attention_softmax_fp32": "fp32"},
     "training.attention_softmax_fp32: expected true or false"),
    ({"training__attention": "flash3"}, "training.attention: expected one of flash, flash2, flash1"),
    ({"training__attention_softmax_fp32": True},
     "training.attention_softmax_fp32: only with attention eager or unfused (attention is flash"),
    ({"parallel__grad_reduce": "herring"}, "parallel.grad_reduce: expected one of auto, ring, tree"),
    ({"parallel__tp_comm_overlap": 1}, "parallel.tp_comm_overlap: expected true or false"),
    ({"parallel__overlap_param_gather": "no"}, "parallel.overlap_param_gather: expected true or false"),
    ({"cluster__intra_node_gbps": -5}, "cluster.intra_node_gbps: must be > 0, got -5"),
    ({"cluster__inter_node_gbps": "fast"}, "cluster.inter_node_gbps: expected a number, got 'fast'"),
    ({"model__mlm_predictions": 20}, "model.mlm_predictions: only for arch bert (its masked-LM head), "
                                     "got arch gpt"),
    ({"model__arch": "bert", "model__mlm_predictions": 129},
     "model.mlm_predictions: expected 1 to model.seq_len (128), got 129"),
    ({"model__arch": "bert", "model__mlm_predictions": 0}, "model.mlm_predictions: must be >= 1, got 0"),
    ({"model__arch": "bert", "model__mlm_predictions": "15%"},
     "model.mlm_predictions: expected an integer, got '15%'"),
])
def test_bad_documents_name_the_key(changes, message):
    with pytest.raises(PartitaError) as err:
        parse_scenario(doc(**changes), origin="f.yaml")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_gpu_count_error_suggests_data_only_where_it_divides():
    with pytest.raises(PartitaError) as err:
        parse_scenario(doc(cluster__gpus=9), origin="f.yaml")
    assert str(err.value).endswith("but cluster has 9 GPUs")       # 9 is no multiple of 4


def test_llama_needs_ffn_hidden():
    d = doc(model__arch="llama")
    with pytest.raises(PartitaError, match="model.ffn_hidden: required for arch llama"):
        parse_scenario(d)


def test_unknown_preset_suggests():
    d = doc(parallel=_DELETE)
    d["model"] = {"preset": "gpt2-xxl"}
    with pytest.raises(PartitaError, match="^s.yaml: model.preset: unknown model preset 'gpt2-xxl'; "
                                           "did you mean"):
        parse_scenario(d, origin="s.yaml")


@pytest.mark.parametrize("text, message", [
    ("model: [1, 2", "invalid YAML at line"),
    ("- just\n- a list\n", "expected a mapping at the top level"),
])
def test_malformed_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PartitaError, match=message):
        load_scenario(path)


def test_missing_file_suggests_shipped_example():
    with pytest.raises(PartitaError, match="did you mean the shipped example 'gpt3-175b-a100'"):
        load_scenario("gpt3-175b-a10")


def test_cli_error_is_one_line(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    if "simulate" not in _commands():
        pytest.skip("simulate command not present")
    assert main(["simulate", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "invalid JSON" in err


def _commands():
    from partita.cli import build_parser
    return build_parser()._subparsers._group_actions[0].choices


@pytest.mark.parametrize("changes, message", [
    ({"training__precision": "fp8", "cluster__system": "p3.16xlarge"},
     "training.precision: precision 'fp8' is not supported by v100-16gb"),
    ({"model__kv_heads": 3}, "model.heads (8) must be divisible by model.kv_heads (3)"),
    ({"model__hidden": 250}, "model.hidden (250) must be divisible by model.heads (8)"),
])
def test_model_and_hardware_errors_name_the_file(tmp_path, capsys, changes, message):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc(**changes)))
    assert main(["simulate", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"error: {path}: {message}")


def test_fp8_recipe_defaults_to_delayed_and_round_trips():
    fp8 = parse_scenario(doc(training__precision="fp8"))
    assert fp8.training.fp8_recipe == "delayed"
    assert "fp8_recipe" not in fp8.to_dict()["training"]
    current = parse_scenario(doc(training__precision="fp8", training__fp8_recipe="current"))
    assert current.training.fp8_recipe == "current"
    assert parse_scenario(current.to_dict()) == current


def test_fp8_recipe_names_its_choices_and_needs_fp8():
    with pytest.raises(PartitaError, match="^training.fp8_recipe: expected one of delayed, "
                                           "current, mxfp8, got 'nvfp4'$"):
        parse_scenario(doc(training__precision="fp8", training__fp8_recipe="nvfp4"))
    with pytest.raises(PartitaError, match="^training.fp8_recipe: a scaling recipe of fp8 "
                                           "training .*training.precision is bf16$"):
        parse_scenario(doc(training__fp8_recipe="delayed"))


@pytest.mark.parametrize("training, message", [
    ({"precision": "fp8", "fp8_recipe": "nvfp4"},
     "training.fp8_recipe: expected one of delayed, current, mxfp8, got 'nvfp4'"),
    ({"precision": "fp8", "fp8_recipe": "mxfp8"},          # dgx-h100: Hopper has no MXFP8 GEMMs
     "training.fp8_recipe: mxfp8 needs a GPU whose tensor cores run block-scaled fp8 (catalog arch "
     "blackwell, e.g. b200), but h100-80gb is of arch 'hopper'; use fp8_recipe delayed or current"),
    ({"precision": "bf16", "fp8_recipe": "current"},
     "training.fp8_recipe: a scaling recipe of fp8 training"),
])
def test_a_bad_fp8_recipe_is_one_error_line_naming_the_file(tmp_path, capsys, training, message):
    path = tmp_path / "s.yaml"
    d = doc(cluster__system="dgx-h100")
    d["training"].update(training)
    path.write_text(yaml.safe_dump(d))
    assert main(["simulate", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {message}") and err.count("\n") == 1
