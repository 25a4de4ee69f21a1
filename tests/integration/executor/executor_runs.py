"""A scenario document run for real by `partita run` (2 gloo processes or more) and by one process,
for the executor's numerics tests: what each test compares is the same pair."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from partita.cli import main
from partita.executor.train import reference_run
from partita.planner.paths import SCENARIOS_DIR
from partita.planner.scenario import load_scenario


def run_and_reference(doc: dict, tmp_path: Path, capsys, *, steps: int):
    """(the run's --json result, its saved final weights, the one-process losses and weights)."""
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc))
    weights = tmp_path / "weights.pt"
    assert main(["run", str(path), "--steps", str(steps), "--json", "--out", str(tmp_path / "out"),
                 "--save-weights", str(weights)]) == 0
    result = json.loads(capsys.readouterr().out)
    want_losses, want = reference_run(load_scenario(path), steps=steps)
    return result, torch.load(weights), want_losses, want


def run_shipped_and_reference(base: str, changes: dict, tmp_path: Path, capsys, *, steps: int):
    """`run_and_reference` of shipped scenario `base` (data/scenarios/) with each section of
    `changes` updated."""
    doc = yaml.safe_load((SCENARIOS_DIR / base).read_text())
    for section, values in changes.items():
        doc[section].update(values)
    return run_and_reference(doc, tmp_path, capsys, steps=steps)


def assert_weights_close(got: dict, want: dict, *, rtol: float, atol: float) -> None:
    """Every weight tensor within rtol of its norm (plus atol) of the one-process run's."""
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        err = (got[name] - w).norm().item()
        assert err <= rtol * w.norm().item() + atol, f"{name}: |diff| {err:.3g}, |w| {w.norm():.3g}"
