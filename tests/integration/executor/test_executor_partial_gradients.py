"""Sequence-parallel norm gradients are summed over the tensor group before the optimizer
(executor.parallel.reduce_partial_gradients), as Megatron-LM does: the optimizer step then issues
no collective, and the weights are those of DTensor's own reduction inside the step (2 gloo
processes)."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytestmark = pytest.mark.slow


def _check(rank: int, world: int, root: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    from partita.executor.parallel import reduce_partial_gradients
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        base = nn.LayerNorm(8)
        out = {}
        for explicit in (False, True):
            norm = copy.deepcopy(base)
            parallelize_module(norm, mesh, SequenceParallel())
            opt = torch.optim.SGD(norm.parameters(), lr=0.1, momentum=0.9)
            partial_before, reduced, step_collectives = [], [], []
            for step in range(3):
                torch.manual_seed(10 + step + rank)
                x = DTensor.from_local(torch.randn(2, 4, 8), mesh, [Shard(1)])
                opt.zero_grad()
                norm(x).to_local().pow(2).sum().backward()
                partial_before.append(all(p.grad.placements[0].is_partial()
                                          for p in norm.parameters()))
                reduced.append(reduce_partial_gradients(list(norm.parameters())) if explicit else 0)
                with CommDebugMode() as comm:
                    opt.step()
                step_collectives.append(comm.get_total_counts())
            out["explicit" if explicit else "implicit"] = {
                "partial_before": partial_before, "reduced": reduced,
                "step_collectives": step_collectives,
                "weights": [p.full_tensor().detach().tolist() for p in norm.parameters()]}
        (Path(root) / f"rank{rank}.json").write_text(json.dumps(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


def test_the_optimizer_step_runs_on_reduced_local_gradients(tmp_path):
    torch.multiprocessing.spawn(_check, args=(2, str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        implicit, explicit = got["implicit"], got["explicit"]
        assert all(implicit["partial_before"]) and all(explicit["partial_before"])
        assert all(n > 0 for n in implicit["step_collectives"])    # DTensor reduces in the step
        assert explicit["reduced"] == [2, 2, 2]                       # weight and bias
        assert explicit["step_collectives"] == [0, 0, 0]
        assert explicit["weights"] == implicit["weights"]
