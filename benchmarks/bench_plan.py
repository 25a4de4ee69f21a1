"""The planner's targets (issue 14), measured and printed; not a timed test.

    python benchmarks/bench_plan.py                 # everything
    python benchmarks/bench_plan.py ilp gpt3        # some parts: ilp, t5, gpt3, published, search

- ilp:       a 200-layer GPT chain into 32 stages, optimal (target < 5 s); T5-3B's encoder-decoder
             graph into 8 stages (target < 20 s); both checked against the exact DP where it applies.
- t5:        T5-3B on 8 x p4d (PP 8 x DP 8): the simulated bubble of the ILP split vs the even split.
- gpt3:      GPT-3 175B, global batch 1536, up to 1,024 A100-80GB: the plan found vs the published
             TP 8 x PP 16 x DP 8 (Megatron-LM README), both simulated; search seconds (target <= 60).
- published: every mapped row of data/validation/published_dev.csv: the plan on the row's own system
             and GPU count (parallel, micro-batch and recompute searched) vs the row's hand-tuned
             configuration, both simulated.
- search:    a wide search (several systems, up to 512 GPUs, no budget): candidates evaluated,
             failures, simulations per second (target >= 10,000 without a crash).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from partita.planner.catalog import load_catalog                      # noqa: E402
from partita.planner.errors import PartitaError                       # noqa: E402
from partita.planner.layergraph import plan_problem                   # noqa: E402
from partita.planner.modelspec import TransformerDims, preset_dims    # noqa: E402
from partita.planner.partition import solve                           # noqa: E402
from partita.planner.partition_dp import exact_chain                  # noqa: E402
from partita.planner.scenario import ParallelSpec, TrainingSpec, load_scenario, parse_scenario  # noqa: E402
from partita.planner.search import plan                               # noqa: E402
from partita.simulator.step import simulate                           # noqa: E402

CATALOG = load_catalog()


def bench_ilp() -> None:
    dims = TransformerDims(arch="gpt", layers=200, hidden=4096, heads=32, seq_len=2048, vocab=51200,
                           tie_embeddings=False)          # a chain: the exact DP applies
    t = TrainingSpec(global_batch=512, micro_batch=1, precision="bf16", recompute="selective")
    par = ParallelSpec(tensor=8, pipeline=32, data=2)
    pr = plan_problem(dims, t, par, memory_bytes=80 * 2**30, peak_flops=312e12,
                      link_bytes_per_s=25e9, time_limit_s=60)
    t0 = time.perf_counter()
    split = solve(pr)
    ilp_s = time.perf_counter() - t0
    dp = exact_chain(pr)
    print(f"ilp  200-layer chain -> 32 stages: {split.solver} {split.status} in {ilp_s:.2f} s "
          f"(target < 5 s); slowest stage {split.max_time_s * 1e3:.3f} ms, exact DP "
          f"{dp.max_time_s * 1e3:.3f} ms, equal: {abs(split.max_time_s - dp.max_time_s) < 1e-9}")
    t5 = preset_dims("t5-3b")
    t = TrainingSpec(global_batch=512, micro_batch=4, precision="bf16")
    par = ParallelSpec(pipeline=8, data=8, zero=1)
    pr = plan_problem(t5, t, par, memory_bytes=40 * 2**30, peak_flops=312e12,
                      link_bytes_per_s=50e9 / 8, time_limit_s=60)
    t0 = time.perf_counter()
    split = solve(pr)
    ilp_s = time.perf_counter() - t0
    print(f"ilp  T5-3B encoder-decoder graph -> 8 stages: {split.solver} {split.status} in "
          f"{ilp_s:.2f} s (target < 20 s); blocks per stage "
          f"{[b - a for a, b in split.ranges]} (24 encoder + 24 decoder)")


def bench_t5() -> None:
    base = load_scenario("t5-3b-p4d")
    doc = base.to_dict()
    doc["parallel"].update(pipeline=8, data=8)
    even = parse_scenario(doc, origin="t5-even")
    r_even = simulate(even, CATALOG)
    t0 = time.perf_counter()
    result = plan(doc, catalog=CATALOG)
    s = parse_scenario(result.best, origin="t5-planned")
    r_plan = simulate(s, CATALOG)
    print(f"t5   T5-3B on 8 x ml.p4d.24xlarge, PP 8 x DP 8, mb 4: bubble even split "
          f"{100 * r_even.bubble_fraction:.1f}% ({r_even.step_time_s:.3f} s/step) -> planned split "
          f"{100 * r_plan.bubble_fraction:.1f}% ({r_plan.step_time_s:.3f} s/step), stages "
          f"{[b - a for a, b in s.parallel.stages]}, {result.solver}, {time.perf_counter() - t0:.1f} s")


def bench_gpt3(budget_s: float = 50.0) -> None:
    published = load_scenario("gpt3-175b-a100")
    r_pub = simulate(published, CATALOG)
    doc = published.to_dict()
    del doc["parallel"]
    doc["cluster"].pop("gpus")
    doc["training"].pop("micro_batch")
    doc["training"].pop("recompute")
    t0 = time.perf_counter()
    result = plan(doc, catalog=CATALOG, max_gpus=1024, time_budget_s=budget_s)
    secs = time.perf_counter() - t0
    best = result.candidates[0]
    r_best = simulate(parse_scenario(result.best, origin="gpt3-planned"), CATALOG)
    print(f"gpt3 GPT-3 175B, up to 1,024 A100-80GB: published TP8 PP16 DP8 (1f1b, mb 1, full "
          f"recompute) {r_pub.step_time_s:.2f} s/step; plan found TP{best.tensor} PP{best.pipeline} "
          f"DP{best.data} CP{best.context} on {best.gpus} GPUs, mb {best.micro_batch}, "
          f"{best.schedule} v{best.virtual_stages}, recompute {best.recompute}, ZeRO {best.zero}: "
          f"{r_best.step_time_s:.2f} s/step (ratio planned/published "
          f"{r_best.step_time_s / r_pub.step_time_s:.3f}), peak {r_best.peak_memory_gib:.1f} GiB; "
          f"search {secs:.1f} s (target <= 60), {result.evaluated} simulations, {result.pruned} "
          f"pruned; notes: {'; '.join(result.notes) or '-'}")


def bench_published(budget_s: float = 8.0, limit: int | None = None) -> None:
    from partita.validation.rowmap import MappedRow, map_row, read_rows
    from partita.validation.rowrules import load_rules
    rules = load_rules()
    rows = [m for m in (map_row(r, rules) for r in read_rows()) if isinstance(m, MappedRow)]
    seen, pairs, worse, failed = set(), 0, [], 0
    t_all = time.perf_counter()
    for m in rows[:limit]:
        doc = {k: v for k, v in m.document.items() if k != "name"}
        key = repr(sorted(doc.items(), key=str))
        if key in seen:
            continue
        seen.add(key)
        try:
            r_pub = simulate(m.scenario, CATALOG)
        except PartitaError as exc:
            print(f"pub  {m.row_id:<10} published configuration does not simulate: {exc}")
            failed += 1
            continue
        search = dict(doc)
        search["parallel"] = {}
        search["training"] = {k: v for k, v in doc["training"].items()
                              if k not in ("micro_batch", "recompute")}
        del search["parallel"]
        t0 = time.perf_counter()
        try:
            result = plan(search, catalog=CATALOG, time_budget_s=budget_s)
        except PartitaError as exc:
            print(f"pub  {m.row_id:<10} plan failed: {exc}")
            failed += 1
            continue
        r_plan = simulate(parse_scenario(result.best, origin=m.row_id), CATALOG)
        b = result.candidates[0]
        ratio = r_plan.step_time_s / r_pub.step_time_s
        pairs += 1
        pub_fits = "" if r_pub.fits_in_memory else " (published does not fit in the model)"
        if ratio > 1 + 1e-9:
            worse.append((m.row_id, ratio))
        p = m.scenario.parallel
        print(f"pub  {m.row_id:<10} {m.model:<14} {m.gpus:>5} GPUs  published tp{p.tensor} "
              f"pp{p.pipeline} dp{p.data} mb{m.scenario.training.micro_batch} "
              f"{m.scenario.training.recompute:<9} {r_pub.step_time_s:9.3f} s{pub_fits} | planned "
              f"tp{b.tensor} pp{b.pipeline} dp{b.data} cp{b.context} mb{b.micro_batch} "
              f"{b.recompute:<9} {b.schedule} v{b.virtual_stages} z{b.zero} "
              f"{r_plan.step_time_s:9.3f} s  ratio {ratio:.3f}  ({time.perf_counter() - t0:.1f} s)")
    print(f"pub  {pairs} pairs, planned slower than published in {len(worse)}: "
          f"{', '.join(f'{i} {r:.3f}' for i, r in worse) or 'none'}; {failed} failed; "
          f"{time.perf_counter() - t_all:.0f} s")


def bench_search() -> None:
    doc = {"name": "gpt-1.3b",
           "model": {"arch": "gpt", "layers": 24, "hidden": 2048, "heads": 16, "seq_len": 2048,
                     "vocab": 51200},
           "training": {"global_batch": 512, "precision": "bf16"},
           "cluster": {}}
    systems = ["p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "dgx-a100-40gb",
               "dgx-a100-80gb", "dgx-h100", "hgx-h200", "g5.48xlarge", "p3dn.24xlarge"]
    t0 = time.perf_counter()
    result = plan(doc, catalog=CATALOG, systems=systems, max_gpus=512, tokens=3e11,
                  top_layouts=12, progress=lambda msg: print(f"     {msg}", flush=True))
    secs = time.perf_counter() - t0
    df = result.table()
    failed = int(df.error.notna().sum())
    print(f"srch {result.evaluated} candidates evaluated ({len(df)} listed, {failed} failed with "
          f"a reason, {int((~df.fits).sum())} do not fit), {result.pruned} pruned, no crash; "
          f"{secs:.1f} s, {result.evaluated / secs:.0f} simulations/s; pareto front: "
          + ", ".join(f"{r.system} x{r.gpus} {r.step_time_s:.2f}s ${r.usd:,.0f}"
                      for r in df[df.pareto].itertuples()))
    for note in result.notes:
        print(f"     note: {note}")


PARTS = {"ilp": bench_ilp, "t5": bench_t5, "gpt3": bench_gpt3, "published": bench_published,
         "search": bench_search}

USAGE = f"usage: bench_plan.py [{' | '.join(PARTS)}] ...  (no part: every one)"


def main(argv: list[str] | None = None) -> int:
    """Run the named parts (all without a name); an unknown part is a usage error (exit 2)."""
    wanted = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in wanted):
        print(USAGE)
        return 0
    unknown = [name for name in wanted if name not in PARTS]
    if unknown:
        print(f"{USAGE}\nerror: unknown part {unknown[0]!r} (valid: {', '.join(PARTS)})",
              file=sys.stderr)
        return 2
    for name in wanted or list(PARTS):
        PARTS[name]()
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
