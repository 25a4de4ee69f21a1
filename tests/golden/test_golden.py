"""CI regression: the validation summary and the shipped scenarios' predictions must not drift.

tests/golden/validation_summary.json holds the hold-out median / p90 / max and the fit median of
`partita validate` (absolute error, percent); a move of more than 0.5 percentage point fails.
tests/golden/memory_summary.json holds the same for the peak memory of `partita validate --memory`
(data/validation/published_memory.csv, split by data/validation/split_memory.yaml).
tests/golden/predictions.json holds step_time_s and peak_memory_gib of every data/scenarios/*.yaml
with a parallel section; a relative move of more than 1e-9 fails. Rewrite both on purpose with
`pytest tests/golden/test_golden.py --update-golden` and commit the diff with the change that
caused it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from partita.planner.paths import SCENARIOS_DIR

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent
SUMMARY_FILE = GOLDEN / "validation_summary.json"
MEMORY_SUMMARY_FILE = GOLDEN / "memory_summary.json"
PREDICTIONS_FILE = GOLDEN / "predictions.json"
SUMMARY_TOLERANCE_PCT = 0.5          # percentage points
PREDICTION_RTOL = 1e-9
SUMMARY_KEYS = {"holdout": ("median_abs_pct", "p90_abs_pct", "max_abs_pct"), "fit": ("median_abs_pct",)}

# The step-time error is no longer held under a ceiling here: the goldens guard drift, and the
# accuracy that counts is the leave-one-source-out figure (`partita validate --cross-validate`),
# which README quotes and tests/unit/simulator/test_validation.py checks against the stored
# residuals (#16).

# The issue's memory target: peak memory within 10% of the published figures. The hold-out p90 of
# the measured BLOOM peaks meets it (2.4 / 9.1 when written); never raised.
MEMORY_HOLDOUT_P90_CEILING_PCT = 10.0

UPDATE_HINT = ("if the change is intended, rewrite with: "
               "pytest tests/golden/test_golden.py --update-golden")


def _need_simulator() -> None:
    if not (ROOT / "simulator" / "step.py").exists():
        pytest.skip("simulator/step.py (simulate) is not in the tree yet")


def compare_summary(expected: dict, actual: dict, tol: float = SUMMARY_TOLERANCE_PCT) -> list[str]:
    problems = []
    for group, keys in SUMMARY_KEYS.items():
        if expected[group]["count"] != actual[group]["count"]:
            problems.append(f"{group}: {actual[group]['count']} rows compared, golden has "
                            f"{expected[group]['count']}")
        for key in keys:
            old, new = expected[group][key], actual[group][key]
            if (old is None) != (new is None) or (old is not None and abs(new - old) > tol):
                problems.append(f"{group} {key}: {new} %, golden {old} % (tolerance {tol} pp)")
    return problems


def compare_predictions(expected: dict, actual: dict, rtol: float = PREDICTION_RTOL) -> list[str]:
    problems = [f"{name}: no golden prediction" for name in sorted(set(actual) - set(expected))]
    problems += [f"{name}: golden prediction but no such scenario" for name in sorted(set(expected) - set(actual))]
    for name in sorted(set(actual) & set(expected)):
        for key, new in actual[name].items():
            old = expected[name].get(key)
            if old is None or abs(new - old) > rtol * abs(old):
                problems.append(f"{name} {key}: {new!r}, golden {old!r}")
    return problems


def _check(path: Path, actual: dict, update: bool, compare) -> None:
    if update:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(actual, indent=2, sort_keys=True) + "\n")
        return
    if not path.exists():
        pytest.fail(f"{path.name} is missing; {UPDATE_HINT}")
    problems = compare(json.loads(path.read_text()), actual)
    assert not problems, "\n".join(problems + [UPDATE_HINT])


@pytest.fixture(scope="module")
def shipped_catalog(tmp_path_factory):
    """The shipped catalog only: no ~/.partita/local.yaml, no $PARTITA_CATALOG."""
    _need_simulator()
    from partita.planner.catalog import load_catalog
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARTITA_HOME", str(tmp_path_factory.mktemp("partita_home")))
        mp.delenv("PARTITA_CATALOG", raising=False)
        yield load_catalog()


@pytest.fixture(scope="module")
def validation_summary(shipped_catalog) -> dict:
    from partita.validation.runner import run_validation
    report = run_validation(catalog=shipped_catalog)
    return {group: report.summary(group).to_json() for group in SUMMARY_KEYS}


def test_validation_summary_holds(validation_summary, update_golden):
    _check(SUMMARY_FILE, validation_summary, update_golden, compare_summary)


@pytest.fixture(scope="module")
def memory_summary(shipped_catalog) -> dict:
    from partita.validation.runner import MEMORY_CSV, MEMORY_SPLIT, load_split, run_validation
    report = run_validation(MEMORY_CSV, split=load_split(MEMORY_SPLIT), catalog=shipped_catalog)
    return {group: report.memory_summary(group).to_json() for group in SUMMARY_KEYS}


def test_memory_summary_holds(memory_summary, update_golden):
    _check(MEMORY_SUMMARY_FILE, memory_summary, update_golden, compare_summary)


def test_memory_holdout_within_issue_target(memory_summary):
    assert memory_summary["holdout"]["count"] > 0
    assert memory_summary["holdout"]["p90_abs_pct"] <= MEMORY_HOLDOUT_P90_CEILING_PCT


def shipped_predictions(catalog) -> dict[str, dict[str, float]]:
    """Every shipped scenario with a parallel section on a shipped system. (Scenarios on `local`,
    the machine `partita calibrate` measured, differ from machine to machine and are left out.)"""
    from partita.planner.scenario import load_scenario
    from partita.simulator.step import simulate
    out = {}
    for path in sorted(SCENARIOS_DIR.glob("*.yaml")):
        scenario = load_scenario(path)
        if scenario.parallel is None or not _shipped_system(catalog, scenario.cluster.system):
            continue
        result = simulate(scenario, catalog)
        out[path.name] = {"step_time_s": result.step_time_s, "peak_memory_gib": result.peak_memory_gib}
    return out


def _shipped_system(catalog, name: str) -> bool:
    from partita.planner.errors import PartitaError
    try:
        catalog.system(name)
    except PartitaError:
        return False
    return True


def test_shipped_scenario_predictions_hold(shipped_catalog, update_golden):
    _check(PREDICTIONS_FILE, shipped_predictions(shipped_catalog), update_golden, compare_predictions)


# The comparisons themselves, so that a drift is known to fail (runs without the simulator).

def _summary(median: float, p90: float, mx: float, fit: float, n: int = 60) -> dict:
    return {"holdout": {"count": n, "median_abs_pct": median, "p90_abs_pct": p90, "max_abs_pct": mx},
            "fit": {"count": 29, "median_abs_pct": fit}}


def test_summary_drift_beyond_half_a_point_fails():
    golden = _summary(10.0, 25.0, 60.0, 9.0)
    assert compare_summary(golden, _summary(10.4, 24.6, 60.5, 9.0)) == []
    assert compare_summary(golden, _summary(10.6, 25.0, 60.0, 9.0)) == [
        "holdout median_abs_pct: 10.6 %, golden 10.0 % (tolerance 0.5 pp)"]
    assert compare_summary(golden, _summary(10.0, 25.0, 60.0, 8.4)) != []
    assert compare_summary(golden, _summary(10.0, 25.0, 60.0, 9.0, n=59)) != []


def test_prediction_drift_fails():
    golden = {"a.yaml": {"step_time_s": 1.0, "peak_memory_gib": 10.0}}
    assert compare_predictions(golden, {"a.yaml": {"step_time_s": 1.0 + 1e-12, "peak_memory_gib": 10.0}}) == []
    assert compare_predictions(golden, {"a.yaml": {"step_time_s": 1.0 + 1e-6, "peak_memory_gib": 10.0}}) != []
    assert compare_predictions(golden, {}) == ["a.yaml: golden prediction but no such scenario"]
    assert compare_predictions({}, golden) == ["a.yaml: no golden prediction"]
