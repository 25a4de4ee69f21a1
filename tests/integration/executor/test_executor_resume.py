"""`partita run` with checkpoints: a resumed or restarted run ends exactly where an uninterrupted one
does, and a checkpoint directory is never overwritten by a run that should not touch it."""
from __future__ import annotations

import json

import pytest
import torch

from partita.cli import main
from partita.planner.paths import SCENARIOS_DIR

pytestmark = pytest.mark.slow

TINY = str(SCENARIOS_DIR / "tiny-gpt-pp2.yaml")
OTHER = str(SCENARIOS_DIR / "tiny-gpt-interleaved.yaml")


@pytest.fixture(autouse=True)
def no_local_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """3 steps in one go, saving a checkpoint after step 2: (result, weights, checkpoint dir)."""
    tmp = tmp_path_factory.mktemp("whole")
    code = main(["run", TINY, "--steps", "3", "--checkpoint-dir", str(tmp / "ck"),
                 "--checkpoint-every", "2", "--out", str(tmp / "out"),
                 "--save-weights", str(tmp / "w.pt")])
    assert code == 0
    return (json.loads((tmp / "out" / "result.json").read_text()), torch.load(tmp / "w.pt"),
            tmp / "ck")


def listing(directory):
    return sorted((p.relative_to(directory).as_posix(), p.stat().st_mtime_ns)
                  for p in directory.rglob("*"))


def same_weights(a, b) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_continues_bit_for_bit_and_guards_the_directory(uninterrupted, tmp_path, capsys):
    whole, weights, ck = uninterrupted
    assert sorted(p.name for p in ck.iterdir()) == ["step-000002"]
    before = listing(ck)
    common = ["--steps", "3", "--json", "--checkpoint-dir", str(ck)]

    # The same plan again without --resume, and another plan with it: refused, nothing written.
    assert main(["run", TINY, *common, "--out", str(tmp_path / "b")]) == 1
    assert "already holds step 2 of this plan; pass --resume" in capsys.readouterr().err
    assert main(["run", OTHER, *common, "--resume", "--out", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "belongs to another plan" in err[0]
    assert listing(ck) == before and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()

    assert main(["run", TINY, *common, "--resume", "--out", str(tmp_path / "d"),
                 "--save-weights", str(tmp_path / "d.pt")]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["steps"] == [3] and resumed["losses"] == whole["losses"][2:]
    assert same_weights(torch.load(tmp_path / "d.pt"), weights)


def test_rank_killed_mid_step_restarts_from_its_checkpoint(uninterrupted, tmp_path, capsys,
                                                           monkeypatch):
    whole, weights, _ = uninterrupted
    monkeypatch.setenv("PARTITA_FAULT_AT_STEP", "3")     # rank 1 dies in the forward of step 3
    code = main(["run", TINY, "--steps", "3", "--json", "--checkpoint-dir", str(tmp_path / "ck"),
                 "--checkpoint-every", "1", "--max-restarts", "1", "--out", str(tmp_path / "out"),
                 "--save-weights", str(tmp_path / "w.pt")])
    captured = capsys.readouterr()
    assert code == 0 and "injected fault: rank 1 killed in step 3" in captured.err
    restarted = json.loads(captured.out)
    assert restarted["steps"] == [3] and restarted["losses"] == whole["losses"][2:]
    assert same_weights(torch.load(tmp_path / "w.pt"), weights)


def test_damaged_newest_checkpoint_is_passed_over_with_a_note(uninterrupted, tmp_path, capsys):
    """A shard with altered bytes but its size unchanged is never loaded: --resume continues from
    the newest intact checkpoint, says which one it passed over, and ends where the whole run did."""
    import shutil
    whole, weights, ck = uninterrupted
    mine = tmp_path / "ck"
    shutil.copytree(ck, mine)
    damaged = mine / "step-000003"
    shutil.copytree(mine / "step-000002", damaged)
    shard = max(damaged.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["run", TINY, "--steps", "3", "--json", "--checkpoint-dir", str(mine), "--resume",
                 "--out", str(tmp_path / "out"), "--save-weights", str(tmp_path / "w.pt")]) == 0
    captured = capsys.readouterr()
    assert f"note: {damaged}: {shard.name} does not match the SHA-256" in captured.err
    assert "(resuming from step 2)" in captured.err
    resumed = json.loads(captured.out)
    assert resumed["steps"] == [3] and resumed["losses"] == whole["losses"][2:]
    assert same_weights(torch.load(tmp_path / "w.pt"), weights)
