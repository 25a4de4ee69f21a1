"""The machine's load before a CPU run or a calibration: when it is said, and what the run records."""
from __future__ import annotations

import json

from partita.executor import preflight
from partita.executor.hostload import HostLoad, host_load, load_warning
from partita.planner.paths import SCENARIOS_DIR


def test_busy_when_load_plus_the_new_processes_exceeds_the_cores():
    assert not HostLoad(load_1m=0.5, cores=4).busy_with(2)
    assert HostLoad(load_1m=2.5, cores=4).busy_with(2)
    assert load_warning(HostLoad(load_1m=0.0, cores=2), 2, "this run") is None
    line = load_warning(HostLoad(load_1m=6.2, cores=2), 2, "this run")
    assert line.startswith("this machine is busy: load average 6.2 on 2 core(s) before this run "
                           "adds 2 process(es)")
    assert load_warning(None, 2, "this run") is None


def test_this_machine_reports_its_load_and_cores():
    load = host_load()
    assert load is not None and load.load_1m >= 0 and load.cores >= 1
    assert json.loads(json.dumps(load.to_dict())) == {"load_average_1m": round(load.load_1m, 2),
                                                     "cores": load.cores}


def test_a_cpu_run_on_a_busy_machine_says_so_and_records_the_load(monkeypatch, tmp_path):
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(preflight, "host_load", lambda: HostLoad(load_1m=9.0, cores=2))
    prepared = preflight.prepare_run(preflight.RunRequest(
        file=str(SCENARIOS_DIR / "tiny-gpt-pp2.yaml"), steps=1, out=str(tmp_path / "out")))
    assert any(n.startswith("this machine is busy: load average 9.0 on 2 core(s)")
               for n in prepared.notes)
    assert prepared.job.host_load == {"load_average_1m": 9.0, "cores": 2}
    monkeypatch.setattr(preflight, "host_load", lambda: HostLoad(load_1m=0.0, cores=64))
    quiet = preflight.prepare_run(preflight.RunRequest(
        file=str(SCENARIOS_DIR / "tiny-gpt-pp2.yaml"), steps=1, out=str(tmp_path / "out")))
    assert not any("busy" in n for n in quiet.notes)
