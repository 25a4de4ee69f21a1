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
import inspect
import os
import sys
import sysconfig
from pathlib import Path

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
    """The model of a scenario's `model:` section: transformer dims, preset, hf_config or module.

    A `module: "pkg.mod:fn"` runs the user's code: `pkg` is looked up first in the scenario
    file's directory, then among installed packages (never the current directory); `fn` must be
    a Python function or class taking no arguments and returning a torch.nn.Module. Whatever the
    code raises, SystemExit included, becomes one PartitaError naming the file and the key.
    """
    if spec.module is None:
        dims = spec.resolve()
        if dims is None:
            raise PartitaError("model: no transformer dims, preset, hf_config or module")
        return build_model(dims, device=device, dtype=dtype, seed=seed)
    where = f"{spec.origin}: model.module" if spec.origin else "model.module"
    fn = _import_function(spec.module, spec.origin, where)
    dev = torch.device(device)
    rng_devices = [dev.index or 0] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(seed)
        with dev:
            module = _call_user_code(lambda: fn(), where, f"calling {spec.module!r}")
    if not isinstance(module, nn.Module):
        raise PartitaError(f"{where}: {spec.module!r} returned {type(module).__name__}, "
                           "expected a torch.nn.Module")
    return module.to(dtype=dtype)


def _call_user_code(call, where: str, doing: str):
    """`call()` with the user's failures, SystemExit included, turned into one PartitaError, and
    no debugger prompt (breakpoint() does nothing meanwhile)."""
    hook = sys.breakpointhook
    sys.breakpointhook = lambda *args, **kwargs: None
    try:
        return call()
    except (KeyboardInterrupt, _NotFound):
        raise
    except PartitaError as exc:
        raise PartitaError(f"{where}: {doing}: {exc}") from None
    except BaseException as exc:  # noqa: BLE001 - the user's code: one line, not our traceback
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        if isinstance(exc, SystemExit):
            detail = f"exit status {exc.code!r}"
        raise PartitaError(f"{where}: {doing} raised {type(exc).__name__}"
                           + (f": {detail}" if detail else "")) from None
    finally:
        sys.breakpointhook = hook


def _import_function(path: str, origin: str = "", where: str = "model.module"):
    modname, _, attr = path.partition(":")
    parts = modname.split(".") + attr.split(".")
    if not modname or not attr or not all(p.isidentifier() for p in parts):
        raise PartitaError(f"{where}: expected 'package.module:function', got {path!r}")
    base = str(Path(origin).resolve().parent) if origin else None
    cwd = {"", os.getcwd()}
    saved = list(sys.path)
    sys.path[:] = ([base] if base else []) + [p for p in saved if p not in cwd or p == base]
    try:
        mod = _call_user_code(lambda: _import(modname), where, f"importing {modname!r}")
    except _NotFound as exc:
        place = f"beside {origin} or installed" if origin else "installed"
        raise PartitaError(f"{where}: cannot import {modname!r}: {exc} (looked {place}; the "
                           "current directory is not searched)") from None
    finally:
        sys.path[:] = saved
    fn = mod
    for part in attr.split("."):
        fn = getattr(fn, part, None)
    if fn is None:
        raise PartitaError(f"{where}: {modname!r} has no function {attr!r}")
    if _in_standard_library(fn):
        raise PartitaError(f"{where}: {path!r} is part of Python's standard library, not a function "
                           "that builds a torch.nn.Module")
    if not (inspect.isfunction(fn) or inspect.isclass(fn)):
        raise PartitaError(f"{where}: {path!r} is a {type(fn).__name__}, expected a Python function "
                           "or class that builds a torch.nn.Module")
    try:
        inspect.signature(fn).bind()
    except TypeError:
        raise PartitaError(f"{where}: {path!r} must be callable with no arguments") from None
    except ValueError:
        pass     # no signature to inspect: the call itself reports a problem
    return fn


def _in_standard_library(fn) -> bool:
    """True for builtins and for functions defined in Python's own library (os, tempfile, ...)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or getattr(module, "__file__", None) is None:
        return inspect.isbuiltin(fn)
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    where = Path(module.__file__).resolve()
    return stdlib in where.parents and "site-packages" not in where.parts


class _NotFound(Exception):
    """The scenario's module itself is missing (not an import inside it)."""


def _import(modname: str):
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name and (modname == exc.name or modname.startswith(exc.name + ".")):
            raise _NotFound(str(exc)) from None
        raise


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
