"""Per-layer profiling of torch models on the meta device, and optional timing on a real device.

    profile = profile_module(preset_dims("llama2-70b"), micro_batch=1, seq_len=4096, precision="bf16")

The model is built on the meta device (no memory, no compute: a 70B model profiles on a laptop)
and each pipeline layer runs forward and backward once. FLOPs come from
torch.utils.flop_counter.FlopCounterMode (2*m*n*k per matmul; attention runs as
planner.models.common._MetaFlashAttention there, see [Note: meta attention]); the bytes saved for
backward from torch.autograd.graph.saved_tensors_hooks, counting each storage once and no
parameters; the output bytes from the layer's output. The last layer of a PipelineLM runs with its
loss, so the head's activations include the fp32 log-softmax.

`measure=True` also times each layer forward and backward on a real device (CUDA if available,
else CPU): the layer alone is materialised there, run `warmup` times, then `repeats` times, and the
median is kept, so a model far larger than the device still gets timed layer by layer.

This module measures (torch at import); the record it returns is planner/profile.py's
`ModelProfile`, and simulator/profiled.py costs a step from it.
"""
from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.flop_counter import FlopCounterMode

from partita.planner.costmodel import element_bytes
from partita.planner.errors import PartitaError
from partita.planner.modelspec import ModelSpec, TransformerDims
from partita.planner.models import PipelineLM, build_from_spec, build_model, init_value, layer_chain
from partita.planner.profile import LayerProfile, ModelProfile

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
          "bf16": torch.bfloat16, "fp8": torch.bfloat16}    # fp8 GEMMs, bf16 weights/activations


def profile_module(model_or_spec: nn.Module | TransformerDims | ModelSpec, *, micro_batch: int,
                   seq_len: int | None = None, precision: str = "bf16", measure: bool = False,
                   device: torch.device | str | None = None, warmup: int = 2, repeats: int = 5,
                   vocab: int | None = None, name: str = "") -> ModelProfile:
    """Profile one micro-batch of `micro_batch` sequences of `seq_len` tokens (default: the model's).

    model_or_spec: transformer dims, a scenario ModelSpec (any form), or an nn.Module (a
    PipelineLM, else an nn.Sequential profiled child by child, else one layer; such a module is
    fed token ids below `vocab`)."""
    if micro_batch < 1:
        raise PartitaError(f"training.micro_batch: must be >= 1, got {micro_batch}")
    element_bytes(precision)                                  # validates the name
    dtype = DTYPES[precision]
    model, seq_len, vocab, label = _meta_model(model_or_spec, seq_len, vocab, dtype)
    chain = layer_chain(model)
    run = _Run(model, chain, micro_batch, seq_len, vocab, dtype)
    layers = run.profile_all()
    where = None
    if measure:
        dev = torch.device(device) if device is not None else default_device()
        layers = [replace(layer, **_time_layer(run, i, dev, dtype, precision, warmup, repeats))
                  for i, layer in enumerate(layers)]
        where = device_name(dev)
    return ModelProfile(model=name or label, method="meta-device", precision=precision,
                        micro_batch=micro_batch, seq_len=seq_len, layers=tuple(layers), device=where)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return dev.type


def achieved_flops_per_s(layer: LayerProfile) -> float | None:
    """Forward + backward FLOPs over measured forward + backward time (None if not measured)."""
    if layer.fwd_s is None or layer.bwd_s is None or layer.fwd_s + layer.bwd_s <= 0:
        return None
    return (layer.fwd_flops + layer.bwd_flops) / (layer.fwd_s + layer.bwd_s)


# ---- building the meta model -----------------------------------------------------------------

def _meta_model(target: Any, seq_len: int | None, vocab: int | None,
                dtype: torch.dtype) -> tuple[nn.Module, int, int, str]:
    """(model on meta, seq_len, vocab, label) for any accepted target."""
    if isinstance(target, ModelSpec):
        if target.module is not None:
            model = build_from_spec(target, device="meta", dtype=dtype)
            return model, seq_len or target.seq_len, vocab or target.vocab, target.module
        target = target.resolve()
    if isinstance(target, TransformerDims):
        dims = _with_seq_len(target, seq_len)
        return build_model(dims, device="meta", dtype=dtype), dims.seq_len, dims.vocab, dims.name or dims.arch
    if isinstance(target, PipelineLM):
        dims = _with_seq_len(target.dims, seq_len)
        return build_model(dims, device="meta", dtype=dtype), dims.seq_len, dims.vocab, dims.name or dims.arch
    if isinstance(target, nn.Module):
        if seq_len is None or vocab is None:
            raise PartitaError("profiling a torch module needs seq_len and vocab (the token ids fed to it)")
        return target, seq_len, vocab, type(target).__name__
    raise PartitaError(f"cannot profile a {type(target).__name__}; expected transformer dims, "
                       "a model spec or a torch.nn.Module")


def _with_seq_len(dims: TransformerDims, seq_len: int | None) -> TransformerDims:
    if seq_len is None or seq_len == dims.seq_len:
        return dims
    if dims.arch in ("gpt", "bert") and seq_len > dims.max_positions:
        raise PartitaError(f"seq_len ({seq_len}) exceeds the model's learned positions "
                           f"(max_positions {dims.max_positions})")
    return replace(dims, seq_len=seq_len)


# ---- the meta run ----------------------------------------------------------------------------

class _Run:
    """One pass over the chain on meta tensors; keeps each layer's input for the timing pass."""

    def __init__(self, model: nn.Module, chain: list[tuple[str, nn.Module]], micro_batch: int,
                 seq_len: int, vocab: int, dtype: torch.dtype):
        self.model, self.chain, self.dtype = model, chain, dtype
        self.vocab = vocab
        is_t5 = isinstance(model, PipelineLM) and model.dims.arch == "t5"
        self.ids_shape = (micro_batch, 2 * seq_len if is_t5 else seq_len)   # [Note: t5 chain]
        self.targets_shape = (micro_batch, seq_len)
        self.inputs: list[torch.Tensor] = []
        self.seen_params: set[int] = set()

    def profile_all(self) -> list[LayerProfile]:
        x: torch.Tensor = torch.empty(self.ids_shape, dtype=torch.long, device="meta")
        out = []
        for i, (name, layer) in enumerate(self.chain):
            self.inputs.append(x)
            profile, y = self._profile_layer(i, name, layer, x)
            out.append(profile)
            x = y.detach()
        return out

    def with_loss(self, i: int) -> bool:
        return isinstance(self.model, PipelineLM) and i == len(self.chain) - 1

    def _profile_layer(self, i: int, name: str, layer: nn.Module,
                       x: torch.Tensor) -> tuple[LayerProfile, torch.Tensor]:
        params, param_bytes = self._params(layer)
        call, exclude = _meta_call(layer, self.dtype)
        x = x.detach().requires_grad_(x.is_floating_point())
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage._cdata not in exclude:
                saved[storage._cdata] = storage.nbytes()
            return t

        with FlopCounterMode(display=False) as counter:
            with saved_tensors_hooks(pack, lambda t: t):
                y = call(x)
                target = self._loss(y) if self.with_loss(i) else y
            fwd = counter.get_total_flops()
            _backward(target)
            bwd = counter.get_total_flops() - fwd
        profile = LayerProfile(
            name=name, kind=_kind(self.model, name), params=params, param_bytes=param_bytes,
            fwd_flops=float(fwd), bwd_flops=float(bwd), matmul_flops=float(fwd),
            activation_bytes=sum(saved.values()), output_bytes=y.numel() * y.element_size())
        return profile, y

    def _loss(self, logits: torch.Tensor) -> torch.Tensor:
        targets = torch.empty(self.targets_shape, dtype=torch.long, device=logits.device)
        return self.model.loss(logits, targets)

    def _params(self, layer: nn.Module) -> tuple[int, int]:
        """Parameters first seen in this layer (a tied tensor counts in its first layer), and
        their bytes at the profiling dtype."""
        count = nbytes = 0
        for p in layer.parameters():
            if id(p) in self.seen_params:
                continue
            self.seen_params.add(id(p))
            count += p.numel()
            nbytes += p.numel() * (_dtype_size(self.dtype) if p.is_floating_point() else p.element_size())
        return count, nbytes


def _meta_call(layer: nn.Module, dtype: torch.dtype) -> tuple[Callable, set[int]]:
    """A function running `layer` on meta tensors, and the storages (parameters, buffers) that do
    not count as activations. A layer with real weights runs with meta stand-ins of them."""
    tensors = dict(layer.named_parameters(remove_duplicate=False))
    tensors.update(dict(layer.named_buffers(remove_duplicate=False)))
    if all(t.is_meta for t in tensors.values()):
        return layer, {t.untyped_storage()._cdata for t in tensors.values()}
    stand_ins = {n: torch.empty_like(t, device="meta", dtype=dtype if t.is_floating_point() else t.dtype)
                 .requires_grad_(t.requires_grad) for n, t in tensors.items()}
    exclude = {t.untyped_storage()._cdata for t in stand_ins.values()}
    return (lambda x: torch.func.functional_call(layer, stand_ins, (x,), tie_weights=True)), exclude


def _backward(target: torch.Tensor) -> None:
    if target.requires_grad:
        target.backward(torch.ones_like(target) if target.dim() else None)


def _kind(model: nn.Module, name: str) -> str:
    if not isinstance(model, PipelineLM):
        return "other"
    return name.split(".")[0]


def _dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype, device="meta").element_size()


# ---- timing on a real device -----------------------------------------------------------------

def _time_layer(run: _Run, i: int, dev: torch.device, dtype: torch.dtype, precision: str,
                warmup: int, repeats: int) -> dict[str, float]:
    """Median forward and backward seconds of layer i, materialised alone on `dev`."""
    if repeats < 1 or warmup < 0:
        raise PartitaError(f"measure: repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    name, meta_layer = run.chain[i]
    layer = _real_layer(meta_layer, dev, dtype)
    x0 = _real_input(run.inputs[i], dev, dtype, run.vocab)
    targets = torch.randint(0, run.vocab, run.targets_shape, device=dev)
    fwd_times, bwd_times = [], []
    with _matmul_precision(precision):
        for rep in range(warmup + repeats):
            x = x0.detach().requires_grad_(x0.is_floating_point())
            layer.zero_grad(set_to_none=True)
            _sync(dev)
            start = time.perf_counter()
            y = layer(x)
            target = run.model.loss(y, targets) if run.with_loss(i) else y
            _sync(dev)
            mid = time.perf_counter()
            _backward(target)
            _sync(dev)
            if rep >= warmup:
                fwd_times.append(mid - start)
                bwd_times.append(time.perf_counter() - mid)
    del layer
    return {"fwd_s": statistics.median(fwd_times), "bwd_s": statistics.median(bwd_times)}


def _real_layer(meta_layer: nn.Module, dev: torch.device, dtype: torch.dtype) -> nn.Module:
    """A copy of the layer with real weights on `dev` (meta weights get GPT-2-style values: real
    numbers, never uninitialised memory, whose denormals or NaNs would distort CPU timings)."""
    layer = copy.deepcopy(meta_layer)
    if any(p.is_meta for p in layer.parameters()):
        layer = layer.to_empty(device=dev)
        with torch.no_grad():
            for pname, p in layer.named_parameters():
                p.copy_(init_value(pname, p.shape, seed=0))
    return layer.to(device=dev, dtype=dtype)


def _real_input(meta_x: torch.Tensor, dev: torch.device, dtype: torch.dtype, vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    if meta_x.is_floating_point():
        return torch.randn(meta_x.shape, generator=gen).to(device=dev, dtype=dtype)
    return torch.randint(0, vocab, meta_x.shape, generator=gen).to(dev)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class _matmul_precision:
    """fp32 matmuls in TF32 for precision tf32, in full fp32 otherwise, restored afterwards."""

    def __init__(self, precision: str):
        self.want = "high" if precision == "tf32" else "highest"

    def __enter__(self) -> None:
        self.before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.want)

    def __exit__(self, *exc: object) -> None:
        torch.set_float32_matmul_precision(self.before)
