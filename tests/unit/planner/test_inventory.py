"""The model-cost inventory (planner/inventory.py): its layers hold the torch models' parameters,
and the planner's and the simulator's statistics are sums over its one list of layers."""
from __future__ import annotations

import pytest

from partita.planner import costmodel, inventory
from partita.planner.modelspec import TransformerDims, preset_dims
from partita.simulator import compute, memory

SMALL = {
    "gpt": TransformerDims(arch="gpt", layers=3, hidden=16, heads=4, seq_len=8, vocab=32),
    "llama": TransformerDims(arch="llama", layers=3, hidden=16, heads=4, kv_heads=2, ffn_hidden=24,
                             seq_len=8, vocab=32),
    "bert": TransformerDims(arch="bert", layers=2, hidden=16, heads=4, seq_len=8, vocab=32),
    "t5": TransformerDims(arch="t5", layers=2, decoder_layers=3, hidden=16, heads=4, seq_len=8,
                          vocab=32),
}


@pytest.mark.parametrize("arch", sorted(SMALL))
def test_each_layer_holds_the_torch_layers_parameters(arch):
    """Per pipeline layer, the inventory's tensors add up to the parameters the torch layer holds
    that no earlier layer holds (a tied head is the embedding's table; T5's relative position bias
    is one module shared by a stack's blocks)."""
    pytest.importorskip("torch")
    from partita.planner.models import build_model
    d = SMALL[arch]
    model = build_model(d, device="meta")
    seen: set[int] = set()
    layers = inventory.layers(d)
    assert [l.name for l in layers] == model.layer_names()
    for layer, module in zip(layers, model.pipeline_layers()):
        new = [p for p in module.parameters() if id(p) not in seen]
        seen.update(id(p) for p in new)
        assert layer.params == sum(p.numel() for p in new), layer.name
    assert inventory.total_params(d) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch", sorted(SMALL))
def test_statistics_are_sums_over_the_list(arch):
    d = SMALL[arch]
    layers = inventory.layers(d, micro_batch=2)
    assert costmodel.total_params(d) == sum(l.params for l in layers)
    assert [p for _, _, p in costmodel.layer_params(d)] == [l.params for l in inventory.layers(d)]
    profile = costmodel.analytic_profile(d, micro_batch=2, precision="bf16")
    assert [lp.fwd_flops for lp in profile.layers] == [float(l.fwd_flops) for l in layers]
    assert costmodel.model_flops_per_step(d, 5) == 5 * sum(3 * l.fwd_flops for l in inventory.layers(d))
    # the simulator: repeated blocks, the embedding and head split into vocab tables and the rest
    word, replicated = memory.embedding_parameters(d)
    table, extra = memory.head_parameters(d)
    blocks = (d.layers * memory.block_parameters(d)
              + d.decoder_layers * (memory.block_parameters(d, decoder=True) if arch == "t5" else 0))
    t5_bias = 2 * inventory.T5_BUCKETS * d.heads if arch == "t5" else 0   # not counted in memory
    assert word + replicated + blocks + table + extra == costmodel.total_params(d) - t5_bias
    for decoder in ((False, True) if arch == "t5" else (False,)):
        assert sum(memory.block_parameter_tensors(d, decoder=decoder)) == memory.block_parameters(
            d, decoder=decoder)


@pytest.mark.parametrize("tensor,context", [(1, 1), (2, 1), (4, 2)])
def test_the_compute_model_times_the_inventorys_gemms(tensor, context):
    d = preset_dims("llama2-7b")
    block = inventory.block(d, micro_batch=2, tensor=tensor, context=context)
    assert compute.block_gemms(d, 2, tensor, context) == list(block.gemms)
    # the attention core is the flash kernel's: 4 b (heads/tp) (s/cp) s hd
    assert sum(g.flops for g in block.attention) == compute.attention_flops(
        2, d.heads // tensor, d.seq_len // context, d.seq_len, d.head_dim)
    whole = inventory.block(d, micro_batch=2)
    assert block.fwd_flops * tensor * context == whole.fwd_flops


def test_tensor_parallel_splits_shrink_the_gemms_not_the_parameters():
    d = preset_dims("gpt2")
    one, four = inventory.block(d, tensor=1), inventory.block(d, tensor=4)
    assert one.tensors == four.tensors
    assert sum(g.flops for g in four.gemms) * 4 == sum(g.flops for g in one.gemms)
    with pytest.raises(ValueError, match="block kind"):
        inventory.block(d, kind="mlp")


@pytest.mark.parametrize("arch", sorted(SMALL))
def test_block_linears_are_the_torch_blocks_linears_in_forward_order(arch):
    """`block_linears` lists the linear layers a block runs, in the order its torch forward runs
    them (what op-level selective checkpointing counts), and does the work of the fused GEMMs."""
    torch = pytest.importorskip("torch")
    from partita.planner.models import build_model
    d = SMALL[arch]
    model = build_model(d, device="meta")
    ran: list[tuple[int, int]] = []
    for layer in model.pipeline_layers()[1:]:
        for module in layer.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_hook(
                    lambda m, args, out: ran.append((m.out_features, m.in_features)))
    ids = torch.zeros((2, d.seq_len), dtype=torch.long, device="meta")
    model(ids)
    want = [(g.n, g.k) for kind, count in (("encoder" if arch == "t5" else "block", d.layers),
                                           ("decoder", d.decoder_layers)) if count
            for _ in range(count) for g in inventory.block_linears(d, kind=kind)]
    head = [(m.out_features, m.in_features) for m in model.pipeline_layers()[-1].modules()
            if isinstance(m, torch.nn.Linear)]
    assert ran == want + head
    for kind in ("block",) if arch != "t5" else ("encoder", "decoder"):
        fused = inventory.block(d, kind=kind, micro_batch=3, tensor=1)
        split = inventory.block_linears(d, kind=kind, micro_batch=3)
        assert sum(g.flops for g in split) == sum(g.flops for g in fused.gemms)


def test_op_policy_keeps_the_first_of_every_two_linears():
    names = [g.name for g in inventory.block_linears(SMALL["llama"])]
    saved, redone = inventory.op_policy_split(inventory.block_linears(SMALL["llama"]))
    assert names == ["attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down"]
    assert [g.name for g in saved] == ["attn.q", "attn.v", "mlp.gate", "mlp.down"]
    assert [g.name for g in redone] == ["attn.k", "attn.o", "mlp.up"]
    t5 = [g.name for g in inventory.op_policy_split(
        inventory.block_linears(SMALL["t5"], kind="decoder"))[1]]
    assert t5 == ["attn.k", "attn.o", "cross_attn.k", "cross_attn.o", "mlp.down"]
    with pytest.raises(ValueError, match="block kind"):
        inventory.block_linears(SMALL["gpt"], kind="stem")
