"""`partita profile FILE [--json] [--measure] [--micro-batch N]`: per-layer costs of a scenario's model.

Usage:
    partita profile llama2-70b-h100                # a shipped example: table of layers and totals
    partita profile my.yaml --json                 # one JSON object (total_params, total_flops, layers)
    partita profile my.yaml --measure --micro-batch 2   # also time each layer on this machine

The model is profiled on the meta device (planner.profiler): FLOPs, parameters, bytes saved for
backward and bytes passed on, per layer, for one micro-batch (the scenario's training.micro_batch
unless --micro-batch) at the scenario's precision. Transformer models also get the simulator's
predicted forward and backward time of each layer on one GPU of the scenario's cluster.system (no
tensor or context parallelism; simulator.layertimes). --measure times each layer forward and backward
on this machine's accelerator (else the CPU) and reports the achieved TFLOP/s.
"""
from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

import partita.commands as commands
from partita.commands import add_catalog_option
from partita.planner.errors import PartitaError
from partita.planner.units import MIB

if TYPE_CHECKING:
    from partita.simulator.layertimes import LayerPrediction

W = 12            # width of a numeric column


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="per-layer FLOPs, parameters and activation bytes of a model",
                       description=__doc__.splitlines()[0])
    p.add_argument("file", metavar="FILE", help="scenario file (YAML/JSON) or a shipped example's name")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--measure", action="store_true",
                   help="also time each layer forward and backward on this machine")
    p.add_argument("--micro-batch", type=_count, metavar="N", default=None,
                   help="sequences per micro-batch (default: the scenario's training.micro_batch)")
    p.add_argument("--device", default=None, help="device for --measure (default: cuda if available, else cpu)")
    p.add_argument("--repeats", type=_count, default=5, metavar="N",
                   help="timed repetitions per layer for --measure, median kept (default 5)")
    add_catalog_option(p)
    p.set_defaults(func=run)


def _count(text: str) -> int:
    """A whole number from 1 to 2**16 (a usage error otherwise: exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= 1 << 16:
        raise argparse.ArgumentTypeError(f"must be from 1 to {1 << 16}, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    from partita.planner.scenario import load_scenario
    from partita.planner.profiler import profile_module
    from partita.simulator.layertimes import predict_layers

    scenario = load_scenario(args.file)
    micro_batch = args.micro_batch if args.micro_batch is not None else scenario.training.micro_batch
    if args.device is not None and not args.measure:
        raise PartitaError("--device: only with --measure (it is where layers are timed)")
    if args.measure:
        check_device(args.device)
    if scenario.model.module is not None:      # user code runs last, after every other check
        check_hardware(scenario, args)
    profile = profile_module(scenario.model, micro_batch=micro_batch, seq_len=scenario.model.seq_len,
                             precision=scenario.training.precision, measure=args.measure,
                             device=args.device, repeats=args.repeats,
                             name=scenario.name or _model_label(scenario.model))
    prediction = predict_layers(scenario, micro_batch, commands.catalog_file(args))
    if args.json:
        print(json.dumps(to_json(profile, prediction)))
    else:
        print(format_table(profile, prediction))
    return 0


def check_device(name: str | None) -> None:
    """--device for --measure: a torch device this machine has (cpu, cuda, cuda:N, mps)."""
    if name is None:
        return
    import torch
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise PartitaError(f"--device: unknown device {name!r} (valid: cpu, cuda, cuda:N, mps)") \
            from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have == 0:
            raise PartitaError(f"--device {name}: no CUDA device on this machine; use --device cpu")
        if dev.index is not None and dev.index >= have:
            raise PartitaError(f"--device {name}: this machine has {have} CUDA devices (cuda:0 to "
                               f"cuda:{have - 1})")
        return
    if dev.type == "mps" and torch.backends.mps.is_available():
        return
    raise PartitaError(f"--device {name}: not available on this machine (valid here: cpu"
                       + (", cuda" if torch.cuda.is_available() else "") + ")")


def check_hardware(scenario, args: argparse.Namespace) -> None:
    """The scenario's system and precision, checked before a `module:` model's code is run."""
    hw = commands.catalog_from_args(args).resolve_cluster(scenario.cluster, scenario.origin)
    try:
        hw.system.gpu.peak(scenario.training.precision)
    except PartitaError as exc:
        where = f"{scenario.origin}: " if scenario.origin else ""
        raise PartitaError(f"{where}training.precision: {exc}") from None


def _model_label(spec) -> str:
    if spec.preset:
        return spec.preset
    if spec.module:
        return spec.module
    dims = spec.resolve()
    return dims.name or dims.arch


def to_json(profile, prediction: LayerPrediction | None = None) -> dict:
    """The profile as the contract's JSON object; measured layers also carry achieved_flops_per_s,
    predicted ones predicted_fwd_s / predicted_bwd_s (on `predicted_gpu`)."""
    from partita.planner.profiler import achieved_flops_per_s

    out = profile.to_dict()
    if prediction is not None:
        out["predicted_gpu"] = prediction.gpu
        if prediction.times is None:
            out["predicted_unavailable"] = prediction.reason
    for i, (layer, entry) in enumerate(zip(profile.layers, out["layers"])):
        rate = achieved_flops_per_s(layer)
        if rate is not None:
            entry["achieved_flops_per_s"] = rate
        if prediction is not None and prediction.times is not None:
            entry["predicted_fwd_s"], entry["predicted_bwd_s"] = prediction.times[i]
    return out


def format_table(profile, prediction: LayerPrediction | None = None) -> str:
    from partita.planner.profiler import achieved_flops_per_s

    measured = profile.device is not None
    predicted = prediction is not None and prediction.times is not None
    head = f"{'layer':<14}{'params':>16}" + "".join(f"{c:>{W}}" for c in
                                                   ("fwd GFLOP", "bwd GFLOP", "act MiB", "out MiB"))
    if predicted:
        head += f"{'pred fwd ms':>{W}}{'pred bwd ms':>{W}}"
    if measured:
        head += f"{'fwd ms':>{W}}{'bwd ms':>{W}}{'TFLOP/s':>{W}}"
    lines = [_title(profile, prediction), head]
    for i, layer in enumerate(profile.layers):
        cells = [layer.fwd_flops / 1e9, layer.bwd_flops / 1e9, layer.activation_bytes / MIB,
                 layer.output_bytes / MIB]
        if predicted:
            cells += [t * 1e3 for t in prediction.times[i]]
        if measured:
            cells += [layer.fwd_s * 1e3, layer.bwd_s * 1e3, (achieved_flops_per_s(layer) or 0.0) / 1e12]
        row = f"{layer.name:<14}{layer.params:>16,}" + "".join(f"{_num(c):>{W}}" for c in cells)
        lines.append(row)
    lines.append(_totals(profile, prediction if predicted else None, measured))
    if prediction is not None and not predicted:
        lines.append(f"(no predicted times: {prediction.reason})")
    return "\n".join(lines)


def _title(profile, prediction: LayerPrediction | None) -> str:
    title = (f"{profile.model}: {profile.method} profile, {profile.precision}, micro-batch "
             f"{profile.micro_batch} x {profile.seq_len} tokens")
    if prediction is not None and prediction.times is not None:
        title += f", predicted on one {prediction.gpu}"
    if profile.device is not None:
        title += f", timed on {profile.device}"
    return title


def _num(x: float) -> str:
    """Four significant digits, without switching to exponents for the sizes seen here."""
    return f"{x:.4g}" if x == 0 or 1e-3 <= abs(x) < 1e7 else f"{x:.3e}"


def _totals(profile, prediction: LayerPrediction | None, measured: bool) -> str:
    layers = profile.layers
    cells = [_num(sum(l.fwd_flops for l in layers) / 1e9), _num(sum(l.bwd_flops for l in layers) / 1e9),
             _num(sum(l.activation_bytes for l in layers) / MIB), ""]
    if prediction is not None:
        cells += [_num(sum(f for f, _ in prediction.times) * 1e3),
                  _num(sum(b for _, b in prediction.times) * 1e3)]
    if measured:
        fwd, bwd = sum(l.fwd_s for l in layers), sum(l.bwd_s for l in layers)
        rate = profile.total_flops / (fwd + bwd) if fwd + bwd > 0 else 0.0
        cells += [_num(fwd * 1e3), _num(bwd * 1e3), _num(rate / 1e12)]
    return f"{'total':<14}{profile.total_params:>16,}" + "".join(f"{c:>{W}}" for c in cells)
