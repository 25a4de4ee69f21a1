"""Context parallelism: why `partita run` refuses it, pinned against the torch it runs on.

On CPU the refusal rests on a fact of torch (2.13): `context_parallel` has no sharding strategy for
CPU attention. The slow test runs torch's context-parallel attention on 2 gloo processes and
expects exactly that error, so the day torch supports it this test fails and the refusal must be
revisited. On CUDA (2 GPUs, marked gpu) the test checks the primitive the executor would build on:
ring attention over a 2-rank mesh, without load balancing, equals unsharded attention (1e-5
relative in fp32 with TF32 off; the kernels' block order differs).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from partita.executor.plan import CP_WHY, execution_plan
from partita.planner.errors import PartitaError
from partita.planner.scenario import parse_scenario

SCRIPT = textwrap.dedent('''
    import sys
    import torch, torch.distributed as dist, torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options
    backend, device = sys.argv[1], sys.argv[2]
    dist.init_process_group(backend)
    rank = dist.get_rank()
    if device == "cuda":
        torch.cuda.set_device(rank)
        torch.backends.cuda.matmul.allow_tf32 = False
    mesh = init_device_mesh(device, (2,))
    _cp_options.enable_load_balance = False
    torch.manual_seed(0)
    x = torch.randn(2, 4, 64, 16, device=device)
    w = torch.randn(16, 16, device=device, requires_grad=True)
    ref = F.scaled_dot_product_attention(x @ w, x @ w, x @ w, is_causal=True)
    xs = x.clone()
    try:
        with context_parallel(mesh, buffers=[xs], buffer_seq_dims=[2]):
            q = xs @ w
            out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    except Exception as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
        sys.exit(3)
    want = ref.chunk(2, dim=2)[rank]
    print(f"rank {rank}: relative error {((out - want).norm() / want.norm()).item():.3g}", flush=True)
    dist.destroy_process_group()
''')


def run_script(tmp_path, backend: str, device: str) -> subprocess.CompletedProcess:
    script = tmp_path / "cp.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(script), backend, device],
                          capture_output=True, text=True, timeout=300)


def test_the_refusal_says_why():
    doc = {"model": {"arch": "gpt", "layers": 2, "hidden": 32, "heads": 4, "seq_len": 16,
                     "vocab": 64},
           "cluster": {"system": "local", "gpus": 2},
           "training": {"global_batch": 4, "micro_batch": 2, "precision": "fp32"},
           "parallel": {"context": 2, "schedule": "gpipe"}}
    with pytest.raises(PartitaError) as err:
        execution_plan(parse_scenario(doc), 2)
    assert "parallel.context = 2" in str(err.value) and CP_WHY in str(err.value)
    assert "_scaled_dot_product_flash_attention_for_cpu" in CP_WHY


@pytest.mark.slow
def test_torch_context_parallel_attention_cannot_run_on_gloo(tmp_path):
    done = run_script(tmp_path, "gloo", "cpu")
    assert done.returncode != 0, done.stdout
    assert ("aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding "
            "strategy registered") in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_torch_context_parallel_attention_on_cuda_equals_unsharded(tmp_path):
    done = run_script(tmp_path, "nccl", "cuda")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    errors = [float(line.rsplit(" ", 1)[1]) for line in done.stdout.splitlines()
              if "relative error" in line]
    assert len(errors) == 2 and max(errors) < 1e-5, done.stdout
