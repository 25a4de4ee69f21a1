"""Effects of one change (validation.effects): pairs of one source, their kind, ratio and error."""
from __future__ import annotations

import copy

import pytest

from partita.planner.scenario import parse_scenario
from partita.validation.effects import (DECISIVE, change_kind, effect_line, effect_lines,
                                        effects_json, one_change_pairs, settings,
                                        summarize_effects)
from partita.validation.rowmap import MappedRow

BASE = {"model": {"arch": "gpt", "layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024,
                  "vocab": 50304},
        "cluster": {"system": "dgx-a100-80gb", "gpus": 8},
        "training": {"global_batch": 64, "micro_batch": 2, "precision": "bf16"},
        "parallel": {"tensor": 1, "pipeline": 1, "data": 8}}


def row(row_id: str, measured: float, *, source: str = "SRC", **sections) -> MappedRow:
    doc = copy.deepcopy(BASE)
    for section, values in sections.items():
        doc[section] = doc[section] | values
    return MappedRow(row_id=row_id, source_key=source, model="m", gpus=doc["cluster"]["gpus"],
                     document=doc, scenario=parse_scenario(doc), measured_step_s=measured,
                     conversion="", measured_peak_memory_gib=None, assumptions=())


def test_each_kind_of_change_is_named_by_the_settings_it_covers():
    assert change_kind({"cluster.gpus", "parallel.data", "training.global_batch"}) == "scale"
    assert change_kind({"parallel.tensor", "parallel.data"}) == "layout"
    assert change_kind({"training.micro_batch"}) == "layout"          # the first kind covering it
    assert change_kind({"training.recompute", "training.micro_batch"}) == "recompute"
    assert change_kind({"training.precision"}) == "precision"
    assert change_kind({"model.hidden", "model.layers", "training.micro_batch"}) == "model"
    assert change_kind({"cluster.system"}) == "system"
    assert change_kind({"model.hidden", "cluster.gpus"}) is None      # two kinds at once
    assert change_kind({"training.attention", "training.micro_batch"}) == "kernels"
    assert change_kind({"training.fused_cross_entropy", "training.norm_kernel"}) == "kernels"
    assert change_kind({"training.attention", "model.seq_len"}) is None  # two kinds at once
    assert change_kind({"training.optimizer"}) is None                # in no kind
    assert change_kind(()) is None


def test_settings_name_the_resolved_model_and_every_section():
    s = settings(parse_scenario(BASE))
    assert s["model.hidden"] == 1024 and s["model.ffn_hidden"] == 4096    # resolved default
    assert s["cluster.gpus"] == 8 and s["training.micro_batch"] == 2 and s["parallel.data"] == 8


def test_pairs_are_one_source_one_kind_slower_first():
    base = row("A", 2.0)
    rows = [(base, 1.0),
            (row("B", 1.0, cluster={"gpus": 16}, parallel={"data": 16},
                 training={"global_batch": 64}), 0.6),                        # scale
            (row("C", 2.5, parallel={"tensor": 2, "data": 4}), 1.5),          # layout
            (row("D", 3.0, model={"hidden": 2048, "heads": 16}, cluster={"gpus": 32},
                 parallel={"data": 32}), 2.0),                                # two kinds: out
            (row("E", 1.8, source="OTHER"), 0.9)]                             # other source: out
    pairs = {(p.slower, p.faster): p for p in one_change_pairs(rows)}
    assert set(pairs) == {("A", "B"), ("C", "A")}      # C and B differ in GPUs and layout: out
    scale = pairs["A", "B"]
    assert scale.kind == "scale" and scale.source_key == "SRC"
    assert scale.measured_ratio == pytest.approx(2.0) and scale.predicted_ratio == pytest.approx(1 / 0.6)
    assert scale.error == pytest.approx((1 / 0.6) / 2.0 - 1.0)
    assert scale.changed == ("cluster.gpus", "parallel.data")
    layout = pairs["C", "A"]                      # C measured slower: it comes first
    assert layout.kind == "layout" and layout.measured_ratio == pytest.approx(1.25)
    assert layout.predicted_ratio == pytest.approx(1.5) and layout.order_right


def test_a_row_without_a_prediction_pairs_with_nothing():
    assert one_change_pairs([(row("A", 2.0), None),
                             (row("B", 1.0, cluster={"gpus": 16}, parallel={"data": 16}), 0.5)]) == []


def test_summary_counts_the_decisive_pairs_and_how_often_their_order_is_right():
    a, b = row("A", 2.0), row("B", 1.0, cluster={"gpus": 16}, parallel={"data": 16})
    close = row("C", 2.0 * (DECISIVE - 0.01), parallel={"tensor": 2, "data": 4})
    pairs = one_change_pairs([(a, 1.0), (b, 1.2), (close, 0.9)])
    by = {(p.slower, p.faster): p for p in pairs}
    assert not by["A", "B"].order_right and by["A", "B"].decisive      # predicted the wrong way
    assert not by["C", "A"].decisive                     # 2% apart: no faster run to name
    s = summarize_effects(pairs)
    assert (s.pairs, s.sources) == (len(pairs), 1)
    assert s.decisive == sum(p.decisive for p in pairs) and s.order_right < s.decisive
    errors = sorted(abs(100 * p.error) for p in pairs)
    assert s.max_pct == pytest.approx(errors[-1])
    assert summarize_effects(pairs, "scale").pairs == 1


def test_lines_and_json_say_what_they_cover():
    a, b = row("A", 2.0), row("B", 1.0, cluster={"gpus": 16}, parallel={"data": 16})
    pairs = one_change_pairs([(a, 1.8), (b, 1.0)])
    line = effect_line(summarize_effects(pairs))
    assert line.startswith("Effects of one change (1 pairs of 1 sources): ratio error median 10.0%")
    assert "the faster run named in 1 of 1 pairs 3% or more apart" in line
    text = effect_lines(pairs, per_pair=True)
    assert any(t.lstrip().startswith("scale") and "1 of 1" in t for t in text)
    assert any("A           / B" in t and "(-10.0%)" in t for t in text)
    j = effects_json(pairs)
    assert j["by_kind"]["all"]["pairs"] == 1 and j["pairs"][0]["error_pct"] == pytest.approx(-10.0)
    assert "pairs" not in effects_json(pairs, per_pair=False)
    assert effect_line(summarize_effects([])).endswith("differs in one kind of setting")


def test_too_many_pairs_is_an_error_not_a_cut(monkeypatch):
    from partita.planner.errors import PartitaError
    from partita.validation import effects
    monkeypatch.setattr(effects, "MAX_PAIRS", 1)
    rows = [(row(f"R{mb}", float(mb), training={"micro_batch": mb, "global_batch": 64}), 1.0)
            for mb in (1, 2, 4)]                       # three layouts of one job: three pairs
    with pytest.raises(PartitaError, match="more than 1 pairs .* split the CSV by job"):
        one_change_pairs(rows)
    monkeypatch.setattr(effects, "MAX_PAIRS", 3)
    assert {p.kind for p in one_change_pairs(rows)} == {"layout"}
