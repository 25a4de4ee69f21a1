"""`partita simulate FILE... [--json] [--trace OUT.json]`: predict one training step of each scenario."""
from __future__ import annotations

import argparse
import json
import sys

from partita.commands import add_catalog_option, catalog_from_args
from partita.planner.errors import PartitaError
from partita.planner.units import GIB


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="predict one training step of a scenario",
                       description="Predict one training step: time, throughput, MFU, memory, breakdown.")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="scenario file (YAML/JSON) or the name of a shipped example")
    p.add_argument("--json", action="store_true", help="print one JSON object (JSON Lines for several files)")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace of the simulated step")
    add_catalog_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from partita.planner.scenario import load_scenario
    from partita.simulator.step import simulate

    if args.trace and len(args.files) > 1:
        raise PartitaError("--trace takes one scenario file, got "
                           f"{len(args.files)}; simulate them one at a time")
    catalog = catalog_from_args(args)
    failed = False
    for path in args.files:
        try:
            scenario = load_scenario(path)
            result = simulate(scenario, catalog, trace=bool(args.trace))
        except PartitaError as exc:
            if len(args.files) == 1:
                raise
            failed = True
            if args.json:
                print(json.dumps({"file": path, "error": str(exc)}), flush=True)
            else:
                print(f"error: {exc}", file=sys.stderr)
            continue
        if args.trace:
            from partita.simulator.trace import write_trace
            write_trace(result.spans, args.trace, metadata={"scenario": scenario.name or str(path)})
        if args.json:
            out = result.to_json()
            if len(args.files) > 1:
                out = {"file": path, **out}
            print(json.dumps(out, sort_keys=False))
        else:
            print(format_summary(scenario, result, path))
    return 1 if failed else 0


def format_summary(scenario, r, path: str) -> str:
    from partita.planner.layergraph import MEMORY_PRESSURE_FRACTION
    p = scenario.parallel
    lines = [
        f"{scenario.name or path}: {r.gpus} GPUs on {r.details.get('nodes', 1)} x {r.system}  "
        f"TP {p.tensor} x PP {p.pipeline} x CP {p.context} x DP {p.data}, {p.schedule}"
        + (f" (v={p.virtual_stages})" if p.virtual_stages > 1 else "")
        + (f", ZeRO-{p.zero}" if p.zero else "")
        + (f" in shards of {p.data_shard}" if p.data_shard is not None else "")
        + (f", recompute {scenario.training.recompute}" if scenario.training.recompute != "none"
           else "")
        + (f" ({scenario.training.recompute_num_layers} blocks per chunk)"
           if scenario.training.recompute_num_layers is not None else ""),
        f"  step time        {r.step_time_s:10.4f} s"
        + (f"   90% interval {r.step_time_interval_s[0]:.4g}-{r.step_time_interval_s[1]:.4g} s "
           f"(errors of {r.interval_rows} runs of sources left out of the fit)"
           if getattr(r, "step_time_interval_s", None) else ""),
        f"  throughput       {r.tokens_per_s:10.1f} tokens/s   {r.samples_per_s:.2f} samples/s",
        f"  model TFLOP/s    {r.tflops_per_gpu:10.1f} per GPU   MFU {100 * r.mfu:.1f}%",
        f"  peak memory      {r.peak_memory_gib:10.2f} GiB of {r.memory_capacity_bytes / GIB:.1f} GiB"
        + ("" if r.fits_in_memory else "   DOES NOT FIT")
        + (f"   NEAR CAPACITY (above {100 * MEMORY_PRESSURE_FRACTION:.0f}%: allocator cache flushes "
           "can slow the step; the prediction has no term for them)" if r.near_memory_capacity else ""),
        f"  bubble           {100 * r.bubble_fraction:10.1f} %",
    ]
    if r.usd_per_step is not None:
        lines.append(f"  cost             {r.usd_per_step:10.4f} $ per step   "
                     f"({r.usd_per_hour:.2f} $/h for the cluster)")
    lines.append("  where the time goes (critical rank):")
    total = r.step_time_s or 1.0
    for key, value in r.breakdown_s.items():
        lines.append(f"    {key:<14} {value:10.4f} s  {100 * value / total:5.1f}%")
    lines.append("  memory per GPU (GiB): " + ", ".join(
        f"{k} {v / GIB:.2f}" for k, v in r.memory_breakdown_bytes.items()))
    lines += stage_lines(r)
    return "\n".join(lines)


STAGE_KEYS = ("parameters", "gradients", "optimizer", "activations", "buffers", "reserve")
STAGE_LABELS = ("params", "grads", "optim", "activ", "buffers", "reserve")


def layer_text(chunks: list[list[int]]) -> str:
    """'0-3, 16-19' for the [start, stop) block ranges of one pipeline rank's chunks."""
    return ", ".join(f"{a}-{b - 1}" if b - a > 1 else (f"{a}" if b > a else "none")
                     for a, b in chunks)


def stage_lines(r) -> list[str]:
    """Which transformer blocks sit on which pipeline stage, and that stage's memory (GiB)."""
    layers, memory = r.details.get("stage_layers"), r.details.get("stage_memory_bytes")
    if not layers or not memory:
        return []
    width = max(6, max(len(layer_text(c)) for c in layers))
    head = "  ".join(f"{k:>7}" for k in STAGE_LABELS)
    out = [f"  per stage (blocks; memory per GPU in GiB, of {r.memory_capacity_bytes / GIB:.1f}):",
           f"    {'stage':>5}  {'blocks':<{width}}  {head}  {'total':>7}"]
    for rank, (chunks, mem) in enumerate(zip(layers, memory)):
        cells = "  ".join(f"{mem[k] / GIB:7.2f}" for k in STAGE_KEYS)
        total = sum(mem[k] for k in STAGE_KEYS) / GIB
        out.append(f"    {rank:>5}  {layer_text(chunks):<{width}}  {cells}  {total:7.2f}")
    return out
