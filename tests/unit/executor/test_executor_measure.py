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
