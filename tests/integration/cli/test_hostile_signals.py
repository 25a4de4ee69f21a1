"""`partita run` killed outright (SIGKILL runs no clean-up): torchrun and its workers do not outlive
the launcher, and the job folder it leaves is removed by the next launch."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from partita.executor import launch


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(int(entry.name))
    return found


def wait_for(condition, seconds: float):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    return condition()


def test_orphaned_job_folders_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"{launch.JOB_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{launch.JOB_PREFIX}{os.getpid()}-def"
    other = tmp_path / "partita-run-notapid-x"
    for folder in (orphan, live, other):
        folder.mkdir()
        (folder / "job.json").write_text("{}")
    launch._remove_orphans()
    assert not orphan.exists() and live.exists() and other.exists()


def test_sigkill_of_the_launcher_stops_torchrun_and_the_next_launch_cleans_up(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PARTITA_HOME": str(tmp_path / "home")}
    env.pop("PARTITA_CATALOG", None)
    proc = subprocess.Popen([sys.executable, "-m", "partita", "run", "tiny-gpt-pp2", "--steps", "100000",
                             "--out", str(tmp_path / "out")], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        folders = wait_for(lambda: list(tmp_path.glob(f"{launch.JOB_PREFIX}{proc.pid}-*")), 120)
        assert folders, "the launcher never wrote its job folder"
        job = folders[0]
        assert wait_for(lambda: processes_mentioning(str(job)), 120), "torchrun never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert wait_for(lambda: not processes_mentioning(str(job)), 60), \
            "torchrun or a worker outlived its launcher"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in processes_mentioning(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)
    assert job.exists()                       # SIGKILL leaves it; the next launch removes it
    old = launch.tempfile.tempdir
    launch.tempfile.tempdir = str(tmp_path)
    try:
        launch._remove_orphans()
    finally:
        launch.tempfile.tempdir = old
    assert not job.exists()
