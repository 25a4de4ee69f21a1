"""`partita report run RUN_DIR`: a real 2-process run of tiny-gpt-pp2 against its prediction.

The prediction needs this machine's `local` system; data/local-machine beside this file holds one
written by `partita calibrate --quick` (a fixed input, so the test does not depend on the host's
speed)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from partita.cli import main
from report_pages import check_page

LOCAL = Path(__file__).resolve().parent / "data" / "local-machine"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    for f in LOCAL.iterdir():
        shutil.copy(f, home / f.name)
    mp = pytest.MonkeyPatch()
    mp.setenv("PARTITA_HOME", str(home))
    out = tmp_path_factory.mktemp("run") / "tiny"
    assert main(["run", "tiny-gpt-pp2", "--steps", "3", "--out", str(out)]) == 0
    yield out
    mp.undo()


@pytest.mark.slow
def test_run_report_joins_measured_and_predicted(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARTITA_HOME", str(LOCAL))
    result = json.loads((run_dir / "result.json").read_text())
    out = tmp_path / "r"
    capsys.readouterr()
    assert main(["report", "run", str(run_dir), "-o", str(out)]) == 0
    check_page(out, "run")
    assert {p.name for p in out.glob("*.png")} == {"run_steps.png", "run_timeline.png",
                                                    "run_actions.png"}
    steps = pd.read_csv(out / "steps.csv")
    assert list(steps["measured_step_s"]) == result["step_times_s"]
    assert steps["predicted_step_s"].iloc[0] == pytest.approx(result["predicted_step_time_s"])
    actions = pd.read_csv(out / "actions.csv")
    # 1F1B, 2 stages, 4 micro-batches: 8 forward and 8 backward actions, every one predicted too.
    assert len(actions) == 16 and actions["predicted_s"].notna().all()
    assert set(actions["action"]) == {f"{s}{k}{m}" for s in (0, 1) for k in "FB" for m in range(4)}
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    measured = {(s["rank"], s["name"]): s["end_s"] - s["start_s"] for s in last["spans"]}
    for row in actions.itertuples():
        assert row.measured_s == pytest.approx(measured[(row.stage, row.action)])


def test_run_report_without_prediction_says_why(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "empty"))
    out = tmp_path / "r"
    assert main(["report", "run", str(run_dir), "-o", str(out)]) == 0
    page = (out / "run.html").read_text()
    assert "no prediction for tiny-gpt-pp2" in page and "unknown system" in page
    assert pd.read_csv(out / "steps.csv")["predicted_step_s"].isna().all()


@pytest.mark.parametrize("broken, message", [
    ("missing", "no such run directory"),
    ("no-result", "no result.json"),
    ("bad-json", "invalid JSON"),
])
def test_bad_run_directory(tmp_path, capsys, broken, message):
    d = tmp_path / "run"
    if broken != "missing":
        d.mkdir()
        (d / "metrics.jsonl").write_text("{}\n")
    if broken == "bad-json":
        (d / "result.json").write_text("{not json")
    assert main(["report", "run", str(d), "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_each_stage_is_drawn_from_its_tp0_dp0_rank():
    from partita.reports.run import RunDir, stage_spans
    # TP 2 x DP 2 x PP 2: world rank = tp + 2 * (dp + 2 * pp) (executor/plan.py), so stage 1's
    # representative is rank 4; ranks 1-3 and 5-7 are other TP / DP members.
    spans = [{"rank": r, "lane": "compute", "name": f"{r // 4}F0", "start_s": 0.0, "end_s": 1.0 + r,
              "cat": "forward"} for r in range(8)]
    run = RunDir(path=Path("."), result={"plan": {"tensor": 2, "data": 2, "pipeline": 2}},
                 steps=({"step": 1, "spans": spans},))
    got = stage_spans(run, run.steps[0])
    assert [(s.rank, s.name, s.end_s) for s in got] == [(0, "0F0", 1.0), (1, "1F0", 5.0)]
