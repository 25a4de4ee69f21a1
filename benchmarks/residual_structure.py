"""Is the leave-one-source-out error a trend, or single configurations? Printed, not asserted.

    python benchmarks/residual_structure.py

Reads the cross-validated errors (data/validation/crossval.json, `partita validate
--cross-validate --write`) and asks two questions of them:

1. Between or within sources: with each source's median error taken out, how large is what is
   left (the spread among one source's rows, where a source's conventions and unstated settings
   cancel)?
2. A smooth trend: does a linear model of the errors over features of the runs (GPU family,
   framework, recompute, tokens per micro-batch, width per TP rank, GPU count, step time, and the
   simulated step's communication share, memory share and MFU), fitted with each source left out
   in turn (ridge, standardised features) and applied to that source, lower the p90? If a missing
   mechanism followed one of these features across sources, it would.

The README quotes both answers ("How good the predictions are").
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from partita.planner.catalog import load_catalog                     # noqa: E402
from partita.simulator.step import simulate                           # noqa: E402
from partita.validation.crossval import dev_rows, load_residuals      # noqa: E402

FEATURE_SETS = {
    "all": ("h100", "a100", "v100", "deepspeed", "fsdp", "recompute", "log_tokens",
            "log_width", "log_gpus", "log_step", "comm_share", "memory_share", "mfu"),
    "GPU family": ("h100", "a100", "v100"),
    "recompute": ("recompute",),
    "recompute, H100": ("recompute", "h100"),
    "tokens, width": ("log_tokens", "log_width"),
    "communication, memory": ("comm_share", "memory_share"),
    "framework": ("deepspeed", "fsdp"),
    "step time": ("log_step",),
}
RIDGE = 1.0


def features(m, catalog) -> dict[str, float]:
    s = m.scenario
    r = simulate(s, catalog)
    dims, t, p = s.model.resolve(), s.training, s.parallel
    gpu = s.cluster.system
    comm = sum(v for k, v in r.breakdown_s.items() if "comm" in k)
    return {"h100": float("h100" in gpu), "a100": float("a100" in gpu),
            "v100": float("v100" in gpu), "deepspeed": float(t.framework == "deepspeed"),
            "fsdp": float(t.framework == "fsdp"), "recompute": float(t.recompute != "none"),
            "log_tokens": math.log(t.micro_batch * dims.seq_len),
            "log_width": math.log(dims.hidden / p.tensor), "log_gpus": math.log(p.gpus),
            "log_step": math.log(m.measured_step_s), "comm_share": comm / r.step_time_s,
            "memory_share": r.peak_memory_bytes / r.memory_capacity_bytes, "mfu": r.mfu}


def nested_ridge(x: np.ndarray, y: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """Each source's errors less what a ridge fit on the other sources predicts for them."""
    out = np.empty_like(y)
    for source in np.unique(sources):
        train = sources != source
        mu, sd = x[train].mean(axis=0), x[train].std(axis=0)
        sd[sd == 0] = 1.0
        a = np.c_[(x[train] - mu) / sd, np.ones(train.sum())]
        penalty = RIDGE * np.eye(a.shape[1])
        penalty[-1, -1] = 0.0                                 # the intercept is not shrunk
        coef = np.linalg.solve(a.T @ a + penalty, a.T @ y[train])
        b = np.c_[(x[~train] - mu) / sd, np.ones((~train).sum())]
        out[~train] = y[~train] - b @ coef
    return out


def summary(errors: np.ndarray) -> str:
    e = np.abs(errors)
    return f"median {np.median(e):5.1f}%, p90 {np.percentile(e, 90):5.1f}%"


def main() -> int:
    stored = load_residuals()["rows"]
    mapped = {m.row_id: m for m in dev_rows()}
    catalog = load_catalog()
    y = np.array([r["error_pct"] for r in stored])
    sources = np.array([r["source_key"] for r in stored])
    feats = [features(mapped[r["id"]], catalog) for r in stored]
    print(f"leave-one-source-out errors of {len(y)} rows of {len(set(sources))} sources: "
          f"{summary(y)}")
    within = y.copy()
    for source in np.unique(sources):
        within[sources == source] -= np.median(y[sources == source])
    share = 1.0 - within.var() / y.var()
    print(f"each source's median error taken out:               {summary(within)} "
          f"(between sources: {share:.0%} of the variance)")
    print("a linear model of the errors, each source left out of its fit:")
    for name, cols in FEATURE_SETS.items():
        x = np.array([[f[c] for c in cols] for f in feats])
        print(f"  {name:<24} {summary(nested_ridge(x, y, sources))}")
    return 0


if __name__ == "__main__":
    # No options: --help prints what the script prints; anything else is a usage error.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
