"""Wall time and peak memory of profiling Llama-2-70B on the meta device (target: < 20 s, < 2 GiB).

    .venv/bin/python benchmarks/bench_profile.py [--preset llama2-70b] [--micro-batch 1] [--precision bf16]

Prints the time to import torch and the models, to build the model on meta, to profile it layer
by layer (FLOPs, saved bytes), the analytic cost model's time for the same shape, and the
process's peak resident memory (getrusage ru_maxrss).
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET_S = 20.0
TARGET_RSS_BYTES = 2 * 2**30


def peak_rss_bytes() -> int:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss    # KiB on Linux
    return kib * 1024 if sys.platform != "darwin" else kib      # bytes on macOS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama2-70b")
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--precision", default="bf16")
    args = parser.parse_args()

    start = time.perf_counter()
    import torch
    from partita.planner.costmodel import analytic_profile
    from partita.planner.modelspec import preset_dims
    from partita.planner.models import build_model
    from partita.planner.profiler import profile_module
    imported = time.perf_counter()

    dims = preset_dims(args.preset)
    build_model(dims, device="meta", dtype=torch.bfloat16)
    built = time.perf_counter()
    profile = profile_module(dims, micro_batch=args.micro_batch, precision=args.precision)
    profiled = time.perf_counter()
    analytic = analytic_profile(dims, micro_batch=args.micro_batch, precision=args.precision)
    done = time.perf_counter()

    total_s = profiled - start
    rss = peak_rss_bytes()
    print(f"{args.preset}: {profile.total_params:,} parameters, {len(profile.layers)} layers, "
          f"micro-batch {args.micro_batch} x {dims.seq_len} tokens, {args.precision}, torch {torch.__version__}")
    print(f"  import            {imported - start:8.2f} s")
    print(f"  build on meta     {built - imported:8.2f} s")
    print(f"  meta profile      {profiled - built:8.2f} s   ({profile.total_flops / 1e12:,.1f} TFLOP fwd+bwd, "
          f"{sum(l.activation_bytes for l in profile.layers) / 2**30:,.1f} GiB saved for backward)")
    print(f"  analytic profile  {done - profiled:8.4f} s   (FLOPs ratio meta/analytic "
          f"{profile.total_flops / analytic.total_flops:.6f})")
    print(f"  wall (import+build+profile) {total_s:.2f} s (target < {TARGET_S:.0f} s): "
          f"{'ok' if total_s < TARGET_S else 'OVER'}")
    print(f"  peak RSS          {rss / 2**20:8.0f} MiB (target < {TARGET_RSS_BYTES / 2**30:.0f} GiB): "
          f"{'ok' if rss < TARGET_RSS_BYTES else 'OVER'}")


if __name__ == "__main__":
    main()
