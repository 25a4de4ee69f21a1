"""The benchmarks' command lines: bench_plan.py's unknown part is a usage error naming the valid
ones and runs nothing, --help prints the usage; the scripts without options refuse one."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_an_unknown_part_is_a_usage_error_naming_the_parts(capsys, monkeypatch):
    from benchmarks import bench_plan
    ran = []
    monkeypatch.setitem(bench_plan.PARTS, "ilp", lambda: ran.append("ilp"))
    assert bench_plan.main(["ilp", "gtp3"]) == 2
    err = capsys.readouterr().err
    assert "error: unknown part 'gtp3' (valid: ilp, t5, gpt3, published, search)" in err
    assert ran == []                               # nothing runs before the arguments are checked


def test_help_prints_the_usage_and_runs_nothing(capsys, monkeypatch):
    from benchmarks import bench_plan
    ran = []
    monkeypatch.setitem(bench_plan.PARTS, "ilp", lambda: ran.append("ilp"))
    assert bench_plan.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: bench_plan.py [ilp | t5 | gpt3")
    assert ran == []


def test_named_parts_run_in_the_order_given(monkeypatch):
    from benchmarks import bench_plan
    ran = []
    for name in ("ilp", "t5"):
        monkeypatch.setitem(bench_plan.PARTS, name, lambda name=name: ran.append(name))
    assert bench_plan.main(["t5", "ilp"]) == 0
    assert ran == ["t5", "ilp"]


@pytest.mark.parametrize("script", ["bench_collectives", "bench_fusion", "bench_host_dispatch",
                                    "bench_simulate", "identification", "microbatch_structure",
                                    "residual_structure"])
def test_scripts_without_options_refuse_an_unknown_one(script):
    """A benchmark with no options says so (exit 2, argparse's one line) instead of running."""
    path = Path(__file__).resolve().parents[3] / "benchmarks" / f"{script}.py"
    run = subprocess.run([sys.executable, str(path), "--out", "x.png"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2
    assert "error: unrecognized arguments: --out x.png" in run.stderr and not run.stdout
