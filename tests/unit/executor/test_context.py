"""Context parallelism's pieces (executor/context.py, planner.models.common): which positions a
rank holds, attention over gathered keys with the position-based causal mask equal to unsharded
attention, and what `partita run` refuses. The multi-process runs against one process are in
tests/integration/executor/test_executor_context.py.
"""
from __future__ import annotations

import pytest
import torch

from partita.executor.context import local_tokens
from partita.executor.plan import execution_plan
from partita.planner.errors import PartitaError
from partita.planner.models.common import Attention, SequenceShard, context_positions
from partita.planner.scenario import parse_scenario


def test_each_rank_holds_two_chunks_that_even_out_causal_work():
    parts = [context_positions(16, 2, r).tolist() for r in range(2)]
    assert parts == [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 8, 9, 10, 11]]
    # causal work: each query attends to (position + 1) keys; the ranks' totals are equal
    assert sum(p + 1 for p in parts[0]) == sum(p + 1 for p in parts[1])
    every = sorted(p for r in range(4) for p in context_positions(32, 4, r).tolist())
    assert every == list(range(32))
    ids = torch.arange(32).view(2, 16)
    assert local_tokens(ids, 2, 1)[1].tolist() == [20, 21, 22, 23, 24, 25, 26, 27]


@pytest.mark.parametrize("causal", [True, False])
def test_sharded_attention_equals_whole_attention(causal):
    """Two 'ranks' in one process: each computes its positions' output with the other's keys and
    values gathered (the gather here concatenates both ranks' tensors, as all_gather does)."""
    torch.manual_seed(0)
    attn = Attention(16, 4, 2, 4, bias=True, causal=causal)
    x = torch.randn(2, 8, 16)
    whole = attn(x)
    pos = [context_positions(8, 2, r) for r in range(2)]
    k_all = [attn._heads(attn.k_proj(x[:, p])) for p in pos]
    v_all = [attn._heads(attn.v_proj(x[:, p])) for p in pos]
    for r in range(2):
        def gather(t, r=r):
            pieces = k_all if t.shape == k_all[r].shape and torch.equal(t, k_all[r]) else v_all
            return torch.cat(pieces, dim=2)
        attn.sequence_shard = SequenceShard(index=r, parts=2, gather=gather)
        got = attn(x[:, pos[r]])
        torch.testing.assert_close(got, whole[:, pos[r]], rtol=1e-5, atol=1e-6)
    attn.sequence_shard = None


def _doc(**parallel) -> dict:
    return {"model": {"arch": parallel.pop("arch", "gpt"), "layers": 2, "hidden": 32, "heads": 4,
                      "seq_len": parallel.pop("seq_len", 16), "vocab": 64},
            "cluster": {"system": "local", "gpus": 2},
            "training": {"global_batch": 4, "micro_batch": 2, "precision": "fp32"},
            "parallel": {"context": 2, "schedule": "gpipe", **parallel}}


def test_t5_and_uneven_chunks_are_refused_with_the_reason():
    with pytest.raises(PartitaError, match=r"parallel.context = 2: .*T5.*valid for arch t5: 1"):
        execution_plan(parse_scenario(_doc(arch="t5")), 2)
    with pytest.raises(PartitaError, match=r"seq_len \(18\) must be a multiple of 2 x context \(4\)"):
        execution_plan(parse_scenario(_doc(seq_len=18)), 2)
    plan = execution_plan(parse_scenario(_doc()), 2)
    assert plan.context == 2 and plan.replicas == 2 and plan.data_parallel != "none"
    assert [plan.coords(r).cp for r in range(2)] == [0, 1]
