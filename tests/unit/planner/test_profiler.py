"""The meta-device profiler against the analytic cost model, on other modules, timing, and the
`partita profile` command."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from partita.cli import main
from partita.planner.costmodel import analytic_profile
from partita.planner.errors import PartitaError
from partita.planner.modelspec import ModelSpec, TransformerDims, preset_dims
from partita.planner.profiler import achieved_flops_per_s, profile_module

FIELDS = ("name", "kind", "params", "param_bytes", "fwd_flops", "bwd_flops", "matmul_flops",
          "activation_bytes", "output_bytes")
TINY = [
    TransformerDims(arch="gpt", layers=2, hidden=64, heads=4, seq_len=16, vocab=97, max_positions=32),
    TransformerDims(arch="llama", layers=2, hidden=64, heads=4, kv_heads=1, ffn_hidden=96, seq_len=16,
                    vocab=97),
    TransformerDims(arch="bert", layers=2, hidden=64, heads=4, seq_len=16, vocab=97, tie_embeddings=False),
    TransformerDims(arch="t5", layers=3, decoder_layers=2, hidden=64, heads=4, head_dim=24,
                    ffn_hidden=80, seq_len=16, vocab=97),
]


def assert_same(measured, analytic):
    assert len(measured.layers) == len(analytic.layers)
    for m, a in zip(measured.layers, analytic.layers):
        for key in FIELDS:
            assert getattr(m, key) == getattr(a, key), (m.name, key)


@pytest.mark.parametrize("dims", TINY, ids=lambda d: d.arch)
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_meta_profile_equals_costmodel_tiny(dims, precision):
    """Every field, every layer: the cost model's accounting is what the torch modules do."""
    measured = profile_module(dims, micro_batch=3, precision=precision)
    assert measured.method == "meta-device" and measured.device is None
    assert_same(measured, analytic_profile(dims, micro_batch=3, precision=precision))


@pytest.mark.parametrize("name", ["gpt2", "bert-large", "t5-small", "llama2-7b"])
def test_meta_profile_equals_costmodel_presets(name):
    dims = preset_dims(name)
    measured = profile_module(dims, micro_batch=2, seq_len=256, precision="bf16")
    analytic = analytic_profile(TransformerDims(**{**dims.to_dict(), "seq_len": 256}),
                                micro_batch=2, precision="bf16")
    assert measured.total_params == analytic.total_params
    assert measured.total_flops == pytest.approx(analytic.total_flops, rel=0.02)
    assert_same(measured, analytic)


@st.composite
def small_dims(draw) -> TransformerDims:
    arch = draw(st.sampled_from(["gpt", "llama", "bert", "t5"]))
    kv = draw(st.sampled_from([1, 2, 4]))
    heads = kv * draw(st.integers(1, 3)) if arch == "llama" else draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([4, 8]))
    hidden = heads * head_dim if arch != "t5" else draw(st.sampled_from([16, 24]))
    seq = draw(st.integers(2, 12))
    return TransformerDims(
        arch=arch, layers=draw(st.integers(1, 3)), hidden=hidden, heads=heads, seq_len=seq,
        vocab=draw(st.integers(5, 40)), kv_heads=kv if arch == "llama" else 0,
        ffn_hidden=draw(st.integers(1, 40)), head_dim=head_dim if arch == "t5" else 0,
        decoder_layers=draw(st.integers(1, 2)) if arch == "t5" else 0,
        max_positions=seq + draw(st.integers(0, 4)) if arch in ("gpt", "bert") else 0,
        tie_embeddings=draw(st.booleans()))


@settings(max_examples=30, deadline=None)
@given(dims=small_dims(), micro_batch=st.integers(1, 3), precision=st.sampled_from(["bf16", "fp32", "fp16"]))
def test_meta_profile_equals_costmodel_property(dims, micro_batch, precision):
    assert_same(profile_module(dims, micro_batch=micro_batch, precision=precision),
                analytic_profile(dims, micro_batch=micro_batch, precision=precision))


def test_llama2_70b_profiles_on_meta():
    profile = profile_module(preset_dims("llama2-70b"), micro_batch=1, precision="bf16")
    assert profile.total_params == 68_976_648_192
    assert len(profile.layers) == 82
    block = profile.layers[1]
    assert block.bwd_flops == 2 * block.fwd_flops
    assert profile.total_flops == pytest.approx(
        analytic_profile(preset_dims("llama2-70b"), micro_batch=1, precision="bf16").total_flops, rel=1e-12)


def test_pipeline_model_profiles_from_its_dims():
    from partita.planner.models import build_model
    dims = TINY[0]
    model = build_model(dims)
    assert_same(profile_module(model, micro_batch=2, precision="fp32"),
                analytic_profile(dims, micro_batch=2, precision="fp32"))


class Square(torch.nn.Module):
    """Saves its input twice for backward (x * x): one storage, counted once."""

    def forward(self, x):
        return x * x


def test_other_modules_sequential_by_children():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 12), Square(),
                                torch.nn.Linear(12, 50))
    profile = profile_module(model, micro_batch=2, seq_len=5, vocab=50, precision="fp32")
    assert [l.name for l in profile.layers] == ["0", "1", "2", "3"]
    assert {l.kind for l in profile.layers} == {"other"}
    assert [l.params for l in profile.layers] == [400, 108, 0, 650]
    t = 2 * 5
    assert profile.layers[1].fwd_flops == 2 * t * 8 * 12
    assert profile.layers[1].bwd_flops == 2 * profile.layers[1].fwd_flops
    assert profile.layers[2].activation_bytes == t * 12 * 4           # x counted once
    assert profile.layers[3].output_bytes == t * 50 * 4
    assert profile.layers[0].activation_bytes == t * 8                # the int64 ids
    assert not any(p.is_meta for p in model.parameters())             # the user's model untouched


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.out = torch.nn.Linear(4, 10, bias=False)

    def forward(self, ids):
        return self.out(self.emb(ids))


def test_other_module_as_one_layer_with_bf16_stand_ins():
    model = TinyLM()
    profile = profile_module(model, micro_batch=3, seq_len=7, vocab=10, precision="bf16")
    (layer,) = profile.layers
    assert (layer.name, layer.params, layer.param_bytes) == ("model", 80, 160)
    assert layer.fwd_flops == 2 * 21 * 4 * 10
    # the ids (int64) and the linear's bf16 input; no weights, although they are saved too
    assert layer.activation_bytes == 21 * 8 + 21 * 4 * 2
    assert model.out.weight.dtype == torch.float32 and not model.out.weight.is_meta
    with pytest.raises(PartitaError, match="needs seq_len and vocab"):
        profile_module(model, micro_batch=1, precision="bf16")
    with pytest.raises(PartitaError, match="cannot profile a str"):
        profile_module("gpt2", micro_batch=1, precision="bf16")


def test_module_spec(tmp_path, monkeypatch):
    (tmp_path / "user_models.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 16),\n"
        "                               torch.nn.GELU(), torch.nn.Linear(16, 64))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = ModelSpec(module="user_models:build", seq_len=8, vocab=64)
    profile = profile_module(spec, micro_batch=2, precision="bf16")
    assert profile.model == "user_models:build" and profile.seq_len == 8
    assert profile.total_params == 64 * 16 + 272 + 16 * 64 + 64
    assert profile.layers[1].param_bytes == 272 * 2
    assert profile.total_flops == 3 * 2 * 16 * (16 * 16 + 16 * 64)


def test_seq_len_override_and_limits():
    dims = TINY[0]
    assert profile_module(dims, micro_batch=1, seq_len=32, precision="fp32").seq_len == 32
    with pytest.raises(PartitaError, match=r"seq_len \(64\) exceeds the model's learned positions \(max_positions 32\)"):
        profile_module(dims, micro_batch=1, seq_len=64, precision="fp32")
    with pytest.raises(PartitaError, match="training.precision: expected one of"):
        profile_module(dims, micro_batch=1, precision="fp4")
    with pytest.raises(PartitaError, match="training.micro_batch: must be >= 1"):
        profile_module(dims, micro_batch=0, precision="fp32")


def test_measure_times_every_layer():
    profile = profile_module(TINY[3], micro_batch=2, precision="fp32", measure=True, device="cpu",
                             warmup=1, repeats=2)
    assert profile.device == "cpu"
    for layer in profile.layers:
        assert layer.fwd_s > 0 and layer.bwd_s > 0
    assert achieved_flops_per_s(profile.layers[1]) > 0
    assert achieved_flops_per_s(analytic_profile(TINY[3], micro_batch=2, precision="fp32").layers[1]) is None
    with pytest.raises(PartitaError, match="repeats must be >= 1"):
        profile_module(TINY[0], micro_batch=1, precision="fp32", measure=True, device="cpu", repeats=0)


# ---- the command line -------------------------------------------------------------------------

def write_scenario(tmp_path, model: str, training: str = "{global_batch: 8, micro_batch: 2, precision: fp32}"):
    path = tmp_path / "scenario.yaml"
    path.write_text(f"model: {model}\ncluster: {{system: dgx-h100, gpus: 8}}\ntraining: {training}\n")
    return str(path)


TINY_GPT = "{arch: gpt, layers: 2, hidden: 32, heads: 4, seq_len: 16, vocab: 128}"


def test_cli_json(tmp_path, capsys):
    assert main(["profile", write_scenario(tmp_path, TINY_GPT), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    layers = out["layers"]
    assert [l["name"] for l in layers] == ["embedding", "block.0", "block.1", "head"]
    assert out["total_params"] == sum(l["params"] for l in layers)
    assert out["total_flops"] == sum(l["fwd_flops"] + l["bwd_flops"] for l in layers)
    for key in ("name", "params", "fwd_flops", "bwd_flops", "activation_bytes", "output_bytes"):
        assert all(key in l for l in layers)
    assert out["micro_batch"] == 2 and out["method"] == "meta-device"


def test_cli_micro_batch_and_table(tmp_path, capsys):
    path = write_scenario(tmp_path, TINY_GPT)
    assert main(["profile", path, "--json", "--micro-batch", "4"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert main(["profile", path, "--json", "--micro-batch", "1"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert four["total_flops"] == 4 * one["total_flops"] and four["micro_batch"] == 4
    assert main(["profile", path]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[:4] == ["layer", "params", "fwd", "GFLOP"]
    assert table[-1].startswith("total")


def test_cli_measure(tmp_path, capsys):
    path = write_scenario(tmp_path, TINY_GPT)
    assert main(["profile", path, "--measure", "--device", "cpu", "--repeats", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "cpu"
    assert all(l["fwd_s"] > 0 and l["bwd_s"] > 0 for l in out["layers"])
    assert out["layers"][1]["achieved_flops_per_s"] > 0
    assert main(["profile", path, "--measure", "--device", "cpu", "--repeats", "1"]) == 0
    assert "TFLOP/s" in capsys.readouterr().out


@pytest.mark.parametrize("model, message", [
    ('{module: "no_such_pkg.models:build", seq_len: 8, vocab: 10}',
     "model.module: cannot import 'no_such_pkg.models': No module named 'no_such_pkg'"),
    ('{module: "json:dumps", seq_len: 8, vocab: 10}',
     "model.module: 'json:dumps' is part of Python's standard library"),
    ('{module: "json:loads", seq_len: 8, vocab: 10}',
     "model.module: 'json:loads' is part of Python's standard library"),
    ('{preset: gpt-2}', "model.preset: unknown model preset 'gpt-2'; did you mean 'gpt2'"),
])
def test_cli_bad_model(tmp_path, capsys, model, message):
    path = write_scenario(tmp_path, model)
    assert main(["profile", path]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {message}") and len(err.strip().splitlines()) == 1


def test_cli_bad_input(tmp_path, capsys):
    assert main(["profile", str(tmp_path / "missing.yaml")]) == 1
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:      # a malformed flag is a usage error: exit 2
        main(["profile", write_scenario(tmp_path, TINY_GPT), "--micro-batch", "0"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().endswith("argument --micro-batch: must be from 1 to 65536, got 0")


def test_cli_module_returning_non_module(tmp_path, capsys, monkeypatch):
    (tmp_path / "odd_models.py").write_text("def build():\n    return [1, 2]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_scenario(tmp_path, '{module: "odd_models:build", seq_len: 8, vocab: 10}')
    assert main(["profile", path]) == 1
    assert capsys.readouterr().err.strip() == \
        f"error: {path}: model.module: 'odd_models:build' returned list, expected a torch.nn.Module"


def test_cli_predicted_times(tmp_path, capsys):
    """Transformer layers get the simulator's time on one GPU of the scenario's system; a system
    the catalog lacks or a module: model gets the reason instead."""
    assert main(["profile", write_scenario(tmp_path, TINY_GPT), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["predicted_gpu"] == "h100-80gb"
    # a block's backward does twice its forward's GEMMs; the head's forward also runs the
    # cross-entropy's six passes over the logits (two backward), so only its times are checked > 0
    blocks = [l for l in out["layers"] if l["name"].startswith("block")]
    assert blocks and all(l["predicted_fwd_s"] > 0 and l["predicted_bwd_s"] >= l["predicted_fwd_s"]
                          for l in blocks)
    assert all(l["predicted_fwd_s"] > 0 and l["predicted_bwd_s"] > 0 for l in out["layers"][1:])
    path = tmp_path / "nowhere.yaml"
    path.write_text(f"model: {TINY_GPT}\ncluster: {{system: no-such-box, gpus: 1}}\n"
                    "training: {global_batch: 1}\n")
    assert main(["profile", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["predicted_gpu"] is None and "unknown system 'no-such-box'" in out["predicted_unavailable"]
    assert "predicted_fwd_s" not in out["layers"][1]
    assert main(["profile", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "(no predicted times: unknown system 'no-such-box')"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measure_on_cuda():
    profile = profile_module(preset_dims("gpt2"), micro_batch=2, seq_len=256, precision="bf16",
                             measure=True, warmup=1, repeats=3)
    assert profile.device == torch.cuda.get_device_name()
    assert all(l.fwd_s > 0 and l.bwd_s > 0 for l in profile.layers)
    assert achieved_flops_per_s(profile.layers[1]) > 1e12
