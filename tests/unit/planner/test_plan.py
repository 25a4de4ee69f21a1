"""`partita plan` and `planner.search.plan`: the search, its table, the written scenario, bad input."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from partita.cli import main
from partita.planner.catalog import load_catalog
from partita.planner.errors import PartitaError
from partita.planner.sagemaker import translate
from partita.planner.scenario import load_scenario, parse_scenario
from partita.planner.search import COLUMNS, plan

CATALOG = load_catalog()


def small(**over) -> dict:
    doc = {"name": "small",
           "model": {"arch": "gpt", "layers": 6, "hidden": 1024, "heads": 16, "seq_len": 1024,
                     "vocab": 32000},
           "cluster": {"system": "p4d.24xlarge", "gpus": 16},
           "training": {"global_batch": 64, "precision": "bf16"}}
    for key, value in over.items():
        section, _, name = key.partition("__")
        if value is None:
            doc[section].pop(name, None)
        else:
            doc.setdefault(section, {})[name] = value
    return doc


def write(tmp_path, doc, name="s.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def fake_evaluate(s):
    """Step time from the plan's shape: fewer GPUs idle and less pipeline bubble is faster; a
    plan with tensor 8 'does not fit' and pipeline 2 x data 2 'fails', to exercise those paths."""
    p, t = s.parallel, s.training
    if p.pipeline == 2 and p.data == 2:
        raise PartitaError("pipeline 2 x data 2 is refused by this test's evaluator")
    m = t.global_batch // (t.micro_batch * p.data)
    step = (1.0 + (p.pipeline - 1) / m) * 16 / p.gpus + 0.01 * p.tensor + 0.001 * p.zero
    cap = 40 * 2**30
    peak = cap * (2 if p.tensor == 8 else 0.5)
    return SimpleNamespace(step_time_s=step, tokens_per_s=1e6 / step, mfu=0.4 / step,
                           bubble_fraction=(p.pipeline - 1) / (m + p.pipeline - 1),
                           peak_memory_bytes=peak, memory_capacity_bytes=cap,
                           fits_in_memory=peak <= cap)


def test_plan_api_contract_and_ranking():
    r = plan(small(cluster__gpus=None), catalog=CATALOG, evaluate=fake_evaluate, max_gpus=16,
             systems=["p4d.24xlarge", "p4de.24xlarge"], tokens=1e9)
    df = r.table()
    assert set(COLUMNS) <= set(df.columns)
    assert list(df.columns[:3]) == ["system", "nodes", "gpus"]
    ok = df[df.error.isna() & df.fits & df.within_budget]
    assert list(ok.step_time_s) == sorted(ok.step_time_s)            # ranked by the objective
    assert df.step_time_s.iloc[0] == ok.step_time_s.min()
    failed = df[df.error.notna()]
    assert len(failed) and (failed.pipeline == 2).all() and (failed.data == 2).all()  # listed
    assert (~df.fits).any() and not df[~df.fits & df.error.isna()].tensor.ne(8).any()
    assert df.pareto.any() and set(df[df.pareto].system) <= {"p4d.24xlarge", "p4de.24xlarge"}
    best = r.candidates[0]
    assert best.days == pytest.approx(1e9 / (64 * 1024) * best.step_time_s / 86400)
    assert best.usd == pytest.approx(best.usd_per_hour * best.days * 24)
    # the best document is a complete scenario the parser accepts, stages included
    s = parse_scenario(r.best, origin="best")
    assert s.parallel.stages is not None and s.parallel.gpus == s.cluster.gpus
    with pytest.raises(Exception):
        r.candidates[0].gpus = 1                                      # frozen


def test_a_system_that_cannot_run_the_precision_is_skipped_with_its_reason():
    r = plan(small(cluster__system=None, cluster__gpus=None), catalog=CATALOG,
             evaluate=fake_evaluate, systems=["p3dn.24xlarge", "p4d.24xlarge"], max_gpus=8)
    assert any("p3dn.24xlarge skipped: precision 'bf16' is not supported" in n for n in r.notes)
    assert set(r.table().system) == {"p4d.24xlarge"}
    # no searched system runs the precision: one line naming the key, the GPU and what it runs
    with pytest.raises(PartitaError, match="^scenario: training.precision: p3dn.24xlarge: "
                       "precision 'bf16' is not supported by v100-32gb \\(supports: fp32, fp16\\)$"):
        plan(small(cluster__system=None, cluster__gpus=None), catalog=CATALOG,
             evaluate=fake_evaluate, systems=["p3dn.24xlarge"], max_gpus=8)


def test_a_system_that_cannot_run_the_fp8_recipe_is_skipped_with_its_reason():
    mx = small(cluster__system=None, cluster__gpus=None, training__precision="fp8",
               training__fp8_recipe="mxfp8")
    r = plan(mx, catalog=CATALOG, evaluate=fake_evaluate,
             systems=["p5.48xlarge", "p6-b200.48xlarge"], max_gpus=8)
    assert any(n.startswith("p5.48xlarge skipped: training.fp8_recipe: mxfp8 needs") for n in r.notes)
    assert set(r.table().system) == {"p6-b200.48xlarge"}
    with pytest.raises(PartitaError, match="^scenario: training.fp8_recipe: p5.48xlarge: mxfp8 "
                       "needs a GPU whose tensor cores run block-scaled fp8 .*'hopper'"):
        plan(mx, catalog=CATALOG, evaluate=fake_evaluate, systems=["p5.48xlarge"], max_gpus=8)


def test_a_system_the_catalog_cannot_link_is_skipped_with_its_reason():
    r = plan(small(cluster__system=None, cluster__gpus=None), catalog=CATALOG,
             evaluate=fake_evaluate, systems=["g5.48xlarge", "p4d.24xlarge"], max_gpus=16)
    note = [n for n in r.notes if n.startswith("g5.48xlarge on 2, 4, 8, 16 GPUs skipped")]
    assert note and "intra_node_gbps" in note[0]
    assert set(r.table().system) == {"p4d.24xlarge"} or set(r.table()[r.table().system ==
                                                             "g5.48xlarge"].gpus) == {1}


def test_progress_is_reported_and_unknown_systems_name_the_option():
    said = []
    plan(small(), catalog=CATALOG, evaluate=fake_evaluate, progress=said.append)
    assert any(m.startswith("layouts:") for m in said) and said[-1].startswith("split:")
    with pytest.raises(PartitaError, match="--systems: unknown system 'p4d.24xlarg'.*did you mean"):
        plan(small(cluster__system=None), catalog=CATALOG, systems=["p4d.24xlarg"])


def test_fixed_fields_stay_fixed():
    r = plan(small(parallel__tensor=2, training__micro_batch=2), catalog=CATALOG,
             evaluate=fake_evaluate)
    df = r.table()
    assert set(df.tensor) == {2} and set(df.micro_batch) == {2} and set(df.gpus) == {16}


def test_given_stages_and_virtual_stages_are_kept():
    doc = small(parallel__pipeline=2, parallel__schedule="interleaved-1f1b",
                parallel__virtual_stages=2, parallel__stages=[[0, 1], [1, 3], [3, 5], [5, 6]],
                training__micro_batch=2)
    r = plan(doc, catalog=CATALOG, evaluate=fake_evaluate)
    assert r.best["parallel"]["stages"] == [[0, 1], [1, 3], [3, 5], [5, 6]]
    assert {(c.schedule, c.virtual_stages) for c in r.candidates} == {("interleaved-1f1b", 2)}


def test_a_given_layout_is_kept_as_its_stages():
    doc = small(parallel__pipeline=2, parallel__schedule="interleaved-1f1b",
                parallel__layout="E|ttt|ttt|L", training__micro_batch=2)
    r = plan(doc, catalog=CATALOG, evaluate=fake_evaluate)
    assert r.best["parallel"]["stages"] == [[0, 0], [0, 3], [3, 6], [6, 6]]
    assert {(c.schedule, c.virtual_stages) for c in r.candidates} == {("interleaved-1f1b", 2)}


def test_a_given_cp_comm_type_is_kept():
    """`partita plan` carries `parallel.cp_comm_type` into the layouts it tries (it searched past
    it before), also where it leaves the context degree to the search."""
    seen = []

    def evaluate(scenario):
        seen.append((scenario.parallel.context, scenario.parallel.cp_comm_type))
        return fake_evaluate(scenario)

    doc = small(parallel__context=2, parallel__cp_comm_type="all_gather", training__micro_batch=2)
    r = plan(doc, catalog=CATALOG, evaluate=evaluate)
    assert seen and all(kind == "all_gather" for context, kind in seen if context > 1)
    assert r.best["parallel"]["cp_comm_type"] == "all_gather"
    assert parse_scenario(r.best).parallel.cp_comm_type == "all_gather"
    seen.clear()
    open_cp = plan(small(parallel__cp_comm_type="all_gather", training__micro_batch=2),
                   catalog=CATALOG, evaluate=evaluate)
    assert seen and all(kind == "all_gather" for _, kind in seen) and open_cp.best


def test_objectives_cost_and_memory():
    cost = plan(small(cluster__gpus=None), catalog=CATALOG, evaluate=fake_evaluate, max_gpus=16,
                objective="cost")
    c = cost.candidates[0]
    per_step = c.usd_per_hour * c.step_time_s
    assert all(per_step <= x.usd_per_hour * x.step_time_s + 1e-12
               for x in cost.candidates if x.ok)
    mem = plan(small(), catalog=CATALOG, evaluate=fake_evaluate, objective="memory")
    assert mem.candidates[0].peak_memory_gib == min(x.peak_memory_gib for x in mem.candidates if x.ok)


def test_headroom_turns_tight_plans_away():
    loose = plan(small(), catalog=CATALOG, evaluate=fake_evaluate)
    assert loose.candidates[0].fits                   # fake peak: half the capacity
    with pytest.raises(PartitaError, match="no plan fits in memory"):
        plan(small(), catalog=CATALOG, evaluate=fake_evaluate, headroom=0.6)


def test_budget_no_plan_meets_is_one_error():
    with pytest.raises(PartitaError, match="no plan meets --max-cost 0.01 USD"):
        plan(small(), catalog=CATALOG, evaluate=fake_evaluate, tokens=1e12, max_cost=0.01)
    r = plan(small(), catalog=CATALOG, evaluate=fake_evaluate, tokens=1e9, max_days=1e6)
    assert all(c.within_budget for c in r.candidates if c.error is None)


def _with_interval(s):
    """fake_evaluate with a 90% interval of -10% / +30% around its step."""
    r = fake_evaluate(s)
    r.step_time_interval_s = (r.step_time_s * 0.9, r.step_time_s * 1.3)
    return r


def test_the_budget_is_checked_at_the_prediction_or_the_slow_end_of_its_interval(capsys):
    best = plan(small(), catalog=CATALOG, evaluate=_with_interval, tokens=1e9).candidates[0]
    assert best.step_time_low_s == pytest.approx(0.9 * best.step_time_s)
    assert best.days_high == pytest.approx(1.3 * best.days)
    assert best.usd_high == pytest.approx(1.3 * best.usd)
    days = 1.1 * best.days                     # above the prediction, below its slow end
    r = plan(small(), catalog=CATALOG, evaluate=_with_interval, tokens=1e9, max_days=days)
    assert r.candidates[0].within_budget and r.candidates[0].step_time_s == best.step_time_s
    with pytest.raises(PartitaError, match="fastest plan at the slow end of its interval"):
        plan(small(), catalog=CATALOG, evaluate=_with_interval, tokens=1e9, max_days=days,
             bound="slow")
    with pytest.raises(PartitaError, match="--bound: expected one of predicted, slow, got 'worst'"):
        plan(small(), catalog=CATALOG, evaluate=_with_interval, bound="worst")


def test_cli_plan_shows_each_plans_interval_and_slow_budget(tmp_path, capsys):
    src = write(tmp_path, small(parallel__tensor=2, training__micro_batch=2))
    assert main(["plan", src, "--tokens", "1e9", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "90% interval" in out and "$ slow" in out and "slow end of the step time's 90%" in out
    assert main(["plan", src, "--top", "2", "--json"]) == 0
    comparison = json.loads(capsys.readouterr().out)["comparison"]
    assert comparison["pairs"] > 0 and comparison["within_of_best"][0] == 1
    with pytest.raises(SystemExit) as exc:                          # a usage error: one line
        main(["plan", src, "--bound", "fastest"])
    assert exc.value.code == 2 and "invalid choice: 'fastest'" in capsys.readouterr().err


def test_plans_near_memory_capacity_are_flagged_as_simulate_flags_them():
    """A plan that fits above MEMORY_PRESSURE_FRACTION of the GPU's memory carries the flag
    `simulate` prints (NEAR CAPACITY), in the table with its legend and in --json."""
    from dataclasses import replace
    from partita.commands.plan import format_table
    from partita.planner.layergraph import MEMORY_PRESSURE_FRACTION
    r = plan(small(), catalog=CATALOG, evaluate=fake_evaluate)
    base = next(c for c in r.candidates if c.ok)
    cap = base.memory_capacity_gib
    tight = replace(base, peak_memory_gib=(MEMORY_PRESSURE_FRACTION + 0.05) * cap)
    roomy = replace(base, peak_memory_gib=(MEMORY_PRESSURE_FRACTION - 0.05) * cap)
    over = replace(base, peak_memory_gib=1.1 * cap, fits=False)
    assert tight.near_memory_capacity and not roomy.near_memory_capacity
    assert not over.near_memory_capacity                      # does not fit: another flag ("!")
    text = format_table(replace(r, candidates=(roomy, tight)), top=2)
    rows = text.splitlines()[2:4]
    assert "near capacity" not in rows[0] and rows[1].endswith("near capacity")
    assert f"(near capacity: above {100 * MEMORY_PRESSURE_FRACTION:.0f}% of the GPU's memory" in text
    assert "(near capacity:" not in format_table(replace(r, candidates=(roomy,)), top=1)
    cands = replace(r, candidates=(roomy, tight)).to_json()["candidates"]
    assert [c["near_memory_capacity"] for c in cands] == [False, True]


def test_a_candidates_capacity_is_the_usable_memory_it_was_fitted_against():
    """On A100 40GB the simulator fits against the 39.5 GiB CUDA leaves usable; the candidate (and
    so plan's table and the compare report's 'does not fit: X of Y') says the same, not the 40 GiB
    label."""
    from partita.simulator.step import simulate
    tiny = small(model__layers=2, model__hidden=256, model__heads=4, model__seq_len=256,
                 cluster__gpus=8)
    r = plan(tiny, catalog=CATALOG, systems=["p4d.24xlarge"], max_gpus=8)
    best = next(c for c in r.candidates if c.ok)
    assert best.memory_capacity_gib == pytest.approx(
        simulate(best.scenario, CATALOG).memory_capacity_bytes / 2**30)
    assert best.memory_capacity_gib == pytest.approx(39.5, abs=0.05)


def test_the_summary_split_line_is_the_chosen_plans_not_another_plans():
    """The `split:` of plan's first line describes the best plan's layer split: its ILP split,
    or what refining its even split said; another plan's failed ILP split is not it."""
    from dataclasses import replace
    from partita.planner.search import _split_key, _split_line
    r = plan(small(), catalog=CATALOG, evaluate=fake_evaluate)
    best, other = [c for c in r.candidates if c.ok][:2]
    failed = {_split_key(other): "ILP split not used: no split into 2 pipeline stages fits"}
    assert _split_line([best, other], failed) == ""              # the best was not refined
    kept = failed | {_split_key(best): "HiGHS, optimal, same split as the default"}
    assert _split_line([best, other], kept) == "HiGHS, optimal, same split as the default"
    refined = replace(best, split="ilp (HiGHS, optimal, gap 0.50%)")
    assert _split_line([refined], failed) == "HiGHS, optimal, gap 0.50%"
    assert _split_line([], kept) == ""


def test_plans_within_the_ratio_error_of_the_best_are_named():
    from partita.commands.plan import comparison_line, within_tolerance
    from partita.simulator.interval import RatioTolerance
    r = plan(small(), catalog=CATALOG, evaluate=fake_evaluate)
    usable = [c for c in r.candidates if c.ok]
    best = usable[0].step_time_s
    tol = RatioTolerance(p90=0.10, pairs=52)
    ranks = within_tolerance(r, tol)
    expect = [i for i, c in enumerate(r.candidates, 1) if c.ok and c.step_time_s <= 1.1 * best]
    assert ranks == expect and ranks[0] == 1
    assert len(ranks) >= 2                   # the fake's plans lie close together
    line = comparison_line(r, tol, top=2)
    assert line.startswith("  plans 1-2") and "10.0% of plan 1's step time" in line
    assert "52 pairs" in line and "measure fastest" in line
    assert within_tolerance(r, None) == [] and comparison_line(r, None, 5) == ""
    ties = [i for i, c in enumerate(r.candidates, 1) if c.ok and c.step_time_s <= best]
    assert within_tolerance(r, RatioTolerance(p90=0.0, pairs=1)) == ties    # the best's equals


def test_ranges_compress_consecutive_ranks():
    from partita.commands.plan import _ranges
    assert _ranges([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8" and _ranges([4]) == "4" and _ranges([]) == ""


@pytest.mark.parametrize("doc, kwargs, message", [
    (small(parallel__pipeline=7), {}, "parallel.pipeline\\*virtual_stages \\(7\\) exceeds the "
                                      "model's 6 layers"),
    (small(parallel__data=5), {}, "parallel.data \\(5\\) does not divide training.global_batch"),
    (small(cluster__system="p4d.24xlarg"), {}, "unknown system 'p4d.24xlarg'"),
    (small(), {"systems": ["p5.48xlarge"]}, "cluster.system \\(p4d.24xlarge\\) is fixed"),
    (small(), {"max_gpus": 8}, "cluster.gpus \\(16\\) exceeds --max-gpus 8"),
    (small(cluster__gpus=None), {}, "cluster.gpus: missing"),
    (small(parallel__tensor=2, parallel__pipeline=2, parallel__data=2), {},
     "tensor\\*pipeline\\*context\\*data = 8 but cluster.gpus is 16"),
    (small(), {"objective": "fast"}, "--objective: expected one of time, cost, memory"),
    # fixed fields that no layout can honour are named before the search, with the valid values
    (small(parallel__tensor=3), {}, "model.heads \\(16\\) must be divisible by parallel.tensor "
                                    "\\(3\\); valid parallel.tensor: 1, 2, 4, 8, 16$"),
    (small(parallel__tensor=32), {}, "valid parallel.tensor: 1, 2, 4, 8, 16$"),
    (small(parallel__context=3), {}, "model.seq_len \\(1024\\) must be divisible by "
                                     "parallel.context \\(3\\)"),
    (small(training__micro_batch=3), {}, "training.micro_batch \\(3\\) does not divide "
                                         "training.global_batch \\(64\\); valid micro-batches: "
                                         "1, 2, 4, 8, 16, 32, 64$"),
    (small(parallel__data=4, training__micro_batch=32), {},
     "training.micro_batch \\(32\\) does not divide training.global_batch / parallel.data "
     "\\(64 / 4 = 16\\); valid micro-batches: 1, 2, 4, 8, 16$"),
    (small(parallel__pipeline=3), {}, "parallel: pipeline = 3 does not divide cluster.gpus \\(16\\)"),
])
def test_bad_input_names_the_key(doc, kwargs, message):
    with pytest.raises(PartitaError, match=message):
        plan(doc, catalog=CATALOG, evaluate=fake_evaluate, **kwargs)


def test_cli_round_trip_with_the_simulator(tmp_path, capsys):
    src = write(tmp_path, small(parallel__tensor=2, training__micro_batch=2))
    out = tmp_path / "planned.yaml"
    assert main(["plan", src, "-o", str(out), "--top", "3"]) == 0
    text = capsys.readouterr()
    assert "partita plan:" in text.out and "error" not in text.err
    planned = yaml.safe_load(out.read_text())
    assert planned["parallel"]["stages"][0][0] == 0
    # simulate takes the written file unchanged, and predicts what plan ranked first
    assert main(["simulate", str(out), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert main(["plan", src, "--json", "--top", "2"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["candidates"][0]["step_time_s"] == pytest.approx(sim["step_time_s"])
    assert len(got["candidates"]) == 2 and got["best"] == planned


def test_executable_plans_are_what_partita_run_executes(tmp_path, capsys):
    from partita.executor.plan import execution_plan
    src = write(tmp_path, small(parallel__tensor=2, training__micro_batch=2))
    out = tmp_path / "run.yaml"
    assert main(["plan", src, "--executable", "-o", str(out)]) == 0
    planned = load_scenario(str(out))
    assert execution_plan(planned, 16).chunks[0][0] == 0            # the executor accepts it
    # context parallelism runs (executor/context.py), for every arch but T5
    cp_out = tmp_path / "cp-run.yaml"
    assert main(["plan", write(tmp_path, small(parallel__context=2), "cp.yaml"), "--executable",
                 "-o", str(cp_out)]) == 0
    cp_planned = load_scenario(str(cp_out))
    assert cp_planned.parallel.context == 2 and execution_plan(cp_planned, 16).context == 2
    capsys.readouterr()
    t5 = small(parallel__context=2, model__arch="t5", model__layers=4, model__decoder_layers=4)
    assert main(["plan", write(tmp_path, t5, "t5.yaml"), "--executable"]) == 1
    assert "parallel.context (2) contradicts --executable" in capsys.readouterr().err


def test_cli_never_writes_over_its_input(tmp_path, capsys):
    src = write(tmp_path, small())
    before = (tmp_path / "s.yaml").read_text()
    assert main(["plan", src, "-o", src]) == 1
    assert "that is the input file" in capsys.readouterr().err
    assert (tmp_path / "s.yaml").read_text() == before


def test_cli_bad_input_is_one_error_line(tmp_path, capsys):
    src = write(tmp_path, small(training__global_batch=7, training__micro_batch=2))
    assert main(["plan", src]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "global_batch (7)" in err[0]
    assert main(["plan", src, "--max-cost", "5"]) == 1
    assert "need --tokens" in capsys.readouterr().err


def test_sagemaker_parameters_map_to_partita_names():
    doc = small()
    doc["sagemaker"] = {"partitions": 2, "tensor_parallel_degree": 2, "pipeline": "simple",
                        "microbatches": 4, "optimize": "memory", "placement_strategy": "cluster",
                        "ddp": True}
    doc["parallel"] = {"data": 4}
    out, kept = translate(doc)
    assert out["parallel"] == {"data": 4, "pipeline": 2, "tensor": 2, "schedule": "gpipe"}
    assert out["training"]["micro_batch"] == 64 // (4 * 4)
    assert kept == {"optimize": "memory", "ddp": True, "microbatches": 4}
    s = parse_scenario(doc)
    assert (s.parallel.pipeline, s.parallel.tensor, s.microbatches()) == (2, 2, 4)
    bad = small(parallel__pipeline=4)
    bad["sagemaker"] = {"partitions": 2}
    with pytest.raises(PartitaError, match="sagemaker.partitions \\(2\\) contradicts parallel.pipeline"):
        translate(bad)
    with pytest.raises(PartitaError, match="microbatches \\(4\\) needs parallel.data"):
        translate({**small(), "sagemaker": {"microbatches": 4}})
    with pytest.raises(PartitaError, match="sagemaker.placement_strategy"):
        translate({**small(), "sagemaker": {"placement_strategy": "spread"}})


def test_sagemaker_microbatches_constrain_the_search():
    doc = small(cluster__gpus=None)
    doc["sagemaker"] = {"microbatches": 8, "ddp": False}
    r = plan(doc, catalog=CATALOG, evaluate=fake_evaluate, max_gpus=8)
    for c in r.candidates:
        assert c.data == 1 and 64 // (c.micro_batch * c.data) == 8


def test_uneven_layer_counts_simulate_and_match_the_written_split(tmp_path, capsys):
    doc = small(parallel__tensor=1, parallel__pipeline=4, parallel__data=4,
                training__micro_batch=1)
    doc["model"]["layers"] = 7
    path = write(tmp_path, doc)
    assert main(["simulate", path, "--json"]) == 0               # used to refuse 7 on 4 stages
    assert json.loads(capsys.readouterr().out)["step_time_s"] > 0
    from partita.executor.plan import execution_plan
    chunks = execution_plan(load_scenario(path), 16).chunks
    assert len(chunks) == 4 and chunks[0][0] == 0 and chunks[-1][1] == 7


def test_messages_that_point_to_partita_plan_name_a_command_that_completes_the_file(tmp_path,
                                                                                   capsys):
    path = write(tmp_path, small(parallel__tensor=2))
    doc = yaml.safe_load(open(path))
    doc.pop("parallel")
    bare = write(tmp_path, doc, "bare.yaml")
    assert main(["simulate", bare]) == 1
    err = capsys.readouterr().err
    assert f"run `partita plan {bare} -o" in err
    command = err.split("`")[1].split()          # the command the message gives, run as given
    out = tmp_path / "planned.yaml"
    command[command.index("-o") + 1] = str(out)
    assert main(command[1:]) == 0 and main(["simulate", str(out)]) == 0


def test_optimize_memory_gives_a_leaner_split():
    """The memory objective's split holds no more on its fullest rank, and is no faster on its
    slowest, than the speed objective's on the same problem (strictly leaner below the top where
    the two differ); `plan(optimize="memory")` writes the memory objective's split."""
    from partita.planner.layergraph import plan_problem
    from partita.planner.partition import solve
    from partita.planner.partition_problem import evaluate
    doc = small(parallel__tensor=1, parallel__pipeline=4, parallel__data=4, parallel__zero=1,
                training__micro_batch=1, training__recompute="none")
    doc["model"]["layers"] = 8
    memory = plan(doc, catalog=CATALOG, optimize="memory")
    s = parse_scenario(memory.best)
    gpu = CATALOG.system("p4d.24xlarge").gpu
    problems = {o: plan_problem(s.model.resolve(), s.training, s.parallel,
                                memory_bytes=gpu.memory_bytes, peak_flops=gpu.peak("bf16"),
                                link_bytes_per_s=25e9, optimize=o) for o in ("speed", "memory")}
    splits = {o: solve(pr).ranges for o, pr in problems.items()}
    t_speed, m_speed = evaluate(problems["speed"], splits["speed"])
    t_mem, m_mem = evaluate(problems["speed"], splits["memory"])
    assert max(m_mem) <= max(m_speed) * (1 + 1e-9) and max(t_speed) <= max(t_mem) * (1 + 1e-9)
    if splits["memory"] != splits["speed"]:
        assert sorted(m_mem, reverse=True) <= sorted(m_speed, reverse=True)
    assert [tuple(r) for r in memory.best["parallel"]["stages"]] == list(splits["memory"])
    with pytest.raises(PartitaError, match="--optimize: expected speed or memory"):
        plan(doc, catalog=CATALOG, optimize="fast")


@pytest.mark.parametrize("cluster, kind", [("x", "str"), ([1], "list"), (3, "int")])
def test_a_cluster_that_is_not_a_mapping_is_one_error_line(tmp_path, capsys, cluster, kind):
    doc = small()
    doc["cluster"] = cluster
    assert main(["plan", write(tmp_path, doc)]) == 1
    err = capsys.readouterr().err
    assert err.strip().endswith(f"cluster: expected a mapping, got {kind}") and "Traceback" not in err


def test_where_only_full_recompute_fits_the_fewest_recomputed_blocks_are_found(tmp_path, capsys):
    """Full recompute of every block fits, none and selective do not: the search bisects for the
    least N of --recompute-num-layers that fits (memory falls and time grows with N) and keeps
    that plan and the all-blocks one, not the probes between."""
    def evaluate(s):
        t, p = s.training, s.parallel
        blocks = 6 // p.pipeline
        n = t.recomputed_blocks(blocks)
        cap = 40 * 2**30
        peak = cap * (1.5 - 0.6 * n / blocks)            # fits from n / blocks >= 5/6
        step = 1.0 + 0.1 * n + 0.01 * p.tensor
        return SimpleNamespace(step_time_s=step, tokens_per_s=1e6 / step, mfu=0.4 / step,
                               bubble_fraction=0.0, peak_memory_bytes=peak,
                               memory_capacity_bytes=cap, fits_in_memory=peak <= cap)

    r = plan(small(parallel__pipeline=1, parallel__tensor=1, training__micro_batch=1),
             catalog=CATALOG, evaluate=evaluate)
    full = [c for c in r.candidates if c.recompute == "full" and c.ok]
    assert {c.recompute_layers for c in full} == {5, None}
    assert r.candidates[0].recompute_layers == 5
    assert r.best["training"]["recompute_num_layers"] == 5
    assert "recompute_layers" in r.table().columns
    # a scenario that names N keeps it
    fixed = plan(small(training__recompute="full", training__recompute_num_layers=6,
                       parallel__pipeline=1), catalog=CATALOG, evaluate=evaluate)
    assert {c.recompute_layers for c in fixed.candidates} == {6}


def test_a_given_shard_group_is_kept_and_divides_the_data_parallel_degree():
    r = plan(small(parallel__zero=3, parallel__data_shard=4), catalog=CATALOG, evaluate=fake_evaluate)
    usable = [c for c in r.candidates if c.error is None]
    assert usable and all(c.data % 4 == 0 for c in usable)
    assert all(c.scenario.parallel.data_shard == 4 for c in usable)
    assert r.best["parallel"]["data_shard"] == 4


def test_sharded_layouts_across_nodes_are_also_tried_sharded_by_node():
    """Hybrid sharding (FSDP HYBRID_SHARD): for the best ZeRO layouts whose data-parallel group
    spans nodes, the search also times the ZeRO stage sharded over one node's data-parallel ranks."""
    r = plan(small(parallel__zero=3, parallel__tensor=1, parallel__pipeline=1), catalog=CATALOG,
             evaluate=fake_evaluate)
    hybrid = [c for c in r.candidates if c.data_shard is not None]
    assert hybrid and all(c.data_shard == 8 and c.data == 16 for c in hybrid)
    assert all(c.scenario.parallel.data_shard == 8 for c in hybrid if c.error is None)
    assert "data_shard" in r.table().columns


def test_op_level_selective_recompute_is_kept_where_named_and_not_searched_otherwise():
    """torchtitan's op policy (recompute: selective-op) is a scenario's choice the plan keeps; the
    search's own recompute settings are none, selective and full."""
    named = plan(small(training__recompute="selective-op"), catalog=CATALOG, evaluate=fake_evaluate)
    assert {c.recompute for c in named.candidates} == {"selective-op"}
    assert named.best["training"]["recompute"] == "selective-op"
    free = plan(small(), catalog=CATALOG, evaluate=fake_evaluate)
    assert "selective-op" not in {c.recompute for c in free.candidates}


def test_fsdp_plans_also_try_the_op_policy_beside_partial_full_recompute():
    """With training.framework fsdp the search tries torchtitan's op policy too; where it fits it
    does not stop the search, so full recompute of the fewest blocks is timed beside it and the
    faster wins. Bisection probes that do not fit are not left in the table."""
    def evaluate(s):
        t, p = s.training, s.parallel
        blocks = 6 // p.pipeline
        n = t.recomputed_blocks(blocks)
        cap = 40 * 2**30
        share = {"none": 0.0, "selective": 0.0, "selective-op": 0.7, "full": n / blocks}[t.recompute]
        peak = cap * (1.5 - 0.6 * share)               # fits from share >= 5/6
        if t.recompute == "selective-op":
            peak = cap * 0.9
        step = 1.0 + {"selective-op": 0.45}.get(t.recompute, 0.1 * n) + 0.01 * p.tensor
        return SimpleNamespace(step_time_s=step, tokens_per_s=1e6 / step, mfu=0.4 / step,
                               bubble_fraction=0.0, peak_memory_bytes=peak,
                               memory_capacity_bytes=cap, fits_in_memory=peak <= cap)

    doc = small(parallel__pipeline=1, parallel__tensor=1, training__micro_batch=1,
                training__framework="fsdp")
    r = plan(doc, catalog=CATALOG, evaluate=evaluate)
    ok = {(c.recompute, c.recompute_layers) for c in r.candidates if c.ok and c.zero == 0}
    assert ("selective-op", None) in ok and ("full", 5) in ok and ("full", None) in ok
    assert r.best["training"]["recompute"] == "selective-op"      # 1.45 s against 1.5 s for N 5
    probes = [c for c in r.candidates if c.recompute == "full" and c.recompute_layers is not None]
    assert {c.recompute_layers for c in probes} == {5}


def test_the_memory_floor_bounds_op_level_selective_recompute_from_below():
    """candidates.memory_floor never rejects a layout that fits: under the op policy it counts
    each block's input only, below what the simulator's rank keeps."""
    from partita.planner.candidates import Layout, memory_floor
    from partita.simulator.step import simulate
    doc = small(training__recompute="selective-op", training__micro_batch=2, parallel__tensor=2,
                parallel__pipeline=2, parallel__data=4)
    doc["model"].update(arch="llama", kv_heads=8, ffn_hidden=2816)
    s = parse_scenario(doc)
    lay = Layout(system="p4d.24xlarge", gpus=16, nodes=2, tensor=2, pipeline=2, data=4, context=1,
                 micro_batch=2, recompute="selective-op", zero=0)
    from dataclasses import replace
    floor = memory_floor(s.model.resolve(), s.training, lay)
    assert 0 < floor < simulate(s, CATALOG).peak_memory_bytes
    assert floor == memory_floor(s.model.resolve(), s.training, replace(lay, recompute="full"))
    assert floor < memory_floor(s.model.resolve(), s.training, replace(lay, recompute="none"))
