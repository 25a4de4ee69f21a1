"""What a real `partita run` measures: the trace of 2 gloo processes lines up with the simulated
one, and on CUDA each rank's peak memory is measured (the numbers from step records are unit-tested
in tests/unit/executor/test_executor_measure.py)."""
from __future__ import annotations

import pytest


@pytest.mark.slow
def test_measured_trace_lines_up_with_the_simulated_one(tmp_path, capsys, monkeypatch):
    """tiny-gpt-pp2 (2 stages, 1F1B, 4 micro-batches, embedding tied across the two ranks) run
    for 2 steps: its last step's trace has the simulator's lanes and action names for compute,
    sends and receives, plus the tied-embedding reduction in its own lane."""
    import json

    import yaml

    from partita.cli import main
    from partita.planner.paths import SCENARIOS_DIR
    from partita.simulator.trace import read_trace
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))
    assert main(["run", "tiny-gpt-pp2", "--steps", "2", "--json", "--out", str(tmp_path / "out")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["memory"]["measured"] is False and "not measured" in result["memory"]["note"]
    assert [r["peak_allocated_bytes"] for r in result["memory"]["ranks"]] == [None, None]
    measured = read_trace(tmp_path / "out" / "trace.json")
    doc = yaml.safe_load((SCENARIOS_DIR / "tiny-gpt-pp2.yaml").read_text())
    doc["cluster"] = {"system": "p4d.24xlarge", "gpus": 2}
    (tmp_path / "sim.yaml").write_text(yaml.safe_dump(doc))
    assert main(["simulate", str(tmp_path / "sim.yaml"), "--trace", str(tmp_path / "sim.json")]) == 0
    simulated = read_trace(tmp_path / "sim.json")

    def names(spans, lane):
        return {(s.rank, s.name) for s in spans if s.lane == lane}

    for lane in ("compute", "send"):
        assert names(measured, lane) == names(simulated, lane), lane
    # the simulator shows a receive only where compute waited; the executor times every wait
    assert names(simulated, "recv") <= names(measured, "recv")
    assert names(measured, "recv") == {(0, f"0RECV_B{mb}") for mb in range(4)} | {
        (1, f"1RECV_F{mb}") for mb in range(4)}
    assert names(measured, "tied") == {(0, "TIED_ALLREDUCE"), (1, "TIED_ALLREDUCE")}
    for s in measured:
        assert 0 <= s.start_s <= s.end_s


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_cuda_run_measures_peak_allocated_and_reserved_memory_per_rank(tmp_path, capsys,
                                                                     monkeypatch):
    """One NCCL process on one GPU: its peaks are measured, reserved >= allocated > the weights."""
    import json

    import yaml

    from partita.cli import main
    from partita.planner.paths import SCENARIOS_DIR
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))
    doc = yaml.safe_load((SCENARIOS_DIR / "tiny-gpt-pp2.yaml").read_text())
    doc["cluster"]["gpus"] = 1
    doc["parallel"].update(pipeline=1)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    assert main(["run", str(tmp_path / "s.yaml"), "--backend", "nccl", "--steps", "2", "--json",
                 "--out", str(tmp_path / "out")]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["measured"] and memory["note"] is None
    (rank,) = memory["ranks"]
    weights = 4 * (128 * 32 + 16 * 32)           # fp32 token and position tables alone
    assert rank["peak_reserved_bytes"] >= rank["peak_allocated_bytes"] > weights
