"""Is a source's error per micro-batch or per step? Printed, not asserted.

    python benchmarks/microbatch_structure.py

A family here is a set of dev runs of one source that share the model, GPU, precision, framework,
recompute, micro-batch size and tensor, pipeline, context and virtual-stage layout and differ only
in the number of micro-batches each pipeline runs per step, m (data-parallel width or global batch
changed): NVIDIA's BERT on 1 to 256 A100s at one global batch, MT-NLG on 2,240 to 3,360 A100s,
Llama 3 405B on 8,192 and 16,384 H100s. Within a family a step is a line in m: T = a m + b, where
a is what one more micro-batch costs (the slowest stage's forward and backward, steady state)
and b what a step costs whatever m is (pipeline fill and drain, the data-parallel reduction, the
optimizer, the parameter gathers). Fitting the line to the measured steps and to the leave-one-
source-out predictions of the same runs (data/validation/crossval.json, `partita validate
--cross-validate --write`) says where a family's error sits: in a (kernels, the sustained
fraction) or in b (the schedule's bubble, the per-step collectives), which no single error can.

With two distinct m the line is exact; with more, the measured steps' residual from their own
line (`fit`, in % of the step) says how well one line describes them.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from partita.validation.crossval import dev_rows, load_residuals      # noqa: E402


def family_key(m) -> tuple:
    """What a family's runs share: everything but the data-parallel width and global batch."""
    s = m.scenario
    dims, t, p = s.model.resolve(), s.training, s.parallel
    return (m.source_key, dims.arch, dims.layers, dims.hidden, dims.seq_len,
            s.cluster.system, t.precision, t.framework, t.recompute, t.micro_batch, t.attention,
            p.tensor, p.pipeline, p.context, p.schedule, p.virtual_stages, p.zero)


def microbatches(m) -> int:
    """Micro-batches each pipeline runs per step."""
    return m.scenario.microbatches()


def line(m: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(a, b) of the least-squares line t = a m + b."""
    a, b = np.polyfit(m, t, 1)
    return float(a), float(b)


def main() -> int:
    stored = {r["id"]: r for r in load_residuals()["rows"]}
    families: dict[tuple, list] = defaultdict(list)
    for mapped in dev_rows():
        if mapped.row_id in stored:
            families[family_key(mapped)].append(mapped)
    shown = 0
    print("per family: T = a m + b (a: seconds per micro-batch, b: seconds per step), measured "
          "against the leave-one-source-out prediction")
    for key, rows in sorted(families.items(), key=lambda kv: kv[1][0].row_id):
        ms = np.array([microbatches(r) for r in rows], dtype=float)
        if len(set(ms)) < 2:
            continue
        shown += 1
        measured = np.array([stored[r.row_id]["measured_step_s"] for r in rows])
        predicted = np.array([stored[r.row_id]["predicted_step_s"] for r in rows])
        (am, bm), (ap, bp) = line(ms, measured), line(ms, predicted)
        fit = np.max(np.abs(measured - (am * ms + bm)) / measured) * 100
        ids = ", ".join(f"{r.row_id} (m {int(k)})" for r, k in sorted(zip(rows, ms),
                                                                   key=lambda x: x[1]))
        print(f"\n{key[0]} {key[1]} {key[2]}L/h{key[3]} on {key[5]}, TP {key[11]} PP {key[12]}"
              f" CP {key[13]} {key[14]} v{key[15]}, micro-batch {key[9]}: {ids}")
        print(f"  a  measured {am:9.4f} s  predicted {ap:9.4f} s  ({(ap / am - 1) * 100:+5.1f}%)")
        print(f"  b  measured {bm:9.4f} s  predicted {bp:9.4f} s  "
              f"({bp - bm:+.3f} s; {(bp - bm) / np.mean(measured) * 100:+5.1f}% of the mean step)")
        if len(rows) > 2:
            print(f"  the measured steps lie within {fit:.1f}% of their own line")
    print(f"\n{shown} families")
    return 0


if __name__ == "__main__":
    # No options: --help prints what the script prints; anything else is a usage error.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
