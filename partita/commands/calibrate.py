"""`partita calibrate [--gpus N] [--quick] [--device cpu|cuda] [--out FILE]`: measure this machine.

    partita calibrate                  # 2 CPU processes (or one per CUDA device), under a minute
    partita calibrate --gpus 4         # for scenarios with cluster: {system: local, gpus: 4}
    partita calibrate --quick          # a few seconds, rougher numbers

Writes the catalog system `local` (and its GPU `local-cpu` / `local-cuda`) to
$PARTITA_HOME/local.yaml (default ~/.partita/), where every command's catalog finds it, and the
simulator's calibration overlay to calibration-local.yaml beside it; then prints the measurements
and what the simulator now predicts for the measured messages and matmuls, next to the measurements.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from partita.planner.errors import PartitaError
from partita.planner.units import MIB


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure this machine into the catalog system `local`",
                       description=__doc__.splitlines()[0])
    p.add_argument("--gpus", metavar="N", type=_process_count, default=None,
                   help="processes that will share this machine, the N of "
                        "`cluster: {system: local, gpus: N}` (default: 2 on a CPU, every device "
                        "with CUDA)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="what one process computes on (default: cuda if available, else cpu)")
    p.add_argument("--quick", action="store_true", help="few sizes, short timings (seconds)")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="catalog file to write (default: $PARTITA_HOME/local.yaml)")
    p.add_argument("--calibration-out", metavar="FILE", default=None,
                   help="calibration overlay to write (default: calibration-<name>.yaml beside "
                        "--out, else $PARTITA_HOME/calibration-local.yaml)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from partita.executor.measure_machine import calibrate
    from partita.executor.machine_files import check_writable, write_documents
    processes, device = _processes(args.gpus, args.device)
    catalog_path, calibration_path = output_paths(args.out, args.calibration_out)
    check_writable(catalog_path)
    check_writable(calibration_path)
    from partita.executor.hostload import host_load, load_warning
    busy = load_warning(host_load(), processes, "the calibration")
    if busy:
        print(f"note: {busy}: the measured host costs will be too large", file=sys.stderr)
    start = time.perf_counter()
    result = calibrate(processes, quick=args.quick, device=device)
    elapsed = time.perf_counter() - start
    write_documents(result, catalog_path, calibration_path)
    check = fit_check(result, catalog_path, calibration_path)
    if args.json:
        print(json.dumps({"catalog": str(catalog_path), "calibration": str(calibration_path),
                          "elapsed_s": elapsed, **result.to_dict(), "check": check}))
    else:
        _print(result, check, catalog_path, calibration_path, elapsed)
    return 0


MAX_PROCESSES = 1024


def _process_count(text: str) -> int:
    """--gpus N: 1 to MAX_PROCESSES (a usage error otherwise: exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes, got {text!r}") \
            from None
    if not 1 <= value <= MAX_PROCESSES:
        raise argparse.ArgumentTypeError(f"expected a number of processes from 1 to {MAX_PROCESSES}, "
                                         f"got {value}")
    return value


def _processes(value: int | None, device: str | None) -> tuple[int, str]:
    import torch
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = device or ("cuda" if have else "cpu")
    if device == "cuda" and have == 0:
        raise PartitaError("--device cuda: no CUDA device is visible on this machine; use "
                           "--device cpu (or leave --device out)")
    if value is None:
        return (have if device == "cuda" else 2), device
    if device == "cuda" and value > have:
        raise PartitaError(f"--gpus {value} with --device cuda: one process per CUDA device, and "
                           f"this machine has {have}")
    return value, device


def output_paths(out: str | None, calibration_out: str | None) -> tuple[Path, Path]:
    from partita.planner.catalog import local_catalog_path
    from partita.simulator.calibration import local_calibration_path
    catalog = Path(out).expanduser() if out else local_catalog_path()
    if calibration_out:
        return catalog, Path(calibration_out).expanduser()
    if out:
        return catalog, catalog.with_name(f"calibration-{catalog.stem}.yaml")
    return catalog, local_calibration_path()


def fit_check(result, catalog_path: Path, calibration_path: Path) -> dict[str, Any]:
    """Load what was written, as the simulator will, and predict the measured work with it."""
    from partita.planner.catalog import load_catalog
    from partita.simulator.calibration import load_calibration
    from partita.simulator.compute import gemm_time
    from partita.simulator.network import Group, build_topology, collective, p2p
    catalog = load_catalog(catalog_path)
    cal = load_calibration(calibration_path, include_local=False)
    system = catalog.system("local")
    out: dict[str, Any] = {"matmul": [
        {"precision": p, "n": int(n), "measured_s": 2.0 * n ** 3 / rate,
         "predicted_s": gemm_time(int(n), int(n), int(n), system.gpu, p, cal)}
        for p, rows in result.matmul.items() for n, _, _, rate in rows]}
    if result.link is not None:
        topo = build_topology(system, cal)
        group = Group(system.gpus_per_node, system.gpus_per_node)
        ar = dict((int(s), t) for s, t in result.allreduce)
        out["messages"] = [{"bytes": int(s), "p2p_measured_s": t,
                            "p2p_predicted_s": p2p(s, True, topo),
                            "allreduce_measured_s": ar[int(s)],
                            "allreduce_predicted_s": collective("allreduce", "auto", s, group, topo)}
                           for s, t in result.p2p]
    return out


def _print(result, check: dict[str, Any], catalog_path: Path, calibration_path: Path,
           elapsed: float) -> None:
    m = result.machine
    threads = f" x {m.threads} thread{'s' if m.threads > 1 else ''}" if m.device == "cpu" else ""
    w = sys.stdout.write
    w(f"partita calibrate: {m.processes} process{'es' if m.processes > 1 else ''}{threads} on "
      f"{m.device_name} ({m.device}, {m.backend}), {elapsed:.1f} s\n")
    for p in result.matmul:
        w(f"  matmul {p:<5}     best {result.best_flops(p) / 1e12:.4g} TFLOP/s\n")
    big_bytes, big_rate = result.copy[-1]
    w(f"  copy             best {result.memory_bytes_per_s / 1e9:.4g} GB/s; "
      f"{big_bytes / 2 / MIB:.0f} MiB at {big_rate / 1e9:.4g} GB/s\n")
    a = result.attention
    w(f"  attention        forward {a['forward_s'] * 1e3:.3g} ms, forward+backward "
      f"{a['forward_backward_s'] * 1e3:.3g} ms ({'x'.join(map(str, a['shape']))}, causal)\n")
    w(f"  smallest op      {result.op_floor_s * 1e6:.3g} us\n")
    if result.link is not None:
        k = result.link
        w(f"  send/recv        4 B {k.p2p_small_s * 1e6:.3g} us one way; {k.bytes_per_s / 1e9:.4g} GB/s "
          f"for large messages\n  all-reduce       4 B {k.allreduce_small_s * 1e6:.3g} us; "
          f"{k.collective_overhead_s * 1e3:.3g} ms per call beyond the ring\n")
    if result.pipeline_action_s:
        per = ", ".join(f"{name} {s * 1e6:.3g} us" for name, s in result.pipeline_action_s.items())
        w(f"  pipeline action  {per}\n")
    if result.handoff_stall:
        stall = ", ".join(f"{s * 1e3:.2g} ms after {b * 1e3:.2g} ms" for b, s in result.handoff_stall)
        w(f"  hand-off stall   {stall} of compute\n")
    w(f"wrote {catalog_path} (catalog: system `local`, GPU `{m.gpu_name}`)\n")
    w(f"wrote {calibration_path} (simulator calibration overlay)\n")
    _print_check(check, w)


def _print_check(check: dict[str, Any], w) -> None:
    w("the simulator with these files, against the measurements (ms):\n")
    w(f"  {'matmul':<16}{'measured':>10}{'predicted':>11}\n")
    for row in check["matmul"]:
        w(f"  {row['precision'] + ' n=' + str(row['n']):<16}{row['measured_s'] * 1e3:>10.4g}"
          f"{row['predicted_s'] * 1e3:>11.4g}\n")
    if "messages" in check:
        w(f"  {'message bytes':<16}{'send/recv':>10}{'predicted':>11}{'all-reduce':>12}"
          f"{'predicted':>11}\n")
        for row in check["messages"]:
            w(f"  {row['bytes']:<16}{row['p2p_measured_s'] * 1e3:>10.4g}"
              f"{row['p2p_predicted_s'] * 1e3:>11.4g}{row['allreduce_measured_s'] * 1e3:>12.4g}"
              f"{row['allreduce_predicted_s'] * 1e3:>11.4g}\n")
