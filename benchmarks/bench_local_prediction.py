"""Benchmark: does `partita calibrate` make the simulator predict this machine's own runs?

Calibrates this machine (into a temporary PARTITA_HOME unless --keep), then for each 2-process
pipeline scenario runs it for real (`partita run --json`) and prints the measured median step time
(warm-up steps excluded), the prediction (`predicted_step_time_s` of the run, or `partita simulate
--json` if the run has none) and their ratio. Target: within 15% (ratio 0.87-1.15).

    .venv/bin/python benchmarks/bench_local_prediction.py              # ~1-2 minutes on 2 cores
    .venv/bin/python benchmarks/bench_local_prediction.py --quick      # quick calibration, fewer steps
    .venv/bin/python benchmarks/bench_local_prediction.py --keep       # calibrate into ~/.partita

The scenarios: the shipped `tiny-gpt-pp2` (hidden 32: per-op overheads dominate) and two written
here whose matmuls dominate (GPT, 4 layers, hidden 256 and 512, seq 128, 1F1B over 2 stages, fp32).
Other processes on the machine disturb both the calibration and the runs: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

COMPUTE_BOUND = {
    "bench-gpt-h256-pp2": {"arch": "gpt", "layers": 4, "hidden": 256, "heads": 4, "seq_len": 128,
                           "vocab": 2048},
    "bench-gpt-h512-pp2": {"arch": "gpt", "layers": 4, "hidden": 512, "heads": 8, "seq_len": 128,
                           "vocab": 2048},
}
TARGET = 0.15


def scenario_doc(name: str, model: dict) -> dict:
    return {"name": name, "model": model, "cluster": {"system": "local", "gpus": 2},
            "training": {"global_batch": 8, "micro_batch": 2, "precision": "fp32",
                         "optimizer": "adam"},
            "parallel": {"pipeline": 2, "schedule": "1f1b"}}


def partita(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "partita", *args], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"partita {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def measure(scenario: str, steps: int, out: Path, env: dict[str, str]) -> tuple[float, float]:
    """(measured median step time, predicted step time) in seconds."""
    run = json.loads(partita(["run", scenario, "--steps", str(steps), "--json", "--out", str(out)],
                             env))
    warm = run.get("warmup_steps", 1)
    median = statistics.median(run["step_times_s"][warm:])
    predicted = run.get("predicted_step_time_s")
    if predicted is None:
        predicted = json.loads(partita(["simulate", scenario, "--json"], env))["step_time_s"]
    return median, predicted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="quick calibration, 6 steps per run")
    parser.add_argument("--keep", action="store_true",
                        help="calibrate into $PARTITA_HOME (default ~/.partita) and keep it")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 12)")
    args = parser.parse_args()
    steps = args.steps or (6 if args.quick else 12)
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        env = dict(os.environ)
        if not args.keep:
            env["PARTITA_HOME"] = str(Path(tmp, "home"))
        print(partita(["calibrate"] + (["--quick"] if args.quick else []), env), end="")
        scenarios = ["tiny-gpt-pp2"]
        for name, model in COMPUTE_BOUND.items():
            path = Path(tmp, f"{name}.yaml")
            path.write_text(yaml.safe_dump(scenario_doc(name, model)), encoding="utf-8")
            scenarios.append(str(path))
        rows = [(Path(s).stem, *measure(s, steps, Path(tmp, "runs", Path(s).stem), env))
                for s in scenarios]
    print(f"\n{'scenario':<22}{'measured ms':>13}{'predicted ms':>14}{'ratio':>8}  within 15%")
    for name, measured, predicted in rows:
        ratio = predicted / measured
        print(f"{name:<22}{measured * 1e3:>13.2f}{predicted * 1e3:>14.2f}{ratio:>8.3f}  "
              f"{'yes' if abs(ratio - 1) <= TARGET else 'no'}")


if __name__ == "__main__":
    main()
