"""Peak allocated memory per GPU against Megatron-LM's functional-test golden values.

Megatron-LM's CI trains the GPT test cases of tests/test_utils/recipes/h100/gpt.yaml on one node of
8 GPUs (its spec: nodes 1, gpus 8; tests/functional_tests/test_cases/gpt) and records per step
`mem-max-allocated-bytes`, torch.cuda.memory_stats()["allocated_bytes.all.peak"] on the last rank
(the tensorboard writer's, megatron/training/global_vars.py): the last pipeline stage. The stored
cases (data/validation/megatron_golden_memory.yaml) carry each case's MODEL_ARGS and the largest
value its golden file holds; this compares them with the allocated bytes partita predicts for the
last stage (`MemoryEstimate.allocated_bytes`: no allocator reserve, no CUDA context).
Cases whose arguments a scenario cannot state are listed with the argument
(validation/megatron_args.py); configurations that recur (a test and its resume or checkpoint
variant) are counted once, at the median of their cases.

    python benchmarks/megatron_golden_memory.py                  # the stored cases
    python benchmarks/megatron_golden_memory.py --extract GITDIR # rewrite the data file from a
                                                                 # Megatron-LM git directory
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from partita.planner.catalog import load_catalog  # noqa: E402
from partita.planner.errors import PartitaError  # noqa: E402
from partita.planner.paths import DATA_DIR  # noqa: E402
from partita.planner.scenario import parse_scenario  # noqa: E402
from partita.simulator.step import simulate  # noqa: E402
from partita.validation.megatron_args import Unexpressed, scenario  # noqa: E402

DATA = DATA_DIR / "validation" / "megatron_golden_memory.yaml"
CASES_DIR = "tests/functional_tests/test_cases/gpt"
RECIPE = "tests/test_utils/recipes/h100/gpt.yaml"   # the cases it runs, on one node of 8 GPUs
GPUS = 8
# The platforms whose goldens are read, first preferred: the dev container on DGX H100, else on
# DGX A100 (the lts container and the other clusters repeat the same cases on older software).
PLATFORMS = {"dev_dgx_h100": "dgx-h100", "dev_dgx_a100": "dgx-a100-80gb"}
GIB = 2**30


def extract(gitdir: str, commit: str = "HEAD") -> dict:
    """The data file's document from a Megatron-LM git directory at `commit`."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", gitdir, *args], capture_output=True, text=True,
                              check=True).stdout

    full = git("rev-parse", commit).strip()
    recipe = yaml.safe_load(git("show", f"{full}:{RECIPE}"))
    if (recipe["spec"]["nodes"], recipe["spec"]["gpus"]) != (1, GPUS):
        raise ValueError(f"{RECIPE}: expected one node of {GPUS} GPUs")
    in_recipe = {case for product in recipe["products"] for case in product["test_case"]}
    files = git("ls-tree", "-r", "--name-only", full, CASES_DIR).split()
    by_case: dict[str, set[str]] = {}
    for f in files:
        case, name = f.split("/")[-2:]
        by_case.setdefault(case, set()).add(name)
    cases = []
    for case in sorted(by_case):
        names = by_case[case]
        platform = next((p for p in PLATFORMS if f"golden_values_{p}.json" in names), None)
        if platform is None or "model_config.yaml" not in names or case not in in_recipe:
            continue
        golden = json.loads(git("show", f"{full}:{CASES_DIR}/{case}/golden_values_{platform}.json"))
        mem = golden.get("mem-max-allocated-bytes")
        if not isinstance(mem, dict) or not isinstance(mem.get("values"), dict):
            continue
        values = [float(v) for v in mem["values"].values() if str(v) != "nan"]
        if not values:
            continue
        config = yaml.safe_load(git("show", f"{full}:{CASES_DIR}/{case}/model_config.yaml"))
        args = {k: v for k, v in (config.get("MODEL_ARGS") or {}).items()
                if not (isinstance(v, str) and "$" in v)}           # the CI machine's paths
        cases.append({"test_case": case, "platform": platform,
                      "max_allocated_bytes": int(max(values)), "args": args})
    return {"_what": "Megatron-LM functional tests (GPT): each case's MODEL_ARGS and the largest "
                     "mem-max-allocated-bytes of its golden values (bytes, the last rank); written "
                     "by `python benchmarks/megatron_golden_memory.py --extract GITDIR`",
            "source": f"NVIDIA/Megatron-LM at {full}: {CASES_DIR}/<test_case>/model_config.yaml "
                      f"and golden_values_<platform>.json, the cases of {RECIPE} (one node of "
                      f"{GPUS} GPUs)",
            "gpus": GPUS, "cases": cases}


def load(path: Path = DATA) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def evaluate(doc: dict) -> tuple[list[dict], list[tuple[str, str]]]:
    """(compared configurations, skipped (test case, reason)): each compared configuration with the
    cases that share it (a test and its resume or checkpoint variants), their median measured GiB
    and the predicted GiB."""
    catalog = load_catalog()
    rows: dict[str, dict] = {}
    skipped = []
    for c in doc["cases"]:
        try:
            sc = scenario(c["args"], gpus=int(doc["gpus"]), system=PLATFORMS[c["platform"]],
                          name=c["test_case"])
            result = simulate(parse_scenario(sc), catalog)
        except (Unexpressed, PartitaError) as e:
            skipped.append((c["test_case"], str(e)))
            continue
        key = json.dumps({k: sc[k] for k in ("model", "cluster", "training", "parallel")},
                         sort_keys=True)
        if key not in rows:
            last = result.details["stage_memory_bytes"][-1]
            predicted = sum(last.values()) - last.get("reserve", 0)
            rows[key] = {"cases": [], "measured": [], "platform": c["platform"], "scenario": sc,
                         "predicted_gib": predicted / GIB,
                         "impl": c["args"].get("--transformer-impl", "transformer_engine")}
        rows[key]["cases"].append(c["test_case"])
        rows[key]["measured"].append(c["max_allocated_bytes"] / GIB)
    for r in rows.values():
        r["measured_gib"] = statistics.median(r["measured"])
    return list(rows.values()), skipped


def summary(errors: list[float]) -> str:
    e = sorted(abs(x) * 100 for x in errors)
    p90 = e[min(len(e) - 1, round(0.9 * (len(e) - 1)))]
    bias = 100 * statistics.mean(errors)
    return (f"{len(e)} configurations: median {statistics.median(e):.1f}%, p90 {p90:.1f}%, "
            f"max {e[-1]:.1f}%, bias {bias:+.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extract", metavar="GITDIR", help="rewrite the data file from this "
                    "Megatron-LM git directory (its HEAD, or --commit)")
    ap.add_argument("--commit", default="HEAD")
    args = ap.parse_args(argv)
    if args.extract:
        try:
            doc = extract(args.extract, args.commit)
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            print(f"error: --extract {args.extract}: not a Megatron-LM git directory at "
                  f"{args.commit} ({detail.strip().splitlines()[0] if detail.strip() else e})",
                  file=sys.stderr)
            return 1
        DATA.write_text(yaml.safe_dump(doc, sort_keys=False, width=100), encoding="utf-8")
        print(f"wrote {DATA} ({len(doc['cases'])} cases)")
        return 0
    rows, skipped = evaluate(load())
    print(f"{'test case':<84}{'platform':<14}{'meas GiB':>9}{'pred GiB':>9}{'error':>8}  layout")
    for r in rows:
        s, p = r["scenario"], r["scenario"]["parallel"]
        t = s["training"]
        layout = (f"tp{p['tensor']} pp{p['pipeline']} cp{p['context']} v{p.get('virtual_stages', 1)}"
                  f" z{p['zero']} {t['attention']} {t.get('recompute', 'none')}")
        err = r["predicted_gib"] / r["measured_gib"] - 1
        more = f" (+{len(r['cases']) - 1})" if len(r["cases"]) > 1 else ""
        print(f"{r['cases'][0] + more:<84}{r['platform']:<14}{r['measured_gib']:>9.2f}"
              f"{r['predicted_gib']:>9.2f}{100 * err:>+7.1f}%  {layout}")
    errors = [r["predicted_gib"] / r["measured_gib"] - 1 for r in rows]
    print("\nPeak allocated memory of the last stage, predicted / measured - 1:")
    print("  all: " + summary(errors))
    for impl in ("transformer_engine", "local"):
        sub = [e for r, e in zip(rows, errors) if r["impl"] == impl]
        if sub:
            print(f"  {impl}: " + summary(sub))
    print("Measured - predicted (GiB), by platform:")
    for platform in PLATFORMS:
        gaps = sorted(r["measured_gib"] - r["predicted_gib"] for r in rows
                      if r["platform"] == platform)
        if gaps:
            print(f"  {platform}: median {statistics.median(gaps):+.3f}, "
                  f"{gaps[0]:+.3f} to {gaps[-1]:+.3f} over {len(gaps)}")
    print(f"\nSkipped {len(skipped)} cases:")
    for case, why in skipped:
        print(f"  {case}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
