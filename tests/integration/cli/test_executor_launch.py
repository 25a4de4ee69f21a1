"""`partita run` for real (2 gloo processes under torchrun): a worker's bad input comes back as one
error, and a run keeps the JSON contract, writes its outputs and runs torch's 1F1B order."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from partita.cli import main
from partita.executor.launch import Job, Rendezvous, launch
from partita.planner.errors import PartitaError
from partita.planner.paths import SCENARIOS_DIR

TINY = SCENARIOS_DIR / "tiny-gpt-pp2.yaml"


@pytest.fixture(autouse=True)
def no_local_calibration(tmp_path, monkeypatch):
    """Runs here see no `partita calibrate` result, whatever the developer's home holds."""
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PARTITA_CATALOG", raising=False)


@pytest.mark.slow
def test_a_workers_bad_input_comes_back_as_one_error(tmp_path):
    """The worker re-checks the plan; its PartitaError reaches the launcher as the message."""
    job = Job(scenario=str(SCENARIOS_DIR / "tiny-llama-pp2-dp2.yaml"), world=2, steps=1,
              out_dir=str(tmp_path / "out"))
    with pytest.raises(PartitaError, match="= 4, but cluster has 2 GPUs"):
        launch(job, 2, Rendezvous(), log=open(tmp_path / "log.txt", "w"))


@pytest.mark.slow
def test_run_prints_the_contract_and_writes_its_outputs(capsys, tmp_path):
    from partita.planner.schedule import build
    from partita.simulator.trace import spans_from_trace
    out = tmp_path / "out"
    tokens = tmp_path / "tokens.bin"
    (np.arange(5000, dtype=np.uint16) * 7 % 128).astype(np.uint16).tofile(tokens)
    assert main(["run", str(TINY), "--steps", "3", "--json", "--out", str(out),
                 "--data", str(tokens)]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["data"] == str(tokens)
    assert {"step_times_s", "tokens_per_s", "predicted_step_time_s", "losses", "final_loss"} <= set(result)
    assert len(result["step_times_s"]) == len(result["losses"]) == 3
    assert result["final_loss"] == result["losses"][-1] and math.isfinite(result["final_loss"])
    assert result["predicted_step_time_s"] is None and "partita calibrate" in captured.err
    assert result["tokens_per_s"] == pytest.approx(8 * 16 / result["median_step_time_s"])
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2, 3] and [l["loss"] for l in lines] == result["losses"]
    assert json.loads((out / "result.json").read_text()) == result
    # The measured timeline joins the simulator's: every rank ran torch's 1F1B order of actions.
    spans = spans_from_trace(json.loads((out / "trace.json").read_text()))
    expected = build("1f1b", 2, 4)
    for rank in (0, 1):
        ran = [s.name for s in sorted(spans, key=lambda s: s.start_s)
               if s.rank == rank and s.lane == "compute"]
        assert ran == [str(a) for a in expected[rank] if a is not None]
        assert all(s.end_s >= s.start_s >= 0 for s in spans if s.rank == rank)
