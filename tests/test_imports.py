"""Imports point one way, and only the profiler, the torch models and the executor need torch.

Layers, each importing only those before it: planner <- simulator <- fitting <- validation
(validation's cross-validation refits with `partita.fitting`; the fitting code takes its rows as
arguments); reports may import validation; the executor uses the planner's plan.
"""
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCH_FREE = ["partita.planner.scenario", "partita.planner.catalog", "partita.planner.costmodel",
              "partita.planner.schedule", "partita.simulator.step", "partita.validation.runner",
              "partita.validation.crossval", "partita.fitting.step_time",
              "partita.simulator.trace", "partita.executor.plan", "partita.executor.launch",
              "partita.cli"]
# package folder -> the partita packages it must not import (at module load)
FORBIDDEN = {
    "simulator": ("partita.validation", "partita.fitting", "partita.reports", "partita.executor"),
    "fitting": ("partita.validation", "partita.reports", "partita.executor"),
    "validation": ("partita.reports", "partita.executor"),
}


def _modules(folder: str) -> list[str]:
    return [f"partita.{folder}.{m.name}" for m in pkgutil.iter_modules([str(ROOT / folder)])]


def _loaded_after_import(modules: list[str]) -> list[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_no_torch_at_import_time():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in TORCH_FREE)
            + "from partita.cli import build_parser\nbuild_parser()\n"
            + "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_planner_does_not_import_the_simulator():
    code = ("import sys\nimport partita.planner.scenario, partita.planner.catalog, "
            "partita.planner.costmodel, partita.planner.schedule, partita.planner.stages\n"
            "print(any(m.startswith(('partita.simulator', 'partita.validation', 'partita.fitting', "
            "'partita.executor', 'partita.reports')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_layers_import_only_the_layers_below(folder):
    modules = _modules(folder)
    assert modules, f"no modules found in {folder}/"
    loaded = _loaded_after_import(modules)
    wrong = [m for m in loaded if m.startswith(FORBIDDEN[folder])]
    assert wrong == [], f"{folder}/ imports {wrong} at load"
