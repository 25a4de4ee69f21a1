"""Measure one CUDA GPU's kernels at training shapes, and whole transformer blocks, into one JSON file.

    python benchmarks/bench_gpu_kernels.py --out gpu.json [--quick] [--only gemm,attention,...]

What it measures (CUDA events, median of repeats after warm-up; bf16 throughout):
- gemm:        the matmuls of GPT/Llama blocks at hidden 1024-8192 and 2k-16k tokens, in the three
               layouts autograd runs them (forward x W^T, input gradient dY W, weight gradient dY^T X)
- attention:   F.scaled_dot_product_attention forward and backward by sequence length, head dim
               64/128, causal or not, 16k tokens per call; the kernel names say which backend ran
- attention_flash2: the same with PyTorch's FlashAttention-2 kernel (SDPBackend.FLASH_ATTENTION)
- loss_memory: peak memory of the executor's loss (bf16 logits, fp32 cast, cross-entropy) per logit
- elementwise: a copy and an add by size (memory-bound rate against the bytes moved)
- launch:      host time per tiny op back to back, per op synchronised, and per kernel in a CUDA
               graph (the device-side gap between kernels)
- eager_ops:   one RMSNorm (eager fp32 ops as Hugging Face and torchtitan write it; torch's native
               kernels), one RoPE (complex multiply; rotate-half), SwiGLU and a residual add, forward
               and backward at a Llama-7B block's shapes
- blocks:      partita's own torch blocks (planner/models, what `partita run` executes) for model
               shapes of published runs, fp/bwd time per block, device time by kernel class
               (torch.profiler), and the activation bytes a block keeps for its backward
- sustained:   a large matmul run back to back for a while: TFLOP/s, SM clock and power each second
               (what a training step's long kernels run at, against a short burst's boost clock)

`benchmarks/gpu_prediction.py` compares the blocks with the simulator. Runs on CPU with --quick
(small shapes, for testing the script), where the timings mean nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

DTYPE = torch.bfloat16


def timer(device: torch.device):
    """A function f(fn, repeats) -> median seconds of fn() (CUDA events on GPU)."""
    cuda = device.type == "cuda"

    def run(fn, repeats: int = 10, warmup: int = 3) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return statistics.median(times)
    return run


def bench_gemm(device, quick: bool) -> list[dict]:
    t = timer(device)
    hiddens = (256,) if quick else (1024, 2048, 2560, 4096, 5120, 8192)
    tokens = (256,) if quick else (2048, 4096, 8192, 16384)
    out = []
    for h in hiddens:
        for m in tokens:
            for name, n, k in (("qkv", 3 * h, h), ("proj", h, h), ("fc1", 4 * h, h),
                               ("fc2", h, 4 * h)):
                x = torch.randn(m, k, device=device, dtype=DTYPE)
                w = torch.randn(n, k, device=device, dtype=DTYPE)
                dy = torch.randn(m, n, device=device, dtype=DTYPE)
                for layout, fn, mnk in (
                        ("fwd", lambda: F.linear(x, w), (m, n, k)),
                        ("dgrad", lambda: dy @ w, (m, k, n)),
                        ("wgrad", lambda: dy.t() @ x, (n, k, m))):
                    s = t(fn, repeats=3 if quick else 10)
                    flops = 2.0 * mnk[0] * mnk[1] * mnk[2]
                    out.append({"name": name, "hidden": h, "layout": layout, "m": mnk[0],
                                "n": mnk[1], "k": mnk[2], "seconds": s, "tflops": flops / s / 1e12})
                del x, w, dy
    return out


def kernel_names(device, fn) -> list[str]:
    if device.type != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages()})


def bench_attention(device, quick: bool, backend: str | None = None) -> list[dict]:
    """`backend` None: SDPA's own choice (cuDNN on Hopper with torch 2.11); "flash": PyTorch's
    FlashAttention-2 kernel (torch.nn.attention.SDPBackend.FLASH_ATTENTION)."""
    import contextlib
    from torch.nn.attention import SDPBackend, sdpa_kernel
    t = timer(device)
    def pick():
        return (sdpa_kernel(SDPBackend.FLASH_ATTENTION) if backend == "flash"
                else contextlib.nullcontext())
    total = 1024 if quick else 16384
    seqs = (128, 256) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    out = []
    for hd in (64, 128):
        heads = (2048 if not quick else 256) // hd
        for s in seqs:
            b = max(1, total // s)
            q, k, v = (torch.randn(b, heads, s, hd, device=device, dtype=DTYPE, requires_grad=True)
                       for _ in range(3))
            for causal in (True, False):
                def fwd():
                    with pick():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                o = fwd()
                g = torch.randn_like(o)

                def both():
                    torch.autograd.grad(fwd(), (q, k, v), g)
                tf, tb = t(fwd), t(both)
                flops = 4.0 * b * heads * s * s * hd          # full forward, no causal discount
                row = {"backend": backend or "default", "head_dim": hd, "seq": s, "batch": b,
                       "heads": heads, "causal": causal,
                       "fwd_s": tf, "bwd_s": tb - tf, "flops_full_fwd": flops,
                       "fwd_tflops_counted": flops * (0.5 if causal else 1) / tf / 1e12}
                if s == seqs[0] and causal:
                    row["kernels"] = kernel_names(device, both)
                out.append(row)
            del q, k, v
    return out


def bench_attention_flash2(device, quick: bool) -> list[dict]:
    return bench_attention(device, quick, backend="flash")


def bench_loss_memory(device, quick: bool) -> list[dict]:
    """Peak bytes per logit above what was allocated before of the executor's loss path
    (executor/stages.py: lm_head under bf16 autocast, F.cross_entropy(logits.float(), ...)),
    forward and backward, and what stays allocated after the forward (kept for the backward)."""
    if device.type != "cuda":
        return []
    out = []
    for tokens, vocab, h in ((8192, 50304, 1024), (8192, 50304, 2048), (4096, 128256, 4096),
                             (16384, 32000, 4096)):
        x = torch.randn(tokens, h, device=device, dtype=DTYPE, requires_grad=True)
        w = torch.randn(vocab, h, device=device, dtype=torch.float32, requires_grad=True) * 0.01
        w = w.detach().requires_grad_()
        target = torch.randint(0, vocab, (tokens,), device=device)
        for form in ("float_then_ce", "ce_on_bf16"):
            torch.cuda.synchronize()
            x.grad = w.grad = None
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = F.linear(x, w)
            loss = F.cross_entropy(logits.float() if form == "float_then_ce" else logits, target)
            kept = torch.cuda.memory_allocated() - base
            fwd_peak = torch.cuda.max_memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
            loss.backward()
            bwd_peak = torch.cuda.max_memory_allocated() - base
            del logits, loss
            out.append({"form": form, "tokens": tokens, "vocab": vocab, "hidden": h,
                        "kept_bytes": kept, "forward_peak_bytes": fwd_peak,
                        "backward_peak_bytes": bwd_peak,
                        "backward_peak_bytes_per_logit": bwd_peak / (tokens * vocab)})
        del x, w
    return out


def bench_elementwise(device, quick: bool) -> list[dict]:
    t = timer(device)
    sizes = [1 << p for p in range(12, 22 if quick else 31, 1)]      # bytes of one bf16 tensor
    out = []
    for nbytes in sizes:
        n = nbytes // 2
        x, y, z = (torch.randn(n, device=device, dtype=DTYPE) for _ in range(3))
        out.append({"op": "copy", "tensor_bytes": nbytes, "moved_bytes": 2 * nbytes,
                    "seconds": t(lambda: y.copy_(x), repeats=20)})
        out.append({"op": "add", "tensor_bytes": nbytes, "moved_bytes": 3 * nbytes,
                    "seconds": t(lambda: torch.add(x, y, out=z), repeats=20)})
        del x, y, z
    return out


def bench_launch(device, quick: bool) -> dict:
    x = torch.zeros(1, device=device)
    n = 200 if quick else 5000
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(100):
        x.add_(1)
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    host = (time.perf_counter() - t0) / n
    sync()
    wall = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n // 5):
        x.add_(1)
        sync()
    synced = (time.perf_counter() - t0) / (n // 5)
    out = {"host_per_op_s": host, "wall_per_op_s": wall, "synced_per_op_s": synced}
    if device.type == "cuda":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                x.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(1000):
                x.add_(1)
        per = timer(device)(graph.replay, repeats=10) / 1000
        out["graph_per_kernel_s"] = per
    return out


BLOCKS = (   # name, arch, hidden, heads, kv_heads, ffn, seq, micro-batches: shapes of published runs
    ("gpt-h1024", "gpt", 1024, 16, 16, 4096, 1024, (1, 4, 16)),
    ("mpt-1b", "gpt", 2048, 16, 16, 8192, 2048, (1, 4, 8)),
    ("mpt-3b", "gpt", 2560, 20, 20, 10240, 2048, (1, 4, 8)),
    ("mpt-7b", "gpt", 4096, 32, 32, 16384, 2048, (1, 2, 4)),
    ("llama2-7b", "llama", 4096, 32, 32, 11008, 4096, (1, 2)),
    ("llama3-8b", "llama", 4096, 32, 8, 14336, 8192, (1,)),
    ("llama2-13b", "llama", 5120, 40, 40, 13824, 4096, (1, 2)),
)


def bench_blocks(device, quick: bool, layers: int = 4) -> list[dict]:
    from partita.planner.models import build_model
    from partita.planner.modelspec import TransformerDims
    t = timer(device)
    out = []
    blocks = (("tiny", "gpt", 64, 4, 4, 256, 32, (2,)),) if quick else BLOCKS
    for name, arch, h, heads, kv, ffn, seq, mbs in blocks:
        dims = TransformerDims(arch=arch, layers=layers, hidden=h, heads=heads, kv_heads=kv,
                               ffn_hidden=ffn, seq_len=seq, vocab=128, name=name)
        model = build_model(dims, device=device, dtype=DTYPE, seed=0)
        chain = torch.nn.Sequential(*model.pipeline_layers()[1:-1])     # the blocks alone
        for b in mbs:
            x = torch.randn(b, seq, h, device=device, dtype=DTYPE, requires_grad=True)
            g = torch.randn(b, seq, h, device=device, dtype=DTYPE)
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            y = chain(x)
            kept = (torch.cuda.memory_allocated() - base) if device.type == "cuda" else None
            del y

            def fwd():
                return chain(x)

            def both():
                torch.autograd.backward(chain(x), g)
            tf, tfb = t(fwd, repeats=5), t(both, repeats=5)
            # host time of the forward alone (no sync): dispatch-bound when it nears tf
            t0 = time.perf_counter()
            y = chain(x)
            host_f = time.perf_counter() - t0
            del y
            row = {"name": name, "arch": arch, "hidden": h, "heads": heads, "kv_heads": kv,
                   "ffn_hidden": ffn, "seq_len": seq, "micro_batch": b, "layers": layers,
                   "fwd_s_per_block": tf / layers, "bwd_s_per_block": (tfb - tf) / layers,
                   "host_fwd_s_per_block": host_f / layers,
                   "kept_bytes_per_block": None if kept is None else kept / layers}
            if device.type == "cuda":
                row["by_class_s_per_block"] = kernel_classes(both, layers)
            out.append(row)
            del x, g
        del model, chain
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def kernel_classes(fn, layers: int) -> dict:
    """Device seconds per block of a forward + backward by kernel class, and every kernel's."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    classes: dict[str, float] = {}
    kernels = []
    for e in prof.key_averages():
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if us <= 0:
            continue
        k = e.key.lower()
        cls = ("attention" if any(w in k for w in ("flash", "fmha", "attention", "cudnn"))
               else "gemm" if any(w in k for w in ("gemm", "xmma", "cutlass", "nvjet", "sm90", "cublas"))
               else "other")
        classes[cls] = classes.get(cls, 0.0) + us / 1e6 / layers
        kernels.append([e.key[:120], e.count, us / 1e6 / layers])
    kernels.sort(key=lambda r: -r[2])
    return {"classes": classes, "kernels": kernels[:40]}


def rms_eager(x, w, eps=1e-5):
    """Hugging Face's LlamaRMSNorm / torchtitan's RMSNorm: fp32 upcast, then PyTorch ops."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


def rope_complex(x, freqs):
    """Meta's Llama / torchtitan apply_rotary_emb: complex multiply in fp32."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(-2).type_as(x)


def rope_matrix(x, rot):
    """fms's RotaryEmbedding.adjusted_qk: pairs of x.float() times cached fp32 2 x 2 rotations,
    summed, cast back (foundation-model-stack fms/modules/positions.py)."""
    pairs = x.float().view(*x.shape[:-1], -1, 1, 2)
    return rot.mul(pairs).sum(-1).flatten(-2).type_as(x)


def rope_half(x, cos, sin):
    """Hugging Face's apply_rotary_pos_emb: x * cos + rotate_half(x) * sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def bench_eager_ops(device, quick: bool) -> list[dict]:
    """Forward and forward + backward of one norm, RoPE or SwiGLU implementation at a Llama
    block's shapes: how many bytes the eager forms move, measured as time."""
    t = timer(device)
    tokens, h, heads, hd, ffn = (256, 64, 4, 16, 128) if quick else (16384, 4096, 32, 128, 11008)
    x = torch.randn(tokens, h, device=device, dtype=DTYPE, requires_grad=True)
    w = torch.ones(h, device=device, dtype=DTYPE, requires_grad=True)
    q = torch.randn(1, tokens, heads, hd, device=device, dtype=DTYPE, requires_grad=True)
    ang = torch.randn(tokens, hd // 2, device=device)
    freqs = torch.polar(torch.ones_like(ang), ang)[None, :, None, :]
    cos = torch.cat((ang.cos(), ang.cos()), -1)[None, :, None, :].to(DTYPE)
    sin = torch.cat((ang.sin(), ang.sin()), -1)[None, :, None, :].to(DTYPE)
    c, s_ = ang.cos(), ang.sin()
    rot = torch.stack([c, -s_, s_, c], dim=-1).view(tokens, hd // 2, 2, 2)[None, :, None]
    gate = torch.randn(tokens, ffn, device=device, dtype=DTYPE, requires_grad=True)
    up = torch.randn(tokens, ffn, device=device, dtype=DTYPE, requires_grad=True)
    cases = {
        "rmsnorm_eager": ((x, w), lambda: rms_eager(x, w)),
        "rmsnorm_native": ((x, w), lambda: F.rms_norm(x, (h,), w, 1e-5)),
        "layernorm_native": ((x, w), lambda: F.layer_norm(x, (h,), w, None, 1e-5)),
        "rope_complex": ((q,), lambda: rope_complex(q, freqs)),
        "rope_rotate_half": ((q,), lambda: rope_half(q, cos, sin)),
        "rope_matrix": ((q,), lambda: rope_matrix(q, rot)),
        "swiglu_eager": ((gate, up), lambda: F.silu(gate) * up),
        "residual_add": ((x,), lambda: x + x.detach()),
    }
    out = []
    for name, (inputs, fn) in cases.items():
        y = fn()
        g = torch.randn_like(y)

        def both():
            torch.autograd.grad(fn(), inputs, g)
        tf, tb = t(fn, repeats=20), t(both, repeats=20)
        out.append({"op": name, "elements": y.numel(), "fwd_s": tf, "bwd_s": tb - tf,
                    "kernels": kernel_names(device, both) if not quick else []})
    return out


def bench_sustained(device, quick: bool, seconds: float = 20.0) -> list[dict]:
    if device.type != "cuda":
        return []
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:            # noqa: BLE001 - optional: clocks and power where NVML answers
        handle = None
    n = 8192
    a = torch.randn(n, n, device=device, dtype=DTYPE)
    b = torch.randn(n, n, device=device, dtype=DTYPE)
    out, t_end = [], time.perf_counter() + (3 if quick else seconds)
    while time.perf_counter() < t_end:
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev0.record()
        reps = 50
        for _ in range(reps):
            a @ b
        ev1.record()
        ev1.synchronize()
        s = ev0.elapsed_time(ev1) / 1e3
        row = {"t_s": round(seconds - (t_end - time.perf_counter()), 2),
               "tflops": 2.0 * n ** 3 * reps / s / 1e12}
        if handle is not None:
            row["sm_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
            row["power_w"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3
            row["temp_c"] = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        out.append(row)
    return out


PARTS = {"gemm": bench_gemm, "attention": bench_attention,
         "attention_flash2": bench_attention_flash2, "loss_memory": bench_loss_memory,
         "elementwise": bench_elementwise,
         "launch": bench_launch, "eager_ops": bench_eager_ops, "blocks": bench_blocks, "sustained": bench_sustained}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=",".join(PARTS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    unknown = [p for p in args.only.split(",") if p not in PARTS]
    if unknown:
        ap.error(f"--only: unknown part {unknown[0]!r} (valid: {', '.join(PARTS)})")
    device = torch.device(args.device)
    result = {"torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        result.update(gpu=p.name, sm_count=p.multi_processor_count,
                      memory_bytes=p.total_memory, cuda=torch.version.cuda)
    for part in args.only.split(","):
        t0 = time.perf_counter()
        try:
            result[part] = PARTS[part](device, args.quick)
        except Exception as exc:              # noqa: BLE001 - keep the other parts' numbers
            result[part + "_error"] = f"{type(exc).__name__}: {exc}"
        print(f"{part}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        with open(args.out, "w") as f:         # written after each part: a timeout keeps the rest
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
