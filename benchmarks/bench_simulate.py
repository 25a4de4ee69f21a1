"""Simulator speed: the issue's two targets, printed (not a timed test).

    python benchmarks/bench_simulate.py

1. One step of the 1T-parameter, 3,072-GPU case (Narayanan et al. 2021 Table 1 last row:
   TP 8 x PP 64 x DP 6, 512 micro-batches per replica): target under 1 s.
2. Simulations per second on one core of GPT-3 175B on 1,024 A100s (the shipped example):
   target at least 50.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from partita.planner.catalog import load_catalog  # noqa: E402
from partita.planner.scenario import load_scenario, parse_scenario  # noqa: E402
from partita.simulator.step import simulate  # noqa: E402

ONE_T = {
    "name": "gpt-1t-3072",
    "model": {"arch": "gpt", "layers": 128, "hidden": 25600, "heads": 160, "seq_len": 2048,
              "vocab": 51200},
    "cluster": {"system": "dgx-a100-80gb", "gpus": 3072},
    "training": {"global_batch": 3072, "micro_batch": 1, "precision": "fp16", "recompute": "full"},
    "parallel": {"tensor": 8, "pipeline": 64, "data": 6, "schedule": "1f1b"},
}


def main() -> int:
    catalog = load_catalog()
    big = parse_scenario(ONE_T)
    simulate(big, catalog)                       # warm caches (catalog, calibration files)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        r = simulate(big, catalog)
        times.append(time.perf_counter() - t0)
    print(f"1T / 3,072 GPUs (PP 64, {r.details['microbatches']} micro-batches): "
          f"{min(times):.3f} s per simulation (median {statistics.median(times):.3f} s; target < 1 s); "
          f"predicted step {r.step_time_s:.1f} s")
    s = load_scenario("gpt3-175b-a100")
    simulate(s, catalog)
    n, t0 = 50, time.perf_counter()
    for _ in range(n):
        simulate(s, catalog)
    rate = n / (time.perf_counter() - t0)
    print(f"GPT-3 175B / 1,024 GPUs: {rate:.1f} simulations per second on one core (target >= 50)")
    return 0


if __name__ == "__main__":
    # No options: --help prints what the script prints; anything else is a usage error.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
