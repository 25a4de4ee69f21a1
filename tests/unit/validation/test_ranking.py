"""Layout choice (validation.ranking): jobs, the pick, its regret and Kendall's tau."""
from __future__ import annotations

import pytest

from partita.validation.ranking import (choice_line, kendall_tau, layout_choices,
                                        summarize_choices)
from partita.validation.rowmap import MappedRow, read_rows, map_row
from partita.validation.rowrules import load_rules


@pytest.fixture(scope="module")
def nar21() -> dict[str, MappedRow]:
    rules = load_rules()
    rows = [map_row(r, rules) for r in read_rows() if r["id"] in
            ("NAR21-11", "NAR21-12", "NAR21-13", "NAR21-17", "NAR21-01")]
    return {m.row_id: m for m in rows if isinstance(m, MappedRow)}


def test_rows_of_one_model_gpus_and_batch_are_one_job(nar21):
    # NAR21-11 (ZeRO-3) and -17 (PTD-P): GPT 175B on 384 GPUs, batch 1536; NAR21-01 is alone.
    preds = {"NAR21-11": 2.0, "NAR21-17": 1.0, "NAR21-01": 0.5}
    choices = layout_choices((nar21[i], p) for i, p in preds.items())
    assert len(choices) == 1
    (c,) = choices
    assert set(c.row_ids) == {"NAR21-11", "NAR21-17"}
    assert c.best == min(c.row_ids, key=lambda i: nar21[i].measured_step_s)


def test_regret_is_the_picks_measured_time_over_the_best(nar21):
    best, worse = sorted(["NAR21-11", "NAR21-17"], key=lambda i: nar21[i].measured_step_s)
    right = layout_choices([(nar21[best], 1.0), (nar21[worse], 2.0)])[0]
    assert right.picked == best and right.regret == 0.0 and right.kendall_tau == 1.0
    wrong = layout_choices([(nar21[best], 2.0), (nar21[worse], 1.0)])[0]
    assert wrong.picked == worse and wrong.kendall_tau == -1.0
    assert wrong.regret == pytest.approx(nar21[worse].measured_step_s
                                         / nar21[best].measured_step_s - 1.0)
    s = summarize_choices([right, wrong])
    assert (s.jobs, s.best_picked) == (2, 1)
    assert s.regret_max_pct == pytest.approx(100 * wrong.regret)
    assert "Layout choice (2 jobs): measured best picked in 1" in choice_line(s)


def test_kendall_tau_counts_concordant_minus_discordant_pairs():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert kendall_tau([1, 2, 3], [10, 30, 20]) == pytest.approx(1 / 3)
    assert kendall_tau([1, 1], [1, 2]) == 0.0
    with pytest.raises(ValueError, match="length"):
        kendall_tau([1.0], [1.0])


def test_no_job_with_two_layouts_says_so():
    assert layout_choices([]) == []
    assert choice_line(summarize_choices([])) == "Layout choice: no job with two or more layouts"
