"""`partita simulate`: the contract's JSON, several files, traces, what-ifs and bad input."""
from __future__ import annotations

import json

import pytest
import yaml

from partita.cli import main
from partita.planner.catalog import load_catalog
from partita.planner.scenario import load_scenario, parse_scenario
from partita.simulator.step import simulate

CONTRACT_KEYS = {"step_time_s", "tokens_per_s", "samples_per_s", "tflops_per_gpu", "mfu",
                 "peak_memory_gib", "fits_in_memory", "bubble_fraction", "breakdown_s"}


def small(**parallel) -> dict:
    doc = {
        "name": "small",
        "model": {"arch": "gpt", "layers": 8, "hidden": 1024, "heads": 16, "seq_len": 1024,
                  "vocab": 32000},
        "cluster": {"system": "p4d.24xlarge", "gpus": 16},
        "training": {"global_batch": 64, "micro_batch": 2, "precision": "bf16"},
        "parallel": {"tensor": 2, "pipeline": 2, "data": 4, "schedule": "1f1b"},
    }
    doc["parallel"].update(parallel)
    return doc


def write(tmp_path, name: str, doc: dict):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_json_has_the_contract_keys(capsys):
    assert main(["simulate", "gpt3-175b-a100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert CONTRACT_KEYS <= out.keys()
    assert {"compute", "optimizer"} <= out["breakdown_s"].keys()
    assert out["step_time_s"] > 0 and 0 < out["mfu"] < 1
    assert abs(sum(out["breakdown_s"].values()) - out["step_time_s"]) < 1e-6 * out["step_time_s"]


def test_summary_is_readable(capsys):
    assert main(["simulate", "t5-3b-p4d"]) == 0
    text = capsys.readouterr().out
    assert "step time" in text and "where the time goes" in text and "$ per step" in text


def test_several_files_give_json_lines_and_keep_going(tmp_path, capsys):
    bad = write(tmp_path, "bad.yaml", small(tensor=3))
    good = write(tmp_path, "good.yaml", small())
    assert main(["simulate", good, bad, good, "--json"]) == 1
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["file"] for x in lines] == [good, bad, good]
    assert "error" in lines[1] and "step_time_s" in lines[0] and "step_time_s" in lines[2]


def test_trace_is_a_chrome_trace(tmp_path):
    out = tmp_path / "trace.json"
    assert main(["simulate", write(tmp_path, "s.yaml", small()), "--trace", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    names = {e["name"] for e in spans}
    assert "0F0" in names and "1B0" in names and "optimizer" in names


def test_same_input_same_output_and_trace(tmp_path, capsys):
    path = write(tmp_path, "s.yaml", small(schedule="interleaved-1f1b", virtual_stages=2))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    main(["simulate", path, "--json", "--trace", str(a)])
    main(["simulate", path, "--json", "--trace", str(b)])
    first, second = capsys.readouterr().out.splitlines()
    assert first == second and a.read_bytes() == b.read_bytes()


def test_too_big_still_gets_a_time():
    doc = small()
    doc["model"] = {"preset": "llama2-70b"}
    doc["cluster"] = {"system": "p4d.24xlarge", "gpus": 8}
    doc["training"] = {"global_batch": 8, "micro_batch": 1}
    doc["parallel"] = {"tensor": 8}
    r = simulate(parse_scenario(doc), load_catalog())
    assert not r.fits_in_memory and r.step_time_s > 0


def test_more_network_bandwidth_is_never_slower():
    catalog = load_catalog()
    times = []
    for gbps in (50, 100, 400, 1600):
        doc = small(tensor=1, pipeline=2, data=8)
        doc["cluster"]["inter_node_gbps"] = gbps
        times.append(simulate(parse_scenario(doc), catalog).step_time_s)
    assert times == sorted(times, reverse=True)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "hierarchical", "parameter-server"])
def test_every_gradient_reduction_runs(algorithm):
    doc = small(tensor=1, pipeline=1, data=16, grad_reduce=algorithm, overlap_grad_reduce=False)
    r = simulate(parse_scenario(doc), load_catalog())
    assert r.breakdown_s["dp_comm"] > 0


def test_zero3_costs_more_communication_than_zero1():
    catalog = load_catalog()
    z1 = simulate(parse_scenario(small(tensor=1, pipeline=1, data=16, zero=1)), catalog)
    z3 = simulate(parse_scenario(small(tensor=1, pipeline=1, data=16, zero=3)), catalog)
    assert z3.peak_memory_gib < z1.peak_memory_gib
    assert z3.breakdown_s.get("fsdp_comm", 0) > 0


def test_recompute_trades_time_for_memory():
    catalog = load_catalog()
    out = {}
    for mode in ("none", "selective", "full"):
        doc = small()
        doc["training"]["recompute"] = mode
        out[mode] = simulate(parse_scenario(doc), catalog)
    assert out["none"].step_time_s < out["selective"].step_time_s < out["full"].step_time_s
    assert out["none"].peak_memory_gib >= out["selective"].peak_memory_gib > out["full"].peak_memory_gib


@pytest.mark.parametrize("change, message", [
    ({"cluster": {"system": "p4d.24xlarg", "gpus": 16}}, "did you mean 'p4d.24xlarge'"),
    ({"parallel": None}, "no parallel section; run `partita plan "),
    ({"cluster": {"system": "p3.16xlarge", "gpus": 16}}, "precision 'bf16' is not supported by v100-16gb"),
    ({"cluster": {"system": "p4d.24xlarge", "gpus": 12}}, "must fill whole p4d.24xlarge nodes"),
])
def test_bad_scenarios_fail_with_one_line(tmp_path, capsys, change, message):
    doc = small()
    doc.update(change)
    if doc["parallel"] is None:
        del doc["parallel"]
    if change.get("cluster", {}).get("gpus") == 12:
        doc["parallel"] = {"tensor": 1, "pipeline": 1, "data": 12}
        doc["training"]["global_batch"] = 24
    assert main(["simulate", write(tmp_path, "s.yaml", doc)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_trace_with_several_files_is_refused(tmp_path, capsys):
    path = write(tmp_path, "s.yaml", small())
    assert main(["simulate", path, path, "--trace", str(tmp_path / "t.json")]) == 1
    assert "--trace takes one scenario file" in capsys.readouterr().err


def test_shipped_examples_simulate():
    catalog = load_catalog()
    for name in ("gpt3-175b-a100", "llama2-70b-h100", "t5-3b-p4d", "gpt2-xl-p3"):
        r = simulate(load_scenario(name), catalog)
        assert r.fits_in_memory, name


@pytest.mark.parametrize("text, message", [
    ("sustained_matmul_fraction: {a100: 1.5}\n", "sustained_matmul_fraction.a100: must be in (0, 1], got 1.5"),
    ("sustained_matmul_fraction: {tpu: 0.5}\n", "unknown key"),
    ("step_overhead: 0.1\n", "step_overhead: unknown key; did you mean 'step_overhead_s'?"),
    ("attention_fraction: 1.2\n", "attention_fraction: must be in (0, 1], got 1.2"),
    ("framework_fraction: {jax: 0.5}\n", "framework_fraction.jax: unknown key"),
    ("zero3_collective_fraction: {deepspeed: 2}\n",
     "zero3_collective_fraction.deepspeed: must be in (0, 1], got 2"),
    ("overlap_slowdown: -0.1\n", "overlap_slowdown: must be >= 0, got -0.1"),
    ("overlap_slowdown: fast\n", "overlap_slowdown: expected a number"),
    ("list_collective_host_us: {all_gather: -1}\n", "list_collective_host_us.all_gather: must be >= 0"),
    ("list_collective_host_us: {broadcast: 1}\n", "list_collective_host_us.broadcast: unknown key"),
    ("list_copy_host_us: -2\n", "list_copy_host_us: must be >= 0"),
    ("framework_block_overhead_us: {jax: 1}\n", "framework_block_overhead_us.jax: unknown key"),
    ("framework_block_overhead_us: {deepspeed: -5}\n",
     "framework_block_overhead_us.deepspeed: must be >= 0, got -5"),
])
def test_bad_overheads_file_names_the_key(tmp_path, text, message):
    from partita.planner.errors import PartitaError
    from partita.simulator.overheads import load_overheads
    path = tmp_path / "training.yaml"
    path.write_text(text)
    with pytest.raises(PartitaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_overheads(path)


def _framework_doc(framework: str) -> dict:
    doc = small(tensor=1, pipeline=1, data=16, zero=3)
    doc["training"].update(framework=framework, recompute="full")
    return doc


def test_framework_fractions_slow_kernels_and_deepspeed_zero3_gathers_again_for_recompute():
    from partita.simulator.overheads import Overheads
    catalog = load_catalog()
    plain = Overheads()
    mega = simulate(parse_scenario(_framework_doc("megatron")), catalog, overheads=plain)
    fsdp = simulate(parse_scenario(_framework_doc("fsdp")), catalog, overheads=plain)
    ds = simulate(parse_scenario(_framework_doc("deepspeed")), catalog, overheads=plain)
    assert fsdp.step_time_s == mega.step_time_s          # no fraction given: the same physics
    # DeepSpeed's hooks re-gather each block's parameters for the recomputed forward.
    assert ds.breakdown_s.get("fsdp_comm", 0.0) > fsdp.breakdown_s.get("fsdp_comm", 0.0)
    slower = Overheads(framework_fraction={"fsdp": 0.5})
    half = simulate(parse_scenario(_framework_doc("fsdp")), catalog, overheads=slower)
    assert half.breakdown_s["compute"] > 1.5 * fsdp.breakdown_s["compute"]
    thin = Overheads(zero3_collective_fraction={"deepspeed": 0.25})
    ds_thin = simulate(parse_scenario(_framework_doc("deepspeed")), catalog, overheads=thin)
    assert ds_thin.step_time_s > ds.step_time_s


def test_framework_block_overhead_is_paid_on_every_block_pass_of_that_framework_only():
    """DeepSpeed's fixed cost per block pass: each chunk's forward pays it once per block, its
    backward three times under full recompute (recomputed forward, backward-input,
    backward-weight); another framework's chunks are unchanged."""
    from partita.simulator.calibration import load_calibration
    from partita.simulator.context import resolve
    from partita.simulator.memory import chunk_blocks
    from partita.simulator.network import build_topology
    from partita.simulator.overheads import Overheads
    from partita.simulator.stagecosts import chunk_costs
    from partita.simulator.stepenv import StepEnv
    from partita.planner.stages import chunk_ranges
    catalog, cal, c = load_catalog(), load_calibration(), 1e-3
    paying = Overheads(framework_block_overhead_s={"deepspeed": c})
    for framework, per_block in (("deepspeed", c), ("megatron", 0.0)):
        doc = small(tensor=1, pipeline=2, data=8)
        doc["training"].update(framework=framework, recompute="full")
        ctx = resolve(parse_scenario(doc), catalog)
        topo = build_topology(ctx.system, cal)
        base = chunk_costs(StepEnv(ctx=ctx, topo=topo, cal=cal, oh=Overheads()))
        paid = chunk_costs(StepEnv(ctx=ctx, topo=topo, cal=cal, oh=paying))
        for (a, b), x, y in zip(chunk_ranges(ctx.dims.total_layers, ctx.parallel), base, paid):
            blocks = chunk_blocks(ctx.dims, a, b)[0]
            assert blocks > 0
            assert y.forward_s - x.forward_s == pytest.approx(blocks * per_block, abs=1e-12)
            assert y.backward_s - x.backward_s == pytest.approx(3 * blocks * per_block, abs=1e-12)


def test_deepspeed_bf16_pipeline_adds_each_micro_batch_gradients_into_fp32():
    """DeepSpeed's BF16_Optimizer under its pipeline engine: after every micro-batch's backward a
    cast (2 -> 4 bytes) and an add (4 + 4 -> 4) per parameter of the chunk, 18 bytes per parameter
    at HBM speed; not under fp16, ZeRO 2, Megatron, or without a pipeline."""
    from partita.simulator.context import resolve
    from partita.simulator.memory import block_parameters
    catalog = load_catalog()
    ctx = resolve(parse_scenario(small()), catalog)

    def run(framework="deepspeed", precision="bf16", **parallel):
        doc = small(**parallel)
        doc["training"].update(framework=framework, precision=precision)
        return simulate(parse_scenario(doc), catalog)

    ds = run()
    micro = 64 // 4 // 2                                  # global / data / micro-batch
    params = (8 // 2 * block_parameters(ctx.dims) + 32000 * 1024) / 2     # per rank: tp 2, pp 2
    hbm = ctx.system.gpu.memory_bandwidth_bytes_per_s
    per_step = ds.breakdown_s["hp_grad_update"]
    assert per_step > micro * 18 * params / hbm          # below HBM peak, never above it
    assert per_step < micro * 18 * params / (0.3 * hbm)
    for other in (run(precision="fp16"), run(zero=2), run(framework="megatron"),
                  run(pipeline=1, data=8)):
        assert "hp_grad_update" not in other.breakdown_s


def test_zero3_gathers_without_prefetch_add_to_compute():
    """overlap_param_gather false (DeepSpeed 0.3's synchronous gathers): each block's all-gathers
    and reduce-scatter run between its kernels, so the step is the overlapped one plus what the
    overlap hid."""
    catalog = load_catalog()
    from partita.simulator.overheads import Overheads
    plain = Overheads()
    for framework in ("fsdp", "deepspeed"):
        hidden = simulate(parse_scenario(_framework_doc(framework)), catalog, overheads=plain)
        doc = _framework_doc(framework)
        doc["parallel"]["overlap_param_gather"] = False
        serial = simulate(parse_scenario(doc), catalog, overheads=plain)
        assert serial.step_time_s > hidden.step_time_s
        assert serial.breakdown_s["fsdp_comm"] > hidden.breakdown_s.get("fsdp_comm", 0.0)
        assert serial.breakdown_s["compute"] == pytest.approx(hidden.breakdown_s["compute"])


def test_list_collective_by_hand():
    """A collective on a Python list of per-rank tensors (DeepSpeed 0.3): per rank, the host loop
    and one copy kernel; none for a kind without an entry."""
    from partita.simulator.overheads import Overheads
    oh = Overheads(list_collective_host_s={"all_gather": 4e-6, "reduce_scatter": 0.0})
    assert oh.list_collective("all_gather", 1000, 3e-6) == pytest.approx(7e-3)   # loop + copy
    assert oh.list_collective("reduce_scatter", 1000, 3e-6) == pytest.approx(3e-3)   # copies only
    assert Overheads().list_collective("all_gather", 1000, 3e-6) == 0.0
    # the host submits each copy while the GPU runs the one before: the slower of the two paces them
    paced = Overheads(list_collective_host_s={"all_gather": 4e-6, "reduce_scatter": 0.0},
                      list_copy_host_s=8e-6)
    assert paced.list_collective("all_gather", 1000, 3e-6) == pytest.approx(12e-3)
    assert paced.list_collective("reduce_scatter", 1000, 3e-6) == pytest.approx(8e-3)
    assert paced.list_collective("reduce_scatter", 1000, 20e-6) == pytest.approx(20e-3)
    assert paced.list_collective("broadcast", 1000, 3e-6) == 0.0


def test_list_collectives_grow_with_ranks_only_for_deepspeed_without_prefetch():
    """DeepSpeed 0.3's synchronous per-tensor list gathers cost more with every rank; FSDP's flat
    gathers and prefetched DeepSpeed do not pay it."""
    from partita.simulator.overheads import Overheads
    catalog = load_catalog()
    plain, listed = Overheads(), Overheads(list_collective_host_s={"all_gather": 4e-6})

    def extra(framework: str, prefetch: bool, gpus: int) -> float:
        doc = _framework_doc(framework)
        doc["cluster"]["gpus"], doc["parallel"]["data"] = gpus, gpus
        doc["training"].update(global_batch=gpus, micro_batch=1)
        doc["parallel"]["overlap_param_gather"] = prefetch
        s = parse_scenario(doc)
        return (simulate(s, catalog, overheads=listed).step_time_s
                - simulate(s, catalog, overheads=plain).step_time_s)

    small_n, large_n = extra("deepspeed", False, 64), extra("deepspeed", False, 256)
    assert small_n > 0 and large_n == pytest.approx(4 * small_n, rel=1e-6)
    assert extra("fsdp", False, 256) == 0.0 and extra("deepspeed", True, 256) == 0.0


def test_deepspeed_does_not_gather_tensors_under_the_persistence_threshold(monkeypatch):
    """stage3_param_persistence_threshold (100,000 elements): biases and norms stay whole, so only
    the weight matrices are gathered per block; gathering everything costs more latency."""
    from dataclasses import replace
    from partita.simulator import stepenv
    from partita.simulator.frameworks import framework_profile
    from partita.simulator.overheads import Overheads
    catalog = load_catalog()
    doc = _framework_doc("deepspeed")
    doc["parallel"]["overlap_param_gather"] = False
    kept = simulate(parse_scenario(doc), catalog, overheads=Overheads()).breakdown_s["fsdp_comm"]
    assert framework_profile("deepspeed").zero3_persistence_threshold_params == 100_000
    every_tensor = replace(framework_profile("deepspeed"), zero3_persistence_threshold_params=0)
    monkeypatch.setattr(stepenv, "framework_profile", lambda name: every_tensor)
    every = simulate(parse_scenario(doc), catalog, overheads=Overheads()).breakdown_s["fsdp_comm"]
    assert every > kept


def test_overlapped_by_hand():
    """A collective beside kernels slows them by k while it runs (Overheads.overlapped)."""
    from partita.simulator.overheads import Overheads
    ideal = Overheads()
    assert ideal.overlapped(1.0, 0.5) == 1.0 and ideal.overlapped(1.0, 3.0) == 3.0
    k = Overheads(overlap_slowdown=0.25)
    # 0.5 s of collective beside 1 s of kernels: 0.5 / 1.25 = 0.4 s of kernel work done beside it,
    # the other 0.6 s after: 1.1 s.
    assert k.overlapped(1.0, 0.5) == pytest.approx(1.1)
    assert k.overlapped(1.0, 1.25) == pytest.approx(1.25)     # the kernels just fit beside it
    assert k.overlapped(1.0, 2.0) == 2.0                       # the collective sets the time
    assert k.overlapped(1.0, 0.0) == 1.0
    assert k.contention(0.5) == pytest.approx(0.1)


@pytest.mark.parametrize("doc", [
    _framework_doc("fsdp"),                                   # ZeRO-3 prefetched gathers
    small(tensor=1, pipeline=1, data=16),                     # DDP buckets beside the backward
    small(tensor=1, pipeline=2, data=8, zero=1),              # distributed optimizer
], ids=["zero3", "ddp", "zero1"])
def test_overlap_slowdown_slows_steps_with_hidden_collectives(doc):
    from partita.simulator.overheads import Overheads
    catalog = load_catalog()
    doc["parallel"]["overlap_grad_reduce"] = True
    doc["parallel"]["overlap_param_gather"] = True
    doc["training"].update(global_batch=512, micro_batch=16)     # compute long enough to hide them
    times = [simulate(parse_scenario(doc), catalog, overheads=Overheads(overlap_slowdown=k)).step_time_s
             for k in (0.0, 0.2, 0.4)]
    assert times[0] < times[1] < times[2]


@pytest.mark.parametrize("inter_node_gbps, micro_batch", [(2.0, 1), (400.0, 32)])
def test_overlapped_parameter_gather_hides_behind_the_first_micro_batch_forward(inter_node_gbps,
                                                                                micro_batch):
    """Megatron-Core's --overlap-param-gather: each bucket's all-gather is waited on in the forward
    pre-hook of its first layer and the next one dispatched, so the gather runs beside the step's
    first micro-batch forward only; the first bucket's, and what outlasts that forward, is exposed."""
    from partita.simulator.calibration import load_calibration
    from partita.simulator.context import resolve
    from partita.simulator.dataparallel import BUCKET_PARAMS, param_gather_time
    from partita.simulator.modelcosts import model_costs
    from partita.simulator.network import build_topology
    from partita.simulator.overheads import Overheads
    from partita.simulator.stepenv import StepEnv
    catalog = load_catalog()
    doc = small(tensor=1, pipeline=1, data=16, zero=1)
    doc["cluster"]["inter_node_gbps"] = inter_node_gbps
    doc["training"].update(global_batch=128 * micro_batch, micro_batch=micro_batch)   # 8 per step
    doc["parallel"]["overlap_grad_reduce"] = False
    runs = {}
    for overlap in (True, False):
        doc["parallel"]["overlap_param_gather"] = overlap
        runs[overlap] = simulate(parse_scenario(doc), catalog, overheads=Overheads(), trace=True)
    saved = runs[False].step_time_s - runs[True].step_time_s
    forward = max(s.end_s - s.start_s for s in runs[True].spans if s.cat == "forward")
    ctx = resolve(parse_scenario(doc), catalog)
    cal = load_calibration()
    env = StepEnv(ctx=ctx, topo=build_topology(ctx.system, cal), cal=cal, oh=Overheads())
    params = sum(model_costs(ctx).chunk_parameters(ctx))
    gather = param_gather_time(env, params)
    hideable = gather * (1 - min(1.0, BUCKET_PARAMS / params))   # all but the first bucket's
    assert saved == pytest.approx(min(hideable, forward), rel=0.02)
    if inter_node_gbps == 2.0:                            # a slow network: the forward is too short
        assert gather > 10 * forward and saved == pytest.approx(forward, rel=0.02)
    else:                                                 # a fast one: all but the first bucket hides
        assert hideable < forward


def test_overlap_slowdown_leaves_steps_without_collectives_alone():
    from partita.simulator.overheads import Overheads
    catalog = load_catalog()
    doc = small(tensor=1, pipeline=2, data=1)
    doc["cluster"]["gpus"] = 2
    a = simulate(parse_scenario(doc), catalog, overheads=Overheads())
    b = simulate(parse_scenario(doc), catalog, overheads=Overheads(overlap_slowdown=0.4))
    assert a.step_time_s == b.step_time_s


# ---- host dispatch and launch, step synchronisations, usable memory, intervals (#16) ----

def _chunks(doc, host):
    from partita.simulator.calibration import load_calibration
    from partita.simulator.context import resolve
    from partita.simulator.network import build_topology
    from partita.simulator.overheads import Overheads
    from partita.simulator.stagecosts import chunk_costs
    from partita.simulator.stepenv import StepEnv
    cal = load_calibration()
    ctx = resolve(parse_scenario(doc), load_catalog())
    return chunk_costs(StepEnv(ctx=ctx, topo=build_topology(ctx.system, cal), cal=cal,
                               oh=Overheads(), host=host))


def test_host_exposed_only_where_the_host_is_slower_than_the_gpu():
    from partita.simulator.host import HostCosts
    doc = small(tensor=1, pipeline=1, data=16)
    none = _chunks(doc, HostCosts())[0]
    cheap = _chunks(doc, HostCosts(op_dispatch_s=1e-9))[0]
    assert cheap.forward_s == none.forward_s and "host" not in cheap.parts    # GPU-bound
    slow = _chunks(doc, HostCosts(op_dispatch_s=1e-2))[0]                    # 10 ms per op
    from partita.simulator.host import forward_kernels
    kf = forward_kernels(decoder=False, tensor=1, attention="flash")
    blocks = 8
    # host-bound: each block's forward costs its kernels' host time, max(device, host), so the
    # chunk costs at least the host time of its blocks and less than host plus device time
    host_s = blocks * kf * 1e-2
    assert host_s <= slow.forward_s < host_s + none.forward_s
    assert slow.parts["host"] > 0


def test_launch_blocking_adds_host_time_to_every_kernel():
    from partita.simulator.host import HostCosts, forward_kernels
    host = HostCosts(op_dispatch_s=3e-6, launch_s=2e-6, launch_blocking_wait_s=5e-6)
    doc = small(tensor=2, pipeline=1, data=8)
    free = _chunks(doc, host)[0]
    doc["training"]["launch_blocking"] = True
    blocking = _chunks(doc, host)[0]
    kf = forward_kernels(decoder=False, tensor=2, attention="flash")
    assert "host" not in free.parts                      # 10 us per kernel: GPU-bound
    assert blocking.forward_s - free.forward_s == pytest.approx(8 * kf * 10e-6, rel=1e-9)
    assert blocking.backward_s - free.backward_s == pytest.approx(8 * 2 * kf * 10e-6, rel=1e-9)


def test_unfused_elementwise_launches_its_separate_kernels():
    """Without the fusions the MLP's bias add and, per residual sublayer, bias add and dropout
    run apart from the kernel the fused block runs: one more for the MLP, two per sublayer."""
    from partita.simulator.host import HostCosts, forward_kernels
    fused = forward_kernels(decoder=False, tensor=1, attention="eager")
    assert forward_kernels(decoder=False, tensor=1, attention="eager",
                           fused_elementwise=False) == fused + 1 + 2 * 2
    assert forward_kernels(decoder=True, tensor=1, attention="eager", fused_elementwise=False) \
        == forward_kernels(decoder=True, tensor=1, attention="eager") + 1 + 2 * 3
    host = HostCosts(op_dispatch_s=3e-6, launch_s=2e-6, launch_blocking_wait_s=5e-6)
    doc = small(tensor=1, pipeline=1, data=16)
    doc["training"].update(launch_blocking=True, attention="eager")
    with_fusion = _chunks(doc, host)[0]
    doc["training"]["fused_elementwise"] = False
    without = _chunks(doc, host)[0]
    assert without.forward_s - with_fusion.forward_s > 8 * 5 * 10e-6    # 5 launches per block more


def test_backward_kernels_cost_their_own_host_time_and_recompute_the_forwards():
    from partita.simulator.host import HostCosts, forward_kernels
    same = HostCosts(op_dispatch_s=3e-6, launch_s=2e-6, launch_blocking_wait_s=5e-6)
    cheap_bwd = HostCosts(op_dispatch_s=3e-6, launch_s=2e-6, launch_blocking_wait_s=5e-6,
                          backward_op_dispatch_s=1e-6)
    assert same.per_backward_kernel_s == same.per_kernel_s      # None: as the forward's
    doc = small(tensor=2, pipeline=1, data=8)
    doc["training"]["launch_blocking"] = True
    doc["training"]["recompute"] = "full"
    a, b = _chunks(doc, same)[0], _chunks(doc, cheap_bwd)[0]
    kf = forward_kernels(decoder=False, tensor=2, attention="flash")
    assert a.forward_s == b.forward_s                        # forward kernels: op_dispatch_s
    # the backward's 2 kf kernels save 2 us each; the recomputed forward's kf kernels do not
    assert a.backward_s - b.backward_s == pytest.approx(8 * 2 * kf * 2e-6, rel=1e-9)


def test_each_recompute_policy_launches_its_own_kernels_again_on_the_host():
    """Under CUDA_LAUNCH_BLOCKING (every kernel's host time adds) the backward pays for what the
    recompute issues again: full, the whole forward; selective, the attention core; selective-op,
    the whole forward dispatched again but the ops its policy saved (every second linear, the
    attention kernel) not launched."""
    from partita.planner import inventory
    from partita.planner.modelspec import TransformerDims
    from partita.simulator.host import HostCosts, attention_core_kernels, forward_kernels
    host = HostCosts(op_dispatch_s=3e-6, launch_s=2e-6, launch_blocking_wait_s=5e-6)
    per_launch = host.per_kernel_s + host.launch_blocking_wait_s
    back = {}
    for mode in ("none", "selective", "selective-op", "full"):
        doc = small(tensor=1, pipeline=1, data=16)
        doc["model"].update(arch="llama", kv_heads=8, ffn_hidden=2816)
        doc["training"].update(launch_blocking=True, recompute=mode)
        back[mode] = _chunks(doc, HostCosts())[0].backward_s, _chunks(doc, host)[0].backward_s
    host_s = {m: with_host - without for m, (without, with_host) in back.items()}
    kf = forward_kernels(decoder=False, tensor=1, attention="flash")
    blocks = 8
    assert host_s["full"] - host_s["none"] == pytest.approx(blocks * kf * per_launch)
    assert host_s["selective"] - host_s["none"] == pytest.approx(
        blocks * attention_core_kernels("flash") * per_launch)
    d = TransformerDims(arch="llama", layers=8, hidden=1024, heads=16, kv_heads=8,
                        ffn_hidden=2816, seq_len=1024, vocab=32000)
    kept, _ = inventory.op_policy_split(inventory.block_linears(d, kind=inventory.block_kind(d)))
    saved = len(kept) + attention_core_kernels("flash")
    # the saved ops cost their dispatch, not their launch nor the blocking wait
    assert host_s["full"] - host_s["selective-op"] == pytest.approx(
        blocks * saved * (host.launch_s + host.launch_blocking_wait_s))
    assert attention_core_kernels("eager", decoder=True) == 14


def test_host_yaml_takes_the_host_time_per_kernel_measured_on_the_gpu_machine():
    """data/calibration/host.yaml's dispatch costs for GPU systems are what
    benchmarks/gpu_prediction.py --host derives from the stored H200 blocks, less the launch."""
    import importlib.util
    from pathlib import Path
    from partita.executor.hostbench import block_host
    from partita.planner.paths import VALIDATION_DIR
    from partita.simulator.host import load_host_costs
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_prediction.py"
    spec = importlib.util.spec_from_file_location("gpu_prediction", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    data = json.loads((VALIDATION_DIR / "gpu" / "h200_kernels.json").read_text())
    counts = block_host(calls=1, repeats=1)
    assert (counts.forward_kernels, counts.backward_kernels) == (12, 26)
    fwd, bwd, nf, nb = bench.host_per_kernel(data, counts.forward_kernels, counts.backward_kernels)
    host = load_host_costs()
    assert host.op_dispatch_s == pytest.approx(fwd - host.launch_s, abs=0.05e-6)
    assert host.backward_op_dispatch_s == pytest.approx(bwd - host.launch_s, abs=0.05e-6)
    assert (nf, nb) == (24, 4)


def test_gpu_prediction_host_says_in_one_line_when_a_file_has_no_gpt_block(tmp_path, capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_prediction.py"
    spec = importlib.util.spec_from_file_location("gpu_prediction", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    f = tmp_path / "empty.json"
    f.write_text(json.dumps({"torch": "x", "first": {"blocks": []}}))
    assert bench.main([str(f), "--host"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {f}: no gpt block")


def test_a_synchronous_device_adds_every_kernels_host_time_to_its_own():
    """On a CPU (kernels run inside the dispatching call) the host time adds to the device time
    even where the device is the slower: blocks, the embedding's and the head's kernels."""
    from partita.simulator.host import (BACKWARD_KERNELS_PER_FORWARD, EMBEDDING_FORWARD_KERNELS,
                                        HEAD_FORWARD_KERNELS, HostCosts, forward_kernels)
    doc = small(tensor=1, pipeline=2, data=8)
    none = _chunks(doc, HostCosts())
    sync = _chunks(doc, HostCosts(op_dispatch_s=1e-9, backward_op_dispatch_s=2e-9,
                                  synchronous=True))
    kf = forward_kernels(decoder=False, tensor=1, attention="flash")
    blocks = 4
    for chunk, extra in ((0, EMBEDDING_FORWARD_KERNELS), (1, HEAD_FORWARD_KERNELS)):
        kernels = blocks * kf + extra
        assert sync[chunk].forward_s - none[chunk].forward_s == pytest.approx(kernels * 1e-9)
        assert sync[chunk].backward_s - none[chunk].backward_s == pytest.approx(
            BACKWARD_KERNELS_PER_FORWARD * kernels * 2e-9)


def test_optimizer_host_time_per_tensor_beside_or_after_the_device():
    from partita.simulator.host import HostCosts
    per = {"adam": 2e-5}
    assert HostCosts(optimizer_step_per_tensor_s=per).optimizer_step("adam", 10, 1e-3) == 1e-3
    assert HostCosts(optimizer_step_per_tensor_s=per).optimizer_step("adam", 100, 1e-3) == 2e-3
    assert HostCosts(optimizer_step_per_tensor_s=per, synchronous=True).optimizer_step(
        "adam", 10, 1e-3) == pytest.approx(1.2e-3)
    assert HostCosts(optimizer_step_per_tensor_s=per).optimizer_step("sgd", 100, 1e-3) == 1e-3


def test_the_pipeline_schedules_work_per_action_adds_to_each_stage_pass():
    from partita.simulator.chunkcost import ChunkCost
    from partita.simulator.host import HostCosts
    from partita.simulator.step import _with_schedule_work
    sync = HostCosts(pipeline_action_s={"1f1b": 3e-4, "interleaved-1f1b": 9e-4}, synchronous=True)
    chunk = ChunkCost(1e-3, 2e-3, 1e-3, {"compute": 3e-3})
    out = _with_schedule_work(chunk, sync, pipeline=2)
    assert (out.forward_s, out.backward_s) == pytest.approx((1.3e-3, 2.3e-3))
    assert out.parts["pipeline_schedule"] == pytest.approx(6e-4) and out.parts["compute"] == 3e-3
    assert _with_schedule_work(chunk, sync, pipeline=1) is chunk          # no pipeline: no schedule
    # each schedule its own runtime's work: GPipe runs on 1F1B's, zero bubble on interleaved's
    assert _with_schedule_work(chunk, sync, 2, "gpipe").forward_s == pytest.approx(1.3e-3)
    for name in ("interleaved-1f1b", "zero-bubble"):
        assert _with_schedule_work(chunk, sync, 2, name).forward_s == pytest.approx(1.9e-3)
    beside = HostCosts(pipeline_action_s={"1f1b": 1.5e-3})               # asynchronous device
    assert _with_schedule_work(chunk, beside, pipeline=4).forward_s == pytest.approx(1.5e-3)
    assert _with_schedule_work(chunk, beside, pipeline=4).backward_s == pytest.approx(2e-3)
    assert _with_schedule_work(chunk, HostCosts(), pipeline=4) is chunk   # nothing measured


def test_a_handoff_stall_grows_with_the_compute_before_the_exchange_and_levels_off():
    """`HostCosts.handoff_stall`: linear from 0 at no compute through the measured points, held
    after the last; a fused-exchange schedule's action pays it at its own compute, the multi-stage
    runtime's does not (its measured work per action stands alone)."""
    from partita.simulator.host import HostCosts
    host = HostCosts(synchronous=True, pipeline_action_s={"1f1b": 1e-4, "interleaved-1f1b": 1e-4},
                     handoff_stall_s=((1e-3, 1e-3), (3e-3, 2e-3)))
    assert host.handoff_stall(0.0) == 0.0
    assert host.handoff_stall(5e-4) == pytest.approx(5e-4)
    assert host.handoff_stall(2e-3) == pytest.approx(1.5e-3)
    assert host.handoff_stall(1.0) == pytest.approx(2e-3)
    assert HostCosts().handoff_stall(1e-3) == 0.0
    assert host.pipeline_action(2e-3, 2, "1f1b") == pytest.approx(2e-3 + 1e-4 + 1.5e-3)
    assert host.pipeline_action(2e-3, 2, "gpipe") == pytest.approx(2e-3 + 1e-4 + 1.5e-3)
    assert host.pipeline_action(2e-3, 2, "interleaved-1f1b") == pytest.approx(2e-3 + 1e-4)
    assert host.pipeline_action(2e-3, 1, "1f1b") == 2e-3


@pytest.mark.parametrize("name, world, split_qkv", [("tiny-gpt-pp2", 2, 4),
                                                   ("tiny-llama-pp2-dp2", 4, 0)])
def test_rank_tensors_count_the_executors_parameter_tensors(name, world, split_qkv):
    """The optimizer's per-tensor host work counts the parameter tensors of the busiest pipeline
    rank: the executor's own model holds as many, less `split_qkv` per block (partita's GPT keeps
    q, k and v apart, weight and bias, where the inventory has Megatron-LM's fused QKV)."""
    import torch
    import yaml
    from partita.executor.plan import execution_plan
    from partita.executor.stages import build_chunks
    from partita.planner.paths import SCENARIOS_DIR
    from partita.simulator.context import resolve
    from partita.simulator.dataparallel import rank_tensors
    doc = yaml.safe_load((SCENARIOS_DIR / f"{name}.yaml").read_text())
    doc["cluster"] = {"system": "dgx-a100-80gb", "gpus": world}     # any system: counts only
    scenario = parse_scenario(doc)
    plan = execution_plan(scenario, world)
    held = []
    for stage in range(plan.pipeline):
        chunks, _, _ = build_chunks(plan, scenario.model.resolve(), plan.stages_of(stage),
                                    torch.device("cpu"), 0)
        blocks = sum(len(plan.layers_of(s)) for s in plan.stages_of(stage)) - 1   # + emb or head
        held.append(sum(len(list(c.parameters())) for c in chunks) - split_qkv * blocks)
    assert rank_tensors(resolve(scenario, load_catalog())) == max(held)


@pytest.mark.parametrize("host, message", [
    ("{bogus_us: 1}", "host.bogus_us"),
    ("{optimizer_step_per_tensor_us: {lamb: 3}}", "optimizer_step_per_tensor_us.lamb"),
    ("{op_dispatch_us: -2}", "op_dispatch_us"),
    ("{synchronous: maybe}", "synchronous"),
    ("{pipeline_action_us: {1f2b: 3}}", "pipeline_action_us.1f2b"),
    ("{pipeline_action_us: {1f1b: -3}}", "pipeline_action_us.1f1b"),
    ("{handoff_stall_us_by_compute_us: [[0, 5]]}", "handoff_stall_us_by_compute_us"),
    ("{handoff_stall_us_by_compute_us: [[300, 5], [100, 9]]}", "handoff_stall_us_by_compute_us"),
    ("{handoff_stall_us_by_compute_us: [[100, -1]]}", "handoff_stall_us_by_compute_us"),
])
def test_a_bad_host_section_of_an_overlay_is_one_error_naming_the_key(tmp_path, host, message):
    from partita.planner.errors import PartitaError
    from partita.simulator.calibration import load_calibration
    f = tmp_path / "overlay.yaml"
    f.write_text(f"host: {host}\n")
    with pytest.raises(PartitaError) as exc:
        load_calibration(f, include_local=False)
    assert str(f) in str(exc.value) and message in str(exc.value)


def test_a_hand_off_stall_measured_as_zero_loads(tmp_path):
    """`partita calibrate` can time no stall after a short compute (the scheduler ran gloo's thread
    at once): a 0 it writes reads back."""
    from partita.simulator.calibration import load_calibration
    f = tmp_path / "overlay.yaml"
    f.write_text("host: {handoff_stall_us_by_compute_us: [[100, 0], [1000, 50]]}\n")
    host = load_calibration(f, include_local=False).local_host
    assert [p for pt in host.handoff_stall_s for p in pt] == pytest.approx([1e-4, 0.0, 1e-3, 5e-5])


def test_an_overlay_from_before_the_schedules_were_timed_apart_reads_as_1f1bs(tmp_path):
    """Its one `pipeline_action_us` number timed torch's Schedule1F1B: it stands for 1F1B and
    GPipe (same runtime), not for the multi-stage runtime."""
    from partita.simulator.calibration import load_calibration
    f = tmp_path / "overlay.yaml"
    f.write_text("host: {pipeline_action_us: 250, synchronous: true}\n")
    host = load_calibration(f, include_local=False).local_host
    assert host.pipeline_action_s == {"1f1b": pytest.approx(2.5e-4)}
    assert host.schedule_action_s("gpipe") == pytest.approx(2.5e-4)
    assert host.schedule_action_s("interleaved-1f1b") == 0.0


def test_host_yaml_without_a_backward_dispatch_uses_the_forwards(tmp_path):
    from partita.simulator.host import load_host_costs
    f = tmp_path / "host.yaml"
    f.write_text("op_dispatch_us: 4.0\nlaunch_us: 1.0\nlaunch_blocking_wait_us: 0.0\n")
    host = load_host_costs(f)
    assert host.backward_op_dispatch_s is None and host.per_backward_kernel_s == pytest.approx(5e-6)
    f.write_text("op_dispatch_us: 4.0\nbackward_op_dispatch_us: 2.0\nlaunch_us: 1.0\n")
    assert load_host_costs(f).per_backward_kernel_s == pytest.approx(3e-6)


def test_host_yaml_op_fractions_default_to_one_and_a_bad_one_names_the_file_and_key(tmp_path):
    from partita.planner.errors import PartitaError
    from partita.simulator.host import load_host_costs
    f = tmp_path / "host.yaml"
    f.write_text("op_dispatch_us: 4.0\nlaunch_us: 1.0\n")
    host = load_host_costs(f)
    assert host.unpad_op_dispatch_fraction == host.optimizer_op_dispatch_fraction == 1.0
    for key in ("unpad_op_dispatch_fraction", "optimizer_op_dispatch_fraction"):
        for bad in ("0", "-0.5", "fast", "1000"):
            f.write_text(f"op_dispatch_us: 4.0\nlaunch_us: 1.0\n{key}: {bad}\n")
            with pytest.raises(PartitaError) as err:
                load_host_costs(f)
            assert str(f) in str(err.value) and key in str(err.value)
            assert "\n" not in str(err.value)


def test_tied_embedding_gradients_are_reduced_between_first_and_last_stage():
    catalog = load_catalog()
    tied = small(tensor=1, pipeline=2, data=8)
    tied["model"]["tie_embeddings"] = True
    untied = small(tensor=1, pipeline=2, data=8)
    untied["model"]["tie_embeddings"] = False
    a = simulate(parse_scenario(tied), catalog)
    b = simulate(parse_scenario(untied), catalog)
    assert a.breakdown_s["embedding_sync"] > 0 and "embedding_sync" not in b.breakdown_s
    one_stage = small(tensor=1, pipeline=1, data=16)
    one_stage["model"]["tie_embeddings"] = True
    assert "embedding_sync" not in simulate(parse_scenario(one_stage), catalog).breakdown_s


def test_no_step_floor_data_parallel_speedup_follows_the_mechanisms():
    """A 350M GPT on one A100 and on eight (DP 8, same per-GPU batch): the step stays near the
    single-GPU one (the gradient all-reduce over NVLink is small), so 8 GPUs give ~8x throughput."""
    catalog = load_catalog()
    runs = {}
    for n in (1, 8):
        doc = {"model": {"preset": "gpt2-medium"},
               "cluster": {"system": "dgx-a100-40gb", "gpus": n},
               "training": {"global_batch": 8 * n, "micro_batch": 8, "precision": "bf16"},
               "parallel": {"data": n}}
        runs[n] = simulate(parse_scenario(doc), catalog)
    assert runs[1].step_time_s < 0.18
    assert runs[8].tokens_per_s / runs[1].tokens_per_s > 7.0


def test_grad_reduce_with_a_sharded_optimizer_is_an_error(tmp_path, capsys):
    path = write(tmp_path, "z.yaml", small(tensor=1, pipeline=1, data=16, zero=1,
                                           grad_reduce="hierarchical"))
    assert main(["simulate", path]) == 1
    err = capsys.readouterr().err
    assert "parallel.grad_reduce" in err and "zero is 1" in err


def test_fits_in_memory_uses_the_memory_cuda_reports():
    doc = small()
    r = simulate(parse_scenario(doc), load_catalog())          # p4d: A100 40GB
    assert r.memory_capacity_bytes == pytest.approx(39.5 * 2**30)


def test_every_prediction_carries_a_cross_validated_interval(capsys):
    assert main(["simulate", "gpt3-175b-a100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    low, high = out["step_time_interval_s"]
    assert low < out["step_time_s"] < high
    assert out["step_time_interval_rows"] >= 100          # every dev row's cross-validated error


def test_interval_is_split_conformal_by_hand(tmp_path):
    from partita.simulator.interval import conformal_bounds, step_time_interval
    # 19 errors -10..8 %: n + 1 = 20, k_lo = floor(20 x 0.05) = 1, k_hi = ceil(20 x 0.95) = 19
    rows = [{"regime": "any", "error_pct": e} for e in range(-10, 9)]
    path = tmp_path / "cv.json"
    path.write_text(json.dumps({"rows": rows}))
    band = step_time_interval(1.0, path)
    assert band.rows == 19
    assert band.low_s == pytest.approx(1 / 1.08) and band.high_s == pytest.approx(1 / 0.90)
    # 108 errors: ranks 5 and 104 (not the 5th and 95th percentiles' interpolation)
    errs = [i / 100 for i in range(108)]
    assert conformal_bounds(errs) == (0.04, 1.03)
    assert conformal_bounds([0.1]) is None


def test_ratio_tolerance_is_the_stored_p90_of_the_effects(tmp_path):
    from partita.planner.errors import PartitaError
    from partita.simulator.interval import ratio_tolerance
    path = tmp_path / "cv.json"
    path.write_text(json.dumps({"rows": [], "effects": {"by_kind": {"all": {"pairs": 52,
                                                                          "p90_pct": 13.1}}}}))
    tol = ratio_tolerance(path)
    assert tol.p90 == pytest.approx(0.131) and tol.pairs == 52
    path.write_text(json.dumps({"rows": []}))                  # written before effects were stored
    assert ratio_tolerance(path) is None
    assert ratio_tolerance(tmp_path / "absent.json") is None
    path.write_text(json.dumps({"rows": [], "effects": {"by_kind": {"all": {"pairs": "x"}}}}))
    with pytest.raises(PartitaError, match="not a cross-validation residuals file"):
        ratio_tolerance(path)
    shipped = ratio_tolerance()                                # the shipped crossval.json
    assert shipped is not None and shipped.pairs > 0 and 0 < shipped.p90 < 1


def test_nested_coverage_leaves_each_source_out_of_its_own_interval():
    from partita.simulator.interval import nested_coverage
    rows = [("a", -0.05), ("a", 0.0), ("a", 0.05), ("b", -0.04), ("b", 0.01), ("b", 0.06),
            ("c", 0.5)]
    # c's row against a's and b's six errors: [-0.05, 0.06], outside; a's rows against b's and c's
    # four: [-0.04, 0.5], two inside; b's against a's and c's: [-0.05, 0.5], all three inside
    assert nested_coverage(rows) == (5, 7)
    assert nested_coverage([("a", 0.1)]) == (0, 0)            # no other source: no interval


def test_hf_config_without_seq_len_is_an_error(tmp_path, capsys):
    doc = small()
    doc["model"] = {"hf_config": {"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 256,
                                  "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "intermediate_size": 512, "vocab_size": 1000,
                                  "max_position_embeddings": 32768}}
    path = write(tmp_path, "m.yaml", doc)
    assert main(["simulate", path]) == 1
    err = capsys.readouterr().err
    assert "model.seq_len: required with hf_config" in err and "32768" in err
    doc["model"]["seq_len"] = 1024
    assert main(["simulate", write(tmp_path, "m2.yaml", doc)]) == 0


def test_sustained_fraction_is_looked_up_by_catalog_family(tmp_path):
    from partita.planner.catalog import load_catalog
    from partita.planner.errors import PartitaError
    from partita.simulator.overheads import load_overheads
    oh, cat = load_overheads(), load_catalog()
    assert oh.sustained(cat.gpu("h200-141gb").family) == oh.sustained_by_family["h200"]
    assert oh.sustained(cat.gpu("a100-40gb").family) == oh.sustained(cat.gpu("a100-80gb").family)
    # a family without a fitted number and a GPU without a family get the file's `default`
    assert oh.sustained(cat.gpu("b200").family) == oh.sustained(None) == oh.sustained_default
    path = tmp_path / "mine.yaml"
    path.write_text("sustained_matmul_fraction: {a100: 0.7}\n")
    mine = load_overheads(path)
    assert mine.sustained("a100") == 0.7
    with pytest.raises(PartitaError, match="no value for GPU family 'b200' and no `default`"):
        mine.sustained("b200")


def test_recomputing_some_blocks_per_chunk_lies_between_none_and_full():
    """Megatron-LM's block method (--recompute-num-layers N): the first N blocks of each chunk
    rerun their forward; the time added and the activations saved scale with N."""
    catalog = load_catalog()

    def run(recompute, n=None):
        doc = small(pipeline=2, data=4)               # 8 blocks: 4 per pipeline stage
        doc["training"]["recompute"] = recompute
        if n is not None:
            doc["training"]["recompute_num_layers"] = n
        return simulate(parse_scenario(doc), catalog)

    none, full = run("none"), run("full")
    some = {n: run("full", n) for n in (1, 2, 3, 4, 9)}
    per_block = full.breakdown_s["recompute"] / 4
    for n in (1, 2, 3):
        assert some[n].breakdown_s["recompute"] == pytest.approx(n * per_block, rel=1e-9)
        assert some[n].step_time_s < some[n + 1].step_time_s
        assert some[n].peak_memory_gib > some[n + 1].peak_memory_gib
    assert none.step_time_s < some[1].step_time_s
    # the first stage holds two micro-batches under 1F1B: one recomputed block saves there (the
    # last stage, one micro-batch, holds the rerun block whole instead, and the loss's peak)
    first = [r.details["stage_memory_bytes"][0]["activations"] for r in (some[1], none)]
    assert first[0] < first[1]
    for n in (4, 9):                                  # every block of the chunk, as full recompute
        assert some[n].step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
        assert some[n].peak_memory_gib == pytest.approx(full.peak_memory_gib, rel=1e-12)


def test_recompute_num_layers_round_trips_and_needs_full_recompute(tmp_path, capsys):
    doc = small()
    doc["training"].update(recompute="full", recompute_num_layers=2)
    s = parse_scenario(doc)
    assert s.training.recompute_num_layers == 2 and s.training.recomputed_blocks(5) == 2
    assert parse_scenario(s.to_dict()) == s
    assert "recompute_num_layers" not in parse_scenario(small()).to_dict()["training"]
    for training, message in (
            ({"recompute": "selective", "recompute_num_layers": 2},
             "training.recompute_num_layers: only with recompute full (recompute is selective"),
            ({"recompute": "full", "recompute_num_layers": 0}, "must be >= 1, got 0"),
            ({"recompute": "full", "recompute_num_layers": "half"}, "expected an integer")):
        bad = small()
        bad["training"].update(training)
        path = write(tmp_path, "bad.yaml", bad)
        assert main(["simulate", path]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_hybrid_sharding_shards_within_a_group_and_all_reduces_the_shards_across_groups(
        tmp_path, capsys):
    """parallel.data_shard (FSDP HYBRID_SHARD, Megatron-Core's distributed optimizer instances):
    state sharded over the group only, and each gradient shard all-reduced across the replicas."""
    from partita.simulator import dataparallel
    from partita.simulator.calibration import load_calibration
    from partita.simulator.context import resolve
    from partita.simulator.network import build_topology, collective
    from partita.simulator.overheads import load_overheads
    from partita.simulator.stepenv import StepEnv
    catalog = load_catalog()

    def scenario(zero, shard=None):
        doc = small(tensor=1, pipeline=1, data=16, zero=zero)
        if shard is not None:
            doc["parallel"]["data_shard"] = shard
        return parse_scenario(doc)

    for zero in (1, 3):
        whole, same, hybrid = (simulate(scenario(zero, s), catalog) for s in (None, 16, 8))
        assert same.step_time_s == whole.step_time_s and same.peak_memory_gib == whole.peak_memory_gib
        assert hybrid.peak_memory_gib > whole.peak_memory_gib          # half as many shards
        assert hybrid.memory_breakdown_bytes["optimizer"] == pytest.approx(
            2 * whole.memory_breakdown_bytes["optimizer"])
    # ZeRO-1/2: the reduce-scatter runs in the shard group (one node of 8), then the shard is
    # all-reduced between the 2 nodes' ranks that hold it
    ctx = resolve(scenario(1, 8), catalog)
    cal = load_calibration()
    env = StepEnv(ctx=ctx, topo=build_topology(ctx.system, cal), cal=cal, oh=load_overheads())
    shard, replicas = dataparallel.shard_groups(ctx)
    assert (shard.ranks, shard.ranks_per_node, replicas.ranks, replicas.ranks_per_node) == (8, 8, 2, 1)
    nbytes = 1e9 * 4                                                   # bf16: fp32 gradients
    expect = (collective("reduce_scatter", "ring", nbytes, shard, env.topo)
              + collective("allreduce", "auto", nbytes / 8, replicas, env.topo))
    assert dataparallel.reduction_time(env, 1e9) == pytest.approx(expect)
    for parallel, message in (({"zero": 0, "data_shard": 8}, "only with zero 1, 2 or 3"),
                              ({"zero": 3, "data_shard": 3}, "must divide parallel.data (4)")):
        doc = small()
        doc["parallel"].update(parallel)
        assert main(["simulate", write(tmp_path, "bad.yaml", doc)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "parallel.data_shard: " + message in err[0]


def test_the_gradient_reduction_dtype_sets_the_bytes_on_the_wire():
    """training.grad_reduce_dtype: fp32 reductions move twice the bytes of bf16 ones; by default
    ZeRO 0-2 reduce as Megatron-LM (fp32 for bf16) and ZeRO-3 in the compute dtype (FSDP)."""
    from partita.simulator import dataparallel
    from partita.simulator.calibration import load_calibration
    from partita.simulator.context import resolve
    from partita.simulator.memory import reduce_bytes
    from partita.simulator.network import build_topology
    from partita.simulator.overheads import load_overheads
    from partita.simulator.stepenv import StepEnv
    from partita.planner.scenario import TrainingSpec
    assert reduce_bytes(TrainingSpec(global_batch=8, precision="bf16"), 1) == 4
    assert reduce_bytes(TrainingSpec(global_batch=8, precision="fp16"), 0) == 2
    assert reduce_bytes(TrainingSpec(global_batch=8, precision="bf16"), 3) == 2
    assert reduce_bytes(TrainingSpec(global_batch=8, precision="fp32"), 3) == 4
    assert reduce_bytes(TrainingSpec(global_batch=8, grad_reduce_dtype="fp32"), 3) == 4
    assert reduce_bytes(TrainingSpec(global_batch=8, grad_reduce_dtype="bf16"), 1) == 2
    catalog = load_catalog()
    cal = load_calibration()

    def reduction(dtype, zero=1):
        doc = small(tensor=1, pipeline=1, data=16, zero=zero)
        doc["training"]["grad_reduce_dtype"] = dtype
        ctx = resolve(parse_scenario(doc), catalog)
        env = StepEnv(ctx=ctx, topo=build_topology(ctx.system, cal), cal=cal, oh=load_overheads())
        return dataparallel.reduction_time(env, 1e9)

    assert reduction("auto") == reduction("fp32") > reduction("bf16")
    doc = small(tensor=1, pipeline=1, data=16, zero=3)
    doc["training"]["grad_reduce_dtype"] = "fp32"
    s = parse_scenario(doc)
    assert parse_scenario(s.to_dict()) == s
    slow, fast = simulate(s, catalog), simulate(parse_scenario(small(tensor=1, pipeline=1, data=16,
                                                                          zero=3)), catalog)
    assert slow.breakdown_s["fsdp_comm"] > fast.breakdown_s["fsdp_comm"]


def test_an_unknown_reduction_dtype_is_one_error_naming_the_choices(tmp_path, capsys):
    doc = small()
    doc["training"]["grad_reduce_dtype"] = "fp33"
    assert main(["simulate", write(tmp_path, "bad.yaml", doc)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert "training.grad_reduce_dtype: expected one of auto, fp32, bf16, fp16" in err[0]


def test_the_summary_names_the_shard_group_and_the_recomputed_blocks(tmp_path, capsys):
    doc = small(tensor=1, pipeline=1, data=16, zero=3, data_shard=8)
    doc["training"].update(recompute="full", recompute_num_layers=2)
    assert main(["simulate", write(tmp_path, "s.yaml", doc)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.endswith("ZeRO-3 in shards of 8, recompute full (2 blocks per chunk)")


def test_op_level_selective_recompute_lies_between_none_and_full(tmp_path, capsys):
    """torchtitan's op policy (recompute: selective-op) re-runs every second linear and the
    elementwise work: slower than none and faster than full, keeping more than full and less than
    none; like full recompute it repeats the forward's tensor-parallel collectives."""
    catalog = load_catalog()

    def run(mode, **parallel):
        doc = small(**parallel)
        doc["model"].update(arch="llama", kv_heads=8, ffn_hidden=2816)
        doc["training"]["recompute"] = mode
        return simulate(parse_scenario(doc), catalog)

    out = {m: run(m) for m in ("none", "selective-op", "full")}
    assert out["none"].step_time_s < out["selective-op"].step_time_s < out["full"].step_time_s
    assert out["none"].peak_memory_gib > out["selective-op"].peak_memory_gib > out["full"].peak_memory_gib
    assert 0 < out["selective-op"].breakdown_s["recompute"] < out["full"].breakdown_s["recompute"]
    tp = {m: out[m].details["chunk_parts_s"][0]["tp_comm"] for m in out}
    assert tp["selective-op"] == pytest.approx(tp["full"]) and tp["none"] < tp["full"]
    doc = small()
    doc["training"]["recompute"] = "selective-op"
    s = parse_scenario(doc)
    assert parse_scenario(s.to_dict()) == s and s.training.recomputed_blocks(8) == 0
    doc["training"]["recompute_num_layers"] = 2
    assert main(["simulate", write(tmp_path, "bad.yaml", doc)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "only with recompute full (recompute is selective-op" in err[0]
