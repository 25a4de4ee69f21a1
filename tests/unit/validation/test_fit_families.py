"""Which GPU families the step-time fit gives a number (fitting/step_time.py `fitted_families`):
the catalog's families that rows run on or the fitted file holds; a same-chip family copies."""
from __future__ import annotations

import pytest

from partita.fitting.step_time import fitted_families, params
from partita.planner.catalog import load_catalog
from partita.simulator.overheads import load_overheads


def test_families_come_from_the_catalog_and_the_fitted_file():
    cat = load_catalog()
    stored = load_overheads().sustained_by_family
    fams = fitted_families(cat, [], stored)
    assert set(fams.fitted) | set(fams.copies) == set(stored)
    order = cat.gpu_families()
    assert list(fams.fitted) == sorted(fams.fitted, key=order.index)
    for family, of in fams.copies.items():          # a copy is the same chip as what it copies
        a = [g for g in map(cat.gpu, cat.gpu_names()) if g.family == family]
        b = [g for g in map(cat.gpu, cat.gpu_names()) if g.family == of]
        assert a[0].peak_flops == b[0].peak_flops and a[0].extra["arch"] == b[0].extra["arch"]
    # one sustained fraction per fitted family and nothing else (#16: ZeRO-3's fraction is not fitted)
    assert [p.name for p in params(fams)] == [f"sustained_matmul_fraction.{f}" for f in fams.fitted]


def test_a_row_on_a_new_family_adds_a_parameter_and_unknown_families_are_ignored():
    cat = load_catalog()
    extra = next(f for f in cat.gpu_families() if f not in load_overheads().sustained_by_family)
    fams = fitted_families(cat, [extra, None, "not-a-family"], {})
    assert fams.fitted == (extra,) and fams.copies == {}


class _Rates:
    """A stand-in predictor: a row's step is its family's true fraction over the fitted one."""

    def __init__(self, families: dict[str, str], truth: dict[str, float]) -> None:
        self.families, self.truth = families, truth

    def gpu_family(self, m):
        return self.families[m.row_id]

    def errors(self, rows, oh):
        return {m.row_id: self.truth[m.source_key] / oh.sustained(self.gpu_family(m)) - 1.0
                for m in rows}


def _row(row_id: str, source: str):
    from types import SimpleNamespace
    return SimpleNamespace(row_id=row_id, source_key=source)


def test_a_family_one_source_runs_on_is_not_fitted_and_its_rows_stay_out():
    """#16: a family's fraction needs rows of two sources; with one it takes the median of the
    families fitted, and its rows do not pull on them."""
    from partita.fitting.step_time import fit
    rows = [_row("A1", "SA"), _row("A2", "SB"), _row("V1", "SC")]
    pred = _Rates({"A1": "a100", "A2": "a100", "V1": "v100"}, {"SA": 0.8, "SB": 0.8, "SC": 0.5})
    result = fit(rows, load_catalog(), predictor=pred)
    assert result.values["sustained_matmul_fraction.a100"] == pytest.approx(0.8, abs=2e-3)
    assert result.values["sustained_matmul_fraction.v100"] == pytest.approx(
        result.values["sustained_matmul_fraction.a100"])          # SC's 0.5 is not fitted
    assert "V1" not in result.rows
    # a second source on V100 identifies it
    rows.append(_row("V2", "SD"))
    pred.families["V2"], pred.truth["SD"] = "v100", 0.5
    result = fit(rows, load_catalog(), predictor=pred)
    assert result.values["sustained_matmul_fraction.v100"] == pytest.approx(0.5, abs=2e-3)


def test_rows_of_one_source_fit_every_family_they_run_on():
    from partita.fitting.step_time import fit
    rows = [_row("A1", "SA"), _row("V1", "SA")]
    pred = _Rates({"A1": "a100", "V1": "v100"}, {"SA": 0.7})
    result = fit(rows, load_catalog(), predictor=pred)
    assert result.values["sustained_matmul_fraction.v100"] == pytest.approx(0.7, abs=2e-3)
