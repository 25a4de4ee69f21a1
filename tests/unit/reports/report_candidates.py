"""A hand-built planner candidates table for the compare report's tests (two systems, three sizes,
two plans per size, one plan that does not fit and one the simulator refused)."""
from __future__ import annotations

import pandas as pd

TOKENS = 2.0e12
SYSTEMS = {  # name: (usd/hour per node, spot, base tokens/s per GPU, scaling loss per doubling)
    "p4d.24xlarge": (32.77, 12.0, 1400.0, 0.05),
    "p5.48xlarge": (98.32, 40.0, 3600.0, 0.08),
}


def candidates() -> pd.DataFrame:
    rows = []
    for system, (usd, spot, per_gpu, loss) in SYSTEMS.items():
        for i, nodes in enumerate((8, 16, 32)):
            gpus = nodes * 8
            for pp, penalty in ((4, 1.0), (8, 0.93)):
                tps = per_gpu * gpus * (1 - loss) ** i * penalty
                step = 128 * 4096 * (gpus // 64) / tps
                days = TOKENS / tps / 86400
                rows.append(dict(
                    system=system, nodes=nodes, gpus=gpus, tensor=8, pipeline=pp, context=1,
                    data=gpus // (8 * pp), micro_batch=1, schedule="1f1b", virtual_stages=1,
                    recompute="selective", zero=1, grad_reduce="ring", step_time_s=step,
                    tokens_per_s=tps, mfu=0.4 * (1 - loss) ** i * penalty,
                    peak_memory_gib=60.0 if pp == 4 else 45.0, memory_capacity_gib=80.0,
                    fits=True, usd_per_hour=usd * nodes, usd_per_hour_spot=spot * nodes,
                    days=days, usd=usd * nodes * days * 24, usd_spot=spot * nodes * days * 24,
                    pareto=False, error=""))
    rows.append(dict(rows[0], pipeline=2, data=4, peak_memory_gib=95.0, fits=False))
    rows.append(dict(rows[1], pipeline=16, step_time_s=None, tokens_per_s=None, mfu=None,
                     days=None, usd=None, usd_spot=None, fits=False,
                     error="80 layers do not split into 16 x 1 chunks of whole layers"))
    frame = pd.DataFrame(rows)
    ok = frame[frame["fits"]].sort_values("days")
    best_usd, front = float("inf"), []
    for idx, r in ok.iterrows():
        if r["usd"] < best_usd:
            best_usd = r["usd"]
            front.append(idx)
    frame.loc[front, "pareto"] = True
    return frame
