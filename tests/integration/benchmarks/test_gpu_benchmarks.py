"""benchmarks/bench_gpu_kernels.py and gpu_prediction.py run as a user runs them: the measuring
script in its CPU mode (--quick: small shapes; timings meaningless) writes every part it was asked
for, and the comparison reads the stored H200 measurement and a fresh file alike."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_json(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "cpu.json"
    bench = _module("bench_gpu_kernels")
    assert bench.main(["--out", str(out), "--quick", "--device", "cpu",
                       "--only", "gemm,eager_ops,launch,blocks"]) == 0
    return out


def test_the_quick_run_writes_every_part_asked_for(quick_json):
    data = json.loads(quick_json.read_text())
    assert data["device"] == "cpu" and not [k for k in data if k.endswith("_error")]
    assert {r["layout"] for r in data["gemm"]} == {"fwd", "dgrad", "wgrad"}
    assert {r["op"] for r in data["eager_ops"]} >= {"rmsnorm_eager", "rope_complex"}
    assert all(r["fwd_s"] > 0 for r in data["eager_ops"])
    (block,) = data["blocks"]
    assert block["fwd_s_per_block"] > 0 and block["micro_batch"] == 2


def test_prediction_reads_the_stored_and_a_fresh_measurement(quick_json, capsys, tmp_path):
    prediction = _module("gpu_prediction")
    assert prediction.main([]) == 0                       # the stored H200 file, second run
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and "over 17 blocks" in out
    figure = tmp_path / "blocks.png"
    assert prediction.main(["--run", "first", "--figure", str(figure)]) == 0
    assert figure.stat().st_size > 10_000
    assert prediction.main([str(quick_json)]) == 0       # a CPU's blocks priced as an H200's
    assert "over 1 blocks" in capsys.readouterr().out


def test_bad_arguments_are_one_line(tmp_path, capsys):
    bench = _module("bench_gpu_kernels")
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--out", str(tmp_path / "x.json"), "--only", "gemm,nosuch"])
    assert exit_.value.code == 2
    assert "--only: unknown part 'nosuch' (valid: gemm," in capsys.readouterr().err
    import subprocess
    import sys
    done = subprocess.run([sys.executable, str(BENCH / "gpu_prediction.py"), "--system", "no-such"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and "no-such" in done.stderr
