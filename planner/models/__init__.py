"""Executable torch models of the four transformer families, built from `TransformerDims`.

    model = build_model(preset_dims("gpt2"), device="cpu", dtype=torch.float32, seed=0)
    ids, targets = model.sample_batch(4)
    loss = model.loss(model(ids), targets)

Every model is a `PipelineLM`: `pipeline_layers()` is the chain [embedding, block..., head] of
one-tensor layers and `layer_names()` their names (see planner/models/common.py). `build_from_spec`
also builds a scenario's `module: "pkg.mod:fn"` model; `layer_chain` gives any model as named layers.
"""
from __future__ import annotations

import importlib

import torch
from torch import nn

from partita.planner.errors import PartitaError
from partita.planner.modelspec import ModelSpec, TransformerDims
from partita.planner.models.bert import Bert
from partita.planner.models.common import PipelineLM, init_value
from partita.planner.models.gpt import GPT
from partita.planner.models.llama import Llama
from partita.planner.models.t5 import T5

__all__ = ["PipelineLM", "build_model", "build_from_spec", "layer_chain", "init_value"]

MODEL_CLASSES: dict[str, type[PipelineLM]] = {"gpt": GPT, "llama": Llama, "bert": Bert, "t5": T5}


def build_model(dims: TransformerDims, *, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, seed: int = 0) -> PipelineLM:
    """The model of `dims`, with deterministic weights (the same for a seed on every device).

    It is built on the meta device first, so `device="meta"` allocates nothing (a 70B model
    builds in about a second) and a real device gets each parameter initialised once.
    """
    with torch.device("meta"):
        model = MODEL_CLASSES[dims.arch](dims)
    model.to(dtype=dtype)
    if torch.device(device).type != "meta":
        model.materialize(device, seed=seed)
    return model


def build_from_spec(spec: ModelSpec, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    """The model of a scenario's `model:` section: transformer dims, preset, hf_config or module."""
    if spec.module is None:
        dims = spec.resolve()
        assert dims is not None
        return build_model(dims, device=device, dtype=dtype, seed=seed)
    fn = _import_function(spec.module)
    dev = torch.device(device)
    rng_devices = [dev.index or 0] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(seed)
        try:
            with dev:
                module = fn()
        except Exception as exc:  # the user's code: report it as one line, not as our bug
            raise PartitaError(f"model.module: calling {spec.module!r} raised "
                               f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(module, nn.Module):
        raise PartitaError(f"model.module: {spec.module!r} returned {type(module).__name__}, "
                           "expected a torch.nn.Module")
    return module.to(dtype=dtype)


def _import_function(path: str):
    modname, _, attr = path.partition(":")
    if not modname or not attr:
        raise PartitaError(f"model.module: expected 'package.module:function', got {path!r}")
    try:
        mod = importlib.import_module(modname)
    except ImportError as exc:
        raise PartitaError(f"model.module: cannot import {modname!r}: {exc}") from exc
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise PartitaError(f"model.module: {modname!r} has no function {attr!r}")
    return fn


def layer_chain(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """A model as named layers run one after another: a PipelineLM's pipeline layers, an
    nn.Sequential's top-level children, any module's own `pipeline_layers()` (an ordered list of
    one-tensor-in, one-tensor-out submodules, named by its `layer_names()` if it has one, else by
    position), or else the whole model as one layer named "model"."""
    if isinstance(model, PipelineLM):
        return list(zip(model.layer_names(), model.pipeline_layers()))
    if callable(getattr(model, "pipeline_layers", None)):
        layers = list(model.pipeline_layers())
        names = (list(model.layer_names()) if callable(getattr(model, "layer_names", None))
                 else [str(i) for i in range(len(layers))])
        return list(zip(names, layers))
    if isinstance(model, nn.Sequential):
        return list(model.named_children())
    return [("model", model)]
