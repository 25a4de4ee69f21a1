"""Which GPU families the step-time fit gives a number (fitting/step_time.py `fitted_families`):
the catalog's families that rows run on or the fitted file holds; a same-chip family copies."""
from __future__ import annotations

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
