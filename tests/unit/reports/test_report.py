"""`partita report scaling|timeline|memory|validate`: rendered from shipped examples, every figure a
real PNG, the page self-contained, and every number equal to what `partita simulate` / `partita
validate` print for the same input."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from partita.cli import main
from report_pages import check_page


def simulate_json(capsys, path) -> dict:
    capsys.readouterr()
    assert main(["simulate", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def report(capsys, *argv) -> None:
    capsys.readouterr()
    assert main(["report", *argv]) == 0, capsys.readouterr().err


def test_scaling_numbers_are_simulates(capsys, tmp_path):
    out = tmp_path / "scaling"
    report(capsys, "scaling", "gpt2-xl-p3", "--nodes", "1,2", "--grad-reduce",
           "ring,parameter-server", "-o", str(out))
    err = capsys.readouterr().err
    assert "scaling 4/4" in err                                   # progress on stderr
    check_page(out, "scaling")
    frame = pd.read_csv(out / "scaling.csv")
    assert list(frame["grad_reduce"]) == ["ring", "ring", "parameter-server", "parameter-server"]
    # The 2-node ring point, written as a scenario and simulated by the CLI, gives the same numbers.
    doc = yaml.safe_load(open("data/scenarios/gpt2-xl-p3.yaml"))
    doc["cluster"] = {"system": "p3.16xlarge", "nodes": 2}
    doc["parallel"].update(data=4, grad_reduce="ring", zero=0)    # named reductions run at ZeRO 0
    doc["training"]["global_batch"] = 128                         # batch per replica kept
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    sim = simulate_json(capsys, tmp_path / "p.yaml")
    row = frame[(frame["grad_reduce"] == "ring") & (frame["nodes"] == 2)].iloc[0]
    for key in ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib"):
        assert row[key] == pytest.approx(sim[key], rel=1e-12)
    one = frame[(frame["grad_reduce"] == "ring") & (frame["nodes"] == 1)].iloc[0]
    assert row["scaling_efficiency"] == pytest.approx(sim["tokens_per_s"] / (2 * one["tokens_per_s"]))


def test_scaling_lists_a_failed_point_and_goes_on(capsys, tmp_path):
    out = tmp_path / "s"
    # llama2-70b-h100 needs 32 GPUs per model copy: 1 and 2 DGX nodes cannot hold one.
    report(capsys, "scaling", "llama2-70b-h100", "--nodes", "2,4", "--grad-reduce", "ring",
           "-o", str(out))
    frame = pd.read_csv(out / "scaling.csv", keep_default_na=False)
    assert "model-parallel group" in frame.loc[frame["nodes"] == 2, "error"].iloc[0]
    assert frame.loc[frame["nodes"] == 4, "error"].iloc[0] == ""
    assert "Points not simulated" in (out / "scaling.html").read_text()


def test_timeline_breakdown_is_simulates(capsys, tmp_path):
    out = tmp_path / "t"
    report(capsys, "timeline", "llama2-70b-h100", "-o", str(out))
    page = check_page(out, "timeline")
    sim = simulate_json(capsys, "llama2-70b-h100")
    frame = pd.read_csv(out / "breakdown.csv")
    assert dict(zip(frame["part"], frame["seconds"])) == pytest.approx(sim["breakdown_s"], rel=1e-12)
    assert f"Step {sim['step_time_s']:.4f} s" in page
    ranks = pd.read_csv(out / "ranks.csv")
    assert list(ranks["rank"]) == [0, 1, 2, 3]                    # one rank per stage
    assert (ranks["forward_s"] > 0).all() and (ranks["backward_s"] > 0).all()


def test_memory_per_stage_is_simulates(capsys, tmp_path):
    out = tmp_path / "m"
    report(capsys, "memory", "gpt3-175b-a100", "-o", str(out))
    check_page(out, "memory")
    sim = simulate_json(capsys, "gpt3-175b-a100")
    frame = pd.read_csv(out / "memory.csv")
    assert len(frame) == len(sim["stage_memory_bytes"]) == 16
    for row, stage in zip(frame.itertuples(), sim["stage_memory_bytes"]):
        assert row.parameters_gib == pytest.approx(stage["parameters"] / 2**30)
        assert row.reserve_gib == pytest.approx(stage["reserve"] / 2**30)
        assert row.headroom_gib == pytest.approx(row.capacity_gib - row.total_gib)
    assert frame["total_gib"].max() == pytest.approx(sim["peak_memory_gib"], rel=1e-9)
    assert frame["capacity_gib"].iloc[0] == pytest.approx(sim["memory_capacity_gib"])


def test_validate_summary_is_validates(capsys, tmp_path):
    out = tmp_path / "v"
    report(capsys, "validate", "-o", str(out))
    check_page(out, "validate")
    capsys.readouterr()
    main(["validate", "--json"])
    summary = json.loads(capsys.readouterr().out)["summary"]
    frame = pd.read_csv(out / "summary.csv").set_index("rows")
    for label, group in (("fit", "fit"), ("held back", "holdout"), ("all", "all")):
        assert frame.loc[label, "count"] == summary[group]["count"]
        for key in ("median_abs_pct", "p90_abs_pct", "max_abs_pct"):
            if summary[group][key] is None:          # the dev CSV's fit takes every row: none held back
                assert pd.isna(frame.loc[label, key]) and summary[group]["count"] == 0
            else:
                assert frame.loc[label, key] == pytest.approx(summary[group][key], rel=1e-12)
    skipped = pd.read_csv(out / "skipped.csv")
    assert len(skipped) >= 1 and skipped["reason"].str.len().min() > 0
    # runs the fit never saw: the stored leave-one-source-out rows and the frozen sets' summaries
    from partita.validation.crossval import load_residuals
    loso = pd.read_csv(out / "loso.csv").set_index("source")
    assert loso.loc["all", "rows"] == len(load_residuals()["rows"])
    frozen = pd.read_csv(out / "frozen.csv").set_index("set")
    assert list(frozen.index) == ["bloom-layouts", "unseen-sources"]
    assert (out / "validate_loso.png").is_file()
    assert "Runs the fit never saw" in (out / "validate.html").read_text()


@pytest.mark.parametrize("argv, message", [
    (["scaling", "gpt2-xl-p3", "--nodes", "8-2"], "--nodes '8-2'"),
    (["scaling", "gpt2-xl-p3", "--grad-reduce", "allgather"], "--grad-reduce 'allgather'"),
    (["memory", "no-such-scenario"], "no-such-scenario"),
])
def test_bad_input_is_one_error_line(capsys, tmp_path, argv, message):
    assert main(["report", *argv, "-o", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]
    assert not (tmp_path / "x").exists()


def test_scaling_of_a_scenario_without_a_plan_is_one_error_line(capsys, tmp_path):
    """The sweep keeps the plan's TP x PP x CP, so a scenario `partita plan` has not completed
    is refused up front (it raised an AttributeError in the page)."""
    src = tmp_path / "open.yaml"
    src.write_text(yaml.safe_dump({"name": "open", "model": {"preset": "gpt2-xl"},
                                   "cluster": {"system": "p4d.24xlarge", "gpus": 8},
                                   "training": {"global_batch": 64}}))
    assert main(["report", "scaling", str(src), "--nodes", "1-2", "-o", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {src}: no parallel section") \
        and "partita plan" in err[0]
    assert not (tmp_path / "s").exists()


def test_validate_of_an_unreadable_csv_is_the_one_error_line(capsys, tmp_path):
    """The file is read before the progress line, so its error is all stderr says."""
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"id,metric\n\x00\n")
    assert main(["report", "validate", str(bad), "-o", str(tmp_path / "v")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}: a NUL byte")
    assert not (tmp_path / "v").exists()


def test_output_path_that_is_a_file_is_refused(capsys, tmp_path):
    target = tmp_path / "file"
    target.write_text("mine")
    assert main(["report", "memory", "gpt2-xl-p3", "-o", str(target)]) == 1
    assert "not a directory" in capsys.readouterr().err
    assert target.read_text() == "mine"


def test_timeline_of_chosen_stages_with_a_close_up_of_the_fill(capsys, tmp_path):
    out = tmp_path / "t"
    report(capsys, "timeline", "gpt3-175b-a100", "--stages", "0,15", "-o", str(out))
    check_page(out, "timeline")
    assert list(pd.read_csv(out / "ranks.csv")["rank"]) == [0, 15]
    assert (out / "timeline_fill.png").is_file()          # 192 micro-batches: the fill is short
    assert main(["report", "timeline", "gpt3-175b-a100", "--stages", "16",
                 "-o", str(tmp_path / "x")]) == 1
    assert "stages 0-15" in capsys.readouterr().err


def test_validate_memory_summary_is_validates(capsys, tmp_path):
    out = tmp_path / "vm"
    report(capsys, "validate", "--memory", "-o", str(out))
    check_page(out, "validate")
    assert (out / "validate_memory.png").is_file()
    capsys.readouterr()
    main(["validate", "--memory", "--json"])
    summary = json.loads(capsys.readouterr().out)["summary"]
    frame = pd.read_csv(out / "memory_summary.csv").set_index("rows")
    for label, group in (("fit", "memory_fit"), ("held back", "memory_holdout"), ("all", "memory")):
        assert frame.loc[label, "count"] == summary[group]["count"]
        assert frame.loc[label, "p90_abs_pct"] == pytest.approx(summary[group]["p90_abs_pct"])
    # the frozen BLOOM rows' step times are withheld from the page, as `validate` withholds them
    from partita.validation.frozen import frozen_row_ids
    from partita.validation.runner import MEMORY_CSV
    rows = pd.read_csv(out / "rows.csv").set_index("id")
    frozen = sorted(frozen_row_ids(MEMORY_CSV) & set(rows.index))
    assert frozen and rows.loc[frozen, "predicted_step_s"].isna().all()
    assert rows.drop(index=frozen)["predicted_step_s"].notna().any()
    assert "step times of 53 rows of a frozen test set are withheld" in (
        out / "validate.html").read_text()


def test_scaling_with_no_point_simulated_still_reports_why(capsys, tmp_path):
    out = tmp_path / "s"
    report(capsys, "scaling", "llama2-70b-h100", "--nodes", "1,2", "--grad-reduce", "ring",
           "-o", str(out))
    assert not list(out.glob("*.png"))
    page = (out / "scaling.html").read_text()
    assert "No point simulated" in page and page.count("model-parallel group") >= 2


def test_validate_with_every_row_skipped_lists_the_reasons(capsys, tmp_path):
    src = open("data/validation/published_dev.csv").read().splitlines()
    rows = [src[0]] + [line for line in src[1:] if line.startswith("GPIPE-0")]   # TPU / CNN rows
    (tmp_path / "few.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "v"
    report(capsys, "validate", str(tmp_path / "few.csv"), "-o", str(out))
    assert not list(out.glob("*.png"))
    skipped = pd.read_csv(out / "skipped.csv")
    assert len(skipped) == len(rows) - 1 and skipped["reason"].str.len().min() > 0


def test_a_directory_holding_other_files_of_the_same_name_is_refused(capsys, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "memory.csv").write_text("mine")
    assert main(["report", "memory", "gpt2-xl-p3", "-o", str(out)]) == 1
    assert "would overwrite memory.csv" in capsys.readouterr().err
    assert (out / "memory.csv").read_text() == "mine"
    (out / "memory.csv").unlink()
    report(capsys, "memory", "gpt2-xl-p3", "-o", str(out))
    report(capsys, "memory", "gpt2-xl-p3", "-o", str(out))      # its own page: rewritten


def test_scaling_fixed_batch_keeps_the_global_batch(capsys, tmp_path):
    out = tmp_path / "s"
    report(capsys, "scaling", "gpt2-xl-p3", "--nodes", "1,2,64", "--grad-reduce", "ring",
           "--fixed-batch", "-o", str(out))
    frame = pd.read_csv(out / "scaling.csv", keep_default_na=False)
    assert list(frame["global_batch"][:2]) == ["64", "64"] and list(frame["data"][:2]) == ["2", "4"]
    # 64 nodes: data 128 x micro-batch 2 > 64 sequences, listed with the reason
    assert "not a multiple of micro-batch 2 x data 128" in frame["error"].iloc[2]
