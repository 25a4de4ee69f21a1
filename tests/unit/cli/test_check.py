"""`partita check`: record a baseline, recheck it unchanged (exit 0), name every moved metric
(exit 1), JUnit XML, and one `error:` line for bad input without touching the user's files."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from partita import __version__
from partita.cli import main
from partita.reports.regression import compare

SCENARIOS = ("gpt2-xl-p3", "t5-3b-p4d")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    path = tmp_path_factory.mktemp("check") / "baseline.json"
    assert main(["check", str(path), "--record", *SCENARIOS]) == 0
    return path


def lines(capsys) -> tuple[list[str], list[str]]:
    got = capsys.readouterr()
    return got.out.strip().splitlines(), got.err.strip().splitlines()


def test_record_writes_version_hashes_and_metrics(baseline, capsys):
    doc = json.loads(baseline.read_text())
    assert doc["partita_version"] == __version__
    assert len(doc["catalog_sha256"]) == len(doc["calibration_sha256"]) == 64
    assert doc["sweep_multipliers"] == [1, 2, 4]
    assert set(doc["scenarios"]) == set(SCENARIOS)
    capsys.readouterr()
    main(["simulate", "gpt2-xl-p3", "--json"])
    sim = json.loads(capsys.readouterr().out)
    m = doc["scenarios"]["gpt2-xl-p3"]["metrics"]
    assert m["step_time_s"] == sim["step_time_s"] and m["tokens_per_s"] == sim["tokens_per_s"]
    assert m["peak_memory_gib"] == sim["peak_memory_gib"]
    assert m["scaling_efficiency_x1"] == 1.0 and 0 < m["scaling_efficiency_x4"] <= 1.0


def test_unchanged_predictions_pass(baseline, capsys, tmp_path):
    junit = tmp_path / "check.xml"
    assert main(["check", str(baseline), "--junit", str(junit)]) == 0
    out, _ = lines(capsys)
    assert out[-1].startswith("2 scenario(s), 12 metric(s): 0 moved")
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "12" and suite.get("failures") == "0"


def test_every_moved_metric_is_named(baseline, capsys, tmp_path):
    doc = json.loads(baseline.read_text())
    doc["scenarios"]["gpt2-xl-p3"]["metrics"]["step_time_s"] *= 1.03
    doc["scenarios"]["t5-3b-p4d"]["metrics"]["scaling_efficiency_x2"] *= 0.95
    doc["scenarios"]["t5-3b-p4d"]["metrics"]["peak_memory_gib"] *= 1.01    # within 2%
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(doc))
    before = moved.read_bytes()
    junit = tmp_path / "check.xml"
    assert main(["check", str(moved), "--junit", str(junit)]) == 1
    out, _ = lines(capsys)
    flagged = [line for line in out if line.startswith("MOVED")]
    assert len(flagged) == 2
    assert flagged[0].startswith("MOVED gpt2-xl-p3 step_time_s:") and "(-2.91%, tolerance 2%)" in flagged[0]
    assert flagged[1].startswith("MOVED t5-3b-p4d scaling_efficiency_x2:")
    assert moved.read_bytes() == before                     # a check never rewrites the baseline
    failures = [c for c in ET.parse(junit).getroot().iter("testcase") if c.find("failure") is not None]
    assert [(c.get("classname"), c.get("name")) for c in failures] == [
        ("gpt2-xl-p3", "step_time_s"), ("t5-3b-p4d", "scaling_efficiency_x2")]
    # A looser tolerance lets both through.
    assert main(["check", str(moved), "--tolerance", "6%"]) == 0


def test_one_scenario_of_the_baseline(baseline, capsys):
    assert main(["check", str(baseline), "t5-3b-p4d"]) == 0
    out, _ = lines(capsys)
    assert out[-1].startswith("1 scenario(s), 6 metric(s)")


def test_a_changed_catalog_is_noted(baseline, capsys, tmp_path):
    doc = json.loads(baseline.read_text())
    doc["catalog_sha256"] = "0" * 64
    doc["partita_version"] = "0.0.0"
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    assert main(["check", str(path)]) == 0
    _, err = lines(capsys)
    assert any("catalog differs" in e for e in err) and any("partita 0.0.0" in e for e in err)


def test_a_point_that_now_fails_is_a_move():
    found = compare("s", {"scaling_efficiency_x2": 0.9}, {"scaling_efficiency_x2": "error: x"}, 0.02)
    assert found[0].moved and "0.9 -> error: x" in found[0].message
    assert not compare("s", {"a": "error: x"}, {"a": "error: y"}, 0.02)[0].moved
    assert compare("s", {}, {"new": 1.0}, 0.02)[0].moved


@pytest.mark.parametrize("content, message", [
    (None, "no such baseline file"),
    ("{not json", "invalid JSON"),
    ('{"format": "other"}', "not a partita check baseline"),
    ('{"format": "partita-check-baseline/1", "scenarios": {}}', "'scenarios' must be"),
    ('{"format": "partita-check-baseline/1", "scenarios": {"a": {"file": "x", "metrics": {"m": [1]}}}}',
     "scenarios.a.metrics.m"),
])
def test_bad_baseline_is_one_error_line(capsys, tmp_path, content, message):
    path = tmp_path / "b.json"
    if content is not None:
        path.write_text(content)
    assert main(["check", str(path)]) == 1
    out, err = lines(capsys)
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert (content is None) == (not path.exists())


@pytest.mark.parametrize("value", ["abc", "x%", "inf%", "-3"])
def test_bad_tolerance_is_a_usage_error(capsys, baseline, value):
    with pytest.raises(SystemExit) as exc:
        main(["check", str(baseline), f"--tolerance={value}"])
    assert exc.value.code == 2
    assert "--tolerance" in capsys.readouterr().err


def test_refusals_touch_nothing(capsys, baseline, tmp_path):
    before = baseline.read_bytes()
    assert main(["check", str(baseline), "--junit", str(baseline)]) == 1
    assert main(["check", str(baseline), "no-such-scenario"]) == 1
    assert main(["check", str(tmp_path / "new.json"), "--record", "no-such-scenario"]) == 1
    _, err = lines(capsys)
    assert [e.split(":")[0] for e in err if not e.startswith("check:")] == ["error"] * 3
    assert baseline.read_bytes() == before and not (tmp_path / "new.json").exists()


def test_recording_one_bad_file_is_one_error_line(capsys, tmp_path):
    """One named file: no progress line before its error (several files: one line each)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {preset: gpt3-175b}\ncluster: {system: dgx-a100-80gb, "
                   "gpus: 8}\ntraining: {global_batch: 8}\nparallel: {tensor: 8, context: 0}\n")
    assert main(["check", str(tmp_path / "new.json"), "--record", str(bad)]) == 1
    _, err = lines(capsys)
    assert err == [f"error: {bad}: parallel.context: must be >= 1, got 0"]


def test_a_scenario_on_part_of_a_node_has_no_node_sweep(tmp_path, capsys):
    import yaml
    doc = yaml.safe_load(open("data/scenarios/gpt2-xl-p3.yaml"))
    doc["cluster"] = {"system": "p3.16xlarge", "gpus": 4}
    doc["parallel"]["data"] = 1
    (tmp_path / "half.yaml").write_text(yaml.safe_dump(doc))
    base = tmp_path / "b.json"
    assert main(["check", str(base), "--record", str(tmp_path / "half.yaml")]) == 0
    metrics = json.loads(base.read_text())["scenarios"]["gpt2-xl-p3"]["metrics"]
    assert set(metrics) == {"step_time_s", "tokens_per_s", "peak_memory_gib"}
