"""benchmarks/microbatch_structure.py: its families and its line through measured steps."""
from __future__ import annotations

import numpy as np
import pytest

from partita.validation.crossval import dev_rows


@pytest.fixture(scope="module")
def mbs():
    from benchmarks import microbatch_structure
    return microbatch_structure


@pytest.fixture(scope="module")
def rows():
    return {m.row_id: m for m in dev_rows()}


def test_line_recovers_slope_and_intercept(mbs):
    m = np.array([160.0, 192.0, 240.0])
    assert mbs.line(m, 0.2 * m + 12.5) == pytest.approx((0.2, 12.5))


def test_a_family_differs_only_in_micro_batches_per_step(mbs, rows):
    """MT-NLG's three layouts are one family (m 240, 192, 160); Narayanan et al. 2021's runs of the
    same model and layout are another source, so another family; a change of micro-batch size or
    of layout is another family."""
    key = mbs.family_key
    assert key(rows["MTNLG-01"]) == key(rows["MTNLG-02"]) == key(rows["MTNLG-03"])
    assert [mbs.microbatches(rows[f"MTNLG-0{i}"]) for i in (1, 2, 3)] == [240, 192, 160]
    assert key(rows["NAR21-20"]) != key(rows["MTNLG-01"])
    assert key(rows["NAR21-20"]) == key(rows["NAR21-22"])
    assert key(rows["NAR21-14"]) != key(rows["NAR21-15"])          # micro-batch 4 against 2
    assert key(rows["LLAMA3-01"]) == key(rows["LLAMA3-02"])
    assert key(rows["LLAMA3-02"]) != key(rows["LLAMA3-03"])         # context parallel 16


def test_main_prints_every_family_with_two_step_counts(mbs, capsys):
    assert mbs.main() == 0
    out = capsys.readouterr().out
    assert "MTNLG-03 (m 160), MTNLG-02 (m 192), MTNLG-01 (m 240)" in out
    assert out.count("  a  measured") == out.count("  b  measured") >= 5
