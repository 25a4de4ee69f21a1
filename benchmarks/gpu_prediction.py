"""The simulator's block times against blocks measured on a GPU by bench_gpu_kernels.py.

    python benchmarks/gpu_prediction.py [GPU.json] [--run first|second] [--system hgx-h200]
    python benchmarks/gpu_prediction.py --host       # host seconds per kernel on the device

GPU.json is what bench_gpu_kernels.py wrote, or the stored H200 measurement
(data/validation/gpu/h200_kernels.json, the default; `--run` picks one of its two runs).

For every measured block (partita's own torch block, bf16 weights, eager PyTorch; its Llama
RMSNorm and rotate-half RoPE priced as the eager forms unless --fused) it prints the
simulator's forward and backward per block (`stagecosts.block_cost`: kernels at the sustained
fractions, host dispatch where it is exposed) next to the measured ones, and the device time by
kernel class (GEMM, attention, other) next to the simulator's parts. Ratios are predicted /
measured. The measured blocks ran a few hundred milliseconds each: short enough that the GPU's
clock had not settled to its sustained level (see the `sustained` part of the JSON).

`--host` prints what the device's host spends per kernel of partita's GPT block (`host_per_kernel`),
over every run in the file: the numbers data/calibration/host.yaml takes for GPU systems.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from pathlib import Path

from partita.planner.catalog import load_catalog
from partita.planner.errors import PartitaError
from partita.planner.paths import VALIDATION_DIR
from partita.planner.scenario import parse_scenario
from partita.simulator.calibration import load_calibration
from partita.simulator.compute import layer_times
from partita.simulator.context import resolve
from partita.simulator.host import load_host_costs
from partita.simulator.network import build_topology
from partita.simulator.overheads import load_overheads
from partita.simulator.stagecosts import block_cost
from partita.simulator.stepenv import StepEnv


STORED = VALIDATION_DIR / "gpu" / "h200_kernels.json"
RUNS = ("first", "second")
# A block's backward is host-bound where it measures at least this many times the device time of
# its backward kernels (two thirds of the profiled forward + backward kernel time).
HOST_BOUND = 2.0


def host_per_kernel(data: dict, forward_kernels: float, backward_kernels: float
                    ) -> tuple[float, float, int, int]:
    """(forward, backward) host seconds per kernel of partita's GPT block on the device that
    measured `data` (bench_gpu_kernels.py's JSON, one run or the stored file's runs), launches
    included, and how many blocks each median is over.

    Forward: the median over the `gpt` blocks of `host_fwd_s_per_block` (the host's time to issue
    a forward with the GPU idle, so no launch waits on a full queue) over the block's forward
    kernels. Backward: the median over the `gpt` blocks whose backward the host bounds (measured
    at least HOST_BOUND times its kernels' device time) of the backward's time over its kernels.
    `forward_kernels`, `backward_kernels`: the block's kernel-launching ops
    (executor.hostbench.block_host counts them on the same module)."""
    runs = [data[r] for r in RUNS if r in data] or [data]
    rows = [row for run in runs for row in run.get("blocks", []) if row["arch"] == "gpt"]
    fwd = [row["host_fwd_s_per_block"] / forward_kernels for row in rows]
    bwd = []
    for row in rows:
        device = sum(row.get("by_class_s_per_block", {}).get("classes", {}).values())
        if device > 0 and row["bwd_s_per_block"] >= HOST_BOUND * device * 2 / 3:
            bwd.append(row["bwd_s_per_block"] / backward_kernels)
    if not fwd or not bwd:
        raise PartitaError("no gpt block in the file says what the host costs per kernel")
    return statistics.median(fwd), statistics.median(bwd), len(fwd), len(bwd)


def predicted(row: dict, system: str, attention: str, framework: str, eager: bool) -> tuple:
    doc = {"name": row["name"],
           "model": {k: row[k] for k in ("arch", "hidden", "heads", "kv_heads", "ffn_hidden",
                                         "seq_len")} | {"layers": row["layers"], "vocab": 128},
           "cluster": {"system": system, "gpus": 1},
           "training": {"global_batch": row["micro_batch"], "micro_batch": row["micro_batch"],
                        "precision": "bf16", "attention": attention, "framework": framework,
                        # partita's GPT block adds each bias in its matmul (addmm) and has no
                        # dropout: the fused block's kernels (12, as executor.hostbench counts
                        # them) and bytes; its Llama block runs SiLU and the multiply apart.
                        "fused_elementwise": row["arch"] == "gpt"} | (
                            {"norm_kernel": "eager", "rope_kernel": "rotate-half"}
                            if row["arch"] == "llama" and eager else {}),
           "parallel": {"pipeline": 1}}
    catalog, cal = load_catalog(), load_calibration(include_local=False)
    ctx = resolve(parse_scenario(doc), catalog)
    env = StepEnv(ctx=ctx, topo=build_topology(ctx.system, cal), cal=cal, oh=load_overheads(),
                  host=load_host_costs())
    cost = block_cost(env, decoder=False)
    t = ctx.training
    lt = layer_times(ctx.dims, t.micro_batch, 1, False, 1, "bf16", "none", ctx.system.gpu, cal,
                     attention=t.attention, fused_elementwise=t.fused_elementwise,
                     norm_kernel=t.norm_kernel,
                     rope_kernel=t.rope_kernel)
    return cost, lt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="?", default=str(STORED))
    ap.add_argument("--run", choices=("first", "second"), default="second")
    ap.add_argument("--system", default="hgx-h200")
    ap.add_argument("--attention", default="flash")
    ap.add_argument("--framework", default="fsdp")
    ap.add_argument("--figure", metavar="OUT.png",
                    help="also draw predicted against measured forward + backward per block")
    ap.add_argument("--fused", action="store_true",
                    help="price the Llama blocks' RMSNorm and RoPE as fused kernels (partita's torch "
                         "Llama runs them as PyTorch ops: training.norm_kernel/rope_kernel eager)")
    ap.add_argument("--host", action="store_true",
                    help="print the host's seconds per kernel of partita's GPT block on the device")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.json).read_text())
    if args.host:
        from partita.executor.hostbench import block_host
        counts = block_host(calls=1, repeats=1)
        try:
            f, b, nf, nb = host_per_kernel(data, counts.forward_kernels, counts.backward_kernels)
        except PartitaError as exc:
            print(f"error: {args.json}: {exc}", file=sys.stderr)
            return 1
        launch = load_host_costs().launch_s
        print(f"{data.get('gpu') or data.get('device')}, torch {data['torch']}: partita's GPT block, "
              f"{counts.forward_kernels:.0f} forward and {counts.backward_kernels:.0f} backward kernels")
        print(f"forward: {f * 1e6:.1f} us per kernel (median of {nf} blocks' host time of a forward); "
              f"less the launch ({launch * 1e6:.1f} us): op_dispatch_us {(f - launch) * 1e6:.1f}")
        print(f"backward: {b * 1e6:.1f} us per kernel (median of {nb} host-bound backwards); less the "
              f"launch: backward_op_dispatch_us {(b - launch) * 1e6:.1f}")
        return 0
    if "blocks" not in data:                       # the stored file holds two runs
        data = {**data, **data[args.run]}
    print(f"{data.get('gpu') or data.get('device')}, torch {data['torch']}: simulator on {args.system}, "
          f"attention {args.attention}, framework {args.framework}")
    print(f"{'block':<11}{'mb':>3} {'fwd ms':>7} {'pred':>7} {'ratio':>6} {'bwd ms':>7} {'pred':>7} "
          f"{'ratio':>6} | device ms (kernels at burst clock): gemm pred/meas, attn, other")
    ratios, points = [], []
    for row in data["blocks"]:
        cost, lt = predicted(row, args.system, args.attention, args.framework, not args.fused)
        f, b = row["fwd_s_per_block"], row["bwd_s_per_block"]
        rf, rb = cost.fwd_s / f, (cost.bwd_s) / b
        ratios.append((cost.fwd_s + cost.bwd_s) / (f + b))
        cls = row.get("by_class_s_per_block", {}).get("classes", {})
        points.append((row, f + b, cost.fwd_s + cost.bwd_s, cls))
        p = lt.parts
        gemm = p["gemm_fwd"] + p["gemm_bwd_input"] + p["gemm_bwd_weight"]
        attn = p["attention_fwd"] + p["attention_bwd"]
        other = p["elementwise_fwd"] + p["elementwise_bwd"]
        print(f"{row['name']:<11}{row['micro_batch']:>3} {f * 1e3:7.3f} {cost.fwd_s * 1e3:7.3f} "
              f"{rf:6.2f} {b * 1e3:7.3f} {cost.bwd_s * 1e3:7.3f} {rb:6.2f} | "
              f"{gemm * 1e3:6.3f}/{cls.get('gemm', 0) * 1e3:6.3f} "
              f"{attn * 1e3:6.3f}/{cls.get('attention', 0) * 1e3:6.3f} "
              f"{other * 1e3:6.3f}/{cls.get('other', 0) * 1e3:6.3f}")
    print(f"fwd+bwd predicted / measured: median {statistics.median(ratios):.2f}, "
          f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} blocks")
    if args.figure:
        draw(points, data.get("gpu") or data.get("device"), Path(args.figure))
        print(f"figure: {args.figure}")
    return 0


def draw(points: list, gpu: str, out: Path) -> None:
    """Left: predicted against measured forward + backward per block (log-log, y = x and +-10%);
    right: where a block's device time went, measured kernels by class, per block."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.5))
    cmap = plt.get_cmap("tab10")
    names = list(dict.fromkeys(row["name"] for row, *_ in points))
    for i, name in enumerate(names):
        mine = [(m, p, row["micro_batch"]) for row, m, p, _ in points if row["name"] == name]
        ax.scatter([m * 1e3 for m, _, _ in mine], [p * 1e3 for _, p, _ in mine], s=30,
                   color=cmap(i), label=name)
        for m, p, mb in mine:
            ax.annotate(f"{mb}", (m * 1e3, p * 1e3), fontsize=7, xytext=(3, 2),
                        textcoords="offset points")
    lo = min(min(m, p) for _, m, p, _ in points) * 1e3 * 0.8
    hi = max(max(m, p) for _, m, p, _ in points) * 1e3 * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    for f in (0.9, 1.1):
        ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.8, ls="--")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="measured forward + backward per block (ms)", ylabel="predicted (ms)",
           title=f"partita's blocks on {gpu}: simulator vs measured (label: micro-batch)")
    ax.legend(fontsize=8)
    labels = [f"{row['name']} x{row['micro_batch']}" for row, *_ in points]
    bottom = [0.0] * len(points)
    for j, kind in enumerate(("gemm", "attention", "other")):
        share = [c.get(kind, 0.0) / m for (_, m, _, c) in points]
        bx.barh(labels, share, left=bottom, color=cmap(j), label=kind)
        bottom = [b + s for b, s in zip(bottom, share)]
    bx.barh(labels, [max(0.0, 1 - b) for b in bottom], left=bottom, color="lightgrey",
            label="idle (host, gaps)")
    bx.set(xlabel="share of the measured forward + backward (kernels from a profiled pass)",
           xlim=(0, max(1.0, max(bottom)) * 1.02), title="measured device time by kernel class")
    bx.tick_params(axis="y", labelsize=7)
    bx.invert_yaxis()
    bx.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except PartitaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
