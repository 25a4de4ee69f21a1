"""The collective model against measured all-reduce sweeps, and its speed.

    .venv/bin/python benchmarks/bench_collectives.py

For each sweep in data/calibration/collective_sweeps.yaml: measured and predicted time per size,
the error, and the half-bandwidth size n_1/2 that would fit the sweep's shape best once the
efficiency is matched to its largest message (how the n_1/2 values in network.yaml were chosen).
Then the number of collective evaluations per second on one core.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import replace

import yaml

from partita.planner.hardware import GPU, Fabric, Network, System
from partita.planner.paths import CALIBRATION_DIR
from partita.simulator.calibration import load_calibration
from partita.simulator.network import Group, build_topology, collective


def sweep_system(s: dict) -> System:
    gpu = GPU(s["gpu"], s["gpu"], 80 * 2**30, 3.35e12, {"bf16": 989e12})
    intra = Fabric(s["intra"]["kind"], s["intra"]["unidir_GBps"] * 1e9, None)
    inter = Network(s["inter"]["kind"], 1, s["inter"]["node_gbps"] * 1e9 / 8, None)
    return System(s["name"], "cloud", gpu, s["gpus_per_node"], intra, inter)


def predict(topo, s: dict, size: float) -> float:
    group = Group(s["ranks"], s["ranks_per_node"])
    return collective("allreduce", s["algorithm"], size, group, topo)


def fit_half_bandwidth(topo, s: dict, points) -> float:
    """n_1/2 (bytes) minimising the squared log error, efficiency held at the largest point's."""
    tier = "inter" if s["ranks"] > s["ranks_per_node"] else "intra"

    def err(half: float) -> float:
        t = replace(getattr(topo, tier), half_bandwidth_bytes=half)
        tp = replace(topo, **{tier: t})
        big_size, big_time = points[-1]
        scale = predict(tp, s, big_size) / big_time
        return sum(math.log(predict(tp, s, n) / scale / m) ** 2 for n, m in points)

    lo, hi = math.log(1e4), math.log(1e10)
    for _ in range(60):                                  # golden-section search in log space
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        if err(math.exp(a)) < err(math.exp(b)):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2)


def main() -> None:
    cal = load_calibration(include_local=False)
    doc = yaml.safe_load((CALIBRATION_DIR / "collective_sweeps.yaml").read_text())
    for s in doc["sweeps"]:
        topo = build_topology(sweep_system(s), cal)
        for tier, fields in (s.get("tier_overrides") or {}).items():
            topo = replace(topo, **{tier: replace(getattr(topo, tier), **fields)})
        points = [(float(n), t * 1e-6) for n, t in s["size_bytes_time_us"]]
        print(f"\n{s['name']}\n  source: {s['source']}")
        print(f"  {'size':>12} {'measured us':>12} {'model us':>10} {'error':>8}")
        errors = []
        for n, m in points:
            p = predict(topo, s, n)
            errors.append(abs(p / m - 1))
            print(f"  {int(n):>12} {m * 1e6:>12.1f} {p * 1e6:>10.1f} {100 * (p / m - 1):>+7.1f}%")
        big = [e for (n, _), e in zip(points, errors) if n >= 2**20]
        print(f"  median |error| {100 * statistics.median(errors):.1f}% (all), "
              f"{100 * statistics.median(big):.1f}% (>= 1 MiB)")
        print(f"  best-fit n_1/2 for this sweep's shape: {fit_half_bandwidth(topo, s, points) / 1e6:.1f} MB")
    system = sweep_system(doc["sweeps"][1])
    topo = build_topology(system, cal)
    group = Group(1024, 8)
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < 1.0:
        for size in (1e6, 1e8, 1e9):
            collective("allreduce", "auto", size, group, topo)
            calls += 1
    rate = calls / (time.perf_counter() - start)
    print(f"\nspeed: {rate:,.0f} auto all-reduce evaluations per second (1,024 ranks, one core)")


if __name__ == "__main__":
    # No options: --help prints what the script prints; anything else is a usage error.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
