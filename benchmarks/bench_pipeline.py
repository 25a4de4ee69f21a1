"""How fast the schedule generators, `validate` and `simulate_pipeline` are at the largest size
the planner meets: Megatron's 1T-parameter run (Narayanan et al. 2021, table 1: 128 layers on
p = 64 pipeline ranks, global batch 3072 over d = 6 replicas, micro-batch 1, so m = 512).

    .venv/bin/python benchmarks/bench_pipeline.py [--repeat 5]

The stage costs are synthetic (uniform f = 1 ms, b = 2 ms, 0.1 ms per transfer): the numbers this
prints are the simulator's own run time, plus the simulated bubble next to its closed form as a
sanity check. Prints; asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from partita.planner.schedule import build, validate  # noqa: E402
from partita.simulator.pipeline import PipelineCosts, simulate_pipeline  # noqa: E402

P, M = 64, 512
F_S, B_S, LINK_S = 1e-3, 2e-3, 1e-4
CASES = [("1f1b", 1), ("gpipe", 1), ("zero-bubble", 1), ("interleaved-1f1b", 2)]


def timed(fn, repeat: int) -> tuple[float, object]:
    """Best-of-`repeat` wall time of fn() in seconds, and its last result."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def bench(name: str, v: int, repeat: int) -> None:
    costs = PipelineCosts.uniform(P * v, F_S / v, B_S / v, activation_s=LINK_S)
    free = PipelineCosts.uniform(P * v, F_S / v, B_S / v)
    gen_s, schedule = timed(lambda: build(name, P, M, v), repeat)
    val_s, _ = timed(lambda: validate(schedule, P, M, v), repeat)
    sim_s, tl = timed(lambda: simulate_pipeline(schedule, costs, check=False), repeat)
    trace_s, traced = timed(lambda: simulate_pipeline(schedule, costs, trace=True, check=False),
                            max(1, repeat // 2))
    all_s, _ = timed(lambda: simulate_pipeline(build(name, P, M, v), costs), repeat)
    ideal = simulate_pipeline(schedule, free, check=False)
    actions = sum(len(a) for a in schedule.values())
    print(f"{name:17s} v={v}  actions {actions:6d}  generate {gen_s * 1e3:6.1f} ms  "
          f"validate {val_s * 1e3:6.1f} ms  simulate {sim_s * 1e3:6.1f} ms  "
          f"build+validate+simulate {all_s * 1e3:6.1f} ms  with trace {trace_s * 1e3:6.1f} ms "
          f"({len(traced.spans)} spans)")
    print(f"{'':17s}      step {tl.makespan_s * 1e3:.1f} ms, bubble {tl.bubble_fraction:.4f}; "
          f"free comm: bubble {ideal.bubble_fraction:.4f}, closed form "
          f"{closed_form_bubble(name, v):.4f}")


def closed_form_bubble(name: str, v: int) -> float:
    """1 - busy/step for uniform stages and free communication (see planner.schedules.generators)."""
    work = M * (F_S + B_S)
    if name == "interleaved-1f1b":
        extra = (P - 1) * (F_S + B_S) / v
    elif name == "zero-bubble":
        extra = (P - 1) * (F_S + B_S / 2 - B_S / 2)      # w = i = b/2 <= f
    else:
        extra = (P - 1) * (F_S + B_S)
    return 1 - work / (work + extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (best kept)")
    args = parser.parse_args(argv)
    print(f"p = {P}, m = {M}, Python {sys.version.split()[0]}, best of {args.repeat}")
    for name, v in CASES:
        bench(name, v, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
