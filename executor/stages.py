"""This rank's model chunks (pipeline stages), cut from the seeded model of planner.models.

Every rank builds the whole model on the meta device (no memory) and materialises only the layers
of its own chunks, with `PipelineLM.materialize`'s per-parameter seeding: a layer gets the same
weights whichever rank builds it, so a pipelined run starts from exactly the weights of the
single-process reference.

A `module:` model (any nn.Sequential, or a module with `pipeline_layers()`) has no per-parameter
seeding: every rank builds the whole module on its device with the scenario's seed (the user's own
initialisation, under `torch.manual_seed(seed)`), keeps its chunks' layers and drops the rest. It
trains as a causal language model, ids (B, S) in and logits (B, S, vocab) out, on the mean token
cross-entropy against the next tokens, unless the module has its own `loss(output, targets)`.

A `Chunk` runs its layers in order, under autocast for bf16 and fp16 and with the plan's activation
recomputation (full: every block of the chunk, or its first `recompute_num_layers`, Megatron-LM's
block method; selective: the projections' outputs kept; selective-op: torchtitan's op policy). Parameters tied across chunks (GPT's embedding and LM head, T5's shared relative
position bias) become one copy per chunk; `TiedGroup` lists them so that the run loop adds their
gradients up, as Megatron-LM does for the embedding of its first and last stage
(Shoeybi et al. 2019, Sec. 3; megatron/core/distributed/finalize_model_grads.py).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from partita.executor.plan import ExecPlan
from partita.planner.modelspec import ModelSpec, TransformerDims

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
NOT_BLOCKS = ("embedding", "head")
# Selective recomputation keeps the outputs of the projections' GEMMs and recomputes the rest of
# a block (attention core, norms, activations): the attention core is Korthikanti et al. 2022's
# selective recomputation (Sec. 5); recomputing the elementwise ops too is torchtitan's op-level
# policy (torchtitan/models/llama3/infra/parallelize.py, _save_list).
SAVED_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
# torchtitan's op-level selective checkpointing (`recompute: selective-op`) keeps the outputs of the
# matmuls and the attention kernel except every second matmul a block runs, and recomputes the rest
# (torchtitan/distributed/activation_checkpoint.py, `_get_custom_policy`). A linear with a bias runs
# as addmm: counted like mm here, so the policy means "every second linear" for every arch
# (torchtitan's models have no biases).
LINEAR_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
              torch.ops.aten.linear.default}
ATTENTION_OPS = {getattr(torch.ops.aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_attention_math", "_scaled_dot_product_fused_attention_overrideable")
    if hasattr(torch.ops.aten, name)}


@dataclass(frozen=True)
class TiedGroup:
    """One parameter used by several layers: its qualified names and the chunks that hold it."""
    names: tuple[str, ...]
    stages: tuple[int, ...]


class Chunk(nn.Module):
    """Consecutive pipeline layers of one model chunk: one tensor in, one tensor out."""

    def __init__(self, stage: int, layers: list[nn.Module], names: list[str], *, recompute: str,
                 precision: str, device_type: str, plain: tuple[str, ...] = NOT_BLOCKS,
                 recompute_num_layers: int | None = None):
        super().__init__()
        self.plain = tuple(plain)          # layers never recomputed (they take or give ids/logits)
        blocks = [i for i, n in enumerate(names) if n not in self.plain]
        self.recomputed = frozenset(blocks[:recompute_num_layers])  # the blocks "full" checkpoints
        self.stage = stage
        self.layers = nn.ModuleList(layers)
        self.names = list(names)
        self.recompute = recompute
        self.autocast = AUTOCAST.get(precision)
        self.device_type = device_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=self.autocast or torch.bfloat16,
                            enabled=self.autocast is not None):
            for i, (name, layer) in enumerate(zip(self.names, self.layers)):
                x = self._run(layer, x, i) if name not in self.plain else layer(x)
        return x

    def _run(self, block: nn.Module, x: torch.Tensor, index: int) -> torch.Tensor:
        if self.recompute == "none":
            return block(x)
        if self.recompute == "full":
            if index not in self.recomputed:
                return block(x)
            return checkpoint(block, x, use_reentrant=False)
        if self.recompute == "selective-op":
            def context():
                return create_selective_checkpoint_contexts(op_policy())
        else:
            context = partial(create_selective_checkpoint_contexts, _selective_policy)
        return checkpoint(block, x, use_reentrant=False, context_fn=context)

    def model_name(self, name: str) -> str:
        """'layers.3.attn.q_proj.weight' -> the model's own name, e.g. 'block.7.attn.q_proj.weight'."""
        _, index, rest = name.split(".", 2)
        return f"{self.names[int(index)]}.{rest}"


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def op_policy():
    """A fresh op-level selective checkpointing policy for one checkpointed block call: keep the
    attention kernel's outputs and the 1st, 3rd, 5th, ... linear's, recompute everything else.
    The forward and the recompute count their linears apart (torch may consult the policy in both),
    so each sees the same sequence."""
    count = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op in ATTENTION_OPS:
            return CheckpointPolicy.MUST_SAVE
        if op in LINEAR_OPS:
            count[ctx.is_recompute] += 1
            return (CheckpointPolicy.MUST_SAVE if count[ctx.is_recompute] % 2 == 1
                    else CheckpointPolicy.PREFER_RECOMPUTE)
        return CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def build_chunks(plan: ExecPlan, model: TransformerDims | ModelSpec, stages: tuple[int, ...],
                 device: torch.device, seed: int) -> tuple[list[Chunk], list[TiedGroup], object]:
    """This rank's chunks (in stage order), every tied group of the model, and the loss function.
    `model`: the transformer's dims, or the scenario's model section (a `module:` model)."""
    if plan.module is not None:
        return _module_chunks(plan, model, stages, device, seed)
    dims = model.resolve() if isinstance(model, ModelSpec) else model
    from partita.planner.models import build_model
    model = build_model(dims, device="meta", seed=seed)
    wanted = sorted({i for s in stages for i in plan.layers_of(s)})
    model.materialize(device, seed=seed, layers=wanted)
    layers, names = model.pipeline_layers(), model.layer_names()
    chunks = [Chunk(s, [layers[i] for i in plan.layers_of(s)], [names[i] for i in plan.layers_of(s)],
                    recompute=plan.recompute, precision=plan.precision, device_type=device.type,
                    recompute_num_layers=plan.recompute_num_layers)
              for s in stages]
    groups = tied_groups(model, plan)
    _untie_across_chunks(chunks)
    return chunks, groups, model.loss


def _module_chunks(plan: ExecPlan, spec: ModelSpec, stages: tuple[int, ...], device: torch.device,
                   seed: int) -> tuple[list[Chunk], list[TiedGroup], object]:
    names, layers, loss = build_module_chain(spec, device, seed)
    plain = (names[0],)
    chunks = [Chunk(s, [layers[i] for i in plan.layers_of(s)], [names[i] for i in plan.layers_of(s)],
                    recompute=plan.recompute, precision=plan.precision, device_type=device.type,
                    plain=plain, recompute_num_layers=plan.recompute_num_layers)
              for s in stages]
    groups = chain_tied_groups(layers, names, plan)
    _untie_across_chunks(chunks)
    return chunks, groups, loss


def build_module_chain(spec: ModelSpec, device: torch.device, seed: int):
    """(layer names, layers, loss function) of a `module:` model built on `device` with `seed`."""
    from partita.planner.models import build_from_spec, layer_chain
    model = build_from_spec(spec, device=device, seed=seed)
    chain = layer_chain(model)
    own = getattr(model, "loss", None)
    return [n for n, _ in chain], [m for _, m in chain], own if callable(own) else next_token_loss


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of (B, S, V) logits against (B, S) targets, in fp32."""
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


def chain_tied_groups(layers: list[nn.Module], names: list[str], plan: ExecPlan) -> list[TiedGroup]:
    """Parameters that several layers of a chain share, across more than one chunk."""
    stage_of_layer = {i: s for s in range(plan.stages) for i in plan.layers_of(s)}
    by_param: dict[int, list[tuple[str, int]]] = {}
    for i, layer in enumerate(layers):
        for name, p in layer.named_parameters(remove_duplicate=False):
            by_param.setdefault(id(p), []).append((f"{names[i]}.{name}", i))
    out = []
    for uses in by_param.values():
        stages = sorted({stage_of_layer[i] for _, i in uses})
        if len(stages) > 1:
            out.append(TiedGroup(names=tuple(n for n, _ in uses), stages=tuple(stages)))
    return sorted(out, key=lambda g: g.names)


def tied_groups(model, plan: ExecPlan) -> list[TiedGroup]:
    """Tied parameters of the model that end up in more than one chunk, in a fixed order."""
    names = model.layer_names()
    stage_of_layer = {i: s for s in range(plan.stages) for i in plan.layers_of(s)}
    out = []
    for group in model.tied_parameters():
        stages = sorted({stage_of_layer[_layer_index(n, names)] for n in group})
        if len(stages) > 1:
            out.append(TiedGroup(names=tuple(group), stages=tuple(stages)))
    return sorted(out, key=lambda g: g.names)


def _layer_index(param_name: str, layer_names: list[str]) -> int:
    """Index of the pipeline layer that owns `param_name` (longest layer-name prefix)."""
    best = max((n for n in layer_names if param_name.startswith(n + ".")), key=len)
    return layer_names.index(best)


def _untie_across_chunks(chunks: list[Chunk]) -> None:
    """Give each chunk its own copy of any module or parameter it shares with an earlier chunk of
    this rank (interleaved or single-rank pipelines): an optimizer and FSDP need one owner per
    tensor. Within one chunk, sharing is kept (one deepcopy memo per chunk)."""
    seen: set[int] = set()
    for chunk in chunks:
        _own(chunk, set(seen), {})
        seen |= {id(m) for m in chunk.modules()} | {id(p) for p in chunk.parameters()}


def _own(module: nn.Module, earlier: set[int], memo: dict) -> None:
    for key, child in list(module._modules.items()):
        if child is None:
            continue
        if id(child) in earlier:
            module._modules[key] = copy.deepcopy(child, memo)
        else:
            _own(child, earlier, memo)
    for key, param in list(module._parameters.items()):
        if param is not None and id(param) in earlier:
            if id(param) not in memo:
                memo[id(param)] = nn.Parameter(param.detach().clone(), param.requires_grad)
            module._parameters[key] = memo[id(param)]


def local_copies(chunks: list[Chunk], group: TiedGroup) -> list[nn.Parameter]:
    """This rank's copies of a tied parameter: one per chunk that holds it."""
    out = []
    for chunk in chunks:
        for name, param in chunk.named_parameters(remove_duplicate=False):
            if chunk.model_name(name) in group.names:
                out.append(param)
                break
    return out
