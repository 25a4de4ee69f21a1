"""Memory report: per pipeline stage, what one GPU holds (parameters, gradients, optimizer state,
activations, buffers, the allocator's and framework's reserve) against the GPU's capacity, and the
headroom left.

The numbers are the simulator's (`SimResult.details["stage_memory_bytes"]`, the same that
`partita simulate` prints per stage); the largest stage is the scenario's peak.
"""
from __future__ import annotations

import pandas as pd

from partita.planner.units import GIB
from partita.reports.figures import MEMORY_COLOURS, new_figure, png_bytes
from partita.reports.html import FigureItem, Report, Section, TableItem

KINDS = ("parameters", "gradients", "optimizer", "activations", "buffers", "reserve")


def layer_text(chunks) -> str:
    return ", ".join(f"{a}-{b - 1}" if b - a > 1 else (f"{a}" if b > a else "none")
                     for a, b in chunks)


def memory_table(result) -> pd.DataFrame:
    """One row per pipeline stage: blocks held and GiB per kind, total, capacity, headroom."""
    capacity = result.memory_capacity_bytes / GIB
    rows = []
    layers = result.details.get("stage_layers") or [[]] * len(result.details["stage_memory_bytes"])
    for rank, (chunks, mem) in enumerate(zip(layers, result.details["stage_memory_bytes"])):
        row = {"stage": rank, "blocks": layer_text(chunks)}
        row.update({f"{k}_gib": mem[k] / GIB for k in KINDS})
        total = sum(mem[k] for k in KINDS) / GIB
        row.update(total_gib=total, capacity_gib=capacity, headroom_gib=capacity - total,
                   fits=total <= capacity)
        rows.append(row)
    return pd.DataFrame(rows)


def _figure(frame: pd.DataFrame, title: str) -> bytes:
    stages = len(frame)
    fig = new_figure(max(6.0, min(12.0, 1.2 + 0.5 * stages)), 4.6)
    ax = fig.add_subplot()
    bottom = [0.0] * stages
    xs = list(frame["stage"])
    for k in KINDS:
        values = list(frame[f"{k}_gib"])
        if not any(values):
            continue
        ax.bar(xs, values, bottom=bottom, color=MEMORY_COLOURS[k], label=k, width=0.7)
        bottom = [b + v for b, v in zip(bottom, values)]
    capacity = float(frame["capacity_gib"].iloc[0])
    ax.axhline(capacity, color="black", ls="--", lw=1.2, label=f"capacity {capacity:.1f} GiB")
    for x, total in zip(xs, frame["total_gib"]):
        head = capacity - total
        ax.annotate(f"{head:+.1f}", (x, total), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=7, color="#2E7D32" if head >= 0 else "#C62828")
    ax.set_ylim(0, max(capacity, max(bottom)) * 1.12)
    ax.set_xticks(xs if stages <= 32 else xs[::max(1, stages // 16)])
    ax.set_xlabel("pipeline stage (index)")
    ax.set_ylabel("memory per GPU (GiB)")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()     # top of the stack first, as drawn
    ax.legend(handles[:1] + handles[:0:-1], labels[:1] + labels[:0:-1], loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
              title="numbers: headroom (GiB)", title_fontsize=8)
    return png_bytes(fig)


def memory_report(scenario, result) -> Report:
    frame = memory_table(result)
    name = scenario.name or scenario.origin
    p, t = scenario.parallel, scenario.training
    worst = frame.loc[frame["total_gib"].idxmax()]
    text = [f"Peak {result.peak_memory_gib:.2f} GiB of {result.memory_capacity_bytes / GIB:.1f} GiB "
            f"on stage {int(worst['stage'])} (headroom {worst['headroom_gib']:.2f} GiB)"
            + ("." if result.fits_in_memory else ": DOES NOT FIT."),
            f"{t.precision}, {t.optimizer}, recompute {t.recompute}"
            + (f" ({t.recompute_num_layers} blocks per chunk)"
               if t.recompute_num_layers is not None else "")
            + f", ZeRO-{p.zero}"
            + (f" in shards of {p.data_shard}" if p.data_shard is not None else "")
            + ", micro-batch "
            f"{t.micro_batch}, {t.framework}. Activations are those of the micro-batches each stage "
            "holds at its fullest point of the schedule; buffers are the logits of the last stage, "
            "ZeRO-3's gathered layers and, under fp8, Transformer Engine's cached fp8 weights; "
            "reserve is what the caching allocator and the framework hold "
            "beyond the live tensors (data/calibration/memory.yaml)."]
    fmt = {f"{k}_gib": ".2f" for k in KINDS} | {"total_gib": ".2f", "capacity_gib": ".1f",
                                                 "headroom_gib": ".2f"}
    fig = FigureItem(name="memory", title="Memory per stage",
                     png=_figure(frame, f"{name}: memory per GPU by pipeline stage"))
    return Report(kind="memory", title=f"Memory: {name}",
                  subtitle=f"{result.gpus} GPUs on {result.details.get('nodes', 1)} x "
                           f"{result.system}, TP {p.tensor} x PP {p.pipeline} x CP {p.context} x "
                           f"DP {p.data}",
                  sections=(Section(heading="Per stage against capacity", text=tuple(text),
                                    figures=(fig,)),
                            Section(heading="Table", tables=(TableItem(
                                name="memory", title="Memory per GPU by stage (GiB)", frame=frame,
                                formats=fmt),))))
