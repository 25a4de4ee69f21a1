"""`partita catalog list|show|numbers`: the hardware catalog as tables, one entry in full, with
sources; and every calibration number that is not a fact (`partita.commands.catalog_numbers`).

Usage:
    partita catalog list                     # systems, then GPUs
    partita catalog list --gpus --json
    partita catalog list --systems --sagemaker   # also the ml. (SageMaker) names
    partita catalog show p4d.24xlarge        # every number of one entry, with its sources
    partita catalog show h100-80gb --catalog my.yaml
    partita catalog numbers                  # measured, fitted and chosen numbers, with sources
    partita catalog numbers --kind chosen --json
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from partita.commands import add_catalog_option, catalog_from_args
from partita.commands.catalog_numbers import register_action as register_numbers
from partita.planner.units import GB, GBIT, GIB

MEASURED = "*"      # marks a FLOP/s figure that is a measured matmul rate, not a datasheet peak


def register(subparsers) -> None:
    p = subparsers.add_parser("catalog", help="list or show GPUs and systems of the hardware catalog",
                              description=__doc__.splitlines()[0])
    actions = p.add_subparsers(dest="catalog_action", metavar="ACTION")
    actions.required = True
    lp = actions.add_parser("list", help="table of systems and/or GPUs")
    which = lp.add_mutually_exclusive_group()
    which.add_argument("--gpus", action="store_true", help="GPUs only")
    which.add_argument("--systems", action="store_true", help="systems only")
    lp.add_argument("--sagemaker", action="store_true", help="also list the ml. (SageMaker) names")
    lp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_catalog_option(lp)
    lp.set_defaults(func=run_list)
    sp = actions.add_parser("show", help="one GPU or system with every number and its sources")
    sp.add_argument("name", help="a system (e.g. p4d.24xlarge, ml.p5.48xlarge) or GPU (e.g. h100-80gb)")
    sp.add_argument("--json", action="store_true", help="print JSON")
    add_catalog_option(sp)
    sp.set_defaults(func=run_show)
    register_numbers(actions)


def run_list(args: argparse.Namespace) -> int:
    catalog = catalog_from_args(args)
    show_systems, show_gpus = not args.gpus, not args.systems
    systems = [catalog.system(n) for n in catalog.system_names(sagemaker=args.sagemaker)]
    gpus = [catalog.gpu(n) for n in catalog.gpu_names()]
    if args.json:
        out: dict[str, Any] = {}
        if show_systems:
            out["systems"] = [_system_row(s) for s in systems]
        if show_gpus:
            out["gpus"] = [_gpu_row(g) for g in gpus]
        print(json.dumps(out, indent=2, default=str))
        return 0
    blocks = []
    if show_systems:
        blocks.append(_systems_table(systems))
    if show_gpus:
        blocks.append(_gpus_table(gpus))
    print("\n\n".join(blocks))
    print(f"\n{MEASURED} measured matmul rate (no datasheet peak); ? supported, figure not published; "
          "- not supported or none.")
    return 0


def run_show(args: argparse.Namespace) -> int:
    info = catalog_from_args(args).describe(args.name)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"{info['name']}  ({info['type']}{', ' + info['kind'] if 'kind' in info else ''}; "
          f"from {', '.join(info['files'])})")
    for key, value in _flatten(info["entry"]):
        print(f"  {key}: {value}")
    if info.get("notes") and info["notes"] != info["entry"].get("notes"):
        print(f"  (loaded) notes: {info['notes']}")
    print("as the simulator uses it (SI units):")
    for key, value in _flatten(info["si"]):
        print(f"  {key}: {value}")
    if "gpu" in info:
        print(f"gpu {info['gpu']['name']} (SI):")
        for key, value in _flatten(info["gpu"]["si"]):
            print(f"  {key}: {value}")
    print("sources:")
    for key, citation in info["sources"].items():
        print(f"  {key}: {citation}" if citation else f"  {key}")
    return 0


def _system_row(s) -> dict[str, Any]:
    return {"name": s.name, "kind": s.kind, "gpu": s.gpu.name, "gpus_per_node": s.gpus_per_node,
            "gpu_memory_gib": s.gpu.memory_bytes / GIB,
            "peak_tflops": {p: v / 1e12 for p, v in s.gpu.peak_flops.items()},
            "intra_node": {"kind": s.intra.kind, "unidir_GBps": _div(s.intra.bytes_per_s, GB)},
            "inter_node": {"kind": s.inter.kind, "nics": s.inter.nics,
                           "gbps": _div(s.inter.bytes_per_s, GBIT)},
            "usd_per_hour": s.price.best_usd_per_hour, "price_date": s.price.date,
            "region": s.price.region}


def _gpu_row(g) -> dict[str, Any]:
    return {"name": g.name, "display_name": g.display_name, "memory_gib": g.memory_bytes / GIB,
            "mem_bw_GBps": g.memory_bandwidth_bytes_per_s / GB,
            "peak_tflops": {p: v / 1e12 for p, v in g.peak_flops.items()},
            "measured": [p for p in g.peak_flops if g.peak_is_measured(p)],
            "nvlink_unidir_GBps": _div(g.nvlink_bytes_per_s, GB),
            "pcie_unidir_GBps": _div(g.pcie_bytes_per_s, GB)}


def _systems_table(systems) -> str:
    head = ("SYSTEM", "KIND", "GPU", "GPUS", "GIB/GPU", "TFLOP/S", "FABRIC GB/S", "NET GBIT/S", "$/H")
    rows = []
    for s in systems:
        prec = next((p for p in ("bf16", "fp16", "fp32") if s.gpu.supports(p)), None)
        flops = f"{_tflops(s.gpu, prec)} {prec}" if prec else "-"
        fabric = s.intra.kind if s.intra.kind == "none" else \
            f"{s.intra.kind} {_num(_div(s.intra.bytes_per_s, GB))}"
        net = "-" if s.inter.kind == "none" else \
            f"{s.inter.kind} {_num(_div(s.inter.bytes_per_s, GBIT))}"
        rows.append((s.name, s.kind, s.gpu.name, str(s.gpus_per_node), _num(s.gpu.memory_bytes / GIB),
                     flops, fabric, net, _num(s.price.best_usd_per_hour)))
    return _table(head, rows)


def _gpus_table(gpus) -> str:
    precisions = ("fp32", "tf32", "fp16", "bf16", "fp8")
    head = ("GPU", "GIB", "MEM GB/S") + tuple(f"{p.upper()} TF/S" for p in precisions) + \
        ("NVLINK GB/S", "PCIE GB/S")
    rows = []
    for g in gpus:
        rows.append((g.name, _num(g.memory_bytes / GIB), _num(g.memory_bandwidth_bytes_per_s / GB))
                    + tuple(_tflops(g, p) for p in precisions)
                    + (_num(_div(g.nvlink_bytes_per_s, GB)), _num(_div(g.pcie_bytes_per_s, GB))))
    return _table(head, rows)


def _tflops(gpu, precision: str) -> str:
    if gpu.supports(precision):
        return _num(gpu.peak(precision) / 1e12) + (MEASURED if gpu.peak_is_measured(precision) else "")
    return "?" if precision in gpu.datasheet_flops else "-"


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [head, *rows])


def _flatten(value: Any, prefix: str = ""):
    """(dotted.key, printable value) pairs of a nested mapping; lists print comma-separated."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, list) and not any(isinstance(v, dict) for v in value):
        yield prefix, ", ".join(str(v) for v in value)
    else:
        yield prefix, "null" if value is None else value


def _div(value: float | None, unit: float) -> float | None:
    return None if value is None else value / unit


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if value < 1e4 else f"{value:,.0f}"
