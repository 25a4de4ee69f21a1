"""`module:` models run as pipelines with data parallelism, as one process trains them (CPU, gloo).

A user's nn.Sequential of 5 layers (embedding, 3 residual MLP blocks, LM head tied to the
embedding) is cut into 2 uneven pipeline stages (3 + 2 layers, as the planner's even split of 5
layers over 2 chunks gives) and trained for 5 steps on 2 pipeline x 2 data-parallel gloo processes;
its losses and final weights are held to `reference_run` (the same module, seed and batches in one
process) at 1e-6 relative, as test_executor_numerics.py holds the transformer models, and for
the same reason (only summation order differs).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from partita.cli import main
from partita.executor.plan import execution_plan
from partita.executor.train import reference_run
from partita.planner.errors import PartitaError
from partita.planner.scenario import load_scenario, parse_scenario

RTOL = 1e-6
ATOL = 1e-9
STEPS = 5

MODULE = '''
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))

def tied_lm(width=16, depth=3, vocab=64):
    emb, head = nn.Embedding(vocab, width), nn.Linear(width, vocab, bias=False)
    head.weight = emb.weight
    return nn.Sequential(emb, *[Block(width) for _ in range(depth)], head)

class Listed(nn.Module):
    """Not a Sequential: an ordered list of blocks through pipeline_layers()."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.blocks = nn.ModuleList(Block(16) for _ in range(2))
        self.out = nn.Linear(16, 64)
    def pipeline_layers(self):
        return [self.emb, *self.blocks, self.out]
    def forward(self, ids):
        for layer in self.pipeline_layers():
            ids = layer(ids)
        return ids

def listed():
    return Listed()

def wrong_vocab():
    return nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 10))

def breaks():
    return nn.Sequential(nn.Embedding(64, 16), nn.Linear(8, 64))
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "toy_lm.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))          # the torchrun workers import it too
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))

    def scenario(fn="tied_lm", *, gpus=4, **parallel):
        doc = {"name": "toy", "model": {"module": f"toy_lm:{fn}", "seq_len": 8, "vocab": 64},
               "cluster": {"system": "local", "gpus": gpus},
               "training": {"global_batch": 8, "micro_batch": 2, "precision": "fp32",
                            "optimizer": "sgd"},
               "parallel": {"pipeline": 2, "data": 2, "schedule": "1f1b", **parallel}}
        path = tmp_path / f"s{len(list(tmp_path.glob('s*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return str(path)
    return scenario


def test_a_module_is_split_by_its_layer_chain(toy):
    plan = execution_plan(load_scenario(toy()), 4)
    assert plan.module == "toy_lm:tied_lm" and plan.blocks == 5
    assert plan.chunks == ((0, 3), (3, 5)) and plan.layers_of(1) == (3, 4)
    explicit = execution_plan(load_scenario(toy(stages=[[0, 1], [1, 5]])), 4)
    assert explicit.layers_of(0) == (0,) and explicit.layers_of(1) == (1, 2, 3, 4)
    listed = execution_plan(load_scenario(toy("listed", gpus=2, data=1)), 2)
    assert listed.chunks == ((0, 2), (2, 4))


@pytest.mark.parametrize("parallel, message", [
    ({"tensor": 2, "data": 1}, "parallel.tensor = 2: a model given as model.module has no known"),
    ({"stages": [[0, 2], [2, 6]]}, "the module's layers: 0, 1, 2, 3, 4"),
    ({"pipeline": 6, "data": 1, "gpus": 6}, "exceeds the module's 5 layers"),
    ({"fn": "wrong_vocab"}, r"to \(2, 8, 10\), expected logits \(B, S, vocab\) = \(2, 8, 64\)"),
    ({"fn": "breaks"}, "layer '1' \\(Linear\\) failed on the meta device: RuntimeError"),
])
def test_module_plans_that_cannot_run(toy, parallel, message):
    gpus = parallel.pop("gpus", 4)
    fn = parallel.pop("fn", "tied_lm")
    with pytest.raises(PartitaError, match=message):
        execution_plan(load_scenario(toy(fn, gpus=gpus, **parallel)), gpus)


@pytest.mark.slow
def test_module_pipeline_with_data_parallelism_equals_one_process(toy, tmp_path, capsys):
    path = toy(zero=1)
    weights = tmp_path / "weights.pt"
    assert main(["run", path, "--steps", str(STEPS), "--json", "--out", str(tmp_path / "out"),
                 "--save-weights", str(weights)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["plan"]["stages"] == [[0, 3], [3, 5]] and result["plan"]["module"] == "toy_lm:tied_lm"
    want_losses, want = reference_run(load_scenario(path), steps=STEPS)
    assert result["losses"] == pytest.approx(want_losses, rel=RTOL, abs=0)
    assert want_losses[-1] < want_losses[0]
    got = torch.load(weights)
    assert sorted(got) == sorted(want) and "0.weight" in got and "4.weight" in got
    for name, w in want.items():
        err = (got[name] - w).norm().item()
        assert err <= RTOL * w.norm().item() + ATOL, f"{name}: |diff| {err:.3g}, |w| {w.norm():.3g}"


@pytest.mark.parametrize("recompute", ["selective", "selective-op"])
def test_selective_recompute_of_a_module_runs_without_a_prediction(toy, tmp_path, recompute):
    """The executor checkpoints a module's layers by the policy; the simulator refuses to price
    it (no block structure), so `partita run` goes on with a note instead of a prediction."""
    from partita.executor.preflight import predict
    doc = yaml.safe_load(Path(toy()).read_text())
    doc["training"]["recompute"] = recompute
    for system in ("local", "p4d.24xlarge"):
        doc["cluster"] = {"system": system, "gpus": 8}
        doc["parallel"]["data"] = 4
        time_s, note, memory = predict(parse_scenario(doc), None)
        assert time_s is None and memory is None
        assert f"does not price recompute {recompute} of a model.module" in note
