"""One calibration file read into validated, SI, possibly partial values (simulator.calibration
merges them and builds the records). The keys each section accepts and their units are here; an
unknown key, a wrong type or a number out of range is an error naming the file and the key path."""
from __future__ import annotations

from typing import Any

from partita.planner.documents import Checker
from partita.planner.enums import FRAMEWORKS, OPTIMIZERS, SCHEDULES
from partita.planner.provenance import load_by_provenance
from partita.planner.units import GIB
from partita.simulator.attentionramp import CURVE_KEYS, AttentionRamp, ramp_from_tflops

MB = 1e6
PRECISION_KEYS = ("fp32", "tf32", "fp16", "bf16", "fp8")
GPU_KEYS = ("like", "matmul", "memory_efficiency_by_mb", "attention_forward_efficiency",
            "attention_backward_efficiency", "flash2_forward_efficiency",
            "flash2_backward_efficiency", "attention_by_seq_tflops", "flash_by_seq_tflops",
            "kernel_floor_us", "source", "notes")
DEFAULT_KEYS = ("matmul_shape_by_ideal_us", "matmul_plateau_efficiency", "memory_efficiency_by_mb",
                "attention_forward_efficiency", "attention_backward_efficiency",
                "attention_by_seq_tflops", "flash1_by_seq_tflops", "kernel_floor_us", "source",
                "notes")
RAMP_KEYS = ("peak_tflops", *CURVE_KEYS, "source", "notes")
MATMUL_KEYS = ("peak_tflops", "measured_mnk_tflops", "plateau_tflops", "like_precision", "source",
               "notes")
TIER_KEYS = ("efficiency", "step_latency_us", "simple_step_latency_us", "base_latency_us",
             "collective_overhead_us", "collective_efficiency",
             "half_bandwidth_mb", "nvls_efficiency_by_gpu", "source", "notes")
TIER_SCALES = {"step_latency_us": ("step_latency_s", 1e-6),
               "simple_step_latency_us": ("simple_step_latency_s", 1e-6),
               "base_latency_us": ("base_latency_s", 1e-6),
               "collective_overhead_us": ("collective_overhead_s", 1e-6),
               "half_bandwidth_mb": ("half_bandwidth_bytes", MB)}
TIER_REQUIRED = ("efficiency", "step_latency_us", "base_latency_us", "half_bandwidth_mb")
HOST_KEYS = ("op_dispatch_us", "backward_op_dispatch_us", "pipeline_action_us", "synchronous",
             "optimizer_step_per_tensor_us", "handoff_stall_us_by_compute_us", "source")
MEMORY_KEYS = ("usable_memory_gib", "cuda_context_gib", "communication_buffers_gib",
               "fragmentation_fraction",
               "framework_buffers_gib", "source", "notes")
FIT_RECORD_KEYS = ("command", "objective", "rows", "loss")     # beside the numbers of a fitted file


class _Whole(dict):
    """A value that an override replaces as a whole (one precision's matmul data)."""


def parse_file(path: str, shipped_memory: bool) -> dict[str, Any]:
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
    for key in ("op_dispatch_us", "backward_op_dispatch_us"):
        if c.has(key):
            out[key.replace("_us", "_s")] = c.number(key, positive=False, minimum=0.0) * 1e-6
    if c.has("pipeline_action_us") and not isinstance(c.mapping["pipeline_action_us"], dict):
        # a file from before the schedules were timed apart: it timed Schedule1F1B
        out["pipeline_action_s"] = {
            "1f1b": c.number("pipeline_action_us", positive=False, minimum=0.0) * 1e-6}
    elif c.has("pipeline_action_us"):
        per = c.sub("pipeline_action_us")
        per.only(SCHEDULES)
        out["pipeline_action_s"] = {
            name: per.number(name, positive=False, minimum=0.0) * 1e-6 for name in per.mapping}
    if c.has("synchronous"):
        out["synchronous"] = c.bool("synchronous", False)
    if c.has("handoff_stall_us_by_compute_us"):
        # a stall measured as 0 (the scheduler happened to run the thread at once) is valid
        out["handoff_stall_s"] = _points(c, "handoff_stall_us_by_compute_us", 1e-6, 1e-6,
                                         zero_y=True)
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
                      ("attention_backward_efficiency", "attention_backward"),
                      ("flash2_forward_efficiency", "flash2_forward"),
                      ("flash2_backward_efficiency", "flash2_backward")):
        if c.has(key):
            out[name] = _fraction(c, key)
    if c.has("attention_by_seq_tflops"):
        out["attention_ramp"] = _parse_ramp(c.sub("attention_by_seq_tflops"))
    if c.has("flash_by_seq_tflops"):
        # The GPU's own flash kernel (`training.attention: flash`), where it ramps otherwise than
        # FlashAttention-2 (attention_by_seq_tflops): relative to its rate at the longest sequence,
        # head dim 128, no mask, the point attention_*_efficiency holds (the published kernels'
        # best, at 16k tokens), so a shorter sequence that measured faster stands above 1.
        ramp = c.sub("flash_by_seq_tflops")
        reference = None
        if ramp.has("full_hd128"):          # a missing curve is _parse_ramp's to name
            reference = max(_rows(ramp, "full_hd128", "[sequence length, TFLOP/s]"))[1]
        out["flash_ramp"] = _parse_ramp(ramp, reference)
    if c.has("flash1_by_seq_tflops"):
        # FlashAttention (v1) in the same figure as attention_by_seq_tflops (FlashAttention-2): its
        # rates relative to FlashAttention-2's best (simulator/attentionramp.py).
        if not c.has("attention_by_seq_tflops"):
            raise c.error("needs attention_by_seq_tflops beside it (FlashAttention-2's rates in "
                          "the same benchmark)", "flash1_by_seq_tflops")
        fa2 = c.sub("attention_by_seq_tflops")
        best = max(t for key in CURVE_KEYS for _, t in _rows(fa2, key, "[sequence length, TFLOP/s]"))
        out["flash1_ramp"] = _parse_ramp(c.sub("flash1_by_seq_tflops"), best)
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


def _parse_ramp(c: Checker, best: float | None = None) -> AttentionRamp:
    """attention_by_seq_tflops: {peak_tflops, causal_hd64: [[seq, TFLOP/s], ...], causal_hd128,
    full_hd64, full_hd128, source}: a flash kernel's measured rates (simulator/attentionramp.py),
    relative to their best or to `best`."""
    c.only(RAMP_KEYS)
    c.number("peak_tflops")         # the figure's peak: kept for the reader, the ramp is relative
    points = {}
    for key in CURVE_KEYS:
        if not c.has(key):
            raise c.error(f"missing required key (expected [[sequence length, TFLOP/s], ...]; "
                          f"a ramp needs {', '.join(CURVE_KEYS)})", key)
        points[key] = list(_rows(c, key, "[sequence length, TFLOP/s]"))
    return ramp_from_tflops(points, _strings(c, "source") if c.has("source") else (), best)


def _parse_tier(c: Checker) -> dict[str, Any]:
    c.only(TIER_KEYS)
    out: dict[str, Any] = {}
    if c.has("efficiency"):
        out["efficiency"] = _fraction(c, "efficiency")
    if c.has("collective_efficiency"):
        out["collective_efficiency"] = _fraction(c, "collective_efficiency")
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


def _rows(c: Checker, key: str, shape: str, zero_last: bool = False) -> list[tuple[float, ...]]:
    """A list of equal-length rows of positive numbers, e.g. shape '[x, y]' (`zero_last`: the
    last number of a row may be 0, as a measured stall may)."""
    width = shape.count(",") + 1
    raw = c.mapping[key]
    if not isinstance(raw, list) or not raw:
        raise c.error(f"expected a list of {shape} rows", key)
    for i, item in enumerate(raw):
        ok = isinstance(item, (list, tuple)) and len(item) == width and all(
            isinstance(v, (int, float)) and not isinstance(v, bool)
            and (v > 0 or (v == 0 and zero_last and j == width - 1)) for j, v in enumerate(item))
        if not ok:
            bound = "numbers > 0 (the last >= 0)" if zero_last else "numbers > 0"
            raise c.error(f"entry {i}: expected {shape} with {bound}, got {item!r}", key)
    return [tuple(float(v) for v in item) for item in raw]


def _points(c: Checker, key: str, x_scale: float, y_scale: float,
            zero_y: bool = False) -> tuple[tuple[float, float], ...]:
    pts = tuple((x * x_scale, y * y_scale) for x, y in _rows(c, key, "[x, y]", zero_y))
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
