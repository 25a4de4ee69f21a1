"""Turning every rank's step records into the run's numbers (no processes needed)."""
from __future__ import annotations

import pytest

from partita.executor.measure import StepRecord, step_lines, summarize
from partita.simulator.result import Span


def record(rank, step, wall, peak=None, reserved=None):
    span = Span(rank=rank, lane="compute", name=f"{rank}F0", start_s=0.0, end_s=wall / 2,
                cat="forward")
    return StepRecord(rank=rank, step=step, wall_s=wall, spans=(span,), peak_memory_bytes=peak,
                      peak_reserved_bytes=reserved)


def test_a_step_lasts_as_long_as_its_slowest_rank_and_the_first_is_warm_up():
    per_rank = [[record(0, 1, 5.0), record(0, 2, 1.0), record(0, 3, 2.0), record(0, 4, 1.5)],
                [record(1, 1, 4.0), record(1, 2, 1.2), record(1, 3, 1.0), record(1, 4, 1.0)]]
    s = summarize(per_rank, [4.0, 3.0, 2.5, 2.0], tokens_per_step=600)
    assert s.step_times_s == (5.0, 1.2, 2.0, 1.5) and s.warmup_steps == 1
    assert s.median_step_time_s == 1.5 and s.tokens_per_s == pytest.approx(400.0)
    lines = step_lines(s)
    assert [l["warmup"] for l in lines] == [True, False, False, False]
    assert [len(l["spans"]) for l in lines] == [2, 2, 2, 2]
    assert lines[1]["tokens_per_s"] == pytest.approx(500.0)


def test_one_step_runs_count_it_and_peak_memory_is_per_rank_and_per_step():
    s = summarize([[record(0, 7, 2.0, peak=10)], [record(1, 7, 3.0, peak=30)]], [1.0], 30)
    assert s.warmup_steps == 0 and s.median_step_time_s == 3.0
    assert s.peak_memory_bytes == (10, 30) and s.step_peak_memory_bytes == (30,)
    cpu = summarize([[record(0, 1, 1.0)]], [1.0], 30)
    assert cpu.peak_memory_bytes == (None,) and step_lines(cpu)[0]["peak_memory_bytes"] is None


def test_memory_is_reported_per_rank_next_to_the_prediction_of_its_stage():
    from types import SimpleNamespace

    from partita.executor.measure import (CPU_MEMORY_NOTE, format_memory, memory_report,
                                          predicted_stage_memory)
    sim = SimpleNamespace(details={"stage_memory_bytes": [{"parameters": 2 ** 30, "activations": 2 ** 29},
                                                           {"parameters": 2 ** 30}]})
    predicted = predicted_stage_memory(sim)
    assert predicted == [3 * 2 ** 29, 2 ** 30]
    assert predicted_stage_memory(SimpleNamespace(details={})) is None
    per_rank = [[record(r, 1, 1.0, peak=(r + 1) * 2 ** 30, reserved=(r + 2) * 2 ** 30)]
                for r in range(4)]
    cuda = summarize(per_rank, [1.0], 30)
    report = memory_report(cuda, "cuda", [0, 0, 1, 1], predicted)
    assert report["measured"] and report["note"] is None
    assert [r["predicted_bytes"] for r in report["ranks"]] == [3 * 2 ** 29, 3 * 2 ** 29, 2 ** 30, 2 ** 30]
    assert [r["peak_allocated_bytes"] for r in report["ranks"]] == [2 ** 30, 2 ** 31, 3 * 2 ** 30, 2 ** 32]
    lines = format_memory(report)
    assert "peak alloc GiB" in lines[0] and lines[3].split() == ["2", "1", "3.00", "4.00", "1.00"]
    cpu = memory_report(summarize([[record(0, 1, 1.0)]], [1.0], 30), "cpu", [0], [2 ** 30])
    assert not cpu["measured"] and cpu["note"] == CPU_MEMORY_NOTE
    assert cpu["ranks"][0]["peak_allocated_bytes"] is None and cpu["ranks"][0]["predicted_bytes"] == 2 ** 30
    assert format_memory(cpu) == [f"  {CPU_MEMORY_NOTE}", "  predicted memory per stage: stage 0 1.00 GiB"]


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
