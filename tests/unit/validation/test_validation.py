"""Published measurements -> scenarios, metric conversions, the fit/hold-out report and `partita validate`.

The harness is exercised with a stand-in simulator (a roofline at 100 TFLOP/s per GPU) so these
tests check the mapping, the conversions and the statistics, not the simulator's accuracy; that is
tests/golden/test_golden.py's job with the real `simulator.step.simulate`.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from partita.cli import main
from partita.planner.errors import PartitaError
from partita.planner.modelspec import TransformerDims, preset_dims
from partita.planner.paths import VALIDATION_DIR
from partita.planner.scenario import parse_scenario
from partita.validation import runner as validation
from partita.validation.metrics import hardware_flops, model_flops
from partita.simulator.result import GIB, SimResult
from partita.validation.rowcells import leading_int
from partita.validation.rowmap import COLUMNS, MappedRow, SkippedRow, map_row, read_rows
from partita.validation.rowrules import load_rules
from partita.validation.runner import load_split, run_validation, summarize

STANDIN_FLOPS = 100e12          # the stand-in simulator's FLOP/s per GPU


def standin_simulate(scenario, catalog):
    """Roofline stand-in: hardware FLOPs of the step at 100 TFLOP/s per GPU; refuses dgx1-v100."""
    if scenario.cluster.system == "dgx1-v100":
        raise PartitaError("stand-in: no model for dgx1-v100")
    flops = hardware_flops(scenario.model.resolve(), scenario.training.global_batch,
                           scenario.training.recompute)
    return SimResult(step_time_s=flops / (scenario.parallel.gpus * STANDIN_FLOPS), tokens_per_s=0.0,
                     samples_per_s=0.0, tflops_per_gpu=0.0, mfu=0.0, peak_memory_bytes=40 * GIB,
                     memory_capacity_bytes=80 * GIB, bubble_fraction=0.0, breakdown_s={},
                     memory_breakdown_bytes={})


@pytest.fixture(scope="module")
def mapped() -> dict[str, MappedRow | SkippedRow]:
    rules = load_rules()
    return {row["id"]: map_row(row, rules) for row in read_rows()}


@pytest.fixture
def standin(monkeypatch):
    # The command modules bind catalog_from_args when first imported: import them all before the
    # patch, or one imported under it would keep the stand-in for every later test.
    import importlib
    import pkgutil

    import partita.commands
    for info in pkgutil.iter_modules(partita.commands.__path__):
        importlib.import_module(f"partita.commands.{info.name}")
    monkeypatch.setattr(validation, "_default_simulate", lambda: standin_simulate)
    monkeypatch.setattr("partita.commands.catalog_from_args", lambda args: object())


# --- the shipped data -------------------------------------------------------------------------

def test_shipped_csv_has_the_published_rows_and_columns():
    rows = read_rows()
    assert len(rows) == 257
    assert set(rows[0]) == set(COLUMNS) - {"peak_memory_GiB"}    # the optional column is absent
    assert all(r["source"] and r["locator"] for r in rows)     # provenance kept


def test_bert_multi_node_table_rows_run_their_precision_column(mapped):
    """NVIDIA BERT's multi-node table, phase 1: the TF32 column at 128 sequences per GPU (the table's
    cell reads 126; 8192 accumulated over 64 steps on one node), fp16 at 256; 65,536 sequences a
    step at every node count, so the step is 65,536 / throughput. Its phase 2 rows stay excluded."""
    tf32, fp16 = mapped["DLEBERT-27"], mapped["DLEBERT-10"]       # 8 nodes, both columns
    assert (tf32.scenario.training.precision, fp16.scenario.training.precision) == ("tf32", "fp16")
    assert (tf32.scenario.training.micro_batch, fp16.scenario.training.micro_batch) == (128, 256)
    assert tf32.scenario.training.global_batch == fp16.scenario.training.global_batch == 65536
    assert tf32.measured_step_s == pytest.approx(65536 / 19815)
    assert mapped["DLEBERT-23"].measured_step_s == pytest.approx(65536 / 18119)    # 4 nodes, fp16
    for i in range(30, 37):                                        # phase 2: seq 512
        row = mapped[f"DLEBERT-{i}"]
        assert isinstance(row, SkippedRow) and "phase 2" in row.reason


def test_flash_attention_2_table_rows_run_the_kernel_of_their_column(mapped):
    """Dao 2023 Table 1: one model, context and batch, two attention kernels (FAPILE-10 / -11)."""
    fa1, fa2 = mapped["FAPILE-10"], mapped["FAPILE-11"]
    assert (fa1.scenario.training.attention, fa2.scenario.training.attention) == ("flash1", "flash2")
    assert fa1.source_key == fa2.source_key == "FAPILE"         # one source with the README's rows
    assert fa1.document["model"] == fa2.document["model"] and fa1.document["model"]["seq_len"] == 8192
    assert fa1.scenario.training.micro_batch == 4 and fa1.scenario.training.global_batch == 128
    # 170 and 220 TFLOP/s per GPU of the same FLOPs: the steps stand in the inverse ratio
    assert fa1.measured_step_s / fa2.measured_step_s == pytest.approx(220 / 170)


def test_the_readme_figures_megatron_bars_run_megatrons_kernels(mapped):
    """FAPILE-06 (Table 1's 2k baseline) and the README figure's Megatron-LM bars: stored attention
    scores and Megatron-LM's own cross entropy, not the source's FlashAttention and fused loss."""
    for row_id in ("FAPILE-06", "FAPILE-18", "FAPILE-21"):
        t = mapped[row_id].scenario.training
        assert t.attention == "unfused" and not t.fused_cross_entropy
        assert any(a.startswith("micro_batch") and "fastest" in a for a in mapped[row_id].assumptions)
    assert mapped["FAPILE-25"].scenario.training.attention == "flash1"     # the README's FA runs


def test_reserved_source_rows_are_excluded(mapped):
    skipped = mapped["NEMOCP-05"]
    assert isinstance(skipped, SkippedRow) and skipped.kind == "excluded"
    assert "RESERVED" in skipped.reason


def test_most_gpu_transformer_rows_map(mapped):
    usable = [m for m in mapped.values() if isinstance(m, MappedRow)]
    assert len(usable) >= 78
    assert {m.source_key for m in usable} >= {"NAR21", "MLMRD", "SHO19", "MLM24", "BLMSW", "LLAMA3",
                                              "MTNLG", "MPT", "NANOGPT", "DLEBERT", "TTITAN", "FMSFSDP",
                                              "FAPILE"}
    # NeMo's performance tables are a RESERVED source (GUIDE.md): excluded, never fitted
    assert not any(m.source_key == "NEMOCP" for m in usable)
    for m in usable:                                   # each is a valid scenario with a positive time
        again = parse_scenario(m.document)
        assert again.parallel.gpus == m.gpus and m.measured_step_s > 0


@pytest.mark.parametrize("row_id, kind", [
    ("GPIPE-07", "not-gpu"), ("HVD-01", "not-transformer"), ("GPIPE-01", "not-transformer"),
    ("NAR21-23", "incomplete"), ("LLAMA1-01", "incomplete"), ("GLM-01", "incomplete"),
    ("NAR21-24", "ratio"), ("PD2BW-01", "ratio"), ("ZERO-01", "ratio"), ("BYTEPS-01", "ratio"),
    ("GPIPE-04", "ratio"), ("NEOX-01", "inconsistent"), ("OPT-01", "inconsistent"),
    ("FMSFSDP-03", "unsupported"),    # fms-fsdp's checkpointing of a fraction of the blocks
    ("TTITAN-12", "hardware"),        # 96 GB HBM2e, 500 W Grand Teton H100
    ("FMSFSDP-09", "excluded"),       # HSDP under torch.compile
    ("FMSFSDP-13", "excluded"),       # torch.compile
    ("TRAINY-01", "excluded"),        # float8
    ("FAPILE-09", "excluded"),        # FlashAttention-2 paper's 8k baseline: not identified
    ("FAPILE-07", "excluded"),        # the README's own FlashAttention run, counted once
    ("FAPILE-16", "excluded"),        # the configs' 8k 2.7B run does not fit in 80 GB
])
def test_rows_that_are_not_simulable_say_why(mapped, row_id, kind):
    skipped = mapped[row_id]
    assert isinstance(skipped, SkippedRow) and skipped.kind == kind and skipped.reason


@pytest.mark.parametrize("row_id, section, key, expected", [
    ("FMSFSDP-01", "parallel", "data_shard", 8),      # HSDP: sharded within a node of 8
    ("FMSFSDP-01", "parallel", "zero", 3),
    ("NAR21-17", "parallel", "pipeline", 12),
    ("NAR21-11", "parallel", "zero", 3),
    ("NAR21-11", "parallel", "overlap_grad_reduce", True),
    ("MTNLG-01", "parallel", "overlap_param_gather", False),   # DeepSpeed ZeRO-1 gathers in step()
    ("MLM24-05", "parallel", "overlap_param_gather", True),
    ("NAR21-01", "training", "recompute", "full"),
    ("TTITAN-02", "training", "recompute", "selective-op"),   # torchtitan's op-level policy
    ("MLMRD-01", "model", "vocab", 51200),                   # GPT-2 BPE padded to 128 x tp 8
    ("MLMRD-01", "cluster", "system", "dgx-a100-80gb"),
    ("SHO19-07", "cluster", "system", "dgx2-v100"),
    ("SHO19-07", "training", "precision", "fp16"),
    ("MLM24-05", "parallel", "sequence_parallel", True),
    ("MLM24-05", "parallel", "zero", 1),
    ("BLMSW-02", "model", "vocab", 250680),
    ("BLMSW-02", "cluster", "inter_node_gbps", 400.0),       # 4 Omni-Path links x 100 Gb/s
    ("LLAMA3-03", "parallel", "context", 16),
    ("LLAMA3-03", "parallel", "zero", 2),
    ("LLAMA3-03", "parallel", "schedule", "interleaved-1f1b"),
    ("LLAMA3-03", "parallel", "cp_comm_type", "all_gather"),     # Sec. 3.3.2: K, V all-gathered
    # Megatron-LM's 2024 runs overlap pipeline communication, which its code allows only interleaved
    ("MLM24-06", "parallel", "schedule", "interleaved-1f1b"),
    ("MLM24-06", "parallel", "virtual_stages", 23),          # 23 blocks per rank: one per chunk
    ("MLM24-08", "parallel", "virtual_stages", 2),           # 12 per rank: the least interleaving
    ("MLM24-04", "parallel", "schedule", "1f1b"),             # no pipeline
    ("LLAMA3-03", "model", "kv_heads", 8),
    ("LLAMA3-03", "model", "ffn_hidden", 53248),
    ("LLAMA3-03", "training", "global_batch", 128),          # 16 sequences per DP group x dp 8
    ("LLAMA3-01", "training", "recompute", "none"),
    ("MPT-01", "parallel", "zero", 3),                       # FSDP FULL_SHARD
    ("MPT-13", "parallel", "zero", 2),                       # FSDP SHARD_GRAD_OP
    ("MPT-25", "cluster", "inter_node_gbps", 1600.0),
    ("MPT-27", "cluster", "system", "dgx-a100-40gb"),
    ("NANOGPT-01", "training", "global_batch", 480),         # 491,520 tokens / 1024
    ("NAR21-11", "training", "framework", "deepspeed"),      # "ZeRO-3 via DeepSpeed"
    ("MTNLG-01", "training", "framework", "deepspeed"),
    ("MPT-01", "training", "framework", "fsdp"),             # FSDP FULL_SHARD
    ("NAR21-17", "training", "framework", "megatron"),       # names neither: the default
    ("NAR21-01", "training", "micro_batch", 16),             # examples/sc21/run_table_1.sh
    ("MLM24-04", "training", "micro_batch", 4),              # not stated: the fastest that fits
    ("MLM24-08", "training", "micro_batch", 1),              # mb 2 does not fit in 80 GB
    ("FAPILE-06", "training", "attention", "unfused"),       # the README figure: Megatron-LM
    ("FAPILE-21", "training", "precision", "fp16"),          # as the owt FlashAttention runs
    ("FAPILE-26", "parallel", "zero", 1),                    # owt/gpt2l-flash.yaml DDPStrategyZero1
    ("FAPILE-25", "training", "micro_batch", 64),            # gpt2m-flash.yaml, >= 80 GB
    ("NAR21-07", "parallel", "virtual_stages", 2),           # 10 layers per stage / 5 per chunk
    ("NAR21-01", "parallel", "overlap_grad_reduce", True),   # DDP=torch
    ("NAR21-05", "parallel", "overlap_grad_reduce", False),  # DDP=local
    ("NAR21-05", "training", "precision", "fp16"),           # examples/sc21/CONFIG.sh --fp16
    ("TTITAN-04", "training", "framework", "fsdp"),          # FSDP2
    ("TTITAN-04", "parallel", "zero", 3),                    # reshard after forward: FULL_SHARD
    ("TTITAN-04", "training", "recompute", "none"),
    ("TTITAN-04", "training", "micro_batch", 2),             # local batch 2, no accumulation
    ("TTITAN-03", "training", "recompute", "full"),
    ("TTITAN-03", "model", "vocab", 128256),
    ("FMSFSDP-06", "cluster", "system", "dgx-h100"),
    ("FMSFSDP-06", "cluster", "inter_node_gbps", 800.0),     # 'H100 96 GPUs with 800 Gbps'
    ("FMSFSDP-06", "model", "ffn_hidden", 22016),            # fms-fsdp's 34b
    ("FMSFSDP-05", "training", "global_batch", 256),         # 2 per GPU x 128
])
def test_row_mapping(mapped, row_id, section, key, expected):
    assert mapped[row_id].document[section][key] == expected


def test_every_assumption_is_recorded(mapped):
    nar = mapped["NAR21-01"].assumptions
    assert any(a.startswith("micro_batch 16:") and "run_table_1.sh" in a for a in nar)
    assert any(a.startswith("flops hardware:") for a in nar)
    assert not any(a.startswith("flops") for a in mapped["MPT-01"].assumptions)  # tokens/s needs none


def test_uneven_pipelines_drop_a_layer_at_both_ends(mapped):
    bloom = mapped["BLMSW-16"].document["parallel"]["stages"]         # 70 layers on 12 stages
    assert bloom[0] == [0, 5] and bloom[-1] == [65, 70]
    assert all(b - a == 6 for a, b in bloom[1:-1])
    # Llama 3 405B as its paper lays it out (Sec. 3.3.2): 126 blocks, one per chunk, and the
    # embedding and the head in chunks of their own: 128 chunks, 8 per rank of PP 16
    assert mapped["LLAMA3-01"].document["parallel"]["layout"] == "E|(t|)*126,L"
    # the 8K rows have no context parallelism: the CP setting is neither applied nor noted there
    assert "cp_comm_type" not in mapped["LLAMA3-01"].document["parallel"]
    assert not any(a.startswith("cp_comm_type") for a in mapped["LLAMA3-01"].assumptions)
    llama = mapped["LLAMA3-01"].scenario.parallel
    assert llama.virtual_stages == 8 and len(llama.stages) == 128
    assert llama.stages[0] == (0, 0) and llama.stages[-1] == (126, 126)
    assert all(b - a == 1 for a, b in llama.stages[1:-1])


def test_a_split_neither_even_nor_one_short_at_both_ends_is_the_simulators_balanced_one():
    from partita.validation.rowcells import Skip, _uneven_stages
    notes: list[str] = []
    assert _uneven_stages(30, 4, notes) == [[0, 7], [7, 15], [15, 23], [23, 30]]   # 32 = 4 x 8
    notes.clear()
    assert _uneven_stages(25, 4, notes) is None and "balanced split" in notes[0]   # 27 % 4 != 0
    with pytest.raises(Skip, match="do not fill"):
        _uneven_stages(3, 4, [])


# --- FLOP conventions and conversions -----------------------------------------------------------

GPT = TransformerDims(arch="gpt", layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200)


def test_model_flops_is_megatrons_72_formula():
    b, s, l, h, v = 1536, 2048, 96, 12288, 51200
    closed = 72 * b * s * l * h ** 2 * (1 + s / (6 * h) + v / (12 * l * h))
    assert model_flops(GPT, b) == pytest.approx(closed, rel=1e-12)


def test_hardware_flops_with_full_recompute_is_narayanans_96_formula():
    b, s, l, h, v = 1536, 2048, 96, 12288, 51200
    closed = 96 * b * s * l * h ** 2 * (1 + s / (6 * h) + v / (16 * l * h))
    assert hardware_flops(GPT, b, "full") == pytest.approx(closed, rel=1e-12)
    assert hardware_flops(GPT, b, "none") == model_flops(GPT, b)
    assert model_flops(GPT, b) < hardware_flops(GPT, b, "selective") < hardware_flops(GPT, b, "full")


def test_llama_model_flops_is_nemos_llama2_formula():
    d = preset_dims("llama2-70b")
    b, s, l, h, f, v = 8, d.seq_len, d.layers, d.hidden, d.ffn_hidden, d.vocab
    g_over_a = d.kv_heads / d.heads
    closed = b * s * l * h * h * (12 + 12 * g_over_a + 18 * f / h + 12 * s / h + 6 * v / (l * h))
    assert model_flops(d, b) == pytest.approx(closed, rel=1e-12)


def test_sources_own_numbers_agree_with_the_flop_conventions(mapped):
    # MLMRD-01: "each iteration takes around 32 seconds resulting in 138 teraFLOPs per GPU"
    mlm = mapped["MLMRD-01"].scenario
    assert hardware_flops(mlm.model.resolve(), 1536, "full") / (32 * 1024) == pytest.approx(138e12, rel=0.005)
    # BLMSW-16: 102.03 s/iter, "reported TFLOPs=153.68" (checkpoint_activations_factor 4)
    bloom = mapped["BLMSW-16"].scenario
    assert hardware_flops(bloom.model.resolve(), 2048, "full") / (102.03 * 384) == pytest.approx(153.68e12, rel=1e-3)
    # MPT-01: "model TFLOP/s/GPU 408, 1007 tokens/s/GPU"
    mpt = mapped["MPT-01"].scenario.model.resolve()
    assert model_flops(mpt, 1) / mpt.seq_len * 1007 == pytest.approx(408e12, rel=0.005)
    # TTITAN-04: 2162 tokens/s per GPU, "MFU 61.1%" of 312 TFLOP/s (6 N + 12 l h q t per token)
    titan = mapped["TTITAN-04"].scenario.model.resolve()
    assert model_flops(titan, 1) / titan.seq_len * 2162 == pytest.approx(0.611 * 312e12, rel=0.015)


def _hw(m: MappedRow) -> float:
    s = m.scenario
    return hardware_flops(s.model.resolve(), s.training.global_batch, s.training.recompute)


def test_metric_conversions_by_hand(mapped):
    assert mapped["MLMRD-01"].measured_step_s == 32
    assert mapped["MPT-01"].measured_step_s == pytest.approx(4096 * 2048 / 515636)
    assert mapped["SHO19-09"].measured_step_s == pytest.approx(0.86 * 86400 / 68507)
    assert mapped["NANOGPT-01"].measured_step_s == pytest.approx(4 * 86400 / 600000)
    assert mapped["FMSFSDP-06"].measured_step_s == pytest.approx(192 * 4096 / (1550 * 96))
    assert mapped["NAR21-10"].measured_step_s == pytest.approx(_hw(mapped["NAR21-10"]) / (163e12 * 3072))
    assert mapped["SHO19-04"].measured_step_s == pytest.approx(_hw(mapped["SHO19-04"]) / (0.83 * 39e12 * 128))
    # MFU: MLM24-10 with its guessed layout written as if stated (the row itself is skipped)
    row = dict({r["id"]: r for r in read_rows()}["MLM24-10"], tp="8", pp="6", dp="2")
    stated = map_row(row, load_rules())
    assert stated.measured_step_s == pytest.approx(
        model_flops(stated.scenario.model.resolve(), 1152) / (0.47 * 989e12 * 96))


def test_weak_scaling_efficiency_agrees_with_days_per_epoch(mapped):
    # the same run (2.5B, 128 GPUs) read two ways: 83% of 39 TFLOP/s vs 2.27 days per 68,507 iterations
    assert mapped["SHO19-04"].measured_step_s == pytest.approx(mapped["SHO19-10"].measured_step_s, rel=0.06)


@pytest.mark.parametrize("text, expected", [("24.0", 24), ("1,536", 1536), ("8 (assumed = model table)", 8),
                                            ("400/MP", None), ("8-100", None), ("not stated", None), ("", None)])
def test_leading_int(text, expected):
    assert leading_int(text)[0] == expected


# --- split, statistics, harness -----------------------------------------------------------------

def test_split_fits_on_every_usable_dev_row_in_file_order(mapped):
    """The fitted numbers are fitted on every dev row the simulator can express (the honest figures
    are leave-one-source-out and the frozen sets): a usable row missing from split.yaml would
    silently stay out of the fit, and a listed row that no longer maps would be a stale id."""
    split = load_split()
    usable = [k for k, m in mapped.items() if isinstance(m, MappedRow)]
    assert split.fit == set(usable) and split.rule
    listed = [line.strip()[2:] for line in
              (VALIDATION_DIR / "split.yaml").read_text().splitlines() if line.startswith("  - ")]
    assert listed == usable


def test_summary_statistics_by_hand():
    s = summarize([0.1, -0.2, 0.05, 0.3])          # |%|: 5 10 20 30
    assert (s.count, s.median_pct, s.max_pct) == (4, pytest.approx(15.0), pytest.approx(30.0))
    assert s.p90_pct == pytest.approx(27.0)         # linear: 20 + 0.7 x (30 - 20)
    assert (s.mean_pct, s.bias_pct) == (pytest.approx(16.25), pytest.approx(6.25))
    assert summarize([]).count == 0 and summarize([]).median_pct is None


def test_harness_compares_prediction_with_measurement(standin):
    split = validation.Split(fit=frozenset({"NAR21-02"}))      # a row the split leaves out is hold-out
    report = run_validation(rows=["NAR21-01", "NAR21-02", "HVD-01"], split=split)
    by_id = {r.row.row_id: r for r in report.results}
    # NAR21 counts hardware FLOPs, as the stand-in does: error = X / 100 TFLOP/s - 1
    assert by_id["NAR21-01"].error == pytest.approx(137 / 100 - 1)
    assert (by_id["NAR21-01"].group, by_id["NAR21-02"].group) == ("holdout", "fit")
    assert [s.row_id for s in report.skipped] == ["HVD-01"]
    assert report.summary("fit").count == 1 and report.summary("holdout").count == 1


def test_a_refused_scenario_is_reported_not_fatal(standin, tmp_path):
    path = _user_csv(tmp_path, [_user_row("u1", gpu="V100", mem="16"), _user_row("u2")])
    report = run_validation(path)
    failed = report.failed()
    assert [r.row.row_id for r in failed] == ["u1"] and "dgx1-v100" in failed[0].failure
    assert report.summary().count == 1


# --- the command line ---------------------------------------------------------------------------

def test_cli_report(standin, capsys):
    assert main(["validate", "--rows", "NAR21-01,NAR21-02,HVD-01,GPIPE-07"]) == 0
    out = capsys.readouterr().out
    assert "NAR21-01" in out and "+37.0" in out and "holdout" in out and "fit" in out
    assert "not a CNN" not in out and "not a transformer (CNN): HVD-01" in out
    assert "Layout choice" not in out       # no job among these rows has two layouts


def test_cli_report_ranks_the_layouts_of_one_job(standin, capsys):
    # GPT 175B on 384 GPUs, batch 1536: ZeRO-3 (NAR21-11) against PTD-P (NAR21-17).
    assert main(["validate", "--rows", "NAR21-11,NAR21-17", "--json"]) == 0
    choice = json.loads(capsys.readouterr().out)["layout_choice"]
    assert choice["jobs"] == 1 and choice["per_job"][0]["rows_measured_fastest_first"][0] == "NAR21-17"
    assert main(["validate", "--rows", "NAR21-11,NAR21-17"]) == 0
    assert "Layout choice (1 jobs): measured best picked in" in capsys.readouterr().out


def test_cli_report_prices_the_effect_of_one_change(standin, capsys):
    # NAR21-17/-18/-19: GPT 175B PTD-P on 384, 768 and 1,536 GPUs at one batch: three scale pairs.
    assert main(["validate", "--rows", "NAR21-17,NAR21-18,NAR21-19", "--json"]) == 0
    effects = json.loads(capsys.readouterr().out)["effects"]
    assert effects["by_kind"]["scale"]["pairs"] == 3 and len(effects["pairs"]) == 3
    assert {p["slower"] for p in effects["pairs"]} == {"NAR21-17", "NAR21-18"}
    assert main(["validate", "--rows", "NAR21-17,NAR21-18,NAR21-19", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "Effects of one change (3 pairs of 1 sources)" in out
    assert "NAR21-17    / NAR21-19" in out           # --verbose: every pair


def test_cli_verbose_and_json(standin, capsys):
    assert main(["validate", "--rows", "NAR21-01,HVD-01", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "measured: step = F_hw" in out and "assumed:  micro_batch 1" in out and "HVD-01" in out
    assert main(["validate", "--rows", "NAR21-01,NAR21-02", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["fit"]["count"] == 2 and doc["summary"]["holdout"]["count"] == 0
    assert doc["summary"]["holdout"]["median_abs_pct"] is None       # an empty group: no figures
    assert doc["rows"][0]["error_pct"] == pytest.approx(37.0)


def _user_row(row_id: str, gpu: str = "H100", mem: str = "80", peak: str = "") -> dict[str, str]:
    return {"id": row_id, "source_key": "MINE", "model": "GPT 1.3B", "layers": "24", "hidden": "2048",
            "heads": "16", "seq_len": "2048", "vocab": "50304", "precision": "bf16", "gpu": gpu,
            "gpu_mem_GB": mem, "num_gpus": "8", "tp": "1", "pp": "1", "dp": "8", "recompute": "no",
            "global_batch": "64", "micro_batch": "8", "metric": "iteration time", "value": "0.9",
            "unit": "s/iter", "peak_memory_GiB": peak}


def _user_csv(tmp_path: Path, rows: list[dict[str, str]], columns=None) -> Path:
    path = tmp_path / "mine.csv"
    columns = columns or list(rows[0])
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_users_own_measurements_in_the_same_columns(standin, tmp_path, capsys):
    path = _user_csv(tmp_path, [_user_row("run-1", peak="50.0")])
    assert main(["validate", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = doc["rows"][0]
    assert row["group"] == "holdout" and row["measured_step_s"] == 0.9
    assert row["predicted_peak_memory_gib"] == 40.0 and doc["summary"]["memory"]["count"] == 1
    assert doc["summary"]["memory"]["max_abs_pct"] == pytest.approx(20.0)     # 40 / 50 - 1


def _fails(argv, capsys, *needles):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    for needle in needles:
        assert needle in err


def test_missing_csv(capsys, tmp_path):
    _fails(["validate", str(tmp_path / "nope.csv")], capsys, "nope.csv: no such file")


def test_unknown_column(capsys, tmp_path):
    path = _user_csv(tmp_path, [{"id": "a", "metric": "m", "value": "1", "unit": "s/iter", "num_gpu": "8"}])
    _fails(["validate", str(path)], capsys, "unknown column 'num_gpu'", "did you mean 'num_gpus'")


def test_missing_required_column(capsys, tmp_path):
    path = _user_csv(tmp_path, [{"id": "a", "metric": "m", "value": "1"}])
    _fails(["validate", str(path)], capsys, "missing column(s) unit")


def test_empty_csv(capsys, tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    _fails(["validate", str(path)], capsys, "empty file")


def test_duplicate_row_id(capsys, tmp_path):
    path = _user_csv(tmp_path, [_user_row("x"), _user_row("x")])
    _fails(["validate", str(path)], capsys, "duplicate id 'x'")


def test_unknown_row_id(capsys):
    _fails(["validate", "--rows", "NAR21-1"], capsys, "unknown row id 'NAR21-1'", "did you mean")


def test_malformed_split_file(capsys, tmp_path):
    split = tmp_path / "split.yaml"
    split.write_text("fit: NAR21-01\n")
    _fails(["validate", "--split", str(split)], capsys, "fit: expected a list of row ids")
    split.write_text("fits: [NAR21-01]\n")
    _fails(["validate", "--split", str(split)], capsys, "unknown key", "did you mean 'fit'")


def test_bad_cells_skip_the_row_with_the_reason(standin, tmp_path):
    path = _user_csv(tmp_path, [{**_user_row("bad"), "num_gpus": "eight"}])
    report = run_validation(path)
    assert report.skipped[0].kind == "incomplete" and "num_gpus 'eight'" in report.skipped[0].reason


@pytest.mark.parametrize("text, needle", [
    ("sources: {X: {micro_batch: {value: 0, why: w}}}\n", "must be >= 1"),
    ("sources: {X: {flops: {value: peak, why: w}}}\n", "expected one of model, hardware"),
    ("sources: {X: {micro_batch: {value: 2}}}\n", "why: missing required key"),
    ("sources: {X: {microbatch: {value: 2, why: w}}}\n", "did you mean 'micro_batch'"),
    ("sources: {X: {framework: {value: jax, why: w}}}\n", "expected one of megatron, deepspeed, fsdp"),
    ("sources: {X: {recompute_every_nth_block: {value: 0, why: w}}}\n", "must be >= 1"),
    ("sources: {X: {data_shard: {value: half, why: w}}}\n", "expected an integer"),
    ("sources: {X: {grad_reduce_dtype: {value: fp33, why: w}}}\n", "expected one of auto, fp32, bf16, fp16"),
    ("sources: {X: {layout: {value: 7, why: w}}}\n", "layout.value: expected a non-empty string, got 7"),
    ("sources: {X: {micro_batch: {value: fast, why: w}}}\n",
     "micro_batch.value: expected an integer or 'fastest', got 'fast'"),
])
def test_malformed_rowmap_rules(tmp_path, text, needle):
    path = tmp_path / "rowmap.yaml"
    path.write_text(text)
    with pytest.raises(PartitaError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_rules(path)


@pytest.mark.parametrize("cell, expected", [
    ("selective layer AC (full checkpointing of every n-th block)", None),     # torchtitan
    ("selective op AC (torchtitan's op policy)", "selective-op"),
    ("Selective AC (full checkpointing of a fraction of the blocks)", None),   # fms-fsdp
    ("selective (Megatron-LM --recompute-granularity selective)", "selective"),
    ("full (every block checkpointed)", "full"),
])
def test_checkpointing_some_blocks_or_ops_is_not_selective_recompute(tmp_path, cell, expected):
    """The simulator's 'selective' recomputes the attention core (Korthikanti et al. 2022); a row
    that checkpoints every n-th block (n unknown here) is skipped, not mapped to it, and
    torchtitan's operator policy is 'selective-op'."""
    row = {**_user_row("ac"), "recompute": cell}
    m = map_row(read_rows(_user_csv(tmp_path, [row]))[0], load_rules())
    if expected is None:
        assert isinstance(m, SkippedRow) and m.kind == "unsupported" and repr(cell) in m.reason
    else:
        assert m.document["training"]["recompute"] == expected


def test_a_row_naming_a_preset_without_dims_maps_to_the_preset(tmp_path):
    """Blank layers, hidden and heads with a preset's name: the preset's dims, its layer count
    for the recompute settings (this raised a KeyError while mapping the row)."""
    row = {**_user_row("preset"), "model": "Llama 2 7B", "layers": "", "hidden": "", "heads": "",
           "seq_len": "4096", "recompute": "full", "global_batch": "64", "micro_batch": "1"}
    m = map_row(read_rows(_user_csv(tmp_path, [row]))[0], load_rules())
    assert isinstance(m, MappedRow), m
    assert m.document["model"] == {"preset": "llama2-7b", "seq_len": 4096}
    assert m.document["training"]["recompute"] == "full"


@pytest.mark.parametrize("col", ["micro_batch", "dp", "global_batch"])
def test_a_zero_batch_or_degree_skips_the_row(tmp_path, col):
    """A micro-batch, data degree or global batch of 0 in a user's CSV is an inconsistent row with
    its reason (a zero micro-batch used to divide by zero while mapping the row)."""
    row = {**_user_row("zero"), col: "0"}
    m = map_row(read_rows(_user_csv(tmp_path, [row]))[0], load_rules())
    assert isinstance(m, SkippedRow) and m.kind == "inconsistent" and col.replace("_", " ") in \
        m.reason.replace("_", " ")


@pytest.mark.parametrize("mem, kind", [("80", None), ("not stated", None), ("96", "hardware"), ("94", "hardware")])
def test_an_h100_with_other_memory_is_not_the_catalogs_h100(tmp_path, mem, kind):
    """torchtitan's Grand Teton H100s (96 GB HBM2e, 500 W) are not the catalog's 80 GB SXM5."""
    m = map_row(read_rows(_user_csv(tmp_path, [_user_row("g", mem=mem)]))[0], load_rules())
    if kind is None:
        assert m.document["cluster"]["system"] == "dgx-h100"
    else:
        assert isinstance(m, SkippedRow) and m.kind == kind and f"with {mem} GB" in m.reason


def test_a_bad_memory_cell_skips_the_row(standin, tmp_path):
    path = _user_csv(tmp_path, [_user_row("m", peak="lots")])
    report = run_validation(path)
    assert report.skipped[0].reason == "peak_memory_GiB 'lots' is not a number"


# 8 H100s, 64 sequences of 2048 tokens per step: 131,072 tokens
@pytest.mark.parametrize("metric, value, unit, seconds", [
    ("iteration time", "0.9", "s/iter", 0.9),
    ("throughput", "131072", "tokens/s", 1.0),
    ("throughput per GPU", "8192", "tokens/s/GPU", 2.0),
    ("throughput", "32", "samples/s", 2.0),
    ("time for 1k iterations", "0.5", "days", 0.5 * 86400 / 1000),
])
def test_user_metric_units(tmp_path, metric, value, unit, seconds):
    row = {**_user_row("u"), "metric": metric, "value": value, "unit": unit}
    m = map_row(read_rows(_user_csv(tmp_path, [row]))[0], load_rules())
    assert m.measured_step_s == pytest.approx(seconds)


@pytest.mark.parametrize("notes, ffn", [
    ("FFN 4h, learned positions", None),            # a multiple of the hidden size, not a width
    ("SwiGLU FFN 11008 (mlp_ratio 8/3)", 11008),
    ("FFN 5504; rotary", 5504),
])
def test_an_ffn_width_is_a_number_of_units_not_a_multiple(tmp_path, notes, ffn):
    row = {**_user_row("u"), "notes": notes}
    m = map_row(read_rows(_user_csv(tmp_path, [row]))[0], load_rules())
    assert m.document["model"].get("ffn_hidden") == ffn


def _rules_file(tmp_path: Path, body: str):
    path = tmp_path / "rowmap.yaml"
    path.write_text(body)
    return load_rules(path)


def test_a_source_rule_sets_the_architecture_a_model_name_does_not_say(tmp_path):
    rules = _rules_file(tmp_path, "sources:\n  MINE:\n    arch: {value: llama, why: RMSNorm and SwiGLU}\n")
    row = {**_user_row("u"), "model": "InternLM-7B", "notes": "FFN 11008"}
    m = map_row(read_rows(_user_csv(tmp_path, [row]))[0], rules)
    assert m.document["model"]["arch"] == "llama" and "arch llama: RMSNorm and SwiGLU" in m.assumptions
    with pytest.raises(PartitaError, match="arch"):
        _rules_file(tmp_path, "sources:\n  MINE:\n    arch: {value: rnn, why: x}\n")


def test_a_rows_own_framework_rule_outranks_the_framework_its_text_names(tmp_path):
    # A plain-DDP baseline in a DeepSpeed repository names DeepSpeed in its source cell.
    rules = _rules_file(tmp_path, "rows:\n  u:\n    framework: {value: fsdp, why: plain DDP}\n"
                        "sources:\n  MINE:\n    framework: {value: megatron, why: source rule}\n")
    row = {**_user_row("u"), "source": "microsoft/DeepSpeedExamples", "other_parallelism": "DDP"}
    other = {**row, "id": "v"}
    a, b = (map_row(r, rules) for r in read_rows(_user_csv(tmp_path, [row, other])))
    assert a.document["training"]["framework"] == "fsdp"
    assert b.document["training"]["framework"] == "deepspeed"      # the text, over the source rule


def test_user_mfu_uses_the_sources_peak(tmp_path):
    row = {**_user_row("u"), "metric": "MFU", "value": "40", "unit": "%"}
    m = map_row(read_rows(_user_csv(tmp_path, [row]))[0], load_rules())
    dims = m.scenario.model.resolve()
    assert m.measured_step_s == pytest.approx(model_flops(dims, 64) / (0.40 * 989e12 * 8))
    assert any(a.startswith("flops model: the source's FLOP convention is not known") for a in m.assumptions)


@pytest.mark.parametrize("metric, value, unit, kind", [
    ("time to train", "3", "days", "ratio"),                 # no iteration count
    ("energy", "12", "kWh", "ratio"),
    ("TFLOP/s per GPU", ">40", "TFLOP/s/GPU", "bound"),
    ("iteration time", "fast", "s/iter", "incomplete"),
])
def test_user_metrics_that_do_not_convert(tmp_path, metric, value, unit, kind):
    row = {**_user_row("u"), "metric": metric, "value": value, "unit": unit}
    skipped = map_row(read_rows(_user_csv(tmp_path, [row]))[0], load_rules())
    assert isinstance(skipped, SkippedRow) and skipped.kind == kind


def test_cli_with_the_real_simulator(capsys):
    if not (Path(__file__).resolve().parents[3] / "simulator" / "step.py").exists():
        pytest.skip("simulator/step.py (simulate) is not in the tree yet")
    assert main(["validate", "--rows", "NAR21-17,MPT-25,HVD-01", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in doc["rows"]] == ["NAR21-17", "MPT-25"]
    assert all(r["predicted_step_s"] > 0 and r["failure"] is None for r in doc["rows"])


def test_a_guessed_parallel_layout_is_not_fully_specified():
    """MLM24-10/11: the CSV guesses TP/PP ('8 (assumed = model table)'); such rows are skipped, not
    scored, since the layout sets most of the step time."""
    from partita.validation.rowmap import SkippedRow, map_row, read_rows
    from partita.validation.rowrules import load_rules
    rules = load_rules()
    rows = {r["id"]: r for r in read_rows()}
    for rid in ("MLM24-10", "MLM24-11"):
        m = map_row(rows[rid], rules)
        assert isinstance(m, SkippedRow) and m.kind == "incomplete"
        assert "parallel layout not stated by the source (tp = '8 (assumed" in m.reason


# --- the published peak-memory runs ------------------------------------------------------------

def test_memory_csv_rows_all_carry_a_peak_and_mostly_map():
    from partita.validation.runner import MEMORY_CSV, MEMORY_SPLIT
    rows = read_rows(MEMORY_CSV)
    assert len(rows) >= 60 and all(float(r["peak_memory_GiB"]) > 0 for r in rows)
    rules = load_rules()
    mapped = [map_row(r, rules, origin=str(MEMORY_CSV)) for r in rows]
    usable = [m for m in mapped if isinstance(m, MappedRow)]
    assert len(usable) >= 60 and all(m.measured_peak_memory_gib > 0 for m in usable)
    fit = load_split(MEMORY_SPLIT).fit
    assert fit <= {m.row_id for m in usable}
    assert 0.25 <= len(fit) / len(usable) <= 0.40          # a third, the rest held out
    # the log's pre-02-28 runs are fp16 (its 'Rebalancing layers' note), the 02-28 ones bf16
    by_id = {m.row_id: m for m in usable}
    assert by_id["BLMEM-07"].scenario.training.precision == "fp16"
    assert by_id["BLMEM-61"].scenario.training.precision == "bf16"


def test_cli_memory_report_splits_fit_and_holdout(standin, capsys):
    assert main(["validate", "--memory", "--rows", "BLMEM-01,BLMEM-02,BLMEM-03"]) == 0
    out = capsys.readouterr().out
    assert "Peak memory per GPU" in out and "[memory 67 GiB, predicted 40.0 (-40.3%)]" in out
    assert "BLMEM-02" in out and " fit " in out and "frozen at 21 of 62" in out
    assert main(["validate", "--memory", "--rows", "BLMEM-01,BLMEM-02", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["memory_fit"]["count"] == 1 and doc["summary"]["memory_holdout"]["count"] == 1


def test_memory_report_withholds_the_frozen_test_sets_step_times(standin, capsys):
    # BLMEM-01 is in the frozen test set, BLMEM-44 not: only the latter's step time is reported.
    assert main(["validate", "--memory", "--rows", "BLMEM-01,BLMEM-44", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["BLMEM-01"]["predicted_step_s"] is None and rows["BLMEM-01"]["error_pct"] is None
    assert rows["BLMEM-01"]["predicted_peak_memory_gib"] is not None
    assert rows["BLMEM-44"]["predicted_step_s"] is not None
    assert main(["validate", "--memory", "--rows", "BLMEM-01,BLMEM-44"]) == 0
    assert "Step times withheld for 1 rows of the frozen test set" in capsys.readouterr().out


# ---- leave-one-source-out and the frozen test: README quotes what `validate` prints (#16) ----

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_quotes_the_stored_leave_one_source_out_figures():
    from partita.commands.validate import loso_line
    from partita.validation import crossval
    stored = crossval.load_residuals()
    assert stored["inputs_sha256"] == crossval.inputs_digest(), (
        "data/validation/crossval.json is stale (its inputs changed); rewrite it with "
        "`partita validate --cross-validate --write` and update README")
    line = loso_line(validation.summarize(r["error_pct"] / 100.0 for r in stored["rows"]))
    assert line in README.read_text()
    from partita.commands.validate import nested_coverage_line
    from partita.simulator.interval import nested_coverage
    coverage = nested_coverage([(r["source_key"], r["error_pct"] / 100.0) for r in stored["rows"]])
    assert nested_coverage_line(*coverage) in README.read_text()
    from partita.validation.crossval import dev_rows
    from partita.validation.effects import effect_line, one_change_pairs, summarize_effects
    mapped = {m.row_id: m for m in dev_rows()}
    pairs = one_change_pairs((mapped[r["id"]], r["predicted_step_s"]) for r in stored["rows"])
    assert effect_line(summarize_effects(pairs)) in README.read_text()
    stored_all = stored["effects"]["by_kind"]["all"]          # what `partita plan` reads
    assert stored_all["pairs"] == len(pairs)
    assert stored_all["p90_pct"] == pytest.approx(summarize_effects(pairs).p90_pct)


def test_readme_quotes_the_frozen_test_figures(tmp_path, monkeypatch):
    from partita.commands.validate import (_frozen_effect_line, _report_choices, coverage_line,
                                           frozen_line, interval_coverage)
    from partita.validation.frozen import frozen_report
    from partita.planner.catalog import load_catalog
    from partita.validation.frozen import load_frozen_sets
    from partita.validation.ranking import choice_line, summarize_choices
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path))          # the shipped catalog only
    monkeypatch.delenv("PARTITA_CATALOG", raising=False)
    text = README.read_text()
    for s in load_frozen_sets():
        report = frozen_report(s, load_catalog())
        assert frozen_line(report.summary(), s.name) in text
        assert coverage_line(*interval_coverage(report)) in text
        assert choice_line(summarize_choices(_report_choices(report))) in text
        assert _frozen_effect_line(report) in text


def test_frozen_test_reports_every_set_and_groups_what_it_could_not_simulate(standin, capsys):
    assert main(["validate", "--frozen-test", "--json"]) == 0
    sets = json.loads(capsys.readouterr().out)["sets"]
    assert list(sets) == ["bloom-layouts", "unseen-sources"]
    unseen = sets["unseen-sources"]
    assert unseen["summary"]["count"] > 0 and unseen["frozen"] == "2026-11-27"
    assert "all" in unseen["effects"]["by_kind"] and "pairs" not in unseen["effects"]   # no row
    assert {"INTEVO-01", "AWSTT-02", "TINYL-01"} <= {k["id"] for k in unseen["skipped"]}
    assert main(["validate", "--frozen-test"]) == 0
    out = capsys.readouterr().out
    assert "unseen-sources: 70 step times of published_unseen.csv, frozen 2026-11-27" in out
    assert "not simulated (12): INTEVO-01, INTEVO-02" in out       # one line per reason


def test_other_reports_withhold_the_unseen_sets_step_times(standin, capsys):
    from partita.validation.rowmap import DEFAULT_CSV
    unseen = str(Path(DEFAULT_CSV).parent / "published_unseen.csv")
    assert main(["validate", unseen, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and all(r["predicted_step_s"] is None for r in rows)


def test_frozen_test_rows_are_never_fit_rows():
    from partita.validation.frozen import load_frozen_sets
    from partita.validation.rowmap import DEFAULT_CSV
    sets = {s.name: s for s in load_frozen_sets()}
    bloom = sets["bloom-layouts"]
    memory_fit = validation.load_split(validation.MEMORY_SPLIT).fit
    assert len(bloom.row_ids) == 53 and not set(bloom.row_ids) & set(validation.load_split().fit)
    # BLMEM-27, -39, -61 and -05, -30, -34, -41, -43, -64 repeat dev fit runs and are kept out
    assert {"BLMEM-27", "BLMEM-39", "BLMEM-61", "BLMEM-05", "BLMEM-30", "BLMEM-34", "BLMEM-41",
            "BLMEM-43", "BLMEM-64"}.isdisjoint(bloom.row_ids)
    assert memory_fit                                  # the memory fit rows' step times: never fitted
    # no frozen row is a row of the dev CSV, which the fits and the cross-validation read
    assert all(s.csv.resolve() != Path(DEFAULT_CSV).resolve() for s in sets.values())


def test_no_frozen_row_is_a_fit_run_under_another_id():
    """A frozen row must not repeat a run the fit is made on: the same model shape, layout, batch
    and measured value under another id (BLMEM-34 is BLMSW-08's 136.13 s/iter, for one)."""
    from partita.validation.frozen import load_frozen_sets
    from partita.validation.rowmap import DEFAULT_CSV, read_rows

    def cell(text: str):
        try:
            return float(text)                     # 72 and 72.0 are one number
        except ValueError:
            return text.strip()

    def run(r: dict) -> tuple:
        return tuple(cell(r.get(k, "")) for k in (
            "layers", "hidden", "heads", "seq_len", "gpu", "num_gpus", "tp", "pp", "dp",
            "micro_batch", "global_batch", "value", "unit"))

    fit = set(validation.load_split().fit)
    fit_runs = {run(r): r["id"] for r in read_rows(DEFAULT_CSV) if r["id"] in fit}
    for s in load_frozen_sets():
        frozen = {r["id"]: r for r in read_rows(s.csv)}
        repeats = {i: fit_runs[run(frozen[i])] for i in s.row_ids if run(frozen[i]) in fit_runs}
        assert not repeats, f"{s.name}: frozen rows repeat fit runs {repeats}"


def _frozen_file(tmp_path, body: str) -> Path:
    (tmp_path / "runs.csv").write_text(",".join(COLUMNS) + "\n" + "\n".join(
        f"R-{i}" + "," * (len(COLUMNS) - 1) for i in (1, 2, 3)) + "\n")
    path = tmp_path / "frozen.yaml"
    path.write_text(body)
    return path


def test_frozen_sets_load_all_rows_or_the_named_ones(tmp_path):
    from partita.validation.frozen import frozen_row_ids, load_frozen_sets
    path = _frozen_file(tmp_path, "sets:\n  a: {csv: runs.csv, frozen: 2026-11-27, rows: all}\n")
    (s,) = load_frozen_sets(path)
    assert (s.name, s.row_ids, s.frozen) == ("a", ("R-1", "R-2", "R-3"), "2026-11-27")
    path.write_text("sets:\n  a: {csv: runs.csv, frozen: 2026-11-27, rows: [R-2]}\n"
                    "  b: {csv: runs.csv, frozen: 2026-11-28, rows: [R-3]}\n")
    sets = load_frozen_sets(path)
    assert frozen_row_ids(tmp_path / "runs.csv", sets) == {"R-2", "R-3"}
    assert frozen_row_ids(tmp_path / "other.csv", sets) == frozenset()


@pytest.mark.parametrize("body, message", [
    ("sets: {}\n", "sets: expected a mapping of set names"),
    ("sets:\n  a: {csv: runs.csv, frozen: 2026-11-27, rows: [R-9]}\n",
     "sets.a.rows: unknown row id 'R-9'"),
    ("sets:\n  a: {csv: runs.csv, frozen: 2026-11-27, rows: [R-1, R-1]}\n",
     "sets.a.rows: duplicate row ids R-1"),
    ("sets:\n  a: {csv: runs.csv, frozen: 2026-11-27, rows: [R-1]}\n"
     "  b: {csv: runs.csv, frozen: 2026-11-27, rows: [R-1]}\n",
     "sets.b.rows: row R-1 is already in set 'a'"),
    ("sets:\n  a: {csv: runs.csv, frozen: soon, rows: all}\n",
     "sets.a.frozen: expected a date YYYY-MM-DD, got 'soon'"),
    ("sets:\n  a: {csv: gone.csv, frozen: 2026-11-27, rows: all}\n", "sets.a.csv: no such file"),
    ("sets:\n  a: {csv: runs.csv, frozen: 2026-11-27, rows: all, extra: 1}\n", "extra"),
])
def test_a_bad_frozen_test_file_is_one_error_naming_the_key(tmp_path, body, message):
    from partita.validation.frozen import load_frozen_sets
    path = _frozen_file(tmp_path, body)
    with pytest.raises(PartitaError) as err:
        load_frozen_sets(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_cross_validate_refuses_other_inputs(capsys):
    assert main(["validate", "--cross-validate", "--rows", "NAR21-01"]) == 2
    assert "error: --cross-validate" in capsys.readouterr().err
    assert main(["validate", "--write"]) == 2


def test_fit_recovers_a_fraction_and_gives_unseen_families_the_median():
    """fitting.step_time.fit on rows whose error depends on the A100 fraction only (a stub
    predictor): the fit finds it, and the V100 and H100 fractions, which no row reads, get the
    median of the fitted families, as the simulator gives a family without rows."""
    from types import SimpleNamespace
    from partita.fitting.step_time import fit

    class Stub:
        def gpu_family(self, m):
            return "a100"

        def errors(self, rows, oh):
            return {m.row_id: oh.sustained("a100") / 0.8 * m.scale - 1.0 for m in rows}

    rows = [SimpleNamespace(row_id=f"R{i}", source_key="S", scale=s)
            for i, s in enumerate((0.98, 1.0, 1.02))]
    result = fit(rows, catalog=None, predictor=Stub())
    v = result.values
    assert v["sustained_matmul_fraction.a100"] == pytest.approx(0.8, abs=0.01)
    assert v["sustained_matmul_fraction.v100"] == v["sustained_matmul_fraction.a100"]
    assert v["sustained_matmul_fraction.h100"] == v["sustained_matmul_fraction.a100"]
    assert result.rows == ("R0", "R1", "R2")


@pytest.mark.parametrize("pp, expected", [("1", 12), ("2", None)])
def test_every_nth_block_checkpointing_is_full_recompute_of_that_many_blocks(tmp_path, pp, expected):
    """torchtitan's 'selective layer' AC checkpoints every n-th block of the whole model: with n
    from the rules, full recompute of layers // n blocks (recompute_num_layers); counted over the
    whole model it is not Megatron's per-chunk count, so a pipelined row is skipped."""
    rules = tmp_path / "rowmap.yaml"
    rules.write_text("sources: {MINE: {recompute_every_nth_block: {value: 2, why: w}}}\n")
    row = {**_user_row("ac"), "recompute": "selective layer AC (every n-th block)", "pp": pp,
           "dp": str(8 // int(pp))}
    m = map_row(read_rows(_user_csv(tmp_path, [row]))[0], load_rules(rules))
    if expected is None:
        assert isinstance(m, SkippedRow) and m.kind == "unsupported" and "pipeline 2" in m.reason
    else:
        assert m.document["training"]["recompute"] == "full"
        assert m.document["training"]["recompute_num_layers"] == expected
        assert any(a.startswith("recompute_every_nth_block 2: w") for a in m.assumptions)
    plain = map_row(read_rows(_user_csv(tmp_path, [row]))[0], load_rules())
    assert isinstance(plain, SkippedRow) and "n is not known" in plain.reason
