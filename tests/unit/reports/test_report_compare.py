"""reports/compare.py on a hand-built planner candidates table (report_candidates.py beside it),
and `partita report compare` refusing cleanly while the planner's search is not installed."""
from __future__ import annotations

import pandas as pd
import pytest

from partita.cli import main
from partita.planner.errors import PartitaError
from partita.reports.compare import best_plans, compare_report, problems_table, recommendation
from partita.reports.html import write_report
from report_candidates import SYSTEMS, TOKENS, candidates
from report_pages import check_page


def test_best_plan_per_system_and_size():
    best = best_plans(candidates())
    assert list(zip(best["system"], best["gpus"])) == [
        (s, g) for s in sorted(SYSTEMS) for g in (64, 128, 256)]
    assert (best["plan"].str.contains("PP 4")).all()           # PP 8 is 7% slower everywhere
    for system, (_, _, _, loss) in SYSTEMS.items():
        eff = best[best["system"] == system]["scaling_efficiency"].tolist()
        assert eff == pytest.approx([1.0, 1 - loss, (1 - loss) ** 2])


def test_recommendation_gives_the_slow_end_where_the_table_has_it():
    frame = candidates()
    frame["days_high"] = frame["days"] * 1.3
    frame["usd_high"] = frame["usd"] * 1.3
    best = best_plans(frame)
    assert {"days_high", "usd_high"} <= set(best.columns)
    first = recommendation(best)[0]
    cheapest = best.sort_values("usd").iloc[0]
    assert f"(up to {cheapest['days_high']:.2f} at the slow end of its 90% interval)" in first
    assert "slow end" not in recommendation(best_plans(candidates()))[0]     # older tables


def test_cost_objective_picks_the_cheapest_plan():
    frame = candidates()
    frame.loc[frame["pipeline"] == 8, "usd"] *= 0.5            # make PP 8 the cheaper plan
    best = best_plans(frame, "cost")
    assert best["plan"].str.contains("PP 8").all()


def test_recommendation_from_the_numbers():
    best = best_plans(candidates())
    lines = recommendation(best, deadline_days=60)
    cheapest = best.sort_values("usd").iloc[0]
    fastest = best.sort_values("days").iloc[0]
    assert lines[0].startswith(f"Cheapest: {cheapest['gpus']} GPUs on {cheapest['nodes']} x "
                               f"{cheapest['system']}") and f"${cheapest['usd']:,.0f}" in lines[0]
    assert lines[1].startswith(f"Fastest: {fastest['gpus']} GPUs") and f"{fastest['days']:.2f} days" in lines[1]
    within = best[best["days"] <= 60].sort_values("usd").iloc[0]
    assert lines[-1].startswith(f"Cheapest within 60 days: {within['gpus']} GPUs on "
                                f"{within['nodes']} x {within['system']}")
    assert "No fitting plan finishes within 1 days" in recommendation(best, 1)[-1]


def test_unusable_candidates_are_listed_with_their_reason():
    problems = problems_table(candidates())
    assert len(problems) == 2
    assert problems["reason"].str.contains("does not fit: 95.0 GiB of 80.0 GiB").any()
    assert problems["reason"].str.contains("do not split").any()


def test_page_renders(tmp_path):
    frame = candidates()
    write_report(compare_report(frame, tokens=TOKENS, deadline_days=60), tmp_path)
    page = check_page(tmp_path, "compare")
    assert "Pareto" in page and "Cheapest within 60 days" in page
    back = pd.read_csv(tmp_path / "candidates.csv")
    assert back["usd"].tolist() == pytest.approx(frame["usd"].tolist(), nan_ok=True)


def test_a_table_without_the_planner_columns_is_refused():
    with pytest.raises(PartitaError, match="lacks column.*pareto"):
        best_plans(candidates().drop(columns=["pareto"]))


def test_cli_renders_a_candidates_csv(capsys, tmp_path):
    table = tmp_path / "cands.csv"
    candidates().to_csv(table, index=False)
    out = tmp_path / "c"
    assert main(["report", "compare", "--candidates", str(table), "--tokens", str(TOKENS),
                 "--deadline-days", "60", "-o", str(out)]) == 0
    check_page(out, "compare")
    best = pd.read_csv(out / "compare.csv")
    assert best["usd"].tolist() == pytest.approx(best_plans(candidates())["usd"].tolist())
    assert "does not fit" in (out / "not_usable.csv").read_text()


def test_cli_refuses_a_table_without_the_columns(capsys, tmp_path):
    table = tmp_path / "bad.csv"
    candidates().drop(columns=["usd_spot"]).to_csv(table, index=False)
    assert main(["report", "compare", "--candidates", str(table), "-o", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "usd_spot" in err[0] and str(table) in err[0]


def test_compare_plans_each_system_and_size_from_the_command_line(tmp_path):
    """`report compare FILE --systems` runs the planner per node count; the page's best plans are
    the planner's own fastest candidates for each (system, nodes)."""
    out = tmp_path / "cmp"
    assert main(["report", "compare", "gpt2-xl-p3", "--systems", "p3.16xlarge,p4d.24xlarge",
                 "--nodes", "1-2", "-o", str(out)]) == 0
    best = pd.read_csv(out / "compare.csv")
    every = pd.read_csv(out / "candidates.csv")
    assert set(best["system"]) == {"p3.16xlarge", "p4d.24xlarge"}
    assert set(best["nodes"]) == {1, 2}
    ok = every[every["fits"].astype(bool) & every["error"].isna()]
    for _, row in best.iterrows():
        same = ok[(ok["system"] == row["system"]) & (ok["nodes"] == row["nodes"])]
        assert row["step_time_s"] == pytest.approx(same["step_time_s"].min())
    assert "per billion" not in (out / "compare.md").read_text()     # the budget is stated
    assert "1,000,000,000 tokens" in (out / "compare.md").read_text()


def test_compare_lists_a_skipped_system_and_a_size_without_a_plan(tmp_path):
    """A system whose GPU lacks the precision, and a node count on which nothing fits, are rows of
    the page's not-usable table with the planner's reason (they used to raise in the page)."""
    import yaml
    doc = {"name": "gpt-6b", "model": {"arch": "gpt", "layers": 28, "hidden": 4096, "heads": 32,
                                       "seq_len": 2048, "vocab": 50304},
           "training": {"global_batch": 64, "precision": "bf16"}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "cmp"
    assert main(["report", "compare", str(path), "--systems", "p3.16xlarge,g5.48xlarge",
                 "--nodes", "1", "-o", str(out)]) == 0
    bad = pd.read_csv(out / "not_usable.csv")
    v100 = bad[bad["system"] == "p3.16xlarge"]
    assert v100["reason"].str.contains("precision 'bf16' is not supported by v100-16gb").all()
    assert (v100["plan"] == "no plan: the search on 1 node").all()
    # alone, the V100 system has no plan at any size: the page says so and still renders
    alone = tmp_path / "alone"
    assert main(["report", "compare", str(path), "--systems", "p3.16xlarge", "--nodes", "1",
                 "-o", str(alone)]) == 0
    page = (alone / "compare.html").read_text()
    assert "No usable candidate." in page and not list(alone.glob("*.png"))   # no figure drawn
    assert "no plan: the search on 1 node" in (alone / "not_usable.csv").read_text()


def test_compare_rejects_both_sizes_and_bad_budgets(tmp_path, capsys):
    for extra in (["--nodes", "1-2", "--gpus", "8-16"], ["--tokens", "-5"]):
        assert main(["report", "compare", "gpt2-xl-p3", "--systems", "p3.16xlarge",
                     *extra, "-o", str(tmp_path / "x")]) == 1
        assert capsys.readouterr().err.startswith("error: ")


def test_compare_takes_a_scenario_that_leaves_cluster_and_parallel_open(tmp_path, capsys):
    """What `partita plan` takes, `report compare` takes: the comparison searches the cluster and
    the layout, so a file that leaves them open is not refused for lacking them; a file whose
    model is wrong is one error line naming the file, and nothing is written."""
    open_doc = tmp_path / "open.yaml"
    open_doc.write_text("name: open\nmodel: {preset: gpt2-xl}\n"
                        "training: {global_batch: 64, precision: fp16}\n")
    out = tmp_path / "cmp"
    assert main(["report", "compare", str(open_doc), "--systems", "p3.16xlarge",
                 "--gpus", "8-16", "-o", str(out)]) == 0
    assert set(pd.read_csv(out / "compare.csv")["gpus"]) == {8, 16}
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {preset: gpt2-xxl}\ntraining: {global_batch: 64, precision: fp16}\n")
    assert main(["report", "compare", str(bad), "--systems", "p3.16xlarge", "--gpus", "8-16",
                 "-o", str(tmp_path / "never")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}: model.preset: unknown model preset")
    assert not (tmp_path / "never").exists()
    bad.write_text("model: {preset: gpt2-xl}\ntraining: {global_batch: 64, precision: fp16}\n"
                   "cluster: 7\n")                    # released, but still not a cluster
    assert main(["report", "compare", str(bad), "--systems", "p3.16xlarge", "--gpus", "8-16",
                 "-o", str(tmp_path / "never")]) == 1
    assert capsys.readouterr().err.strip() == f"error: {bad}: cluster: expected a mapping, got 7"
    assert not (tmp_path / "never").exists()


def test_a_best_plan_near_memory_capacity_says_so_as_plan_does():
    """The comparison's plan text flags a plan above 90% of the GPU's memory (the threshold of
    `simulate`'s NEAR CAPACITY and `plan`'s `near capacity`), and only one that fits."""
    frame = candidates()
    plain = best_plans(frame)
    assert not plain["plan"].str.contains("near capacity").any()     # 60 of 80 GiB
    frame["peak_memory_gib"] = frame["peak_memory_gib"].where(~frame["fits"].astype(bool), 76.0)
    tight = best_plans(frame)
    assert tight["plan"].str.endswith(", near capacity (76.0 of 80 GiB)").all()
