"""`partita simulate` text output: the header names GPUs and nodes, and the per-stage table says
which blocks sit on which stage and that stage's memory, consistent with the JSON."""
from __future__ import annotations

import json
import re

import pytest

from partita.cli import main


def run(capsys, *argv) -> str:
    capsys.readouterr()
    assert main(["simulate", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name, header", [
    ("llama2-70b-h100", "llama2-70b-h100: 64 GPUs on 8 x dgx-h100  TP 8 x PP 4"),
    ("gpt2-xl-p3", "gpt2-xl-p3: 8 GPUs on 1 x p3.16xlarge  TP 1 x PP 4"),
])
def test_header_says_gpus_on_nodes(capsys, name, header):
    assert run(capsys, name).splitlines()[0].startswith(header)


def stage_rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("per stage"))
    assert lines[start + 1].split() == ["stage", "blocks", "params", "grads", "optim", "activ",
                                        "buffers", "reserve", "total"]
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start + 2:]]


def test_blocks_cover_the_model_once_and_memory_matches_json(capsys):
    text = run(capsys, "llama2-70b-h100")
    sim = json.loads(run(capsys, "llama2-70b-h100", "--json"))
    rows = stage_rows(text)
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    blocks = []
    for r in rows:
        for part in r[1].split(", "):
            a, b = (int(x) for x in part.split("-"))
            blocks += range(a, b + 1)
    assert sorted(blocks) == list(range(80))                  # Llama-2 70B: 80 blocks, 5 chunks each
    assert rows[0][1] == "0-3, 16-19, 32-35, 48-51, 64-67"    # interleaved: chunks r, r+4, ...
    for r, mem in zip(rows, sim["stage_memory_bytes"]):
        assert float(r[2]) == pytest.approx(mem["parameters"] / 2**30, abs=0.005)
        assert float(r[-1]) == pytest.approx(sum(mem.values()) / 2**30, abs=0.005)
    assert max(float(r[-1]) for r in rows) == pytest.approx(sim["peak_memory_gib"], abs=0.005)


def test_t5_counts_encoder_and_decoder_blocks(capsys):
    rows = stage_rows(run(capsys, "t5-3b-p4d"))
    assert [r[1] for r in rows] == ["0-11", "12-23", "24-35", "36-47"]   # 24 + 24 blocks


def test_a_step_above_90_percent_of_memory_is_flagged_near_capacity(capsys, tmp_path):
    import yaml
    from partita.planner.layergraph import MEMORY_PRESSURE_FRACTION
    doc = {"name": "full", "model": {"arch": "gpt", "layers": 72, "hidden": 14336, "heads": 112,
                                     "seq_len": 2048, "vocab": 250880},
           "cluster": {"system": "dgx-a100-80gb", "gpus": 384},
           "training": {"global_batch": 2016, "micro_batch": 2, "precision": "fp16",
                        "recompute": "full", "framework": "deepspeed"},
           "parallel": {"tensor": 8, "pipeline": 2, "data": 24, "zero": 1}}
    path = tmp_path / "full.yaml"
    path.write_text(yaml.safe_dump(doc))
    sim = json.loads(run(capsys, str(path), "--json"))
    share = sim["peak_memory_gib"] / sim["memory_capacity_gib"]
    assert MEMORY_PRESSURE_FRACTION < share <= 1.0 and sim["near_memory_capacity"] is True
    assert "NEAR CAPACITY" in run(capsys, str(path))
    assert json.loads(run(capsys, "llama2-70b-h100", "--json"))["near_memory_capacity"] is False
