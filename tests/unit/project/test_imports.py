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

ROOT = Path(__file__).resolve().parents[3]
TORCH_FREE = ["partita.planner.scenario", "partita.planner.catalog", "partita.planner.costmodel",
              "partita.planner.schedule", "partita.simulator.step", "partita.validation.runner",
              "partita.validation.crossval", "partita.fitting.step_time",
              "partita.simulator.trace", "partita.executor.plan", "partita.executor.launch",
              "partita.executor.preflight", "partita.executor.hostload", "partita.cli"]

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


COST_MODULES = ("context", "profiled", "chunkcost", "stepenv", "modelcosts", "stagecosts",
                "dataparallel", "memory", "compute", "step", "frameworks")


def _partita_imports(path, *, top_level: bool):
    """The partita modules a file imports at module level (or, top_level=False, inside functions)."""
    import ast
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("partita"):
            if (id(node) in top) == top_level:
                out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def test_the_cost_modules_import_each_other_one_way_at_load():
    """The model costs are chosen once (simulator/modelcosts.py), so no cost module defers an
    import to break a cycle; only the profiler (torch) is imported where it is used."""
    sim = ROOT / "simulator"
    assert sim.is_dir(), sim
    names = {f"partita.simulator.{m}": m for m in COST_MODULES if (sim / f"{m}.py").exists()}
    graph = {m: {names[i] for i in _partita_imports(sim / f"{m}.py", top_level=True) if i in names}
             for m in names.values()}
    deferred = {m: _partita_imports(sim / f"{m}.py", top_level=False) for m in names.values()}
    assert {m: d for m, d in deferred.items() if d} == {
        "profiled": ["partita.planner.profiler", "partita.planner.profiler.profile_module"]}
    done: set[str] = set()

    def visit(m, path):
        assert m not in path, f"import cycle: {' -> '.join(path + [m])}"
        if m not in done:
            for n in graph[m]:
                visit(n, path + [m])
            done.add(m)
    for m in graph:
        visit(m, [])


# modules that once imported each other through deferred imports; the shared piece now lives in a
# module both import at load (planner/dims.py, planner/partition_problem.py, validation/rowrules.py)
ONE_WAY_AT_LOAD = ("planner/modelspec.py", "planner/hf_config.py", "planner/dims.py",
                   "planner/partition.py", "planner/partition_problem.py", "planner/partition_dp.py",
                   "planner/ilp_solver.py", "validation/rowmap.py", "validation/rowcells.py",
                   "validation/rowrules.py")


@pytest.mark.parametrize("path", ONE_WAY_AT_LOAD)
def test_these_modules_import_partita_only_at_load(path):
    """No deferred partita import (one inside a function or under `if TYPE_CHECKING`) stands in
    for an import that would close a cycle."""
    assert (ROOT / path).is_file(), path
    assert _partita_imports(ROOT / path, top_level=False) == []
