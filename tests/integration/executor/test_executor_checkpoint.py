"""Checkpoints (executor.checkpoint) and fault injection (executor.faults): exact save/load with plain
and FSDP2 modules on 2 gloo processes, torn checkpoints ignored, another plan's checkpoint refused,
and a rank killed mid-step under torchrun resuming to exactly the weights of an uninterrupted run."""
from __future__ import annotations

import hashlib

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from partita.executor.checkpoint import (latest_checkpoint, load_checkpoint, plan_fingerprint,
                                 read_manifest, save_checkpoint)
from partita.executor.faults import (FAULT_EXIT_CODE, RESTART_SAFE_ENV, Fault, due_fault,
                             maybe_inject_fault, parse_faults)
from partita.planner.errors import PartitaError
from partita.planner.scenario import parse_scenario

TESTS = Path(__file__).resolve().parent
PLAN = {
    "model": {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 16, "vocab": 256},
    "cluster": {"system": "local", "gpus": 2},
    "training": {"global_batch": 8, "micro_batch": 2, "precision": "fp32", "optimizer": "adam"},
    "parallel": {"pipeline": 2, "schedule": "1f1b"},
}


def fingerprint(**changes) -> str:
    doc = json.loads(json.dumps(PLAN))
    for path, value in changes.items():
        section, key = path.split("__")
        doc[section][key] = value
    return plan_fingerprint(parse_scenario(doc, origin="plan.yaml"))


def tiny(seed: int) -> tuple[list[nn.Module], torch.optim.Optimizer]:
    torch.manual_seed(seed)
    parts = [nn.Linear(4, 8), nn.Sequential(nn.Tanh(), nn.Linear(8, 2))]
    return parts, torch.optim.Adam([p for m in parts for p in m.parameters()], lr=1e-2)


def train_step(parts: list[nn.Module], optimizer: torch.optim.Optimizer) -> None:
    x = torch.randn(3, 4)                          # draws from the global RNG: resumed with it
    parts[1](parts[0](x)).pow(2).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def snapshot(parts, optimizer) -> list[torch.Tensor]:
    tensors = [t.detach().clone() for m in parts for t in m.state_dict().values()]
    for state in optimizer.state_dict()["state"].values():
        tensors += [v.clone() for v in state.values()]
    return tensors


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------- plan fingerprint

def test_fingerprint_is_stable_and_names_the_plan():
    fp = fingerprint()
    assert fp == fingerprint()
    digest, summary = fp.split(" ", 1)
    assert len(digest) == 12
    assert summary == "(gpt L4 H64 S16; tp1 pp2 dp1 cp1 1f1b zero0; stages even; " \
                      "batch 8 = 4 x 2 x dp; fp32 adam)"


@pytest.mark.parametrize("change", [
    {"parallel__stages": [[0, 1], [1, 4]]}, {"parallel__schedule": "gpipe"},
    {"training__micro_batch": 1}, {"training__optimizer": "sgd"}, {"model__hidden": 32},
    {"training__precision": "bf16"},
])
def test_fingerprint_changes_with_the_layout(change):
    assert fingerprint(**change) != fingerprint()


def test_fingerprint_ignores_what_does_not_change_the_state():
    assert fingerprint(training__recompute="full") == fingerprint()
    assert fingerprint(cluster__system="dgx-a100-80gb") == fingerprint()


def test_fingerprint_needs_a_parallel_section():
    doc = {k: v for k, v in PLAN.items() if k != "parallel"}
    with pytest.raises(PartitaError, match="no parallel section"):
        plan_fingerprint(parse_scenario(doc, origin="plan.yaml"))


# ---------------------------------------------------------------- one process

def test_save_then_load_restores_model_optimizer_and_rng(tmp_path):
    parts, opt = tiny(0)
    train_step(parts, opt)
    path = save_checkpoint(tmp_path, 1, parts, opt, fingerprint="fp", extra={"data_position": 24})
    assert path == tmp_path / "step-000001"
    saved = snapshot(parts, opt)
    train_step(parts, opt)
    reference = snapshot(parts, opt)

    parts2, opt2 = tiny(seed=7)                    # other weights, empty Adam state, other RNG
    assert latest_checkpoint(tmp_path, fingerprint="fp") == 1
    assert load_checkpoint(tmp_path, 1, parts2, opt2) == {"data_position": 24}
    assert same(snapshot(parts2, opt2), saved)
    train_step(parts2, opt2)                       # same batch (RNG restored), same Adam step
    assert same(snapshot(parts2, opt2), reference)


def test_manifest_lists_every_file_with_its_size_and_sha256(tmp_path):
    parts, opt = tiny(0)
    path = save_checkpoint(tmp_path, 3, parts, opt, fingerprint="fp", extra={})
    manifest = read_manifest(path)
    assert manifest["step"] == 3 and manifest["world_size"] == 1
    assert manifest["state_keys"] == ["ranks0"]
    on_disk = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
               for p in path.iterdir() if p.name != "manifest.json"}
    assert manifest["files"] == on_disk and ".metadata" in on_disk


def _flip_a_byte(path):
    """Alter one byte in the middle of the largest shard, keeping its size."""
    shard = max((p for p in path.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return shard


def test_damaged_shard_is_passed_over_for_the_newest_intact_one(tmp_path, capsys):
    parts, opt = tiny(0)
    for step in (2, 4):
        save_checkpoint(tmp_path, step, parts, opt, fingerprint="fp", extra={"step": step})
    shard = _flip_a_byte(tmp_path / "step-000004")
    assert latest_checkpoint(tmp_path, fingerprint="fp") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"note: {tmp_path / 'step-000004'}: {shard.name} does not match the "
                          "SHA-256") and "(resuming from step 2)" in err
    parts2, opt2 = tiny(seed=7)
    with pytest.raises(PartitaError, match="does not match the SHA-256"):
        load_checkpoint(tmp_path, 4, parts2, opt2)          # never unpickled
    assert load_checkpoint(tmp_path, 2, parts2, opt2) == {"step": 2}


def test_no_intact_checkpoint_is_none_with_a_note(tmp_path, capsys):
    parts, opt = tiny(0)
    save_checkpoint(tmp_path, 1, parts, opt, fingerprint="fp", extra={})
    _flip_a_byte(tmp_path / "step-000001")
    assert latest_checkpoint(tmp_path, fingerprint="fp") is None
    assert "(no intact checkpoint left)" in capsys.readouterr().err


def test_latest_is_the_newest_complete_one(tmp_path):
    parts, opt = tiny(0)
    for step in (2, 10, 4):
        save_checkpoint(tmp_path, step, parts, opt, fingerprint="fp", extra={"step": step})
    assert latest_checkpoint(tmp_path, fingerprint="fp") == 10
    assert latest_checkpoint(tmp_path / "missing", fingerprint="fp") is None


def torn_copies(tmp_path: Path) -> Path:
    """A complete step 1, then three torn step-5 checkpoints of different kinds."""
    parts, opt = tiny(0)
    good = save_checkpoint(tmp_path, 1, parts, opt, fingerprint="fp", extra={})
    shutil.copytree(good, tmp_path / "step-000005.tmp-0123abcd")    # never renamed
    return good


def test_tmp_directory_is_not_a_checkpoint(tmp_path):
    torn_copies(tmp_path)
    assert latest_checkpoint(tmp_path, fingerprint="fp") == 1


def test_final_name_without_manifest_is_not_a_checkpoint(tmp_path):
    good = torn_copies(tmp_path)
    shutil.copytree(good, tmp_path / "step-000005")
    (tmp_path / "step-000005" / "manifest.json").unlink()
    assert latest_checkpoint(tmp_path, fingerprint="fp") == 1
    parts, opt = tiny(0)
    with pytest.raises(PartitaError, match="step-000005: not a complete checkpoint"):
        load_checkpoint(tmp_path, 5, parts, opt)


def test_truncated_shard_is_not_a_checkpoint(tmp_path):
    good = torn_copies(tmp_path)
    shutil.copytree(good, tmp_path / "step-000005")
    shard = next((tmp_path / "step-000005").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-8])
    assert latest_checkpoint(tmp_path, fingerprint="fp") == 1


def test_a_new_save_removes_torn_leftovers_and_replaces_its_step(tmp_path):
    torn_copies(tmp_path)
    parts, opt = tiny(0)
    save_checkpoint(tmp_path, 1, parts, opt, fingerprint="fp", extra={"again": True})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000001"]
    assert load_checkpoint(tmp_path, 1, parts, opt) == {"again": True}


def test_checkpoint_of_another_plan_is_refused(tmp_path):
    parts, opt = tiny(0)
    ours, theirs = fingerprint(), fingerprint(parallel__schedule="gpipe")
    save_checkpoint(tmp_path, 4, parts, opt, fingerprint=theirs, extra={})
    with pytest.raises(PartitaError) as err:
        latest_checkpoint(tmp_path, fingerprint=ours)
    msg = str(err.value)
    assert "step-000004 belongs to another plan" in msg
    assert theirs in msg and ours in msg and "gpipe" in msg and "1f1b" in msg
    with pytest.raises(PartitaError, match="belongs to another plan"):
        load_checkpoint(tmp_path, 4, parts, opt, fingerprint=ours)


def test_unwritable_directory_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    parts, opt = tiny(0)
    with pytest.raises(PartitaError, match="cannot create the checkpoint directory"):
        save_checkpoint(blocker / "ck", 1, parts, opt, fingerprint="fp", extra={})


def test_extra_must_be_json(tmp_path):
    parts, opt = tiny(0)
    with pytest.raises(TypeError, match="JSON values only"):
        save_checkpoint(tmp_path, 1, parts, opt, fingerprint="fp", extra={"t": torch.ones(1)})
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- fault injection

def test_fault_list_parses_one_fault_per_attempt():
    assert parse_faults("3") == (Fault(3, "forward", 1, 0),)
    assert parse_faults("3, 5:checkpoint:0") == (Fault(3, "forward", 1, 0),
                                                 Fault(5, "checkpoint", 0, 1))


@pytest.mark.parametrize("text, match", [
    ("x", "step must be a whole number"), ("3:sideways", "unknown phase 'sideways'"),
    ("3:forward:-1", "rank must be a whole number"), ("3,,4", "STEP\\[:PHASE\\[:RANK\\]\\]"),
    ("3:forward:1:2", "STEP\\[:PHASE\\[:RANK\\]\\]"),
])
def test_bad_fault_list_is_one_clear_error(text, match):
    with pytest.raises(PartitaError, match=match):
        parse_faults(text)


def test_fault_fires_only_on_its_rank_step_phase_and_attempt():
    env = {"PARTITA_FAULT_AT_STEP": "3,5:checkpoint:0", "RANK": "1"}
    assert due_fault(3, "forward", env) == Fault(3, "forward", 1, 0)
    assert due_fault(3, "backward", env) is None
    assert due_fault(3, "forward", {**env, "RANK": "0"}) is None
    assert due_fault(3, "forward", {**env, "TORCHELASTIC_RESTART_COUNT": "1"}) is None
    assert due_fault(5, "checkpoint", {**env, "RANK": "0", "TORCHELASTIC_RESTART_COUNT": "1"})
    assert due_fault(3, "forward", {"RANK": "1"}) is None


def test_injected_fault_kills_the_process():
    code = ("from executor.faults import maybe_inject_fault as f; "
            "f(2, 'forward'); f(3, 'forward'); print('alive')")
    env = {**os.environ, "PARTITA_FAULT_AT_STEP": "3", "RANK": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == FAULT_EXIT_CODE and "alive" not in done.stdout
    assert "rank 1 killed in step 3 (forward)" in done.stderr
    with pytest.raises(ValueError, match="unknown fault phase"):
        maybe_inject_fault(1, "sideways", {})


# ---------------------------------------------------------------- two gloo processes

def _two_rank_checks(rank: int, world: int, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=world)
    try:
        results = {"plain": _plain_stage_roundtrip(rank, Path(root) / "plain"),
                   "fsdp-default-key": _fsdp_roundtrip(rank, world, Path(root) / "fsdp", None),
                   "fsdp-shared-key": _fsdp_roundtrip(rank, world, Path(root) / "fsdp-dp", "dp")}
        (Path(root) / f"rank{rank}.json").write_text(json.dumps(results))
        dist.barrier()      # nobody tears down while the other still talks
    finally:
        dist.destroy_process_group()
    # FSDP2 on gloo occasionally aborts in interpreter teardown after all work is done
    # ("terminate called without an active exception"); the results are on disk, so leave now,
    # as executor/worker.py does.
    os._exit(0)


def _plain_stage_roundtrip(rank: int, directory: Path) -> bool:
    """Each rank's stage has the same names and shapes but other values: none may overwrite another."""
    torch.manual_seed(10 + rank)
    part = nn.Linear(8, 8)
    opt = torch.optim.Adam(part.parameters(), lr=1e-2)

    def step():
        part(torch.randn(3, 8)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()

    step(), step()
    save_checkpoint(directory, 2, [part], opt, fingerprint="two-rank", extra={"rank0": rank == 0})
    saved = snapshot([part], opt)
    step()
    extra = load_checkpoint(directory, 2, [part], opt)
    return same(snapshot([part], opt), saved) and extra == {"rank0": True}


def _fsdp_roundtrip(rank: int, world: int, directory: Path, key: str | None) -> bool:
    """FSDP2 over both ranks: resume at step 2 and step 3 gives the uninterrupted weights exactly."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))

    def build(seed):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
        for sub in (model[0], model[2], model):
            fully_shard(sub, mesh=mesh, reshard_after_forward=False)
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(model, opt, i):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(100 * i + rank))
        model(x).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()

    model, opt = build(0)
    step(model, opt, 1), step(model, opt, 2)
    save_checkpoint(directory, 2, [model], opt, fingerprint="fsdp", extra={}, state_key=key)
    step(model, opt, 3)
    reference = [p.full_tensor() for p in model.parameters()]
    model, opt = build(1)
    load_checkpoint(directory, 2, [model], opt, state_key=key)
    step(model, opt, 3)
    return same([p.full_tensor() for p in model.parameters()], reference)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("two-ranks")
    torch.multiprocessing.spawn(_two_rank_checks, args=(2, str(root)), nprocs=2)
    return root, [json.loads((root / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("check", ["plain", "fsdp-default-key", "fsdp-shared-key"])
def test_two_rank_save_and_load_are_exact(two_ranks, check):
    _, results = two_ranks
    assert [r[check] for r in results] == [True, True]


@pytest.mark.slow
def test_two_rank_checkpoint_layout(two_ranks):
    root, _ = two_ranks
    assert read_manifest(root / "plain" / "step-000002")["state_keys"] == ["ranks0", "ranks1"]
    assert read_manifest(root / "fsdp" / "step-000002")["state_keys"] == ["ranks0", "ranks0"]
    parts, opt = tiny(0)
    with pytest.raises(PartitaError, match="saved by 2 processes, this run has 1"):
        load_checkpoint(root / "plain", 2, parts, opt)


# ---------------------------------------------------------------- killed under torchrun

def torchrun(out: Path, *, steps: int, restarts: int = 0, checkpoint_dir: Path | None = None,
             faults: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **RESTART_SAFE_ENV, "PARTITA_FAULT_AT_STEP": faults}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), str(TESTS / "fault_worker.py"), "--steps", str(steps),
           "--out", str(out)]
    if checkpoint_dir is not None:
        cmd += ["--checkpoint-dir", str(checkpoint_dir)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.mark.slow
def test_killed_rank_resumes_to_exactly_the_uninterrupted_weights(tmp_path):
    torchrun(tmp_path / "reference", steps=6)
    # attempt 0: rank 1 dies in the forward of step 3 (rank 0 is mid-step); attempt 1: rank 0 dies
    # while saving step 5, after the shards and before the manifest; attempt 2 finishes.
    done = torchrun(tmp_path / "hit", steps=6, restarts=2, checkpoint_dir=tmp_path / "ck",
                    faults="3,5:checkpoint:0")
    assert "rank 1 killed in step 3 (forward)" in done.stderr
    assert "rank 0 killed in step 5 (checkpoint)" in done.stderr
    lines = (tmp_path / "hit" / "attempts.jsonl").read_text().splitlines()
    attempts = [json.loads(line) for line in lines]
    assert attempts == [{"attempt": 0, "resumed_from": None}, {"attempt": 1, "resumed_from": 2},
                        {"attempt": 2, "resumed_from": 4}]
    for rank in (0, 1):
        want = torch.load(tmp_path / "reference" / f"rank{rank}.pt")
        got = torch.load(tmp_path / "hit" / f"rank{rank}.pt")
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want), f"rank {rank} weights differ"
