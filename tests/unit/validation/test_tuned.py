"""validation.tuned: an unstated micro-batch is the fastest predicted that fits, chosen without
the row's measurement and without the fitted fractions."""
from __future__ import annotations

import pytest

from partita.validation import tuned
from partita.validation.rowmap import map_row, read_rows
from partita.validation.rowrules import load_rules


class _Result:
    def __init__(self, step, fits):
        self.step_time_s, self.fits_in_memory = step, fits


@pytest.fixture
def fake_simulate(monkeypatch):
    """Each scenario stands for its micro-batch; `table` maps it to (step, fits)."""
    table: dict[int, tuple[float, bool]] = {}
    seen = []

    def simulate(scenario, catalog, *, overheads=None):
        seen.append(overheads)
        return _Result(*table[scenario])
    monkeypatch.setattr("partita.simulator.step.simulate", simulate)
    monkeypatch.setattr(tuned, "_catalog", lambda: None)
    tuned._predict.cache_clear()            # predictions are kept per scenario
    yield table, seen
    tuned._predict.cache_clear()


def test_the_fastest_that_fits_wins(fake_simulate):
    table, _ = fake_simulate
    table.update({1: (3.0, True), 2: (2.0, True), 4: (1.0, False)})
    mb, how = tuned.fastest_micro_batch(4, lambda mb: mb)
    assert mb == 2 and "4: 1 s (does not fit)" in how and how.startswith("the fastest")


def test_only_divisors_of_the_ranks_share_are_tried(fake_simulate):
    table, _ = fake_simulate
    table.update({1: (3.0, True), 2: (1.0, True)})
    assert tuned.fastest_micro_batch(6, lambda mb: mb)[0] == 2      # 4 and 8 do not divide 6


def test_none_fits_takes_the_smallest_and_says_so(fake_simulate):
    table, _ = fake_simulate
    table.update({1: (3.0, False), 2: (1.0, False)})
    mb, how = tuned.fastest_micro_batch(2, lambda mb: mb)
    assert mb == 1 and how.startswith("the smallest, as none fits")


def test_a_candidate_that_is_no_scenario_is_passed_over(fake_simulate):
    table, _ = fake_simulate
    table.update({1: (3.0, True)})
    assert tuned.fastest_micro_batch(2, lambda mb: None if mb == 2 else mb)[0] == 1


def test_the_choice_ignores_the_fitted_fractions(fake_simulate):
    table, seen = fake_simulate
    table.update({1: (1.0, True)})
    tuned.fastest_micro_batch(1, lambda mb: mb)
    oh = seen[0]
    assert oh.sustained_by_family == {} and oh.sustained_default == 1.0
    assert oh.zero3_collective_fraction == {}


def test_a_row_asking_for_it_records_the_choice_and_keeps_its_measurement():
    rules = load_rules()
    row = next(r for r in read_rows() if r["id"] == "MLM24-04")
    m = map_row(row, rules)
    note = next(a for a in m.assumptions if a.startswith("micro_batch"))
    assert note.startswith("micro_batch 4:") and "fastest predicted that fits" in note
    assert "1: " in note and "2: " in note                  # every candidate's prediction shown
    # the measured step comes from the row's TFLOP/s, whatever the micro-batch
    one = map_row({**row, "micro_batch": "1"}, rules)
    assert one.scenario.training.micro_batch == 1
    assert one.measured_step_s == pytest.approx(m.measured_step_s)
