"""The two files `partita calibrate` writes from its measurements (executor.measure_machine.Calibrated).

- The catalog entry, in planner/catalog.py's format: GPU `local-cpu` / `local-cuda` and system
  `local` ($PARTITA_HOME/local.yaml).
- The calibration overlay, in simulator/calibration.py's format: that GPU's curves and the
  `local` link tier ($PARTITA_HOME/calibration-local.yaml).

Both carry `source: "partita calibrate <date> on <hostname>"`; numbers are rounded to 4 significant
digits (6 for matmul rates, whose ratios make the efficiency curve). Each file is written whole
(a temporary file renamed over the old one).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from partita.executor.measure_machine import GIB, MIB, Calibrated
from partita.planner.errors import PartitaError

MAX_EFFICIENCY = 1.5      # simulator/calibration.py rejects efficiencies above this
MATMUL_MARGIN = 1.01      # keeps a measured matmul's memory roofline under its time after rounding


def _r(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def catalog_document(c: Calibrated) -> dict[str, Any]:
    """The `local` system and its GPU in planner/catalog.py's file format (file units)."""
    m, src = c.machine, c.machine.source
    per = f"{m.processes} process{'es' if m.processes > 1 else ''}"
    per += f" x {m.threads} thread{'s' if m.threads > 1 else ''}" if m.device == "cpu" else ""
    gpu = {"name": m.gpu_name, "display_name": f"{m.device_name} ({per})",
           "memory_gib": _r(m.memory_bytes / GIB), "mem_bw_GBps": _r(c.memory_bytes_per_s / 1e9),
           "measured_matmul_tflops": {p: _r(c.best_flops(p) / 1e12) for p in c.matmul},
           "source": [src],
           "notes": (f"Measured by partita calibrate with {per} running at once (torch "
                     f"{m.torch_version}); memory_gib is this process's share. mem_bw_GBps is the "
                     "best copy rate (read + write) over the sizes tried; a copy of "
                     f"{c.copy[-1][0] / 2 / MIB:.0f} MiB ran at {c.copy[-1][1] / 1e9:.3g} GB/s. "
                     "The calibration's memory_efficiency_by_mb is measured on a GPT block's "
                     "norms, residual adds and GELU, forward and backward.")}
    if c.link is None:
        intra: dict[str, Any] = {"kind": "none"}
    else:
        intra = {"kind": "host" if m.device == "cpu" else "pcie",
                 "unidir_GBps": _r(c.link.bytes_per_s / 1e9), "source": [src]}
        if c.link.step_latency_s > 0:           # the catalog takes positive latencies only
            intra["latency_us"] = _r(c.link.step_latency_s * 1e6)
    system = {"name": "local", "kind": "local", "gpu": m.gpu_name, "gpus_per_node": m.processes,
              "intra_node": intra, "inter_node": {"kind": "none"}, "vcpus": m.vcpus,
              "host_memory_gib": _r(m.host_memory_bytes / GIB), "source": [src],
              "notes": _link_notes(c)}
    return {"gpus": [gpu], "systems": [system]}


def _link_notes(c: Calibrated) -> str:
    if c.link is None:
        return "One process: no link between processes was measured."
    k = c.link
    return (f"{c.machine.backend} between {c.machine.processes} processes: send/recv of 4 B "
            f"{k.p2p_small_s * 1e6:.1f} us one way, all-reduce of 4 B {k.allreduce_small_s * 1e6:.1f} "
            f"us; large-message send/recv {k.bytes_per_s / 1e9:.3g} GB/s (least squares, >= 1 MiB). "
            "latency_us is the per-step latency of the simulator's model (calibration tier `local`).")


def calibration_document(c: Calibrated) -> dict[str, Any]:
    """The overlay for simulator/calibration.py: this GPU's curves and the `local` tier."""
    src = [c.machine.source]
    matmul = {}
    for p, rows in c.matmul.items():
        matmul[p] = {"peak_tflops": _r(c.best_flops(p) / 1e12, 6),
                     "measured_mnk_tflops": [[int(m), int(n), int(k), _r(f / 1e12, 6)]
                                             for m, n, k, f in rows],
                     "source": src}
    fwd, bwd = attention_efficiencies(c)
    gpu = {"matmul": matmul,
           "memory_efficiency_by_mb": [[_r(b / 1e6), _r(eff)] for b, eff in memory_curve(c)],
           "attention_forward_efficiency": _r(fwd), "attention_backward_efficiency": _r(bwd),
           "kernel_floor_us": _r(c.op_floor_s * 1e6), "source": src}
    doc: dict[str, Any] = {"source": src, "gpus": {c.machine.gpu_name: gpu}}
    host = host_document(c)
    if host:
        doc["host"] = host | {"source": src}
    if c.link is not None:
        k = c.link
        doc["tiers"] = {"local": {"efficiency": 1.0, "step_latency_us": _r(k.step_latency_s * 1e6),
                                  "base_latency_us": _r(k.base_latency_s * 1e6),
                                  "collective_overhead_us": _r(k.collective_overhead_s * 1e6),
                                  "collective_efficiency": _r(k.collective_efficiency),
                                  "half_bandwidth_mb": _r(k.half_bandwidth_bytes / 1e6),
                                  "source": src}}
    return doc


def host_document(c: Calibrated) -> dict[str, Any]:
    """The overlay's `host:` section (simulator/host.py `HostCosts`): per kernel of a block pass
    (executor.hostbench: the block's process time per kernel-launching op at hidden 8, where the
    kernels' own arithmetic is next to nothing), per pipeline action of the executor's schedule, an
    exchange's wait for a process's communication thread after compute (by the compute), and per
    parameter tensor of an optimizer step. On a CPU the kernels run inside the dispatching call
    (`synchronous`)."""
    out: dict[str, Any] = {}
    b = c.block_host
    if b:
        out["op_dispatch_us"] = _r(b["forward_per_kernel_s"] * 1e6)
        out["backward_op_dispatch_us"] = _r(b["backward_per_kernel_s"] * 1e6)
    elif c.op_dispatch_s > 0:
        out["op_dispatch_us"] = _r(c.op_dispatch_s * 1e6)
    if out:
        out["synchronous"] = c.machine.device == "cpu"
    if c.pipeline_action_s:
        out["pipeline_action_us"] = {k: _r(v * 1e6) for k, v in c.pipeline_action_s.items()}
    if c.handoff_stall:
        out["handoff_stall_us_by_compute_us"] = [[_r(b * 1e6), _r(s * 1e6)]
                                                 for b, s in c.handoff_stall]
    if c.optimizer_step_per_tensor_s:
        out["optimizer_step_per_tensor_us"] = {k: _r(v * 1e6)
                                               for k, v in c.optimizer_step_per_tensor_s.items()}
    return out


def elementwise_rates(c: Calibrated) -> list[tuple[float, float]]:
    """(bytes, bytes/s) of the measured block elementwise kernels, with bytes counted as the
    simulator counts them for a GPT block in fp32 (simulator/compute.py _block_elementwise_bytes:
    two norms 2Th each, two residual adds 3Th each, GELU 2T*4h elements; 4 bytes each), the
    backward moving ELEMENTWISE_BWD_FACTOR times the forward's bytes. Sorted by bytes; points
    within 1% of each other are averaged."""
    from partita.simulator.compute import ELEMENTWISE_BWD_FACTOR
    points = []
    for tokens, hidden, t_f, t_fb in c.elementwise:
        nbytes = 4.0 * (2 * 2 + 2 * 3 + 2 * 4) * tokens * hidden
        points.append((nbytes, nbytes / t_f))
        back = ELEMENTWISE_BWD_FACTOR * nbytes
        points.append((back, back / max(t_fb - t_f, 1e-9)))
    merged: list[list[float]] = []
    for nbytes, rate in sorted(points):
        if merged and nbytes <= merged[-1][0] * 1.01:
            merged[-1][1:] = [merged[-1][1] + rate, merged[-1][2] + 1]
        else:
            merged.append([nbytes, rate, 1])
    return [(b, total / n) for b, total, n in merged]


def memory_curve(c: Calibrated) -> list[tuple[float, float]]:
    """(bytes, fraction of the best copy rate) for the memory-efficiency curve: the measured
    elementwise kernels, raised where a measured matmul shows more. A matmul moved its operands
    and result ((mk + kn + mn) elements, as the roofline of simulator/compute.py counts them) in
    the time it ran, so at that size the curve may not claim a slower transfer; otherwise the
    roofline would predict a small measured matmul slower than it ran (the elementwise points,
    several launch-bound passes, lie above its size and extend flat below)."""
    from partita.simulator.calibration import Curve
    from partita.simulator.compute import element_bytes
    bw = c.memory_bytes_per_s
    points = {b: min(rate / bw, MAX_EFFICIENCY) for b, rate in elementwise_rates(c)}
    measured = Curve(tuple(sorted(points)), tuple(points[b] for b in sorted(points)))
    for precision, rows in c.matmul.items():
        for m, n, k, rate in rows:
            nbytes = (m * k + k * n + m * n) * element_bytes(precision)
            shown = nbytes / (2.0 * m * n * k / rate) / bw * MATMUL_MARGIN
            points[nbytes] = min(max(points.get(nbytes, measured(nbytes)), shown), MAX_EFFICIENCY)
    return sorted(points.items())


def attention_efficiencies(c: Calibrated) -> tuple[float, float]:
    """Measured causal attention as fractions of the fp32 matmul rate, counted as the simulator
    counts them (simulator/compute.py: full forward FLOPs 4bhs^2d, times CAUSAL_FRACTION; the
    backward does FLASH_BWD_FACTOR times the forward's work)."""
    from partita.simulator.compute import CAUSAL_FRACTION, FLASH_BWD_FACTOR
    b, h, s, d = c.attention["shape"]
    work = 4.0 * b * h * s * s * d * CAUSAL_FRACTION
    peak = c.best_flops("fp32")
    t_f = c.attention["forward_s"]
    t_b = max(c.attention["forward_backward_s"] - t_f, 1e-9)
    fwd = work / (t_f * peak)
    bwd = FLASH_BWD_FACTOR * work / (t_b * peak)
    return min(fwd, MAX_EFFICIENCY), min(bwd, MAX_EFFICIENCY)


def write_documents(c: Calibrated, catalog_path: Path, calibration_path: Path) -> None:
    """Both files: written beside their targets, loaded back as the catalog and the simulator will
    load them, and only then renamed over the old ones (a failure leaves the old files as they were)."""
    head = (f"# Written by `{c.machine.source}` ({c.machine.processes} processes, "
            f"{c.machine.device}, torch {c.machine.torch_version}).\n"
            "# Run `partita calibrate` again to refresh it; edits are overwritten.\n")
    pending = [(_write_tmp(catalog_path, head, catalog_document(c)), catalog_path),
               (_write_tmp(calibration_path, head, calibration_document(c)), calibration_path)]
    try:
        _load_back(pending[0][0], pending[1][0])
        for tmp, path in pending:
            os.replace(tmp, path)
    except OSError as exc:
        raise PartitaError(f"{exc.filename}: cannot write ({exc.strerror or exc})") from None
    finally:
        for tmp, _ in pending:
            tmp.unlink(missing_ok=True)


def _write_tmp(path: Path, head: str, doc: dict[str, Any]) -> Path:
    import yaml
    text = head + yaml.dump(doc, Dumper=_plain_dumper(), sort_keys=False, default_flow_style=None,
                            width=100)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.yaml")
    try:
        tmp.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PartitaError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return tmp


def _load_back(catalog_file: Path, calibration_file: Path) -> None:
    """What was measured must load; a PartitaError here is a bug of this module, not bad input.
    The catalog is loaded without the current local file (which may be the broken one that this
    run replaces): PARTITA_HOME points at an empty folder meanwhile."""
    import tempfile
    from partita.planner.catalog import load_catalog
    from partita.simulator.calibration import load_calibration
    saved = os.environ.get("PARTITA_HOME")
    try:
        with tempfile.TemporaryDirectory(prefix="partita-home-") as empty:
            os.environ["PARTITA_HOME"] = empty
            load_catalog(catalog_file).system("local")
            load_calibration(calibration_file, include_local=False)
    except PartitaError as exc:
        raise RuntimeError(f"partita calibrate wrote a file that does not load: {exc}") from exc
    finally:
        if saved is None:
            os.environ.pop("PARTITA_HOME", None)
        else:
            os.environ["PARTITA_HOME"] = saved


def _plain_dumper():
    import yaml

    class PlainDumper(yaml.SafeDumper):
        """No `&id001` anchors for values that appear twice (the source list)."""
        def ignore_aliases(self, data: Any) -> bool:
            return True
    return PlainDumper


def check_writable(path: Path) -> None:
    """Fail before measuring if `path` cannot be written (its folder is created if missing)."""
    if path.is_dir():
        raise PartitaError(f"{path}: is a directory, expected a file name to write")
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise PartitaError(f"{path}: expected a .yaml or .yml file name to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PartitaError(f"{path.parent}: cannot create the folder "
                           f"({exc.strerror or exc})") from None
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists()
                                                         and not os.access(path, os.W_OK)):
        raise PartitaError(f"{path}: not writable")
