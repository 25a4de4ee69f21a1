"""Full recompute with early stop: what torch.utils.checkpoint(use_reentrant=False) runs again, the
simulator's price of it (`compute.early_stop_skip`), the framework defaults and the scenario keys."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

from partita.cli import main
from partita.planner.catalog import load_catalog
from partita.planner.hardware import GPU
from partita.planner.modelspec import TransformerDims
from partita.planner.scenario import parse_scenario
from partita.simulator.calibration import load_calibration
from partita.simulator.compute import (block_gemms, early_stop_skip, early_stop_skips, gemm_time,
                                       layer_times)
from partita.simulator.frameworks import load_frameworks
from partita.simulator.step import simulate

H100 = GPU("h100-80gb", "H100", 80 * 2**30, 3.35e12,
           {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12})
H = 32


class _Block(nn.Module):
    """A pre-norm block (gpt / llama layout); `post_norm` puts the norm after the residual add
    (bert's layout); `p` the dropout after the MLP's output projection."""

    def __init__(self, p: float = 0.0, post_norm: bool = False):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.attn, self.up, self.down = nn.Linear(H, H), nn.Linear(H, 4 * H), nn.Linear(4 * H, H)
        self.drop, self.post_norm = nn.Dropout(p), post_norm

    def forward(self, x):
        if self.post_norm:
            x = self.norm1(x + self.attn(x))
            return self.norm2(x + self.drop(self.down(F.gelu(self.up(x)))))
        x = x + self.attn(self.norm1(x))
        return x + self.drop(self.down(F.gelu(self.up(self.norm2(x)))))


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func.__name__, tuple(out.shape) if isinstance(out, torch.Tensor) else ()))
        return out


def _recomputed(block: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """The forward ops the backward of a checkpointed `block` runs again (before its first
    gradient op), as torch's aten stream shows them."""
    x = torch.randn(2, 3, H, requires_grad=True)
    y = checkpoint(block, x, use_reentrant=False)
    with _Ops() as mode:
        y.sum().backward()
    ops = [op for op in mode.ops if op[0] not in ("detach.default", "t.default", "view.default",
                                                  "_unsafe_view.default", "expand.default")]
    first_grad = next(i for i, op in enumerate(ops) if op[0] == "gelu_backward.default"
                      or (op[0] == "mm.default" and op[1] == (4 * H, H)))   # d(down.weight)
    return ops[:first_grad]


def test_torch_stops_the_recompute_before_the_last_linear_of_a_dropout_free_pre_norm_block():
    """The premise of `early_stop_skip`, on the installed PyTorch: autograd saves an op's inputs
    before its kernel, so the recompute halts at the output projection, whose input and weight
    are the block's last saved tensors; a dropout after it saves its mask (an output) after
    running, so the projection runs again; a post-norm block's closing norm saves its statistics
    after running, so everything runs again."""
    def projections(ops):
        return sum(1 for name, shape in ops if name in ("addmm.default", "mm.default")
                   and shape[-1] == H and len(shape) == 2)
    plain = _recomputed(_Block())
    assert projections(plain) == 1                 # attn again, not down
    assert not [op for op in plain if op[0] == "add.Tensor"][1:]   # the closing add skipped
    assert projections(_recomputed(_Block(p=0.1))) == 2
    post = _recomputed(_Block(post_norm=True))
    assert projections(post) == 2 and [op[0] for op in post].count("native_layer_norm.default") == 2


@pytest.fixture(scope="module")
def shipped():
    return load_calibration(include_local=False)


@pytest.mark.parametrize("arch, ffn", [("gpt", 0), ("llama", 2816)])
def test_early_stop_prices_the_forward_less_the_output_projection_and_the_residual_add(shipped,
                                                                                         arch, ffn):
    d = TransformerDims(arch=arch, layers=2, hidden=1024, heads=16, ffn_hidden=ffn, seq_len=512,
                        vocab=32000, dropout=False)
    g = shipped.gpu(H100.name)
    full = layer_times(d, 2, 1, False, 1, "bf16", "full", H100, shipped)
    early = layer_times(d, 2, 1, False, 1, "bf16", "full", H100, shipped, early_stop=True)
    down = block_gemms(d, 2)[-1]
    assert down.name == "mlp_down"
    skip_gemm, skip_add = early_stop_skip(d, 2, 1, 1, False, "bf16", H100, g, False)
    assert skip_gemm == pytest.approx(gemm_time(down.m, down.n, down.k, H100, "bf16", shipped))
    assert 0 < skip_add < skip_gemm
    assert early.recompute_s == pytest.approx(full.recompute_s - skip_gemm - skip_add, rel=1e-12)
    assert early.fwd_s == full.fwd_s and early.bwd_s == full.bwd_s
    assert early.parts["recompute_gemm"] == pytest.approx(early.parts["gemm_fwd"] - skip_gemm)
    # none and selective recompute are what they were
    for mode in ("none", "selective"):
        assert layer_times(d, 2, 1, False, 1, "bf16", mode, H100, shipped,
                           early_stop=True) == layer_times(d, 2, 1, False, 1, "bf16", mode, H100,
                                                           shipped)


def test_with_dropout_only_the_residual_add_is_skipped_and_bert_runs_it_all(shipped):
    g = shipped.gpu(H100.name)
    gpt = TransformerDims(arch="gpt", layers=2, hidden=1024, heads=16, seq_len=512, vocab=32000)
    assert gpt.dropout is True                       # Megatron-LM's default for gpt, bert, t5
    skip_gemm, skip_add = early_stop_skip(gpt, 2, 1, 1, False, "bf16", H100, g, False,
                                          fused_elementwise=False)
    assert skip_gemm == 0 and skip_add > 0
    bert = TransformerDims(arch="bert", layers=2, hidden=1024, heads=16, seq_len=128, vocab=30528,
                           dropout=False)
    assert early_stop_skip(bert, 2, 1, 1, False, "bf16", H100, g, False) == (0.0, 0.0)
    full = layer_times(bert, 2, 1, False, 1, "bf16", "full", H100, shipped)
    assert layer_times(bert, 2, 1, False, 1, "bf16", "full", H100, shipped,
                       early_stop=True).recompute_s == full.recompute_s
    llama = TransformerDims(arch="llama", layers=2, hidden=1024, heads=16, ffn_hidden=2816,
                            seq_len=512, vocab=32000)
    assert llama.dropout is False
    # a fused bias-dropout-add saves its mask and runs: nothing is left out
    assert early_stop_skips(gpt, fused_elementwise=True) == (False, False)
    assert early_stop_skips(gpt, fused_elementwise=False) == (False, True)
    assert early_stop_skips(llama) == (True, True) and early_stop_skips(bert) == (False, False)


def test_frameworks_say_which_checkpoint_stops_early():
    profiles = load_frameworks()
    assert {n: p.recompute_early_stop for n, p in profiles.items()} == {
        "megatron": False, "deepspeed": False, "fsdp": True}


def _doc(**training) -> dict:
    return {"name": "early-stop",
            "model": {"arch": "llama", "layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 4,
                      "ffn_hidden": 5632, "seq_len": 2048, "vocab": 32000},
            "cluster": {"system": "dgx-h100", "gpus": 8},
            "training": {"global_batch": 16, "micro_batch": 2, "recompute": "full", **training},
            "parallel": {"tensor": 1, "pipeline": 1, "data": 8, "zero": 3}}


def test_an_fsdp_step_with_full_recompute_is_faster_by_what_the_early_stop_skips():
    cat = load_catalog()
    fsdp = simulate(parse_scenario(_doc(framework="fsdp")), cat).step_time_s
    whole = simulate(parse_scenario(_doc(framework="fsdp", recompute_early_stop=False)),
                     cat).step_time_s
    megatron = simulate(parse_scenario(_doc()), cat).step_time_s
    stopped = simulate(parse_scenario(_doc(recompute_early_stop=True)), cat).step_time_s
    assert fsdp < whole and stopped < megatron
    assert (whole - fsdp) / whole > 0.03              # a fifth of the recomputed forward's GEMMs


def test_scenario_keys_round_trip_and_bad_values_name_the_key(tmp_path, capsys):
    import yaml
    doc = _doc(framework="fsdp", recompute_early_stop=False)
    doc["model"]["dropout"] = True
    s = parse_scenario(doc)
    assert s.training.recompute_early_stop is False and s.model.resolve().dropout is True
    again = parse_scenario(s.to_dict())
    assert again.training.recompute_early_stop is False and again.model.resolve().dropout is True
    assert "recompute_early_stop" not in parse_scenario(_doc()).to_dict()["training"]
    assert "dropout" not in parse_scenario(_doc()).to_dict()["model"]      # llama's default
    for section, key in (("training", "recompute_early_stop"), ("model", "dropout")):
        bad = _doc()
        bad[section][key] = "yes"
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump(bad))
        assert main(["simulate", str(path)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and f"{section}.{key}" in err[0]
        assert "expected true or false" in err[0]
