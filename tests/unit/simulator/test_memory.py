"""Per-GPU memory: Megatron's theoretical-memory formulas by hand, Korthikanti's activation terms,
ZeRO sharding, pipeline schedules' in-flight micro-batches, and bad input."""
from __future__ import annotations

import pytest

from partita.planner.activations import block_activation_bytes
from partita.planner.errors import PartitaError
from partita.planner.modelspec import TransformerDims, preset_dims
from partita.planner.scenario import ParallelSpec, TrainingSpec
from partita.simulator.calibration import load_calibration
from partita.simulator.memory import (activation_microbatches, block_parameters, bytes_per_parameter,
                                      embedding_parameters, pipeline_memory, stage_memory)

GPT = TransformerDims(arch="gpt", layers=24, hidden=2048, heads=16, seq_len=2048, vocab=51200)
LLAMA = preset_dims("llama2-7b")


@pytest.fixture(scope="module")
def cal():
    return load_calibration(include_local=False)


def megatron_weight_and_optimizer(d: TransformerDims, tp: int, pp: int, dp: int,
                                  distributed_optimizer: bool) -> float:
    """megatron/training/theoretical_memory_usage.py, compute_weight_and_optimizer_memory, by hand
    for a llama (RMSNorm, SwiGLU, untied) model."""
    h, a, g = d.hidden, d.heads, d.kv_heads
    layer = 2 * h * (d.ffn_hidden * 3 / 2 + 1) + 2 * h * h * (1 + g / a)
    block = layer * d.layers + h                             # + final layernorm
    embedding = h * d.vocab
    shard = (block / pp + embedding) / tp
    if pp == 1:
        shard += embedding / tp                              # untied output layer
    per_param = 6 + 12 / dp if distributed_optimizer else 18
    return shard * per_param


@pytest.mark.parametrize("tp,pp,dp,zero", [(1, 1, 1, 0), (2, 4, 8, 1), (8, 2, 4, 0), (4, 1, 16, 1)])
def test_weights_and_optimizer_match_megatron(cal, tp, pp, dp, zero):
    m = stage_memory(LLAMA, micro_batch=1, precision="bf16", optimizer="adam", recompute="none",
                     cal=cal, tp=tp, dp=dp, zero=zero, pipeline=pp, blocks=LLAMA.layers // pp,
                     first=True, last=(pp == 1))
    ours = m.parameters + m.gradients + m.optimizer
    expect = megatron_weight_and_optimizer(LLAMA, tp, pp, dp, zero == 1)
    # Megatron's formula spreads the final norm over all stages and TP ranks (h / (pp * tp) here);
    # it lives, replicated, on the last stage only.
    per_param = 6 + 12 / dp if zero == 1 else 18
    expect += per_param * ((LLAMA.hidden if pp == 1 else 0) - LLAMA.hidden / (pp * tp))
    assert ours == pytest.approx(expect, rel=1e-12)


def test_megatron_block_parameters_by_hand():
    h, f = GPT.hidden, GPT.ffn_hidden
    assert block_parameters(GPT) == 12 * h * h + 13 * h            # 4h^2 + 8h^2 weights, biases, LNs
    h, f = LLAMA.hidden, LLAMA.ffn_hidden
    assert block_parameters(LLAMA) == 4 * h * h + 3 * h * f + 2 * h


@pytest.mark.parametrize("name", ["gpt2", "llama2-70b", "bert-large"])
def test_block_parameters_agree_with_the_cost_model(name):
    from partita.planner.costmodel import layer_params
    dims = preset_dims(name)
    blocks = {p for _, kind, p in layer_params(dims) if kind == "block"}
    assert blocks == {block_parameters(dims)}


@pytest.mark.parametrize("name", ["gpt2", "llama2-70b", "bert-large", "t5-3b"])
def test_parameter_tensors_add_up_to_the_block(name):
    from partita.simulator.memory import block_parameter_tensors
    dims = preset_dims(name)
    for decoder in (False, True) if dims.arch == "t5" else (False,):
        assert sum(block_parameter_tensors(dims, decoder=decoder)) == block_parameters(
            dims, decoder=decoder)


def test_activations_match_megatron_with_sequence_parallel(cal):
    """compute_activation_memory (SP + selective), first pipeline stage, 1F1B with m >= p."""
    tp, pp, m = 4, 4, 16
    s, b, h, L = GPT.seq_len, 2, GPT.hidden, GPT.layers
    expect = (s * b * h * (18 + 4 * GPT.ffn_hidden / h) * L + 8 * s * b * pp + s * b * h * pp) / tp
    expect += 8 * s * b * pp * (1 - 1 / tp)     # token ids are replicated, not split over TP ranks
    training = TrainingSpec(global_batch=b * m, micro_batch=b, recompute="selective")
    parallel = ParallelSpec(tensor=tp, pipeline=pp, sequence_parallel=True)
    first = pipeline_memory(GPT, training, parallel, cal, flash_attention=False)[0]
    assert first.activations == pytest.approx(expect)


def test_interleaved_penalty_matches_megatron(cal):
    tp, pp, v, m = 2, 4, 3, 8
    s, b, h, L = GPT.seq_len, 1, GPT.hidden, GPT.layers
    penalty = 1 + (pp - 1) / (pp * v)
    expect = (s * b * h * 34 * L + 8 * s * b * pp + s * b * h * pp) * penalty / tp
    expect += 8 * s * b * pp * penalty * (1 - 1 / tp)     # token ids are replicated over TP ranks
    training = TrainingSpec(global_batch=m, recompute="selective")
    parallel = ParallelSpec(tensor=tp, pipeline=pp, sequence_parallel=True,
                            schedule="interleaved-1f1b", virtual_stages=v)
    first = pipeline_memory(GPT, training, parallel, cal, flash_attention=False)[0]
    assert first.activations == pytest.approx(expect)


def test_korthikanti_per_layer_terms():
    s, b, h, a = GPT.seq_len, 1, GPT.hidden, GPT.heads
    sbh = s * b * h
    kw = dict(precision="bf16", flash_attention=False)
    assert block_activation_bytes(GPT, b, recompute="none", **kw) == pytest.approx(
        sbh * (34 + 5 * a * s / h))
    for t in (2, 8):
        assert block_activation_bytes(GPT, b, tp=t, recompute="none", **kw) == pytest.approx(
            sbh * (10 + 24 / t + 5 * a * s / (h * t)))
        assert block_activation_bytes(GPT, b, tp=t, sp=True, recompute="none", **kw) == pytest.approx(
            sbh * (34 + 5 * a * s / h) / t)
        assert block_activation_bytes(GPT, b, tp=t, recompute="selective", **kw) == pytest.approx(
            sbh * (10 + 24 / t))
        assert block_activation_bytes(GPT, b, tp=t, recompute="full", **kw) == pytest.approx(2 * sbh)
        assert block_activation_bytes(GPT, b, tp=t, sp=True, recompute="full", **kw) == pytest.approx(
            2 * sbh / t)


def test_flash_attention_never_stores_scores():
    flash_none = block_activation_bytes(GPT, 1, recompute="none")
    flash_sel = block_activation_bytes(GPT, 1, recompute="selective")
    plain_sel = block_activation_bytes(GPT, 1, recompute="selective", flash_attention=False)
    assert flash_none == flash_sel
    assert flash_sel - plain_sel == pytest.approx(4 * GPT.heads * GPT.seq_len)   # logsumexp only


def test_eager_fp32_softmax_keeps_its_output_at_four_bytes():
    """Korthikanti's 5 bytes per score (16-bit softmax output 2, dropout mask 1, dropout output 2)
    become 7 when eager attention soft-maxes in fp32; in fp32 training nothing changes."""
    s, h, a = GPT.seq_len, GPT.hidden, GPT.heads
    kw = dict(recompute="none", flash_attention=False)
    plain = block_activation_bytes(GPT, 1, precision="bf16", **kw)
    fp32_softmax = block_activation_bytes(GPT, 1, precision="bf16", softmax_fp32=True, **kw)
    assert fp32_softmax - plain == pytest.approx(s * h * 2 * a * s / h)
    assert block_activation_bytes(GPT, 1, precision="fp32", softmax_fp32=True, **kw) == \
        block_activation_bytes(GPT, 1, precision="fp32", **kw)
    cal = load_calibration()
    training = TrainingSpec(global_batch=8, micro_batch=1, precision="bf16", attention="eager",
                            attention_softmax_fp32=True)
    parallel = ParallelSpec(tensor=1, pipeline=1, data=8)
    eager = pipeline_memory(GPT, training, parallel, cal, flash_attention=False)[0]
    plain_training = TrainingSpec(global_batch=8, micro_batch=1, precision="bf16", attention="eager")
    base = pipeline_memory(GPT, plain_training, parallel, cal, flash_attention=False)[0]
    assert eager.activations - base.activations == pytest.approx(
        GPT.layers * s * 2 * a * s)


def test_a_fused_loss_keeps_the_logits_at_their_own_precision():
    cal = load_calibration()
    parallel = ParallelSpec(tensor=1, pipeline=1, data=8)
    plain = pipeline_memory(GPT, TrainingSpec(global_batch=8, micro_batch=1, precision="bf16"),
                            parallel, cal)[0]
    fused = pipeline_memory(GPT, TrainingSpec(global_batch=8, micro_batch=1, precision="bf16",
                                              fused_cross_entropy=True), parallel, cal)[0]
    assert plain.details["logits"] - fused.details["logits"] == pytest.approx(
        GPT.seq_len * GPT.vocab * (4 - 2))


@pytest.mark.parametrize("framework, precision, fused, per_logit", [
    ("megatron", "bf16", False, 4 + 2),      # 16-bit logits beside their fp32 copy; in place after
    ("megatron", "fp32", False, 4),          # the cast copies nothing
    ("deepspeed", "fp16", False, 4 + 2),     # Megatron-DeepSpeed runs Megatron's cross-entropy
    ("fsdp", "bf16", False, 2 + 12),         # 16-bit logits, fp32 log-softmax and two gradients
    ("fsdp", "fp32", False, 4 + 12),
    ("fsdp", "bf16", True, 2),               # fused: the logits at their precision, in place
])
def test_the_loss_peak_per_logit(cal, framework, precision, fused, per_logit):
    """The cross-entropy's peak beyond the head's kept logits (4 bytes, e when fused), once per
    stage holding the head, by the framework's loss form (data/frameworks.yaml `loss`)."""
    m = stage_memory(GPT, micro_batch=2, precision=precision, optimizer="adam", recompute="none",
                     cal=cal, tp=2, framework=framework, fused_loss=fused)
    kept = (2 if precision == "bf16" else 4) if fused else 4
    logits = 2 * GPT.seq_len * GPT.vocab / 2
    assert m.details["loss_peak"] == pytest.approx(logits * (per_logit - kept))
    none = stage_memory(GPT, micro_batch=2, precision=precision, optimizer="adam",
                        recompute="none", cal=cal, tp=2, framework=framework, fused_loss=fused,
                        last=False)
    assert "loss_peak" not in none.details


def test_fp32_doubles_the_two_byte_terms():
    sbh = GPT.seq_len * GPT.hidden
    kw = dict(recompute="selective", flash_attention=False)
    assert block_activation_bytes(GPT, 1, precision="fp32", **kw) == pytest.approx(sbh * (2 * 32 + 2))


def test_context_parallel_divides_activations():
    one = block_activation_bytes(GPT, 1, recompute="selective")
    assert block_activation_bytes(GPT, 1, cp=4, recompute="selective") == pytest.approx(one / 4)


def test_bytes_per_parameter():
    assert bytes_per_parameter("bf16", "adam", 0, 1) == (2, 4, 12)
    assert bytes_per_parameter("bf16", "sgd", 0, 1) == (2, 4, 8)
    assert bytes_per_parameter("fp32", "adam", 0, 1) == (4, 4, 8)
    assert bytes_per_parameter("bf16", "adam", 1, 8) == (2, 4, 1.5)
    assert bytes_per_parameter("bf16", "adam", 2, 8) == (2, 0.25, 1.5)
    # ZeRO-3: (2 + 2 + K) psi / N_d (Rajbhandari et al. 2020)
    assert sum(bytes_per_parameter("bf16", "adam", 3, 64)) == pytest.approx((2 + 2 + 12) / 64)


def test_zero3_divides_all_three_by_the_data_group(cal):
    kw = dict(micro_batch=1, precision="bf16", optimizer="adam", recompute="full", cal=cal, zero=3)
    one = stage_memory(GPT, dp=1, **kw)
    many = stage_memory(GPT, dp=8, cp=2, **kw)
    for key in ("parameters", "gradients", "optimizer"):
        assert getattr(many, key) == pytest.approx(getattr(one, key) / 16)
    assert many.activations == pytest.approx(one.activations / 2)       # cp halves the sequence
    assert many.details["zero3_gathered"] == pytest.approx(2 * block_parameters(GPT) * 2)


def test_gpipe_holds_at_least_what_1f1b_holds(cal):
    for p, m in ((4, 8), (8, 8), (4, 2)):
        for rank in range(p):
            gpipe = activation_microbatches("gpipe", p, m, rank)
            one_f = activation_microbatches("1f1b", p, m, rank)
            assert gpipe >= one_f
            assert one_f == min(p - rank, m)
            assert activation_microbatches("zero-bubble", p, m, rank) == one_f
    # interleaved, first rank: p (1 + (p-1)/(pv)) chunks' worth, capped at all m micro-batches
    assert activation_microbatches("interleaved-1f1b", 4, 8, 0, 2) == 4 + 3 / 2
    assert activation_microbatches("interleaved-1f1b", 8, 8, 0, 2) == 8
    training = TrainingSpec(global_batch=16)
    for schedule in ("1f1b", "gpipe"):
        mems = pipeline_memory(GPT, training, ParallelSpec(pipeline=4, schedule=schedule), cal)
        if schedule == "1f1b":
            one_f = [x.activations for x in mems]
        else:
            assert all(g >= o for g, o in zip((x.activations for x in mems), one_f))
    assert one_f == sorted(one_f, reverse=True)


def test_embedding_placement(cal):
    word, _ = embedding_parameters(GPT)
    kw = dict(micro_batch=1, precision="bf16", optimizer="adam", recompute="full", cal=cal)
    alone = stage_memory(GPT, **kw)
    last = stage_memory(GPT, blocks=0, first=False, last=True, pipeline=2, **kw)
    middle = stage_memory(GPT, blocks=0, first=False, last=False, pipeline=2, **kw)
    assert alone.details["parameter_count"] == GPT.layers * block_parameters(GPT) + word \
        + GPT.max_positions * GPT.hidden + 2 * GPT.hidden
    assert last.details["parameter_count"] == word + 2 * GPT.hidden   # tied copy + final LN
    assert middle.details["parameter_count"] == 0
    untied = stage_memory(LLAMA, blocks=0, first=False, last=True, pipeline=2, **kw)
    assert untied.details["parameter_count"] == LLAMA.vocab * LLAMA.hidden + LLAMA.hidden


def test_logits_and_framework_reserve(cal):
    m = stage_memory(GPT, micro_batch=2, precision="bf16", optimizer="adam", recompute="full",
                     cal=cal, tp=2)
    tokens = 2 * GPT.seq_len
    assert m.details["logits"] == pytest.approx(2 * 2 * tokens * GPT.hidden + 4 * tokens * GPT.vocab / 2)
    allocated = m.allocated_bytes
    mem = cal.memory
    reserve = (mem.cuda_context_bytes + mem.communication_buffers_bytes
               + mem.fragmentation_fraction * allocated)
    assert m.details["framework_reserve"] == pytest.approx(reserve, rel=1e-6)
    assert abs(m.total_bytes - sum(m.breakdown().values())) <= len(m.breakdown())   # rounding
    # DeepSpeed adds its own buffers (memory.yaml framework_buffers_gib), Megatron-LM none
    ds = stage_memory(GPT, micro_batch=2, precision="fp16", optimizer="adam", recompute="full",
                      cal=cal, tp=2, framework="deepspeed")
    mg = stage_memory(GPT, micro_batch=2, precision="fp16", optimizer="adam", recompute="full",
                      cal=cal, tp=2)
    assert ds.allocated_bytes == mg.allocated_bytes
    assert ds.total_bytes - mg.total_bytes == pytest.approx(
        mem.framework_buffers_bytes["deepspeed"], abs=2)


def test_full_recompute_holds_one_block_whole_while_it_reruns(cal):
    """Chen et al. 2016: checkpoints (every block's input) plus the largest segment, one block."""
    kw = dict(micro_batch=2, precision="bf16", optimizer="adam", cal=cal, tp=2, blocks=6,
              inflight=3.0, flash_attention=False)
    full = stage_memory(GPT, recompute="full", **kw)
    inputs = block_activation_bytes(GPT, 2, tp=2, recompute="full", flash_attention=False)
    whole = block_activation_bytes(GPT, 2, tp=2, recompute="none", flash_attention=False)
    first = 8 * 2 * GPT.seq_len + 2 * GPT.seq_len * GPT.hidden       # token ids + dropout mask
    assert full.details["recompute_segment"] == pytest.approx(whole)
    assert full.activations == pytest.approx(3.0 * (6 * inputs + first) + whole)
    none = stage_memory(GPT, recompute="none", **kw)
    assert "recompute_segment" not in none.details


def test_deepspeed_bf16_keeps_an_fp32_copy_of_every_gradient():
    """BF16_Optimizer: bf16 .grad plus an unsharded fp32 accumulation buffer (ZeRO 0/1 only)."""
    assert bytes_per_parameter("bf16", "adam", 1, 8, "deepspeed") == (2, 6, 1.5)
    assert bytes_per_parameter("bf16", "adam", 0, 1, "deepspeed") == (2, 6, 12)
    assert bytes_per_parameter("fp16", "adam", 1, 8, "deepspeed") == (2, 2, 1.5)
    assert bytes_per_parameter("bf16", "adam", 2, 8, "deepspeed") == (2, 0.25, 1.5)
    assert bytes_per_parameter("bf16", "adam", 1, 8, "megatron") == (2, 4, 1.5)


def test_t5_decoder_blocks_and_stage_split(cal):
    t5 = preset_dims("t5-base")
    assert block_parameters(t5, decoder=True) > block_parameters(t5)
    mems = pipeline_memory(t5, TrainingSpec(global_batch=8), ParallelSpec(pipeline=2), cal)
    assert mems[0].details["parameter_count"] < mems[1].details["parameter_count"] + \
        t5.vocab * t5.hidden
    explicit = ParallelSpec(pipeline=2, stages=((0, 20), (20, 24)))
    uneven = pipeline_memory(t5, TrainingSpec(global_batch=8), explicit, cal)
    assert uneven[0].parameters > uneven[1].parameters


def test_gpt3_fits_an_a100_80gb_with_megatrons_plan(cal):
    """Narayanan et al. 2021 trained GPT-3 175B with t=8, p=8 (or 12) on 80 GB A100s."""
    training = TrainingSpec(global_batch=1536, micro_batch=1, recompute="full")
    parallel = ParallelSpec(tensor=8, pipeline=8, data=16)
    peak = max(m.total_bytes for m in pipeline_memory(preset_dims("gpt3-175b"), training,
                                                      parallel, cal))
    assert 30 * 2**30 < peak < 80 * 2**30


def test_bad_input(cal):
    with pytest.raises(PartitaError, match="training.optimizer: expected one of adam, sgd, got 'adamw'"):
        bytes_per_parameter("bf16", "adamw", 0, 1)
    with pytest.raises(PartitaError, match="parallel.zero"):
        bytes_per_parameter("bf16", "adam", 4, 1)
    with pytest.raises(PartitaError, match="parallel.schedule: expected one of"):
        activation_microbatches("1f2b", 4, 8)


def test_recomputing_some_blocks_keeps_the_others_activations(cal):
    """--recompute-num-layers N: N blocks keep their input only, the rest all their activations,
    plus one block whole while it reruns."""
    kw = dict(micro_batch=2, precision="bf16", optimizer="adam", cal=cal, tp=2, blocks=6,
              inflight=3.0, flash_attention=False, first=False)
    inputs = block_activation_bytes(GPT, 2, tp=2, recompute="full", flash_attention=False)
    whole = block_activation_bytes(GPT, 2, tp=2, recompute="none", flash_attention=False)
    for n in (1, 4, 6):
        some = stage_memory(GPT, recompute="full", recomputed=n, **kw)
        assert some.activations == pytest.approx(3.0 * (n * inputs + (6 - n) * whole) + whole)
    assert stage_memory(GPT, recompute="full", recomputed=6, **kw) == \
        stage_memory(GPT, recompute="full", **kw)
    # a stage's count is the sum over its chunks of min(N, the chunk's blocks)
    t = TrainingSpec(global_batch=16, recompute="full", recompute_num_layers=2)
    p = ParallelSpec(pipeline=2, schedule="interleaved-1f1b", virtual_stages=3)
    chunked = pipeline_memory(GPT, t, p, cal)               # 24 blocks: 6 chunks of 4
    rank0 = stage_memory(GPT, micro_batch=1, precision="bf16", optimizer="adam", recompute="full",
                         cal=cal, pipeline=2, blocks=12, first=True, last=False, recomputed=6,
                         inflight=activation_microbatches("interleaved-1f1b", 2, 16, 0, 3))
    assert chunked[0].activations == pytest.approx(rank0.activations)


def test_op_policy_keeps_its_saved_outputs_by_hand():
    """torchtitan's op-level selective checkpointing on llama2-7b (h 4096, 32 heads, ffn 11008),
    bf16, flash attention: the block input, q, v, gate and down outputs and the attention output,
    plus the fp32 log-sum-exp per query and head; with TP 2 the column-parallel outputs halve, and
    sequence parallelism splits the input and the row-parallel output too."""
    s, h, f, heads = LLAMA.seq_len, 4096, 11008, 32
    want = s * (2 * (h + h + h + f + h + h) + 4 * heads)
    assert block_activation_bytes(LLAMA, 1, recompute="selective-op") == pytest.approx(want)
    tp2 = s * (2 * (h + h / 2 + h / 2 + f / 2 + h + h / 2) + 4 * heads / 2)
    assert block_activation_bytes(LLAMA, 1, tp=2, recompute="selective-op") == pytest.approx(tp2)
    sp2 = s * (2 * (h / 2 + h / 2 + h / 2 + f / 2 + h / 2 + h / 2) + 4 * heads / 2)
    assert block_activation_bytes(LLAMA, 1, tp=2, sp=True,
                                  recompute="selective-op") == pytest.approx(sp2)
    full = block_activation_bytes(LLAMA, 1, recompute="full")
    none = block_activation_bytes(LLAMA, 1, recompute="none")
    assert full < block_activation_bytes(LLAMA, 1, recompute="selective-op") < none


def test_op_policy_stage_memory_holds_one_block_whole(cal):
    """Under the op policy a rank keeps every block's saved outputs plus, while one block is
    recomputed, that block's whole activations (as under full recompute)."""
    kw = dict(micro_batch=1, precision="bf16", optimizer="adam", cal=cal, flash_attention=True)
    op = stage_memory(LLAMA, recompute="selective-op", **kw)
    whole = block_activation_bytes(LLAMA, 1, recompute="none")
    assert op.details["recompute_segment"] == pytest.approx(whole)
    per_block = block_activation_bytes(LLAMA, 1, recompute="selective-op")
    embedding = stage_memory(LLAMA, recompute="none", blocks=0, **kw).activations
    assert op.activations == pytest.approx(LLAMA.layers * per_block + whole + embedding)
