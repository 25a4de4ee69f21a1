"""Benchmark: does `partita calibrate` make the simulator predict this machine's own runs?

Calibrates this machine (into a temporary PARTITA_HOME unless --keep) once per process count the
scenarios need, then runs each scenario for real (`partita run --json`) and prints the measured median step time
(warm-up steps excluded), the prediction (`predicted_step_time_s` of the run, or `partita simulate
--json` if the run has none) and their ratio. Target: within 15% (ratio 0.87-1.15).

    .venv/bin/python benchmarks/bench_local_prediction.py              # ~2-3 minutes on 2 cores
    .venv/bin/python benchmarks/bench_local_prediction.py --quick      # quick calibration, fewer steps
    .venv/bin/python benchmarks/bench_local_prediction.py --keep       # calibrate into ~/.partita

The scenarios: the shipped tiny examples (hidden 32: per-op host costs dominate; `tiny-llama-pp2-dp2`
runs 4 processes, so on a machine of fewer cores they share them, calibration included) and two
written here whose matmuls dominate (GPT, 4 layers, hidden 256 and 512, seq 128, 1F1B over 2 stages,
fp32). Each row also prints where the prediction puts the time (compute, host, bubble, ...).
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
SHIPPED_2 = ("tiny-gpt-pp2", "tiny-gpt-interleaved")     # 2 processes
SHIPPED_4 = ("tiny-llama-pp2-dp2",)                       # 4 processes


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
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 24)")
    args = parser.parse_args()
    steps = args.steps or (6 if args.quick else 24)
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        env = dict(os.environ)
        if not args.keep:
            env["PARTITA_HOME"] = str(Path(tmp, "home"))
        by_world = {2: list(SHIPPED_2), 4: list(SHIPPED_4)}
        for name, model in COMPUTE_BOUND.items():
            path = Path(tmp, f"{name}.yaml")
            path.write_text(yaml.safe_dump(scenario_doc(name, model)), encoding="utf-8")
            by_world[2].append(str(path))
        rows = []
        for world, scenarios in by_world.items():
            if not args.keep:
                env["PARTITA_HOME"] = str(Path(tmp, f"home{world}"))
            print(partita(["calibrate", "--gpus", str(world)] + (["--quick"] if args.quick else []),
                          env), end="")
            rows += [(Path(s).stem, *measure(s, steps, Path(tmp, "runs", Path(s).stem), env),
                      breakdown(s, env)) for s in scenarios]
    print(f"\n{'scenario':<22}{'measured ms':>13}{'predicted ms':>14}{'ratio':>8}  within 15%"
          "  predicted parts (ms)")
    for name, measured, predicted, parts in rows:
        ratio = predicted / measured
        print(f"{name:<22}{measured * 1e3:>13.2f}{predicted * 1e3:>14.2f}{ratio:>8.3f}  "
              f"{'yes' if abs(ratio - 1) <= TARGET else 'no ':<10} {parts}")


def breakdown(scenario: str, env: dict[str, str]) -> str:
    """The simulator's step breakdown, largest parts first, in ms."""
    parts = json.loads(partita(["simulate", scenario, "--json"], env))["breakdown_s"]
    return " ".join(f"{k} {v * 1e3:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
                    if v > 0)


if __name__ == "__main__":
    main()
