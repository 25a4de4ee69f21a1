"""Simulating a model given only as a torch module (`model: {module: ...}`) from its profile."""
from __future__ import annotations

import json

import pytest
import yaml

from partita.cli import main

MODULE = '''
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))

def mlp_lm(width=512, depth=8, vocab=1000):
    return nn.Sequential(nn.Embedding(vocab, width), *[Block(width) for _ in range(depth)],
                         nn.Linear(width, vocab))
'''


@pytest.fixture
def module_scenario(tmp_path, monkeypatch):
    (tmp_path / "toy_models.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(training=None, **parallel):
        doc = {"model": {"module": "toy_models:mlp_lm", "seq_len": 256, "vocab": 1000},
               "cluster": {"system": "p4d.24xlarge", "gpus": 8},
               "training": {"global_batch": 64, "micro_batch": 4, "precision": "bf16",
                            **(training or {})},
               "parallel": {"pipeline": 2, "data": 4, "schedule": "1f1b", **parallel}}
        path = tmp_path / f"s{len(list(tmp_path.glob('s*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return str(path)
    return make


def test_a_module_model_simulates_from_its_profile(module_scenario, capsys):
    assert main(["simulate", module_scenario(), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] > 0 and out["fits_in_memory"] and 0 < out["mfu"] < 1
    # 10 profiled layers (embedding, 8 blocks, head) split over 2 stages, 4 data replicas
    assert out["breakdown_s"]["compute"] > 0 and out["breakdown_s"]["dp_comm"] >= 0


def test_more_stages_of_a_module_change_the_time(module_scenario, capsys):
    main(["simulate", module_scenario(), module_scenario(schedule="gpipe"), "--json"])
    a, b = (json.loads(x) for x in capsys.readouterr().out.splitlines())
    assert a["step_time_s"] > 0 and b["step_time_s"] > 0
    assert b["peak_memory_gib"] >= a["peak_memory_gib"]        # GPipe holds every micro-batch


@pytest.mark.parametrize("parallel, message", [
    ({"pipeline": 1, "data": 4, "tensor": 2}, "parallel.tensor = 2: a model given as model.module"),
    ({"zero": 3}, "sequence_parallel and zero 3 need a transformer model"),
    ({"stages": [[0, 4], [4, 9]]}, "parallel.stages ends at layer 9, but the model has 10 layers"),
    ({"stages": [[0, 4], [5, 10]]}, "parallel.stages[1] starts at layer 5, expected 4"),
])
def test_what_a_module_cannot_do_is_one_error(module_scenario, capsys, parallel, message):
    path = module_scenario(**parallel)
    assert main(["simulate", path]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_a_module_recomputes_its_first_layers_of_each_chunk(module_scenario, capsys):
    """recompute_num_layers on a profiled module: the first N layers of each chunk (never the
    token-taking layer 0, as the executor runs it) rerun their forward."""
    files = [module_scenario(training={"recompute": "none"}),
             module_scenario(training={"recompute": "full", "recompute_num_layers": 2}),
             module_scenario(training={"recompute": "full"})]
    main(["simulate", *files, "--json"])
    none, some, full = (json.loads(x) for x in capsys.readouterr().out.splitlines())
    assert "recompute" not in none["breakdown_s"]
    # 5 layers per chunk: 2 of 5 blocks rerun, against every layer under full recompute
    assert 0 < some["breakdown_s"]["recompute"] < 0.5 * full["breakdown_s"]["recompute"]
    assert none["step_time_s"] < some["step_time_s"] < full["step_time_s"]
    assert none["peak_memory_gib"] > some["peak_memory_gib"] > full["peak_memory_gib"]


@pytest.mark.parametrize("recompute", ["selective", "selective-op"])
def test_selective_recompute_of_a_module_is_one_error(module_scenario, capsys, recompute):
    """Selective recompute re-runs parts of a transformer block; a module has no known blocks,
    so the simulator refuses it rather than predicting no recompute."""
    assert main(["simulate", module_scenario(training={"recompute": recompute})]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"training.recompute = {recompute}" in err and "use none or full" in err

