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

from partita.planner.documents import Checker
from partita.planner.enums import FRAMEWORKS, OPTIMIZERS
from partita.planner.errors import PartitaError, unknown_name
from partita.planner.paths import CALIBRATION_DIR
from partita.planner.provenance import load_by_provenance
from partita.planner.units import GIB
from partita.simulator.attentionramp import CURVE_KEYS, AttentionRamp, ramp_from_tflops
from partita.simulator.curve import Curve
from partita.simulator.host import HostCosts

MB = 1e6
PRECISION_KEYS = ("fp32", "tf32", "fp16", "bf16", "fp8")
GPU_KEYS = ("like", "matmul", "memory_efficiency_by_mb", "attention_forward_efficiency",
            "attention_backward_efficiency", "attention_by_seq_tflops", "kernel_floor_us", "source",
            "notes")
DEFAULT_KEYS = ("matmul_shape_by_ideal_us", "matmul_plateau_efficiency", "memory_efficiency_by_mb",
                "attention_forward_efficiency", "attention_backward_efficiency",
                "attention_by_seq_tflops", "kernel_floor_us", "source", "notes")
RAMP_KEYS = ("peak_tflops", *CURVE_KEYS, "source", "notes")
MATMUL_KEYS = ("peak_tflops", "measured_mnk_tflops", "plateau_tflops", "like_precision", "source",
               "notes")
TIER_KEYS = ("efficiency", "step_latency_us", "simple_step_latency_us", "base_latency_us",
             "collective_overhead_us",
             "half_bandwidth_mb", "nvls_efficiency_by_gpu", "source", "notes")
TIER_SCALES = {"step_latency_us": ("step_latency_s", 1e-6),
               "simple_step_latency_us": ("simple_step_latency_s", 1e-6),
               "base_latency_us": ("base_latency_s", 1e-6),
               "collective_overhead_us": ("collective_overhead_s", 1e-6),
               "half_bandwidth_mb": ("half_bandwidth_bytes", MB)}
TIER_REQUIRED = ("efficiency", "step_latency_us", "base_latency_us", "half_bandwidth_mb")
HOST_KEYS = ("op_dispatch_us", "backward_op_dispatch_us", "pipeline_action_us", "synchronous",
             "optimizer_step_per_tensor_us", "source")
MEMORY_KEYS = ("usable_memory_gib", "cuda_context_gib", "communication_buffers_gib",
               "fragmentation_fraction",
               "framework_buffers_gib", "source", "notes")
FIT_RECORD_KEYS = ("command", "objective", "rows", "loss")     # beside the numbers of a fitted file
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

    def attention_efficiency(self, backward: bool, seq_len: float | None = None,
                             head_dim: float | None = None, causal: bool = True) -> float:
        """Flash attention's fraction of the matmul peak: the long-sequence efficiency times the
        ramp at this sequence length and head dimension (when both are given)."""
        eff = self.attention_backward if backward else self.attention_forward
        if self.attention_ramp is None or seq_len is None or head_dim is None:
            return eff
        return eff * self.attention_ramp(seq_len, head_dim, causal)

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
                              d.attention_ramp)

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
        part = _parse_file(path, shipped_memory=Path(path) in MEMORY_FILES)
        for section in merged:
            for name, value in part.get(section, {}).items():
                if isinstance(value, dict) and section in ("gpus", "tiers"):
                    first_seen.setdefault((section, name), path)
                    merged[section][name] = _deep_merge(merged[section].get(name, {}), value)
                else:
                    merged[section][name] = _deep_merge(merged[section].get(name), value)
    return _build(merged, first_seen, tuple(p for p, _ in stamps))


class _Whole(dict):
    """A value that an override replaces as a whole (one precision's matmul data)."""


def _deep_merge(base: Any, over: Any) -> Any:
    if type(base) is dict and type(over) is dict:
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base.get(k), v)
        return out
    return over


# ---- reading one file into validated, SI, possibly partial values ----

def _parse_file(path: str, shipped_memory: bool) -> dict[str, Any]:
    doc = load_by_provenance(path)
    top = Checker(doc, "", path)
    if shipped_memory:                      # memory.yaml holds the memory keys at the top level
        return {"memory": _parse_memory(top, FIT_RECORD_KEYS)}
    top.only(("default", "gpus", "tiers", "memory", "host", "source", "notes"))
    out: dict[str, Any] = {}
    if top.has("default"):
        out["default"] = _parse_gpu(top.sub("default"), DEFAULT_KEYS)
    if top.has("gpus"):
        gpus = top.sub("gpus")
        out["gpus"] = {str(name): _parse_gpu(gpus.sub(str(name)), GPU_KEYS) for name in gpus.mapping}
    if top.has("tiers"):
        tiers = top.sub("tiers")
        out["tiers"] = {str(name): _parse_tier(tiers.sub(str(name))) for name in tiers.mapping}
    if top.has("memory"):
        out["memory"] = _parse_memory(top.sub("memory"))
    if top.has("host"):
        out["host"] = _parse_host(top.sub("host"))
    return out


def _parse_host(c: Checker) -> dict[str, Any]:
    """A measured machine's host costs (simulator/host.py `HostCosts`), SI."""
    c.only(HOST_KEYS)
    out: dict[str, Any] = {}
    for key in ("op_dispatch_us", "backward_op_dispatch_us", "pipeline_action_us"):
        if c.has(key):
            out[key.replace("_us", "_s")] = c.number(key, positive=False, minimum=0.0) * 1e-6
    if c.has("synchronous"):
        out["synchronous"] = c.bool("synchronous", False)
    if c.has("optimizer_step_per_tensor_us"):
        per = c.sub("optimizer_step_per_tensor_us")
        per.only(OPTIMIZERS)
        out["optimizer_step_per_tensor_s"] = {
            name: per.number(name, positive=False, minimum=0.0) * 1e-6 for name in per.mapping}
    return out


def _parse_gpu(c: Checker, keys: tuple[str, ...]) -> dict[str, Any]:
    c.only(keys)
    out: dict[str, Any] = {}
    if c.has("like"):
        out["like"] = c.str("like")
    if c.has("matmul"):
        mm = c.sub("matmul")
        mm.only(PRECISION_KEYS)
        out["matmul"] = {p: _Whole(_parse_matmul(mm.sub(p))) for p in PRECISION_KEYS if mm.has(p)}
    if c.has("matmul_shape_by_ideal_us"):
        out["shape"] = _points(c, "matmul_shape_by_ideal_us", 1e-6, 1.0)
    if c.has("matmul_plateau_efficiency"):
        out["plateau"] = _fraction(c, "matmul_plateau_efficiency")
    if c.has("memory_efficiency_by_mb"):
        out["memory"] = _points(c, "memory_efficiency_by_mb", MB, 1.0)
    for key, name in (("attention_forward_efficiency", "attention_forward"),
                      ("attention_backward_efficiency", "attention_backward")):
        if c.has(key):
            out[name] = _fraction(c, key)
    if c.has("attention_by_seq_tflops"):
        out["attention_ramp"] = _parse_ramp(c.sub("attention_by_seq_tflops"))
    if c.has("kernel_floor_us"):
        out["kernel_floor_s"] = c.number("kernel_floor_us", positive=False) * 1e-6
    if c.has("source"):
        out["source"] = _strings(c, "source")
    return out


def _parse_matmul(c: Checker) -> dict[str, Any]:
    c.only(MATMUL_KEYS)
    forms = [k for k in ("measured_mnk_tflops", "plateau_tflops", "like_precision") if c.has(k)]
    if len(forms) > 1:
        raise c.error(f"expected one of measured_mnk_tflops, plateau_tflops, like_precision; "
                      f"got {', '.join(forms)}")
    out: dict[str, Any] = {}
    if c.has("like_precision"):
        out["like_precision"] = c.choice("like_precision", PRECISION_KEYS)
    if c.has("peak_tflops"):
        out["peak"] = c.number("peak_tflops") * 1e12
    if c.has("plateau_tflops"):
        out["plateau"] = c.number("plateau_tflops") * 1e12
    if c.has("measured_mnk_tflops"):
        out["measured"] = _mnk_points(c)
    if ("plateau" in out or "measured" in out) and "peak" not in out:
        raise c.error("missing required key (expected a number: the datasheet peak the "
                      "measurements are relative to)", "peak_tflops")
    if c.has("source"):
        out["source"] = _strings(c, "source")
    return out


def _parse_ramp(c: Checker) -> AttentionRamp:
    """attention_by_seq_tflops: {peak_tflops, causal_hd64: [[seq, TFLOP/s], ...], causal_hd128,
    full_hd64, full_hd128, source}: a flash kernel's measured rates (simulator/attentionramp.py)."""
    c.only(RAMP_KEYS)
    c.number("peak_tflops")         # the figure's peak: kept for the reader, the ramp is relative
    points = {}
    for key in CURVE_KEYS:
        if not c.has(key):
            raise c.error(f"missing required key (expected [[sequence length, TFLOP/s], ...]; "
                          f"a ramp needs {', '.join(CURVE_KEYS)})", key)
        points[key] = list(_rows(c, key, "[sequence length, TFLOP/s]"))
    return ramp_from_tflops(points, _strings(c, "source") if c.has("source") else ())


def _parse_tier(c: Checker) -> dict[str, Any]:
    c.only(TIER_KEYS)
    out: dict[str, Any] = {}
    if c.has("efficiency"):
        out["efficiency"] = _fraction(c, "efficiency")
    if c.has("nvls_efficiency_by_gpu"):
        by_gpu = c.sub("nvls_efficiency_by_gpu")
        out["nvls_efficiency"] = {str(g): by_gpu.number(str(g), required=True) for g in by_gpu.mapping}
    for key, (name, scale) in TIER_SCALES.items():
        if c.has(key):
            out[name] = c.number(key, positive=False) * scale
            if out[name] < 0:
                raise c.error(f"must be >= 0, got {c.mapping[key]}", key)
    if c.has("source"):
        out["source"] = _strings(c, "source")
    return out


def _parse_memory(c: Checker, record_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    c.only(MEMORY_KEYS + record_keys)
    out: dict[str, Any] = {}
    for key, name in (("cuda_context_gib", "cuda_context_bytes"),
                      ("communication_buffers_gib", "communication_buffers_bytes")):
        if c.has(key):
            out[name] = c.number(key, positive=False) * GIB
    if c.has("fragmentation_fraction"):
        out["fragmentation_fraction"] = c.number("fragmentation_fraction", positive=False)
    if c.has("framework_buffers_gib"):
        sub = c.sub("framework_buffers_gib")
        sub.only(FRAMEWORKS)
        out["framework_buffers_bytes"] = {name: sub.number(name, positive=False) * GIB
                                          for name in sub.mapping}
    if c.has("usable_memory_gib"):
        sub = c.sub("usable_memory_gib")
        out["usable_memory_bytes"] = {str(name): sub.number(name) * GIB for name in sub.mapping}
    if c.has("source"):
        out["source"] = _strings(c, "source")
    return out


def _fraction(c: Checker, key: str) -> float:
    value = c.number(key)
    if value > 1.5:
        raise c.error(f"expected an efficiency (a fraction of peak, about 0-1), got {value}", key)
    return value


def _rows(c: Checker, key: str, shape: str) -> list[tuple[float, ...]]:
    """A list of equal-length rows of positive numbers, e.g. shape '[x, y]'."""
    width = shape.count(",") + 1
    raw = c.mapping[key]
    if not isinstance(raw, list) or not raw:
        raise c.error(f"expected a list of {shape} rows", key)
    for i, item in enumerate(raw):
        ok = isinstance(item, (list, tuple)) and len(item) == width and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in item)
        if not ok:
            raise c.error(f"entry {i}: expected {shape} with numbers > 0, got {item!r}", key)
    return [tuple(float(v) for v in item) for item in raw]


def _points(c: Checker, key: str, x_scale: float, y_scale: float) -> tuple[tuple[float, float], ...]:
    pts = tuple((x * x_scale, y * y_scale) for x, y in _rows(c, key, "[x, y]"))
    if any(b[0] <= a[0] for a, b in zip(pts, pts[1:])):
        raise c.error("x values must increase strictly from one point to the next", key)
    return pts


def _mnk_points(c: Checker) -> tuple[tuple[float, float], ...]:
    """(FLOPs, achieved FLOP/s) of each measured matmul."""
    rows = _rows(c, "measured_mnk_tflops", "[m, n, k, tflops]")
    return tuple((2.0 * m * n * k, tflops * 1e12) for m, n, k, tflops in rows)


def _strings(c: Checker, key: str) -> tuple[str, ...]:
    raw = c.mapping[key]
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(s, str) and s for s in raw):
        raise c.error("expected a list of names", key)
    return tuple(raw)


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
                             tuple(d.get("source", ())), d["plateau"], d.get("attention_ramp"))
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
                          tuple(e.get("source", ())), default.default_plateau, ramp)


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
                           value.get("collective_overhead_s", 0.0))

