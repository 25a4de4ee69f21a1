"""`partita calibrate`: the measured `local` entry loads in the catalog and the calibration, the
simulator reproduces what was measured with it, the link fit recovers known parameters, and bad
flags or paths fail before anything is measured."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from partita.executor.hostbench import HANDOFF_BUSY_S
from partita.executor.measure_machine import MIB, fit_link, threads_per_process
from partita.cli import main
from partita.planner.catalog import load_catalog
from partita.simulator.calibration import load_calibration


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> tuple[Path, dict]:
    """One quick calibration of this machine (2 processes) into a fresh PARTITA_HOME."""
    home = tmp_path_factory.mktemp("partita-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARTITA_HOME", str(home))
        out = io.StringIO()
        with redirect_stdout(out):
            assert main(["calibrate", "--quick", "--gpus", "2", "--device", "cpu", "--json"]) == 0
    return home, json.loads(out.getvalue())


@pytest.mark.slow
def test_writes_a_loadable_local_system(calibrated):
    home, report = calibrated
    assert report["catalog"] == str(home / "local.yaml")
    assert report["calibration"] == str(home / "calibration-local.yaml")
    system = load_catalog(home / "local.yaml").system("local")
    assert (system.kind, system.gpus_per_node, system.gpu.name) == ("local", 2, "local-cpu")
    assert system.gpu.peak("fp32") > 0 and system.gpu.peak_is_measured("fp32")
    assert system.gpu.memory_bandwidth_bytes_per_s > 0 and system.gpu.memory_bytes > 0
    assert system.intra.kind == "host" and system.intra.bytes_per_s > 0
    assert system.intra.latency_s > 0 and system.inter.kind == "none"
    assert system.source[0].startswith("partita calibrate ")
    assert system.gpu.source == system.source


@pytest.mark.slow
def test_writes_a_loadable_calibration_overlay(calibrated):
    home, _ = calibrated
    cal = load_calibration(home / "calibration-local.yaml", include_local=False)
    gpu = cal.gpu("local-cpu")
    assert "fp32" in gpu.matmul and gpu.source[0].startswith("partita calibrate ")
    assert 0 < gpu.memory_efficiency(1e6) <= 1.5
    assert 0 < gpu.attention_forward <= 1.5 and 0 < gpu.attention_backward <= 1.5
    assert gpu.kernel_floor_s > 0
    tier = cal.tier("local")
    assert tier.efficiency == 1.0 and tier.step_latency_s + tier.base_latency_s > 0
    assert tier.half_bandwidth_bytes >= 0


@pytest.mark.slow
def test_simulator_reproduces_the_measurements(calibrated):
    _, report = calibrated
    for row in report["check"]["matmul"]:
        assert row["predicted_s"] == pytest.approx(row["measured_s"], rel=1e-3)
    small = report["check"]["messages"][0]
    assert small["bytes"] == 4
    assert small["p2p_predicted_s"] == pytest.approx(small["p2p_measured_s"], rel=0.01)


@pytest.mark.slow
def test_a_scenario_on_local_simulates_with_it(calibrated, monkeypatch, capsys):
    home, _ = calibrated
    monkeypatch.setenv("PARTITA_HOME", str(home))
    assert main(["simulate", "tiny-gpt-pp2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["system"] == "local" and result["step_time_s"] > 0


def test_link_fit_recovers_the_model_parameters():
    bw, n_half, base, step, world = 2e9, 1.5e6, 20e-6, 30e-6, 2
    ramp = lambda s: max(s / (s + n_half), 0.25)                        # simulator/network.py
    p2p = [[s, base + step + s / (bw * ramp(s))] for s in (4, MIB, 4 * MIB, 16 * MIB)]
    allreduce = [[s, base + 2 * step + s / (bw * ramp(s))] for s in (4, MIB)]
    fit = fit_link(p2p, allreduce, world)
    assert fit.bytes_per_s == pytest.approx(bw, rel=1e-9)
    assert fit.half_bandwidth_bytes == pytest.approx(n_half, rel=1e-3)
    assert fit.step_latency_s == pytest.approx(step, rel=1e-3)
    assert fit.base_latency_s == pytest.approx(base, rel=1e-3)


def test_link_fit_keeps_send_exact_when_all_reduce_is_slow():
    p2p = [[4, 50e-6], [MIB, 550e-6], [4 * MIB, 2050e-6]]
    fit = fit_link(p2p, [[4, 300e-6]], world=2)                     # 6x a send: no ring fits
    assert (fit.base_latency_s, fit.step_latency_s) == (0.0, 50e-6)
    assert fit.bytes_per_s == pytest.approx(3 * MIB / 1.5e-3)
    # the rest of the small all-reduce is a per-collective overhead: the model gives it back
    assert fit.collective_overhead_s == pytest.approx(300e-6 - 2 * 50e-6)


def test_link_fit_has_no_collective_overhead_when_a_ring_fits():
    p2p = [[4, 50e-6], [MIB, 550e-6], [4 * MIB, 2050e-6]]
    assert fit_link(p2p, [[4, 80e-6]], world=2).collective_overhead_s == 0.0


def test_link_fit_takes_the_collective_overhead_from_buffers_that_fill_the_ring():
    """A 4-byte all-reduce fills one of gloo's 2N ring segments and runs fast; the overhead is the
    median excess of the all-reduces of 1 KiB to 256 KiB over the ring's latency and transfer."""
    p2p = [[4, 50e-6], [MIB, 550e-6], [4 * MIB, 2050e-6]]
    bw = 3 * MIB / 1.5e-3
    ring = 2 * 50e-6

    def allreduce(nbytes, overhead):
        return [nbytes, ring + nbytes / bw + overhead]     # 2(N-1)/N = 1 for N = 2
    measured = [[4, 300e-6], allreduce(1024, 1.0e-3), allreduce(65536, 1.2e-3),
                allreduce(262144, 0.9e-3), allreduce(4 * MIB, 5e-3)]
    fit = fit_link(p2p, measured, world=2)
    assert fit.collective_overhead_s == pytest.approx(1.0e-3, rel=1e-6)
    assert fit.allreduce_small_s == 300e-6


def test_link_fit_takes_the_rings_transfer_rate_from_the_large_all_reduces():
    """gloo's ring reduces and copies on the CPU between sends: all-reduces of 1 MiB and more that
    move their bytes at half a send's rate give a collective efficiency of 0.5; a ring as fast as
    the sends gives 1 (never more)."""
    p2p = [[4, 50e-6], [MIB, 50e-6 + MIB / 2e9], [4 * MIB, 50e-6 + 4 * MIB / 2e9]]
    ring = 2 * 50e-6

    def allreduce(nbytes, rate):
        return [nbytes, ring + 1e-3 + nbytes / (2e9 * rate)]       # 2(N-1)/N = 1 for N = 2
    slow = [[4, 300e-6], allreduce(1024, 1.0), allreduce(65536, 1.0)] + [
        allreduce(s, 0.5) for s in (MIB, 4 * MIB, 16 * MIB)]
    assert fit_link(p2p, slow, world=2).collective_efficiency == pytest.approx(0.5, rel=0.02)
    fast = slow[:3] + [allreduce(s, 2.0) for s in (MIB, 4 * MIB)]
    assert fit_link(p2p, fast, world=2).collective_efficiency == 1.0
    assert fit_link(p2p, [[4, 300e-6]], world=2).collective_efficiency == 1.0


def test_threads_per_process_shares_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert [threads_per_process(n) for n in (1, 2, 3, 32)] == [16, 8, 5, 1]


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "0"], "argument --gpus: expected a number of processes from 1 to 1024, got 0"),
    (["--gpus", "two"], "argument --gpus: expected a whole number of processes, got 'two'"),
])
def test_bad_process_count_is_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--quick", "--device", "cpu", *argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)


def test_cuda_without_a_device_is_one_error_line(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for gpus in (["--gpus", "1"], []):       # without --gpus: no word about `--gpus 0`
        assert main(["calibrate", "--quick", "--device", "cuda", *gpus]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: --device cuda: no CUDA device is visible") and err.count("\n") == 1
        assert "--gpus" not in err


def test_output_path_that_is_a_directory_fails_before_measuring(tmp_path, capsys):
    assert main(["calibrate", "--quick", "--device", "cpu", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path}: is a directory, expected a file name to write\n"


def test_output_under_a_file_fails_before_measuring(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    target = blocker / "local.yaml"
    assert main(["calibrate", "--quick", "--device", "cpu", "--out", str(target)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {blocker}: cannot create the folder") and err.count("\n") == 1
    assert not target.exists()


def test_output_that_is_not_yaml_fails_before_measuring(tmp_path, capsys):
    target = tmp_path / "local.txt"
    assert main(["calibrate", "--quick", "--device", "cpu", "--out", str(target)]) == 1
    assert capsys.readouterr().err == f"error: {target}: expected a .yaml or .yml file name to write\n"


@pytest.mark.slow
def test_a_broken_local_file_is_replaced_by_a_good_one(calibrated, tmp_path, monkeypatch):
    """Writing loads the new files back before replacing; the old local.yaml plays no part."""
    from partita.executor.machine_files import write_documents
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path))
    (tmp_path / "local.yaml").write_text("gpus: 3\n")
    write_documents(_calibrated_from(calibrated[1]), tmp_path / "local.yaml",
                    tmp_path / "calibration-local.yaml")
    assert load_catalog().system("local").gpus_per_node == 2


def _calibrated_from(report: dict):
    from partita.executor.measure_machine import Calibrated, LinkFit, Machine
    fields = {k: report[k] for k in Calibrated.__dataclass_fields__}
    fields["machine"] = Machine(**report["machine"])
    fields["link"] = LinkFit(**report["link"])
    return Calibrated(**fields)


def test_unknown_device_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--device", "tpu"])
    assert exc.value.code == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


@pytest.mark.slow
def test_memory_curve_never_claims_a_measured_matmul_slower_than_it_ran(calibrated):
    """However slow the elementwise kernels measured, the curve written at a measured matmul's size
    lets the roofline move that matmul's bytes within the time the matmul took."""
    import dataclasses
    from partita.executor.machine_files import memory_curve
    from partita.simulator.compute import element_bytes
    c = _calibrated_from(calibrated[1])
    slow = dataclasses.replace(c, elementwise=[row[:2] + [t * 50 for t in row[2:]]
                                               for row in c.elementwise])
    curve = dict(memory_curve(slow))
    for precision, rows in slow.matmul.items():
        for m, n, k, rate in rows:
            nbytes = (m * k + k * n + m * n) * element_bytes(precision)
            seconds = nbytes / (slow.memory_bytes_per_s * curve[nbytes])
            assert seconds < 2.0 * m * n * k / rate


@pytest.mark.slow
def test_host_costs_are_measured_and_read_back_for_local(calibrated):
    """`partita calibrate` measures the host's time per kernel of a GPT block pass (forward and
    backward) and per parameter tensor of an optimizer step, and writes them to the overlay's
    `host` section with `synchronous` on a CPU; the simulator reads them back for `local`
    (simulator/host.py)."""
    from partita.executor.machine_files import calibration_document
    from partita.simulator.calibration import load_calibration
    home, report = calibrated
    block = report["block_host"]
    assert block["forward_kernels"] >= 10 and block["backward_kernels"] > block["forward_kernels"]
    assert 0 < block["forward_per_kernel_s"] < 1e-3 and 0 < block["backward_per_kernel_s"] < 1e-3
    assert set(report["pipeline_action_s"]) == {"1f1b", "interleaved-1f1b"}
    assert all(0 <= v < 0.1 for v in report["pipeline_action_s"].values())
    stall = report["handoff_stall"]
    assert [b for b, _ in stall] == pytest.approx(list(HANDOFF_BUSY_S))
    assert all(0 <= s < 0.1 for _, s in stall)
    per_tensor = report["optimizer_step_per_tensor_s"]
    assert set(per_tensor) == {"adam", "sgd"} and per_tensor["adam"] > per_tensor["sgd"] > 0
    doc = calibration_document(_calibrated_from(report))
    assert doc["host"]["op_dispatch_us"] == pytest.approx(block["forward_per_kernel_s"] * 1e6,
                                                          rel=1e-3)
    assert doc["host"]["synchronous"] is True
    assert doc["host"]["pipeline_action_us"] == pytest.approx(
        {k: v * 1e6 for k, v in report["pipeline_action_s"].items()}, rel=1e-3, abs=1e-3)
    path = home / "overlay.yaml"
    import yaml
    path.write_text(yaml.safe_dump(doc))
    host = load_calibration(path, include_local=False).local_host
    assert host.synchronous
    assert host.op_dispatch_s == pytest.approx(block["forward_per_kernel_s"], rel=1e-3)
    assert host.per_backward_kernel_s == pytest.approx(block["backward_per_kernel_s"], rel=1e-3)
    assert host.optimizer_step_per_tensor_s["adam"] == pytest.approx(per_tensor["adam"], rel=1e-3)
    assert host.pipeline_action_s == pytest.approx(report["pipeline_action_s"], rel=1e-3, abs=1e-9)
    assert [b for b, _ in host.handoff_stall_s] == pytest.approx(list(HANDOFF_BUSY_S))


@pytest.mark.slow
def test_the_summary_names_the_host_mechanisms_it_measured(calibrated, capsys):
    """`partita calibrate` prints the per-call collective overhead, each schedule runtime's work per
    action and the hand-off stall by compute, beside the link it measured."""
    from partita.commands.calibrate import _print
    home, report = calibrated
    _print(_calibrated_from(report), {"matmul": []}, home / "local.yaml",
           home / "calibration-local.yaml", 1.0)
    out = capsys.readouterr().out
    assert "ms per call beyond the ring" in out
    assert "pipeline action  1f1b " in out and "interleaved-1f1b " in out
    assert "hand-off stall" in out and "after 10 ms" in out
