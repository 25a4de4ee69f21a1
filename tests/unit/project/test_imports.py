"""Imports point one way, and only the profiler, the torch models and the executor need torch."""
import subprocess
import sys

TORCH_FREE = ["partita.planner.scenario", "partita.planner.catalog", "partita.planner.costmodel",
              "partita.planner.schedule", "partita.simulator.step", "partita.simulator.validation",
              "partita.simulator.trace", "partita.executor.plan", "partita.executor.launch",
              "partita.cli"]


def test_no_torch_at_import_time():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in TORCH_FREE)
            + "from partita.cli import build_parser\nbuild_parser()\n"
            + "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_planner_does_not_import_the_simulator():
    code = ("import sys\nimport partita.planner.scenario, partita.planner.catalog, "
            "partita.planner.costmodel, partita.planner.schedule, partita.planner.stages\n"
            "print(any(m.startswith(('partita.simulator', 'partita.executor', 'partita.reports')) "
            "for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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
    from pathlib import Path
    sim = Path(__file__).resolve().parents[3] / "simulator"
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
