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
