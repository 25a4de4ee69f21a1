"""Data by provenance: the calibration files keep facts, measured, fitted and chosen numbers in
separate sections, and `partita catalog numbers` lists every number that is not a fact."""
from __future__ import annotations

import json

import pytest
import yaml

from partita.cli import main
from partita.commands.catalog_numbers import REFERENCE_ONLY, data_files, non_facts
from partita.fitting.writer import FittedFile, write_fitted_file
from partita.planner.errors import PartitaError
from partita.planner.paths import CALIBRATION_DIR
from partita.planner.provenance import KINDS, is_sectioned, load_by_provenance, numbers


def test_every_calibration_file_the_simulator_reads_is_sectioned_by_provenance():
    files = data_files()
    assert {p.name for p in files} >= {"compute.yaml", "network.yaml", "memory.yaml", "host.yaml",
                                       "training.yaml", "fitted.yaml", "fitted_memory.yaml"}
    for path in files:
        doc = yaml.safe_load(path.read_text())
        assert is_sectioned(doc) and set(doc) <= set(KINDS), path.name
    assert all((CALIBRATION_DIR / name).is_file() for name in REFERENCE_ONLY)


def test_the_listing_names_each_kind_with_a_source_and_a_unit():
    found = non_facts()
    kinds = {n.kind for n in found}
    assert kinds == {"measured", "fitted", "chosen"}
    assert all(n.source and n.unit for n in found)
    by_key = {(n.file.rsplit("/", 1)[-1], n.key): n for n in found}
    fitted = by_key[("fitted.yaml", "sustained_matmul_fraction.a100")]
    assert fitted.kind == "fitted" and fitted.source.startswith("python benchmarks/fit_overheads.py")
    assert by_key[("fitted_memory.yaml", "framework_buffers_gib.deepspeed")].unit == "GiB"
    assert by_key[("network.yaml", "tiers.efa.half_bandwidth_mb")].kind == "fitted"
    assert by_key[("compute.yaml", "default.kernel_floor_us")].kind == "chosen"
    assert by_key[("training.yaml", "overlap_slowdown")].source.startswith("Lee et al. 2025")
    # facts are not listed: datasheet peaks and NCCL's latency tables
    assert ("compute.yaml", "gpus.h100-80gb.matmul.bf16.peak_tflops") not in by_key
    assert ("network.yaml", "tiers.nvswitch.step_latency_us") not in by_key


def test_catalog_numbers_prints_each_number_and_the_counts(capsys):
    assert main(["catalog", "numbers", "--kind", "fitted"]) == 0
    out = capsys.readouterr().out
    import yaml
    from partita.planner.paths import CALIBRATION_DIR
    fit = yaml.safe_load((CALIBRATION_DIR / "fitted.yaml").read_text())["fitted"]
    a100 = fit["sustained_matmul_fraction"]["a100"]
    assert f"fitted   sustained_matmul_fraction.a100 = {a100:g} fraction" in out
    assert f"source: python benchmarks/fit_overheads.py --write on {len(fit['rows'])} rows" in out
    count = sum(n.kind == "fitted" for n in non_facts())
    assert out.strip().splitlines()[-1] == f"{count} numbers that are not facts (fitted {count})"
    assert main(["catalog", "numbers", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(non_facts()) and {"kind", "unit", "file", "key", "source"} <= set(rows[0])


@pytest.mark.parametrize("text, message", [
    ("facts: {a_us: 1}\nchosen: {a_us: 2, source: x}\n", "a_us: stands in both facts and chosen"),
    ("facts: {a_us: 1}\nextra_us: 2\n", "extra_us: a file with provenance sections holds only"),
    ("chosen: {tiers: {x: {efficiency: 0.5}}}\n", "chosen.tiers.x.efficiency: a chosen number "
                                                  "needs a `source`"),
    ("measured: [1, 2]\n", "measured: expected a mapping"),
])
def test_bad_provenance_sections_name_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PartitaError, match=f"{path}: {message}".replace("(", r"\(")):
        load_by_provenance(path)


def test_sections_merge_into_the_files_own_layout_and_sources_join(tmp_path):
    path = tmp_path / "tiers.yaml"
    path.write_text("facts: {tiers: {t: {step_latency_us: 1.0, source: [A]}}}\n"
                    "fitted: {tiers: {t: {half_bandwidth_mb: 2.0, source: [B]}}}\n")
    assert load_by_provenance(path) == {"tiers": {"t": {"step_latency_us": 1.0,
                                                        "half_bandwidth_mb": 2.0,
                                                        "source": ["A", "B"]}}}
    assert [(n.kind, n.key, n.unit, n.source) for n in numbers(path)] == [
        ("fitted", "tiers.t.half_bandwidth_mb", "MB", "B")]


def test_the_writer_emits_a_fitted_file_the_loader_reads(tmp_path):
    from partita.simulator.overheads import TRAINING_FILE, load_overheads
    fitted = FittedFile(title="test fit", command="python fit.py --write", objective="least squares",
                        rows=("R-1", "R-2"), loss=0.5,
                        values={"sustained_matmul_fraction": {"default": 0.5, "a100": 0.6}})
    path = write_fitted_file(tmp_path / "fitted.yaml", fitted)
    oh = load_overheads(TRAINING_FILE, fitted=path)
    assert oh.sustained_default == 0.5 and oh.sustained_by_family == {"a100": 0.6}
    assert oh.zero3_collective_fraction == {}
    listed = numbers(path)
    assert [n.key for n in listed] == ["sustained_matmul_fraction.default",
                                       "sustained_matmul_fraction.a100"]
    assert {n.source for n in listed} == {"python fit.py --write on 2 rows"}
    assert path.read_text().startswith("# test fit\n")


def test_a_fitted_file_holds_only_the_fitted_numbers(tmp_path):
    """DeepSpeed's ZeRO-3 collective fraction is no longer fitted (#16): in fitted.yaml it is an
    unknown key naming what the file may hold; a user's own training.yaml may still set it."""
    from partita.simulator.overheads import TRAINING_FILE, load_overheads
    path = tmp_path / "fitted.yaml"
    path.write_text("fitted:\n  command: fit\n  sustained_matmul_fraction: {default: 0.5}\n"
                    "  zero3_collective_fraction: {deepspeed: 0.6}\n")
    with pytest.raises(PartitaError, match=r"fitted.yaml: zero3_collective_fraction: unknown key "
                                           r"\(valid: sustained_matmul_fraction, rows, "):
        load_overheads(TRAINING_FILE, fitted=path)
    own = tmp_path / "training.yaml"
    own.write_text("zero3_collective_fraction: {deepspeed: 0.6}\n")
    assert load_overheads(own).zero3_collective_fraction == {"deepspeed": 0.6}


def test_an_unknown_kind_is_a_usage_error_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["catalog", "numbers", "--kind", "bogus"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "invalid choice: 'bogus' (choose from 'measured', 'fitted', 'chosen')" in err
