"""Framework profiles (data/frameworks.yaml, simulator/frameworks.py): every framework has one,
every flag has a source, and the cost code reads the flags, never the framework's name."""
from __future__ import annotations

from dataclasses import replace

import pytest

from partita.planner.catalog import load_catalog
from partita.planner.enums import FRAMEWORKS
from partita.planner.errors import PartitaError
from partita.planner.scenario import parse_scenario
from partita.simulator import stepenv
from partita.simulator.frameworks import FLAGS, FRAMEWORKS_FILE, framework_profile, load_frameworks
from partita.simulator.memory import bytes_per_parameter
from partita.simulator.overheads import Overheads
from partita.simulator.step import simulate


def test_every_framework_has_a_profile():
    assert sorted(load_frameworks()) == sorted(FRAMEWORKS)
    assert framework_profile("deepspeed").zero3_gather == "per_tensor"
    assert framework_profile("fsdp").zero3_gather == "flat"
    assert framework_profile("deepspeed").blocking_sends and not framework_profile("megatron").blocking_sends


def _write(tmp_path, text):
    path = tmp_path / "frameworks.yaml"
    path.write_text(text)
    return path


def _entry(name, source='source: "x"', **flags):
    values = {k: "false" for k in FLAGS} | {"zero3_gather": "flat",
                                            "zero3_persistence_threshold_params": "0",
                                            "loss": "torch"} | flags
    body = "".join(f"    {k}: {v}\n" for k, v in values.items())
    return f"  {name}:\n    {source}\n{body}"


def test_a_profile_without_a_source_or_a_flag_is_refused(tmp_path):
    ok = _write(tmp_path, "frameworks:\n" + _entry("fsdp"))
    assert framework_profile("fsdp", ok).zero3_persistence_threshold_params == 0
    with pytest.raises(PartitaError, match="megatron: no profile"):
        framework_profile("megatron", ok)
    nosource = _write(tmp_path, "frameworks:\n" + _entry("fsdp", source="source: {blocking_sends: x}"))
    with pytest.raises(PartitaError, match="frameworks.fsdp.source: no source for zero3_gather"):
        load_frameworks(nosource)
    bad = _write(tmp_path, "frameworks:\n" + _entry("fsdp", zero3_gather="tree"))
    with pytest.raises(PartitaError, match="zero3_gather: expected one of flat, per_tensor"):
        load_frameworks(bad)
    bad = _write(tmp_path, "frameworks:\n" + _entry("fsdp", loss="fused"))
    with pytest.raises(PartitaError, match="fsdp.loss: expected one of vocab_parallel, torch"):
        load_frameworks(bad)
    unknown = _write(tmp_path, "frameworks:\n" + _entry("jax"))
    with pytest.raises(PartitaError, match="unknown key"):
        load_frameworks(unknown)
    assert FRAMEWORKS_FILE.exists()


def test_a_framework_is_what_its_profile_says(monkeypatch):
    """FSDP given DeepSpeed's profile costs a step as DeepSpeed does (no fitted numbers apply with
    Overheads()): the cost code branches on the flags alone."""
    catalog = load_catalog()

    def step(framework):
        doc = {"model": {"preset": "gpt2-xl"}, "cluster": {"system": "p4d.24xlarge", "gpus": 16},
               "parallel": {"tensor": 1, "pipeline": 2, "data": 8, "zero": 1},
               "training": {"global_batch": 64, "micro_batch": 2, "precision": "bf16",
                            "framework": framework}}
        return simulate(parse_scenario(doc), catalog, overheads=Overheads()).step_time_s

    ds, fsdp = step("deepspeed"), step("fsdp")
    assert ds != fsdp                      # blocking sends, bf16 gradient accumulation
    monkeypatch.setattr(stepenv, "framework_profile",
                        lambda name: replace(framework_profile("deepspeed"), name=name))
    assert step("fsdp") == ds


def test_the_fp32_gradient_copy_is_the_profiles():
    assert bytes_per_parameter("bf16", "adam", 0, 8, "deepspeed")[1] == 6.0
    assert bytes_per_parameter("bf16", "adam", 0, 8, "fsdp")[1] == 4.0
    assert bytes_per_parameter("bf16", "adam", 2, 8, "deepspeed")[1] == 2.0 / 8


def test_fsdp_reduces_and_gathers_block_by_block():
    """FSDP issues one reduce-scatter and one all-gather per wrapped unit (every transformer block,
    then the root's embedding and head), each paying the collective's latency; Megatron-LM's and
    DeepSpeed's buckets are priced as one collective over the rank's parameters. On 512 ranks a
    ring's latency grows with the ranks, so FSDP's ZeRO-2 (SHARD_GRAD_OP) costs more, and the
    excess is the extra collectives' cost."""
    from partita.simulator import dataparallel
    from partita.simulator.calibration import load_calibration
    from partita.simulator.context import resolve
    from partita.simulator.memory import block_parameters
    from partita.simulator.network import build_topology, collective
    from partita.simulator.stepenv import StepEnv
    assert framework_profile("fsdp").dp_collectives_per_block
    assert not framework_profile("megatron").dp_collectives_per_block
    assert not framework_profile("deepspeed").dp_collectives_per_block
    catalog, cal = load_catalog(), load_calibration()

    def env(framework, gpus=512):
        doc = {"model": {"preset": "gpt2-xl"}, "cluster": {"system": "dgx-h100", "gpus": gpus},
               "parallel": {"tensor": 1, "pipeline": 1, "data": gpus, "zero": 2},
               "training": {"global_batch": 8 * gpus, "micro_batch": 8, "precision": "bf16",
                            "framework": framework}}
        ctx = resolve(parse_scenario(doc), catalog)
        return StepEnv(ctx=ctx, topo=build_topology(ctx.system, cal), cal=cal, oh=Overheads())

    fsdp, megatron = env("fsdp"), env("megatron")
    block = block_parameters(fsdp.ctx.dims)
    root = block / 3
    params = 48 * block + root                       # 48 blocks and the root unit
    group = dataparallel.shard_groups(fsdp.ctx)[0]
    one = lambda n: collective("all_gather", "auto", n * 2, group, fsdp.topo)   # noqa: E731
    gather = dataparallel.param_gather_time
    assert gather(fsdp, params) == pytest.approx(48 * one(block) + one(root))
    assert gather(megatron, params) == pytest.approx(one(params))
    assert gather(fsdp, params) - gather(megatron, params) > 0.2 * gather(megatron, params)
    assert (dataparallel.reduction_time(fsdp, params)
            > dataparallel.reduction_time(megatron, params))
    # the collective no compute hides: FSDP's root unit (its gradients come last, its parameters
    # are gathered first), else one 40M-parameter bucket's share
    assert dataparallel.edge_collective(fsdp, params, 1.0, one) == pytest.approx(one(root))
    assert dataparallel.edge_collective(megatron, params, 1.0, one) == pytest.approx(
        dataparallel.BUCKET_PARAMS / params)
    assert dataparallel.edge_collective(fsdp, 3 * block, 1.0, one) == pytest.approx(one(block))
