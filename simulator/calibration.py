"""Calibration data: achieved-vs-peak efficiency curves per GPU and per link tier, loaded from YAML.

The shipped files are data/calibration/compute.yaml (matmul, memory and attention efficiency per
GPU and precision), network.yaml (per tier: efficiency, latencies, half-bandwidth size),
memory.yaml (framework reserve) and fitted_memory.yaml (the reserve's fitted numbers); each number
there carries its source, in a section by provenance (facts, measured, fitted, chosen:
planner/provenance.py, merged on reading). `load_calibration()` reads them, then `$PARTITA_HOME/calibration-local.yaml` (default ~/.partita/, written by `partita
calibrate`) if present, then an optional extra file, and converts units once (SI inside).

An override file has any of the top-level sections of the shipped files, in the same format:

    gpus:                       # compute.yaml form, by GPU catalog name
      local-cpu:
        matmul:
          fp32: {peak_tflops: 1.2, measured_mnk_tflops: [[512, 512, 512, 0.4], [2048, 2048, 2048, 0.9]]}
        memory_efficiency_by_mb: [[1, 0.5], [100, 0.8]]
        source: ["partita calibrate 2026-08-01 on myhost"]
    tiers:                      # network.yaml form, by tier name
      local: {efficiency: 1.0, step_latency_us: 40, base_latency_us: 15, half_bandwidth_mb: 2}
    memory: {cuda_context_gib: 0.5}          # memory.yaml keys

Entries merge by name, field by field (a file may change one number of one GPU; one precision's
matmul data is replaced whole); a new name adds an entry. Errors name the file and the key path.
Reading and checking one file is simulator/calibration_file.py; this module merges and builds.

"Calibration" in partita is this data: how much of the datasheet rates a GPU and a link achieve
(this module) and the costs beside them (host.py, overheads.py). The numbers fitted end to end to
measured step times and peaks are "fitted" (partita.fitting writes data/calibration/fitted*.yaml);
measuring this machine is executor/measure_machine.py (`partita calibrate`, the command name of the
scenario contract), whose executor/machine_files.py writes an override file of this module's format.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from partita.planner.errors import PartitaError, unknown_name
from partita.planner.paths import CALIBRATION_DIR
from partita.simulator.attentionramp import AttentionRamp
from partita.simulator.calibration_file import (PRECISION_KEYS, TIER_REQUIRED, TIER_SCALES,
                                                parse_file)
from partita.simulator.curve import Curve
from partita.simulator.host import HostCosts

MEMORY_FILES = (CALIBRATION_DIR / "memory.yaml", CALIBRATION_DIR / "fitted_memory.yaml")


@dataclass(frozen=True)
class GpuCalibration:
    """Efficiencies of one GPU. Matmul curves are over ideal time (2mnk / peak, seconds)."""
    name: str
    matmul: dict[str, Curve] = field(hash=False)
    default_matmul: Curve
    memory: Curve                      # memory-bandwidth efficiency over bytes moved
    attention_forward: float
    attention_backward: float
    kernel_floor_s: float
    source: tuple[str, ...] = ()
    default_plateau: float = 1.0       # the plateau default_matmul is scaled to
    # Flash attention's efficiency relative to attention_forward/backward by sequence length and
    # head dimension (simulator/attentionramp.py); None: flat (e.g. measured at one shape locally).
    attention_ramp: AttentionRamp | None = None
    # FlashAttention-2's long-sequence efficiencies where the GPU's own flash kernel is a later
    # generation (Hopper: FlashAttention-3, cuDNN); None: FlashAttention-2 is its flash kernel.
    flash2_forward: float | None = None
    flash2_backward: float | None = None
    # FlashAttention (v1) relative to FlashAttention-2's best, by sequence length, head dimension
    # and mask (measured on A100, where both ran in one benchmark; another GPU runs v1 at that
    # fraction of its own FlashAttention-2's best).
    flash1_ramp: AttentionRamp | None = None
    # The ramp of the GPU's own flash kernel where it was measured apart from FlashAttention-2's
    # (Hopper: cuDNN's fused attention); None: attention_ramp serves both.
    flash_ramp: AttentionRamp | None = None

    def attention_efficiency(self, backward: bool, seq_len: float | None = None,
                             head_dim: float | None = None, causal: bool = True,
                             kernel: str = "flash") -> float:
        """Flash attention's fraction of the matmul peak: the long-sequence efficiency of `kernel`
        ("flash": the GPU's best flash kernel; "flash2": FlashAttention-2) times the ramp at this
        sequence length and head dimension (when both are given: `flash_ramp` for "flash" where the
        GPU has one, else `attention_ramp`); "flash1", FlashAttention (v1):
        FlashAttention-2's long-sequence efficiency times v1's rate relative to v2's best."""
        eff = self.attention_backward if backward else self.attention_forward
        if kernel in ("flash2", "flash1"):
            own = self.flash2_backward if backward else self.flash2_forward
            eff = eff if own is None else own
        if kernel == "flash1":
            if self.flash1_ramp is None:
                raise PartitaError(f"training.attention: flash1 has no FlashAttention (v1) rates in "
                                   f"the calibration of {self.name} (flash1_by_seq_tflops)")
            if seq_len is None or head_dim is None:         # no shape: at its best, as flash2
                return eff * self.flash1_ramp.best
            return eff * self.flash1_ramp(seq_len, head_dim, causal)
        ramp = (self.flash_ramp if kernel == "flash" and self.flash_ramp is not None
                else self.attention_ramp)
        if ramp is None or seq_len is None or head_dim is None:
            return eff
        return eff * ramp(seq_len, head_dim, causal)

    def matmul_efficiency(self, precision: str, ideal_s: float, measured_peak: bool = False) -> float:
        """Fraction of the peak at this ideal time. Against a measured peak (a GPU whose datasheet
        peak is unknown) the default curve's plateau is already in the peak, so only its shape
        applies."""
        curve = self.matmul.get(precision)
        if curve is not None:
            return curve(ideal_s)
        eff = self.default_matmul(ideal_s)
        return eff / self.default_plateau if measured_peak else eff

    def memory_efficiency(self, nbytes: float) -> float:
        return self.memory(nbytes)


@dataclass(frozen=True)
class TierCalibration:
    """One kind of link (nvswitch, efa, ...): see the model note in data/calibration/network.yaml."""
    kind: str
    efficiency: float
    step_latency_s: float
    base_latency_s: float
    half_bandwidth_bytes: float
    nvls_efficiency: dict[str, float] = field(default_factory=dict, hash=False)   # by GPU name
    source: tuple[str, ...] = ()
    simple_step_latency_s: float | None = None    # bandwidth (Simple) protocol; None: as LL
    collective_overhead_s: float = 0.0    # per collective call beyond a send's latency (measured)
    collective_efficiency: float = 1.0    # a ring collective's transfer rate / a send's (measured)


@dataclass(frozen=True)
class MemoryCalibration:
    cuda_context_bytes: float
    communication_buffers_bytes: float
    fragmentation_fraction: float
    source: tuple[str, ...] = ()
    # Buffers a training framework allocates besides the model's tensors, by framework name.
    framework_buffers_bytes: dict[str, float] = field(default_factory=dict, hash=False)
    # What CUDA reports as the device's total memory, by catalog GPU name, where a source measured
    # it below the catalog's capacity label (driver and ECC reserve); others: the label.
    usable_memory_bytes: dict[str, float] = field(default_factory=dict, hash=False)

    def usable_bytes(self, gpu_name: str, nominal_bytes: float) -> float:
        return self.usable_memory_bytes.get(gpu_name, nominal_bytes)

    def reserve_bytes(self, allocated_bytes: float, framework: str = "megatron") -> float:
        return (self.cuda_context_bytes + self.communication_buffers_bytes
                + self.framework_buffers_bytes.get(framework, 0.0)
                + self.fragmentation_fraction * allocated_bytes)


@dataclass(frozen=True)
class Calibration:
    gpus: dict[str, GpuCalibration] = field(hash=False)
    default: GpuCalibration
    tiers: dict[str, TierCalibration] = field(hash=False)
    memory: MemoryCalibration
    files: tuple[str, ...] = ()
    # The host costs `partita calibrate` measured on this machine (its overlay's `host:` section,
    # simulator/host.py); None where none was measured.
    local_host: HostCosts | None = None

    def gpu(self, name: str) -> GpuCalibration:
        """The GPU's calibration; a GPU without data gets the default curves under its own name."""
        found = self.gpus.get(name)
        if found is not None:
            return found
        d = self.default
        return GpuCalibration(name, {}, d.default_matmul, d.memory, d.attention_forward,
                              d.attention_backward, d.kernel_floor_s, d.source, d.default_plateau,
                              d.attention_ramp, flash1_ramp=d.flash1_ramp)

    def tier(self, kind: str) -> TierCalibration:
        if kind not in self.tiers:
            raise unknown_name("link tier in the calibration", kind, self.tiers)
        return self.tiers[kind]


def local_calibration_path() -> Path:
    """Where `partita calibrate` writes this machine's calibration overlay."""
    home = os.environ.get("PARTITA_HOME")
    base = Path(home) if home else Path.home() / ".partita"
    return base / "calibration-local.yaml"


def load_calibration(extra: str | Path | None = None, *, include_local: bool = True) -> Calibration:
    """Shipped calibration, then the local overlay (if present and asked for), then `extra`."""
    paths = [CALIBRATION_DIR / "compute.yaml", CALIBRATION_DIR / "network.yaml", *MEMORY_FILES]
    local = local_calibration_path()
    if include_local and local.is_file():
        paths.append(local)
    if extra is not None:
        extra = Path(extra)
        if not extra.exists():
            raise PartitaError(f"{extra}: no such calibration file")
        paths.append(extra)
    stamps = tuple((str(p), p.stat().st_mtime_ns) for p in paths)
    return _load(stamps)


@lru_cache(maxsize=8)
def _load(stamps: tuple[tuple[str, int], ...]) -> Calibration:
    merged: dict[str, Any] = {"default": {}, "gpus": {}, "tiers": {}, "memory": {}, "host": {}}
    first_seen: dict[tuple[str, str], str] = {}
    for path, _ in stamps:
        part = parse_file(path, shipped_memory=Path(path) in MEMORY_FILES)
        for section in merged:
            for name, value in part.get(section, {}).items():
                if isinstance(value, dict) and section in ("gpus", "tiers"):
                    first_seen.setdefault((section, name), path)
                    merged[section][name] = _deep_merge(merged[section].get(name, {}), value)
                else:
                    merged[section][name] = _deep_merge(merged[section].get(name), value)
    return _build(merged, first_seen, tuple(p for p, _ in stamps))


def _deep_merge(base: Any, over: Any) -> Any:
    if type(base) is dict and type(over) is dict:
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base.get(k), v)
        return out
    return over


# ---- building the records from the merged values ----

def _build(merged: dict[str, Any], first_seen: dict[tuple[str, str], str],
           files: tuple[str, ...]) -> Calibration:
    d, m, where = merged["default"], merged["memory"], files[0]
    _require(d, ("shape", "plateau", "memory", "attention_forward", "attention_backward",
                 "kernel_floor_s"), f"{where}: default")
    _require(m, ("cuda_context_bytes", "communication_buffers_bytes", "fragmentation_fraction"),
             f"{where}: memory")
    shape = Curve(*zip(*d["shape"]))
    peak_shape = max(shape.ys)
    default_curve = shape.scaled(d["plateau"] / peak_shape)
    default = GpuCalibration("default", {}, default_curve, Curve(*zip(*d["memory"])),
                             d["attention_forward"], d["attention_backward"], d["kernel_floor_s"],
                             tuple(d.get("source", ())), d["plateau"], d.get("attention_ramp"),
                             flash1_ramp=d.get("flash1_ramp"))
    gpus = {name: _build_gpu(name, merged["gpus"], shape, peak_shape, default, first_seen)
            for name in merged["gpus"]}
    tiers = {name: _build_tier(name, value, first_seen.get(("tiers", name), where))
             for name, value in merged["tiers"].items()}
    memory = MemoryCalibration(m["cuda_context_bytes"], m["communication_buffers_bytes"],
                               m["fragmentation_fraction"], tuple(m.get("source", ())),
                               dict(m.get("framework_buffers_bytes", {})),
                               dict(m.get("usable_memory_bytes", {})))
    host = merged["host"]
    return Calibration(gpus, default, tiers, memory, files,
                       HostCosts(**{k: v for k, v in host.items() if k != "source"})
                       if host else None)


def _require(values: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    for key in keys:
        if key not in values:
            raise PartitaError(f"{where}: missing required calibration value {key!r}")


def _resolve_like(name: str, entries: dict[str, Any], first_seen, seen=()) -> dict[str, Any]:
    entry = entries[name]
    base_name = entry.get("like")
    if base_name is None:
        return entry
    origin = first_seen.get(("gpus", name), "calibration")
    if base_name not in entries:
        raise PartitaError(f"{origin}: gpus.{name}.like: "
                           + str(unknown_name("GPU in the calibration", base_name, entries)))
    if base_name in seen or base_name == name:
        raise PartitaError(f"{origin}: gpus.{name}.like: circular reference through {base_name!r}")
    base = _resolve_like(base_name, entries, first_seen, seen + (name,))
    merged = _deep_merge(base, {k: v for k, v in entry.items() if k != "like"})
    merged.pop("like", None)
    return merged


def _build_gpu(name: str, entries: dict[str, Any], shape: Curve, peak_shape: float,
               default: GpuCalibration, first_seen) -> GpuCalibration:
    e = _resolve_like(name, entries, first_seen)
    origin = first_seen.get(("gpus", name), "calibration")
    raw = e.get("matmul", {})
    curves: dict[str, Curve] = {}
    for precision in PRECISION_KEYS:
        if precision in raw and "like_precision" not in raw[precision]:
            curves[precision] = _matmul_curve(raw[precision], shape, peak_shape, origin,
                                              f"gpus.{name}.matmul.{precision}")
    for precision in PRECISION_KEYS:
        other = raw.get(precision, {}).get("like_precision")
        if other is not None:
            if other not in curves:
                raise PartitaError(f"{origin}: gpus.{name}.matmul.{precision}.like_precision: "
                                   f"no measured data for {other!r} on {name}")
            curves[precision] = curves[other]
    memory = Curve(*zip(*e["memory"])) if "memory" in e else default.memory
    # A GPU with attention efficiencies of its own but no ramp measured them at one shape (e.g.
    # `partita calibrate`): flat. Without either it takes the default's, ramp included.
    own_attention = "attention_forward" in e or "attention_backward" in e
    ramp = e.get("attention_ramp", None if own_attention else default.attention_ramp)
    return GpuCalibration(name, curves, default.default_matmul, memory,
                          e.get("attention_forward", default.attention_forward),
                          e.get("attention_backward", default.attention_backward),
                          e.get("kernel_floor_s", default.kernel_floor_s),
                          tuple(e.get("source", ())), default.default_plateau, ramp,
                          e.get("flash2_forward"), e.get("flash2_backward"),
                          e.get("flash1_ramp", default.flash1_ramp), e.get("flash_ramp"))


def _matmul_curve(entry: dict[str, Any], shape: Curve, peak_shape: float, origin: str,
                  where: str) -> Curve:
    peak = entry.get("peak")
    if "measured" in entry:
        pts = sorted((flops / peak, achieved / peak) for flops, achieved in entry["measured"])
        xs, ys = [], []
        for x, y in pts:                       # equal ideal times: keep the better measurement
            if xs and math.isclose(x, xs[-1]):
                ys[-1] = max(ys[-1], y)
            else:
                xs.append(x)
                ys.append(y)
        return Curve(tuple(xs), tuple(ys))
    if "plateau" in entry:
        return shape.scaled(entry["plateau"] / peak / peak_shape)
    raise PartitaError(f"{origin}: {where}: expected measured_mnk_tflops, plateau_tflops or "
                       "like_precision")


def _build_tier(name: str, value: dict[str, Any], origin: str) -> TierCalibration:
    missing = [k for k in TIER_REQUIRED if TIER_SCALES.get(k, (k,))[0] not in value]
    if missing:
        raise PartitaError(f"{origin}: tiers.{name}: missing required key {missing[0]!r} "
                           f"(a new tier needs {', '.join(TIER_REQUIRED)})")
    return TierCalibration(name, value["efficiency"], value["step_latency_s"],
                           value["base_latency_s"], value["half_bandwidth_bytes"],
                           dict(value.get("nvls_efficiency", {})),
                           tuple(value.get("source", ())), value.get("simple_step_latency_s"),
                           value.get("collective_overhead_s", 0.0),
                           value.get("collective_efficiency", 1.0))

