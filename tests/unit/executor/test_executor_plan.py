"""The executor's per-rank plan, its data stream and its model chunks, all in one process (fast)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from partita.executor import stages
from partita.executor.data import DataSpec, TokenStream, check_token_file, replica_samples
from partita.executor.plan import Coords, execution_plan
from partita.executor.stages import Chunk, build_chunks, tied_groups
from partita.planner.errors import PartitaError
from partita.planner.scenario import parse_scenario

BASE = {
    "name": "t",
    "model": {"arch": "gpt", "layers": 4, "hidden": 32, "heads": 4, "seq_len": 16, "vocab": 128},
    "cluster": {"system": "local", "gpus": 8},
    "training": {"global_batch": 16, "micro_batch": 2, "precision": "fp32"},
    "parallel": {"tensor": 2, "pipeline": 2, "data": 2, "schedule": "1f1b"},
}


def scenario(**changes):
    d = json.loads(json.dumps(BASE))
    for path, value in changes.items():
        section, key = path.split("__")
        d[section][key] = value
    return parse_scenario(d)


def test_rank_order_is_megatron_tensor_fastest():
    plan = execution_plan(scenario(), 8)
    assert [plan.coords(r) for r in (0, 1, 2, 5, 7)] == [
        Coords(0, 0, 0), Coords(0, 0, 1), Coords(0, 1, 0), Coords(1, 0, 1), Coords(1, 1, 1)]
    assert all(plan.rank_of(plan.coords(r)) == r for r in range(8))
    assert plan.microbatches == 16 // (2 * 2)


def test_chunks_hold_embedding_first_and_head_last():
    plan = execution_plan(scenario(), 8)
    assert plan.chunks == ((0, 2), (2, 4))
    # pipeline_layers() = [embedding, block0..3, head]
    assert plan.layers_of(0) == (0, 1, 2) and plan.layers_of(1) == (3, 4, 5)


def test_interleaved_rank_holds_every_pth_chunk():
    s = scenario(parallel__schedule="interleaved-1f1b", parallel__virtual_stages=2,
                 parallel__tensor=1, cluster__gpus=4)
    plan = execution_plan(s, 4)
    assert plan.chunks == ((0, 1), (1, 2), (2, 3), (3, 4))
    assert plan.stages_of(0) == (0, 2) and plan.stages_of(1) == (1, 3)
    assert plan.layers_of(3) == (4, 5)


@pytest.mark.parametrize("data, zero, schedule, mode, noted", [
    (1, 3, "1f1b", "none", False),
    (2, 0, "1f1b", "all-reduce", False),
    (2, 1, "1f1b", "fsdp", True),
    (2, 2, "1f1b", "fsdp", False),
    (2, 3, "1f1b", "fsdp-reshard", False),
    (2, 3, "zero-bubble", "fsdp", True),
])
def test_data_parallel_mode_per_zero_stage(data, zero, schedule, mode, noted):
    s = scenario(parallel__data=data, parallel__zero=zero, parallel__schedule=schedule,
                 cluster__gpus=4 * data)
    plan = execution_plan(s, 4 * data)
    assert plan.data_parallel == mode and bool(plan.notes()) == noted
    assert plan.to_dict()["data_parallel"] == mode


def test_recompute_num_layers_is_carried_and_written_only_when_set():
    plan = execution_plan(scenario(training__recompute="full", training__recompute_num_layers=1), 8)
    assert plan.recompute == "full" and plan.recompute_num_layers == 1
    assert plan.to_dict()["recompute_num_layers"] == 1
    every = execution_plan(scenario(training__recompute="full"), 8)
    assert every.recompute_num_layers is None and "recompute_num_layers" not in every.to_dict()


def test_data_shard_is_carried_and_written_only_when_set():
    plan = execution_plan(scenario(parallel__data=4, parallel__zero=3, parallel__data_shard=2,
                                   cluster__gpus=16), 16)
    assert (plan.data_shard, plan.shard, plan.shard_replicas) == (2, 2, 2)
    assert plan.to_dict()["data_shard"] == 2 and plan.to_dict()["data_parallel"] == "fsdp-reshard"
    whole = execution_plan(scenario(parallel__zero=3), 8)
    assert (whole.data_shard, whole.shard, whole.shard_replicas) == (None, 2, 1)
    assert "data_shard" not in whole.to_dict()


HYBRID = {"parallel__data": 4, "parallel__zero": 3, "parallel__data_shard": 2}


def _mesh_groups(plan, dims: tuple[str, ...]) -> list[list[int]]:
    """The groups torch's device mesh (executor/parallel.py mesh_dims) forms over `dims`: every
    rank numbered row-major, as init_device_mesh numbers them."""
    from partita.executor.parallel import mesh_dims
    names, shape = mesh_dims(plan)
    grid = np.arange(plan.world).reshape(shape)
    axes = [names.index(d) for d in dims]
    moved = np.moveaxis(grid, axes, range(-len(axes), 0))
    size = int(np.prod([shape[a] for a in axes]))
    return sorted(sorted(g) for g in moved.reshape(-1, size).tolist())


@pytest.mark.parametrize("changes", [
    {"parallel__tensor": 2, "parallel__pipeline": 2, "cluster__gpus": 16},
    {"parallel__tensor": 1, "parallel__pipeline": 1, "parallel__context": 2, "cluster__gpus": 8},
])
def test_hybrid_shard_and_replica_groups_follow_the_rank_order(changes):
    plan = execution_plan(scenario(**HYBRID, **changes), changes["cluster__gpus"])
    rg = plan.ranks
    shards, replicas = plan.shard_groups(), plan.replica_groups()
    for groups in (shards, replicas):     # each rank in exactly one group of each kind
        assert sorted(r for g in groups for r in g) == list(range(plan.world))
    for g in shards:                      # 2 consecutive dp ranks x every cp rank, same tp and pp
        cs = [rg.coords(r) for r in g]
        assert len({(c["tp"], c["pp"], c["dp"] // 2) for c in cs}) == 1
        first = cs[0]["dp"] // 2 * 2
        assert sorted({c["dp"] for c in cs}) == [first, first + 1] and len(g) == 2 * plan.context
    for g in replicas:                    # one rank of each shard group: dp = s, s + 2
        cs = [rg.coords(r) for r in g]
        assert len({(c["tp"], c["cp"], c["pp"], c["dp"] % 2) for c in cs}) == 1 and len(g) == 2
    assert shards == _mesh_groups(plan, ("dp_shard", "cp"))     # what torch builds
    assert replicas == _mesh_groups(plan, ("dp_replicate",))


def test_hybrid_groups_of_tensor2_data4_shard2_pipeline2():
    plan = execution_plan(scenario(**HYBRID, cluster__gpus=16), 16)
    # rank = tp + 2 * (dp + 4 * pp)
    assert plan.shard_groups() == [[0, 2], [1, 3], [4, 6], [5, 7],
                                   [8, 10], [9, 11], [12, 14], [13, 15]]
    assert plan.replica_groups() == [[0, 4], [1, 5], [2, 6], [3, 7],
                                     [8, 12], [9, 13], [10, 14], [11, 15]]


@pytest.mark.parametrize("data_shard", [None, 4])
def test_without_hybrid_sharding_the_mesh_and_groups_are_the_whole_data_group(data_shard):
    from partita.executor.parallel import mesh_dims
    plan = execution_plan(scenario(parallel__data=4, parallel__zero=1,
                                   parallel__data_shard=data_shard, cluster__gpus=16), 16)
    assert mesh_dims(plan) == plan.ranks.mesh(("pp", "dp", "cp", "tp"))
    assert plan.shard_groups() == plan.ranks.groups("dp")
    assert plan.replica_groups() == [[r] for r in range(16)]


def test_explicit_stages_are_used():
    s = scenario(parallel__stages=[[0, 1], [1, 4]])
    assert execution_plan(s, 8).chunks == ((0, 1), (1, 4))


@pytest.mark.parametrize("changes, message", [
    ({"parallel__context": 2, "cluster__gpus": 16, "model__arch": "t5"},
     "parallel.context = 2: partita run does not shard T5's chain by sequence"),
    ({"parallel__context": 4, "cluster__gpus": 32, "model__seq_len": 36},
     "model.seq_len (36) must be a multiple of 2 x context (8)"),
    ({"parallel__sequence_parallel": True, "model__arch": "t5"}, "does not shard T5's chain"),
    ({"training__precision": "fp8"}, "executes fp32, tf32, fp16, bf16 (fp8 needs Transformer"),
    ({"model__kv_heads": 1}, "must divide model.kv_heads (1)"),
    ({"training__global_batch": 4}, "1f1b needs micro-batches per replica (1) >= pipeline (2)"),
    ({"parallel__stages": [[0, 2], [2, 5]]}, "ends at layer 5, but the model has 4 layers"),
    ({"model__arch": "bert", "model__mlm_predictions": 4},
     "model.mlm_predictions = 4: partita run's BERT runs its MLM head on every position"),
])
def test_plans_the_executor_cannot_run(changes, message):
    with pytest.raises(PartitaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        execution_plan(scenario(**changes), scenario(**changes).parallel.gpus)


def test_degrees_must_match_processes():
    with pytest.raises(PartitaError, match="= 8, but cluster has 4 GPUs"):
        execution_plan(scenario(), 4)


def test_synthetic_stream_is_a_function_of_the_sample_index():
    spec = DataSpec("gpt", seq_len=16, vocab=128, seed=3)
    whole = TokenStream(spec).batch(32, 16)
    parts = [TokenStream(spec).batch(*replica_samples(2, 16, 2, d)) for d in range(2)]
    assert np.array_equal(np.concatenate([p[0] for p in parts]), whole[0])
    ids, targets = whole
    assert ids.shape == (16, 16) and np.array_equal(ids[:, 1:], targets[:, :-1])
    assert not np.array_equal(TokenStream(DataSpec("gpt", 16, 128, seed=4)).batch(32, 16)[0], ids)


def test_t5_and_bert_examples_follow_the_models_conventions():
    ids, targets = TokenStream(DataSpec("t5", seq_len=8, vocab=50)).batch(0, 2)
    assert ids.shape == (2, 16) and targets.shape == (2, 8)
    assert (ids[:, 8] == 0).all() and np.array_equal(ids[:, 9:], targets[:, :-1])
    ids, targets = TokenStream(DataSpec("bert", seq_len=64, vocab=50)).batch(0, 4)
    changed = (ids != targets).mean()
    assert ids.shape == targets.shape == (4, 64) and 0.03 < changed < 0.25


def test_token_files_bin_and_npy(tmp_path):
    tokens = np.arange(200, dtype=np.uint16) % 100
    tokens.tofile(tmp_path / "t.bin")
    np.save(tmp_path / "t.npy", tokens.astype(np.int32))
    for name in ("t.bin", "t.npy"):
        spec = DataSpec("llama", seq_len=16, vocab=100, path=str(tmp_path / name))
        assert check_token_file(spec) == 200
        ids, targets = TokenStream(spec).batch(1, 2)
        assert ids[0].tolist() == list(range(16, 32)) and targets[1].tolist() == list(range(33, 49))


def _write(path, data):
    if isinstance(data, bytes):
        path.write_bytes(data)
    elif path.suffix == ".npy":
        np.save(path, data)
    else:
        data.tofile(path)
    return path


@pytest.mark.parametrize("name, data, message", [
    ("missing.bin", None, "no such file"),
    ("tokens.txt", b"1 2 3", "unknown token file type '.txt'"),
    ("tokens.bin", b"\x01\x00\x02", "3 bytes is not a whole number of uint16 tokens"),
    ("tokens.bin", np.arange(10, dtype=np.uint16), "10 tokens, fewer than one gpt sample needs"),
    ("tokens.bin", np.arange(100, dtype=np.uint16) + 60, r"token ids span \[60, 159\]"),
    ("tokens.npy", np.zeros((4, 40), dtype=np.int64), "expected a 1-D integer array"),
])
def test_bad_token_files(tmp_path, name, data, message):
    path = tmp_path / name if data is None else _write(tmp_path / name, data)
    with pytest.raises(PartitaError, match=message):
        check_token_file(DataSpec("gpt", seq_len=16, vocab=128, path=str(path)))


def test_tied_embedding_across_stages_is_one_group():
    from partita.planner.models import build_model
    plan = execution_plan(scenario(), 8)
    model = build_model(scenario().model.resolve(), device="meta")
    assert tied_groups(model, plan)[0].names == ("embedding.tok.weight", "head.lm_head.weight")
    assert tied_groups(model, plan)[0].stages == (0, 1)
    llama = scenario(model__arch="llama", model__ffn_hidden=64)
    assert tied_groups(build_model(llama.model.resolve(), device="meta"),
                       execution_plan(llama, 8)) == []


def test_chunks_of_one_rank_get_their_own_copy_of_a_tied_weight():
    s = scenario(parallel__tensor=1, parallel__pipeline=1, parallel__data=1, cluster__gpus=1,
                 parallel__schedule="interleaved-1f1b", parallel__virtual_stages=2)
    plan = execution_plan(s, 1)
    chunks, groups, _ = build_chunks(plan, s.model.resolve(), plan.stages_of(0),
                                     torch.device("cpu"), seed=0)
    emb = chunks[0].layers[0].tok.weight
    head = chunks[1].layers[-1].lm_head.weight
    assert emb is not head and torch.equal(emb, head)
    assert groups[0].stages == (0, 1)
    assert chunks[1].model_name("layers.2.lm_head.weight") == "head.lm_head.weight"


def test_chunks_chain_to_the_whole_model():
    from partita.planner.models import build_model
    s = scenario(parallel__tensor=1, parallel__data=1, cluster__gpus=2)
    plan = execution_plan(s, 2)
    chunks = [build_chunks(plan, s.model.resolve(), (st,), torch.device("cpu"), seed=5)[0][0]
              for st in range(2)]
    model = build_model(s.model.resolve(), seed=5)
    ids = torch.randint(0, 128, (2, 16))
    torch.testing.assert_close(chunks[1](chunks[0](ids)), model(ids), rtol=0, atol=0)


@pytest.mark.parametrize("recompute, num_layers, checkpointed", [
    ("full", 1, 1), ("full", None, 3), ("full", 5, 3), ("selective", None, 3),
    ("selective-op", None, 3), ("none", None, 0)])
def test_full_recompute_checkpoints_the_first_n_blocks(recompute, num_layers, checkpointed,
                                                       monkeypatch):
    from partita.planner.models import build_model
    dims = scenario(model__layers=3).model.resolve()
    calls = []

    def counting(block, *args, **kwargs):
        calls.append(block)
        return torch.utils.checkpoint.checkpoint(block, *args, **kwargs)

    monkeypatch.setattr(stages, "checkpoint", counting)
    ids, targets = torch.randint(0, 128, (2, 2, 16), generator=torch.Generator().manual_seed(1))
    runs = []
    for mode, n in ((recompute, num_layers), ("none", None)):
        model = build_model(dims, seed=3)
        chunk = Chunk(0, model.pipeline_layers(), model.layer_names(), recompute=mode,
                      precision="fp32", device_type="cpu", recompute_num_layers=n)
        out = chunk(ids)
        model.loss(out, targets).backward()
        runs.append((chunk, out.detach(), {k: p.grad for k, p in chunk.named_parameters()}))
    (chunk, out, grads), (_, want_out, want_grads) = runs[0], runs[1]
    assert chunk.names[1:-1] == ["block.0", "block.1", "block.2"]
    assert [list(chunk.layers).index(b) for b in calls] == [1, 2, 3][:checkpointed]
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    assert grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-6, atol=0, msg=name)


@pytest.mark.parametrize("arch", ["llama", "gpt"])
def test_op_policy_keeps_every_other_linear_and_the_attention_kernel(arch):
    """recompute selective-op (torchtitan's op policy): in a block's forward the 1st, 3rd, ...
    linear and the attention kernel are kept, the rest recomputed; gradients are unchanged."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    from partita.planner import inventory
    from partita.planner.models import build_model
    extra = {"model__ffn_hidden": 64, "model__kv_heads": 2} if arch == "llama" else {}
    dims = scenario(model__layers=2, model__arch=arch, **extra).model.resolve()
    model = build_model(dims, seed=3)
    block = model.pipeline_layers()[1]
    x = torch.randn(2, 16, dims.hidden, requires_grad=True)
    decisions = []
    policy = stages.op_policy()

    def logged(ctx, op, *args, **kwargs):
        out = policy(ctx, op, *args, **kwargs)
        if not ctx.is_recompute and (op in stages.LINEAR_OPS or op in stages.ATTENTION_OPS):
            decisions.append(("attention" if op in stages.ATTENTION_OPS else "linear",
                              out == CheckpointPolicy.MUST_SAVE))
        return out

    out = torch.utils.checkpoint.checkpoint(
        block, x, use_reentrant=False,
        context_fn=lambda: create_selective_checkpoint_contexts(logged))
    out.square().sum().backward()
    linears = [kept for kind, kept in decisions if kind == "linear"]
    saved, _ = inventory.op_policy_split(inventory.block_linears(dims))
    assert linears == [i % 2 == 0 for i in range(len(inventory.block_linears(dims)))]
    assert sum(linears) == len(saved)
    assert ("attention", True) in decisions
    got = {k: p.grad.clone() for k, p in block.named_parameters()} | {"x": x.grad.clone()}
    block.zero_grad()
    x.grad = None
    block(x).square().sum().backward()
    want = {k: p.grad for k, p in block.named_parameters()} | {"x": x.grad}
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-6, atol=1e-7, msg=name)
