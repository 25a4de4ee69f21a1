"""The allowed values of every scenario and catalog choice, each written once.

Tuples (not `enum.Enum`) because the values are the strings users write in scenario documents
(../shared/specs/scenario.md) and `Checker.choice` names them in its errors; order is the order the
errors list them in. Megatron-Core keeps its choices the same way in one place
(megatron/core/enums.py).
"""
from __future__ import annotations

ARCHS = ("gpt", "llama", "bert", "t5")                                 # model.arch
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")                   # training.precision, catalog FLOP/s keys
EXECUTED_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")                 # what `partita run` executes
RECOMPUTE = ("none", "selective", "selective-op", "full")              # training.recompute
# recompute policies whose backward re-runs the block's whole forward function (the op-level policy
# replays it, skipping only the ops whose outputs it kept)
WHOLE_FORWARD_AGAIN = ("full", "selective-op")
OPTIMIZERS = ("adam", "sgd")                                           # training.optimizer
OPTIMIZER_IMPLS = ("fused", "apex-fp16-optimizer")                      # training.optimizer_impl
FP8_RECIPES = ("delayed", "current", "mxfp8")   # training.fp8_recipe: Transformer Engine's scaling recipes
BLOCK_SCALED_ARCHS = ("blackwell",)   # GPU archs (catalog `arch`) whose tensor cores run MXFP8 GEMMs
UNPAD_FORMS = ("none", "per-tensor", "per-layer")                        # training.attention_unpad
ATTENTION = ("flash", "flash2", "flash1", "unfused", "eager")          # training.attention
FLASH_KERNELS = ("flash", "flash2", "flash1")   # attention kernels that never store the scores
FRAMEWORKS = ("megatron", "deepspeed", "fsdp")                         # training.framework
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")       # parallel.schedule
GRAD_REDUCE = ("auto", "ring", "tree", "hierarchical", "parameter-server")  # parallel.grad_reduce
CP_COMM_TYPES = ("p2p", "all_gather")                                  # parallel.cp_comm_type
REDUCE_DTYPES = ("auto", "fp32", "bf16", "fp16")                      # training.grad_reduce_dtype
NORM_FORMS = ("fused", "eager")                                    # training.norm_kernel
ROPE_FORMS = ("fused", "complex", "rotate-half", "matrix")          # training.rope_kernel
OPTIMIZE = ("speed", "memory")                                         # the partitioner's objective
