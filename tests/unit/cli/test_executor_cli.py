"""`partita run`: bad input is refused before anything starts (no process is launched; the real
runs are in tests/integration/cli/test_executor_launch.py)."""
from __future__ import annotations

import pytest
import torch
import yaml

from partita.executor.launch import Rendezvous, torchrun_command
from partita.cli import build_parser, main
from partita.commands.run import request
from partita.executor.preflight import placement
from partita.planner.paths import SCENARIOS_DIR

TINY = SCENARIOS_DIR / "tiny-gpt-pp2.yaml"


@pytest.fixture(autouse=True)
def no_local_calibration(tmp_path, monkeypatch):
    """Runs here see no `partita calibrate` result, whatever the developer's home holds."""
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PARTITA_CATALOG", raising=False)


def scenario_file(tmp_path, **changes) -> str:
    doc = yaml.safe_load(TINY.read_text())
    for path, value in changes.items():
        section, key = path.split("__")
        doc[section][key] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def refused(capsys, tmp_path, *argv) -> str:
    """Run `partita run ...`; it must fail with one `error:` line and start nothing."""
    out = tmp_path / "out"
    code = main(["run", *argv, "--out", str(out)])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert not out.exists() and captured.out == ""
    return lines[0]


def test_stage_ranges_out_of_bounds(capsys, tmp_path):
    line = refused(capsys, tmp_path, scenario_file(tmp_path, parallel__stages=[[0, 2], [2, 6]]))
    assert "parallel.stages ends at layer 6, but the model has 4 layers" in line


def test_degrees_that_do_not_multiply_to_the_process_count(capsys, tmp_path):
    line = refused(capsys, tmp_path, scenario_file(tmp_path, parallel__data=2))
    assert "tensor*pipeline*context*data = 1*2*1*2 = 4, but cluster has 2 GPUs" in line


def test_missing_token_file(capsys, tmp_path):
    line = refused(capsys, tmp_path, str(TINY), "--data", str(tmp_path / "nope.bin"))
    assert "nope.bin: no such file" in line


def test_system_not_local_without_rendezvous_says_what_to_do(capsys, tmp_path):
    path = scenario_file(tmp_path, cluster__system="p4d.24xlarge")
    line = refused(capsys, tmp_path, path)
    assert "not 'local'" in line and "cluster: {system: local, gpus: 2}" in line
    assert "--nnodes 1 --node-rank I --rdzv-endpoint HOST:PORT" in line


def test_local_system_across_nodes_is_refused(capsys, tmp_path):
    assert "this machine" in refused(capsys, tmp_path, str(TINY), "--nnodes", "2")


def test_unknown_system_is_refused(capsys, tmp_path):
    path = scenario_file(tmp_path, cluster__system="p4d.24xl")
    assert "unknown system 'p4d.24xl'" in refused(capsys, tmp_path, path, "--nnodes", "1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_nccl_without_gpus(capsys, tmp_path):
    line = refused(capsys, tmp_path, str(TINY), "--backend", "nccl")
    assert "2 needed on this machine, 0 found; use --backend gloo" in line


@pytest.mark.parametrize("flags, message", [
    (["--resume"], "--resume needs --checkpoint-dir DIR"),
    (["--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint-dir DIR"),
    (["--save-weights", "/no/such/dir/w.pt"], "--save-weights /no/such/dir/w.pt: no such directory"),
])
def test_flag_combinations(capsys, tmp_path, flags, message):
    assert message in refused(capsys, tmp_path, str(TINY), *flags)


def test_outputs_are_checked_before_training(capsys, tmp_path):
    """--out FILE, --save-weights DIR or an existing weights file: refused before a process starts,
    so a finished run is never lost to a path that cannot be written (nor overwrites a file)."""
    (tmp_path / "f").write_text("mine")
    code = main(["run", str(TINY), "--out", str(tmp_path / "f")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "--out" in err[0] and "not a directory" in err[0]
    line = refused(capsys, tmp_path, str(TINY), "--save-weights", str(tmp_path))
    assert "is a directory; give a file name" in line
    line = refused(capsys, tmp_path, str(TINY), "--save-weights", str(tmp_path / "f"))
    assert "already exists" in line and (tmp_path / "f").read_text() == "mine"
    assert main(["run", str(TINY), "--out", str(tmp_path / "f" / "sub")]) == 1
    assert "is a file, so no directory can be made under it" in capsys.readouterr().err


def test_a_model_larger_than_this_machine_is_refused_before_launch(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("partita.executor.preflight.available_bytes", lambda: 2**30)
    path = scenario_file(tmp_path, model__hidden=2048, model__heads=16)
    line = refused(capsys, tmp_path, path)
    assert "2 CPU processes need at least" in line and "1.0 GiB available" in line


def test_resume_with_nothing_to_resume_is_an_error(capsys, tmp_path):
    line = refused(capsys, tmp_path, str(TINY), "--checkpoint-dir", str(tmp_path / "ck"), "--resume")
    assert "--resume: no intact checkpoint of this plan" in line and "without --resume" in line


def test_checkpoint_dir_that_is_a_file(capsys, tmp_path):
    (tmp_path / "ck").write_text("")
    line = refused(capsys, tmp_path, str(TINY), "--checkpoint-dir", str(tmp_path / "ck"))
    assert "exists and is not a directory" in line


@pytest.mark.parametrize("changes, message", [
    ({"training__precision": "fp8"}, "fp8 needs Transformer Engine"),
    ({"parallel__schedule": "gpipe", "parallel__context": 2, "cluster__gpus": 4,
      "model__arch": "t5"}, "parallel.context = 2: partita run does not shard T5's chain"),
])
def test_plans_the_executor_does_not_run(capsys, tmp_path, changes, message):
    assert message in refused(capsys, tmp_path, scenario_file(tmp_path, **changes))


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "must be >= 1"), (["--lr", "-1"], "must be > 0"),
    (["--lr", "inf"], "must be > 0 and <= 10"), (["--lr", "nan"], "must be > 0 and <= 10"),
    (["--seed", "-1"], "must be >= 0"), (["--seed", str(2**32)], "must be <= 4294967295"),
    (["--max-restarts", "x"], "expected a whole number"), (["--backend", "mpi"], "invalid choice"),
])
def test_bad_flag_values_are_usage_errors(capsys, flags, message):
    with pytest.raises(SystemExit) as exc:
        main(["run", str(TINY), *flags])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_several_machines_get_torchruns_rendezvous_flags(tmp_path):
    from partita.planner.scenario import load_scenario
    scenario = load_scenario(scenario_file(tmp_path, cluster__system="p4d.24xlarge",
                                           cluster__gpus=16, parallel__data=8,
                                           training__global_batch=64))
    args = build_parser().parse_args(["run", "x", "--nnodes", "2", "--node-rank", "1",
                                      "--rdzv-endpoint", "host0:29500", "--max-restarts", "2"])
    gpus, per_node, rdzv = placement(scenario, request(args))
    assert (gpus, per_node) == (16, 8)
    cmd = torchrun_command(tmp_path / "job.json", per_node, rdzv)
    text = " ".join(cmd)
    assert "--standalone" not in cmd and "--nproc-per-node 8 --nnodes 2 --node-rank 1" in text
    assert "--rdzv-endpoint host0:29500" in text and "--max-restarts 2" in text
    assert cmd[-4:] == ["-m", "partita.executor.worker", "--job", str(tmp_path / "job.json")]
    one = torchrun_command(tmp_path / "job.json", 2, Rendezvous())
    assert "--standalone" in one and "--nnodes" not in one


def test_gpus_must_split_over_the_nodes(capsys, tmp_path):
    path = scenario_file(tmp_path, cluster__system="p4d.24xlarge", cluster__gpus=2)
    assert "2 GPUs do not split evenly over --nnodes 4" in refused(capsys, tmp_path, path,
                                                                  "--nnodes", "4")
