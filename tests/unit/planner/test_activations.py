"""Activation bytes (planner/activations.py): the two accountings of the inventory's layers, and
the planner's profile and the simulator's memory summing the same list of layers."""
from __future__ import annotations

import pytest

from partita.planner import inventory
from partita.planner.activations import (MEGATRON, MODULES, ActivationSettings,
                                         block_activation_bytes)
from partita.planner.costmodel import analytic_profile
from partita.planner.modelspec import TransformerDims, preset_dims
from partita.simulator.calibration import load_calibration
from partita.simulator.memory import stage_memory

GPT = TransformerDims(arch="gpt", layers=4, hidden=256, heads=8, seq_len=128, vocab=1024)


def test_modules_accounting_is_counted_unsplit_without_recompute():
    layer = inventory.layers(GPT)[1]
    for split in (dict(tensor=2), dict(context=2), dict(sequence_parallel=True),
                  dict(recompute="selective")):
        with pytest.raises(ValueError, match="unsplit without recompute"):
            MODULES.layer_bytes(GPT, layer, ActivationSettings(micro_batch=1, precision="bf16", **split))


def test_the_accountings_differ_by_what_each_implementation_saves():
    """A GPT block at 16-bit: Megatron keeps 34 sbh (two 1-byte dropout masks), partita's modules
    32 sbh plus the fp32 norm statistics (16 bytes a token); both keep the fp32 log-sum-exp."""
    s = ActivationSettings(micro_batch=2, precision="bf16")
    block = inventory.layers(GPT)[1]
    tokens = 2 * GPT.seq_len
    lse = 4 * GPT.heads * tokens
    assert MEGATRON.layer_bytes(GPT, block, s) == 34 * tokens * GPT.hidden + lse
    assert MODULES.layer_bytes(GPT, block, s) == 32 * tokens * GPT.hidden + 16 * tokens + lse


@pytest.mark.parametrize("name", ["gpt2-medium", "llama2-7b", "bert-large", "t5-base"])
def test_megatron_blocks_are_the_korthikanti_block(name):
    d = preset_dims(name)
    s = ActivationSettings(micro_batch=2, precision="bf16", tensor=2, sequence_parallel=True,
                           recompute="selective")
    for layer in inventory.layers(d)[1:-1]:
        assert MEGATRON.layer_bytes(d, layer, s) == block_activation_bytes(
            d, 2, tp=2, sp=True, recompute="selective", decoder=layer.kind == "decoder")


def test_memory_and_profile_sum_the_same_layers():
    """With the modules accounting, one rank holding the whole model keeps, per micro-batch, the
    analytic profile's activation bytes: the embedding and blocks as activations, the head's under
    `other` (logits)."""
    profile = analytic_profile(GPT, micro_batch=2, precision="bf16")
    mem = stage_memory(GPT, micro_batch=2, precision="bf16", optimizer="adam", recompute="none",
                       cal=load_calibration(), activation_model=MODULES)
    *kept, head = profile.layers
    assert mem.activations == sum(l.activation_bytes for l in kept)
    assert mem.details["logits"] == head.activation_bytes


def test_gathered_mlm_head_keeps_the_masked_rows_only():
    """BERT with `mlm_predictions`: the head's matmuls, inputs and fp32 logits are those of the
    gathered positions; the blocks keep every position."""
    every = TransformerDims(arch="bert", layers=2, hidden=256, heads=8, seq_len=128, vocab=1024)
    gathered = TransformerDims(**{**every.to_dict(), "mlm_predictions": 20})
    s = ActivationSettings(micro_batch=2, precision="bf16")
    head_all, head_20 = inventory.layers(every, micro_batch=2)[-1], inventory.layers(gathered, micro_batch=2)[-1]
    assert [g.m for g in head_20.gemms] == [2 * 20] * len(head_all.gemms)
    assert head_20.fwd_flops * 128 == head_all.fwd_flops * 20
    for accounting in (MEGATRON, MODULES):
        assert accounting.layer_bytes(gathered, head_20, s) * 128 == pytest.approx(
            accounting.layer_bytes(every, head_all, s) * 20, rel=1e-3)
        block = inventory.layers(gathered)[1]
        assert accounting.layer_bytes(gathered, block, s) == accounting.layer_bytes(every, block, s)
