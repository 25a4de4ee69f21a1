"""Reading the cells of a published-measurement row: numbers, model dims, GPU, plan, batch, precision.

Each reader returns what the scenario needs or raises `Skip` with the reason the row cannot be
simulated. Every value that is inferred rather than read (a default, a padded vocabulary, a node
layout) is appended to `notes`, which `partita validate` prints as the row's assumptions.
"""
from __future__ import annotations

import math
import re
from typing import Any

from partita.planner.errors import PartitaError
from partita.planner.modelspec import preset_dims, preset_names
from partita.validation.rowrules import Rules
from partita.validation.tuned import FASTEST

SKIP_KINDS = {
    "excluded": "excluded in rowmap.yaml",
    "not-gpu": "not a GPU run (TPU)",
    "not-transformer": "not a transformer (CNN)",
    "ratio": "a ratio, average or other metric without an absolute time",
    "bound": "a bound, not a measurement",
    "incomplete": "configuration not fully stated",
    "unsupported": "a setting the simulator does not express",
    "hardware": "GPU not in the catalog",
    "inconsistent": "configuration does not add up",
}
_MISSING = ("", "nan", "none stated", "not stated", "not found", "n/a", "-")
_CNN = re.compile(r"inception|resnet|vgg|amoebanet|efficientnet|mobilenet|alexnet", re.I)
OMNIPATH_LINK_GBPS = 100        # Intel Omni-Path 100 series: 100 Gb/s per port
GPT2_BPE_VOCAB = 50257          # GPT-2 tokenizer (Radford et al. 2019)
MEGATRON_VOCAB_DIVISOR = 128    # Megatron pads the vocab to a multiple of 128 x tp (--make-vocab-size-divisible-by)
CATALOG_H100_MEMORY_GB = 80     # the catalog's h100-80gb (SXM5, HBM3); other H100s are other GPUs
# Checkpointing that is neither none, full, nor the simulator's selective (the attention core,
# Korthikanti et al. 2022 Sec. 5): whole blocks checkpointed for some of the blocks (torchtitan's
# 'selective layer', fms-fsdp's selective_checkpointing), which is full recompute of that many
# blocks (`training.recompute_num_layers`) where the rules give the interval n
# (`recompute_every_nth_block`), or an operator policy (torchtitan's 'selective op': every second
# matmul and all non-matmul ops recomputed), which the simulator does not express.
_SOME_BLOCKS = re.compile(r"selective layer\b|fraction of (?:the )?blocks|every n-th block", re.I)
_OP_POLICY = re.compile(r"selective op\b", re.I)


class Skip(Exception):
    """The row is not a fully specified GPU training run; `kind` is a key of SKIP_KINDS."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


def missing(text: str) -> bool:
    return text.strip().lower() in _MISSING or text.strip().lower().startswith("not stated")


def leading_int(text: str) -> tuple[int | None, str]:
    """'24.0' -> 24; '8 (assumed = model table)' -> (8, '(assumed = model table)'); '400/MP' -> None."""
    m = re.fullmatch(r"\s*(\d[\d,]*)(?:\.0+)?\s*(\(.*\))?\s*", text)
    if not m:
        return None, text
    return int(m.group(1).replace(",", "")), m.group(2) or ""


def required_int(row: dict[str, str], col: str) -> int:
    value, _ = leading_int(row[col])
    if value is None or value < 1:
        what = "not stated" if missing(row[col]) else f"{row[col]!r} is not one whole number"
        raise Skip("incomplete", f"{col} {what}")
    return value


def optional_number(row: dict[str, str], col: str) -> float | None:
    text = row.get(col, "")
    if missing(text):
        return None
    try:
        value = float(text)
    except ValueError:
        raise Skip("incomplete", f"{col} {text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise PartitaError(f"{col} {text!r}: expected a positive, finite number")
    return value


def check_simulable(row: dict[str, str], rules: Rules) -> None:
    """Reject rows that are not a GPU transformer training run before reading their details."""
    excluded = rules.setting(row, "exclude")
    if excluded is not None and excluded[0]:
        raise Skip("excluded", excluded[1])
    if "tpu" in row["gpu"].lower() or "not gpu" in row["gpu"].lower():
        raise Skip("not-gpu", f"runs on {row['gpu']!r}")
    if _CNN.search(row["model"]):
        raise Skip("not-transformer", f"{row['model']} is a CNN; the simulator models transformers")
    metric = row["metric"].lower()
    if "->" in row["value"]:
        raise Skip("ratio", f"{row['metric']!r} is a before -> after pair, not one run's time")
    if row["unit"].strip() == "x" or "speedup" in metric or "speed-up" in metric:
        raise Skip("ratio", f"{row['metric']!r} is a speed-up ratio, not a time of this run")
    if "efficiency" in metric and "baseline" not in metric:
        raise Skip("ratio", f"{row['metric']!r} has no absolute baseline to convert from")
    if "average over" in metric or "averaged over" in metric:
        raise Skip("ratio", f"{row['metric']!r} averages several models")


def metric_value(row: dict[str, str], notes: list[str]) -> float:
    text = row["value"].strip()
    if text.startswith((">", "<", "up to")):
        raise Skip("bound", f"value {text!r} is a bound")
    approx = text.startswith("~")
    try:
        value = float(text.lstrip("~").replace(",", ""))
    except ValueError:
        raise Skip("incomplete", f"value {text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise PartitaError(f"value {text!r} ({row['metric']}): expected a positive, finite number")
    if approx:
        notes.append(f"value {text}: approximate as published, taken as {value:g}")
    return value


def degrees(row: dict[str, str]) -> tuple[int, int, int, int]:
    """(tp, pp, dp, cp); cp from 'CP=n' in other_parallelism, else 1.

    A degree the source does not state (the CSV marks a guess '(assumed ...)' or '(if ...)') makes
    the row not fully specified: the parallel layout sets most of the step time, and a simulated
    guess would judge the guess, not the simulator."""
    out = []
    for col in ("tp", "pp", "dp"):
        value, rest = leading_int(row[col])
        if value is None:
            raise Skip("incomplete", f"parallel degrees not stated ({col} = {row[col] or 'empty'!r})")
        if "assum" in rest or "if " in rest:
            raise Skip("incomplete", f"parallel layout not stated by the source ({col} = {row[col]!r})")
        if value < 1:
            raise Skip("inconsistent", f"{col} {row[col]!r}: a parallel degree is at least 1")
        out.append(value)
    cp = re.search(r"\bCP\s*=\s*(\d+)", row["other_parallelism"])
    return out[0], out[1], out[2], int(cp.group(1)) if cp else 1


def model_section(row: dict[str, str], tp: int, rules: Rules, notes: list[str]) -> dict[str, Any]:
    """The scenario's `model:` section: transformer dims, or a preset the row names without dims.
    The architecture is the rule's `arch` where the source has one (a model whose name does not
    say it), else read from the name."""
    seq_len = required_int(row, "seq_len")
    name = row["model"]
    if all(missing(row[c]) for c in ("layers", "hidden", "heads")):
        preset = _preset_for(name)
        if preset is None:
            raise Skip("incomplete", f"model dims (layers, hidden, heads) not stated for {name!r}")
        notes.append(f"model dims of preset {preset} (the row names {name!r} without dims)")
        return {"preset": preset, "seq_len": seq_len}
    arch = rules.value(row, "arch", notes) or _arch(name, notes)
    heads, kv_heads = _heads(row)
    model = {"arch": arch, "layers": required_int(row, "layers"), "hidden": required_int(row, "hidden"),
             "heads": heads, "seq_len": seq_len, "vocab": _vocab(row, tp, notes)}
    if kv_heads:
        model["kv_heads"] = kv_heads
    # a width ('FFN 14336'), not a multiple of the hidden size ('FFN 4h')
    ffn = re.search(r"\bFFN\s+(\d+)(?![\d.]*\s*[hx]\b)", row["notes"] + " " + row["other_parallelism"],
                    re.I)
    if ffn:
        model["ffn_hidden"] = int(ffn.group(1))
    elif arch == "llama":
        raise Skip("incomplete", f"{name!r} has a gated MLP whose width (FFN) the row does not state")
    return model


def _preset_for(name: str) -> str | None:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for preset in preset_names():
        if re.sub(r"[^a-z0-9]", "", preset) == key:
            return preset
    return None


def _arch(name: str, notes: list[str]) -> str:
    low = name.lower()
    for key, arch in (("llama", "llama"), ("bert", "bert"), ("t5", "t5")):
        if key in low:
            return arch
    if "gpt" not in low:
        notes.append(f"arch gpt for {name!r}: a GPT-like decoder (4h GELU MLP; position encoding "
                     "does not change the matmuls)")
    return "gpt"


def _heads(row: dict[str, str]) -> tuple[int, int]:
    """'128 (8 KV heads, GQA)' -> (128, 8); '96' -> (96, 0)."""
    heads, rest = leading_int(row["heads"])
    if heads is None:
        raise Skip("incomplete", f"heads {row['heads'] or 'not stated'!r}")
    kv = re.search(r"(\d+)\s*KV heads", rest, re.I)
    return heads, int(kv.group(1)) if kv else 0


def _vocab(row: dict[str, str], tp: int, notes: list[str]) -> int:
    """'250k (250680)' -> 250680; '50257 (embedding padded to 50432)' -> 50432; 'GPT-2 BPE' -> padded."""
    text = row["vocab"]
    padded = re.search(r"padded to (\d+)", text)
    exact = re.search(r"\((\d{4,})\)", text)
    first = re.match(r"\s*(\d{4,})", text)
    for m in (padded, exact, first):
        if m:
            return int(m.group(1))
    if "gpt-2 bpe" in text.lower():
        divisor = MEGATRON_VOCAB_DIVISOR * tp
        vocab = -(-GPT2_BPE_VOCAB // divisor) * divisor
        notes.append(f"vocab {vocab}: GPT-2 BPE ({GPT2_BPE_VOCAB}) padded to a multiple of 128 x tp "
                     "as Megatron does")
        return vocab
    raise Skip("incomplete", f"vocab {text or 'not stated'!r}")


def system(row: dict[str, str], rules: Rules, notes: list[str]) -> tuple[str, dict[str, Any]]:
    """The catalog system for the row's GPU (its node layout comes from the catalog), and the
    cluster what-if `inter_node_gbps` where the row states a different network."""
    name = _system_name(row, rules, notes)
    extra: dict[str, Any] = {}
    gbps = _inter_node_gbps(row["inter_node"], notes)
    if gbps is None:
        gbps = rules.value(row, "inter_node_gbps", notes)
    if gbps is not None:
        extra["inter_node_gbps"] = gbps
    return name, extra


def _system_name(row: dict[str, str], rules: Rules, notes: list[str]) -> str:
    gpu = row["gpu"]
    low = gpu.lower()
    instance = re.search(r"\b(?:ml\.)?([pg]\d\w*\.\d*xlarge)\b", low)
    if instance:
        return instance.group(1)
    if "h200" in low:
        return "hgx-h200"
    if "h100" in low:
        memory = row["gpu_mem_GB"]
        if not missing(memory) and leading_int(memory)[0] != CATALOG_H100_MEMORY_GB:
            raise Skip("hardware", f"GPU {gpu!r} with {memory} GB: the catalog's H100 is the "
                       f"{CATALOG_H100_MEMORY_GB} GB SXM5 (HBM3); a variant with other memory (and "
                       "its own clocks and power limit) has no system in the catalog")
        return "dgx-h100"
    if "a100" in low or "v100" in low:
        memory = _gpu_memory_gb(row, rules, notes)
        if "a100" in low:
            return "dgx-a100-40gb" if memory <= 40 else "dgx-a100-80gb"
        if memory >= 32 or "dgx-2" in low or "sxm3" in low:
            return "dgx2-v100"
        return "dgx1-v100"
    raise Skip("hardware", f"GPU {gpu!r} has no system in the catalog")


def _gpu_memory_gb(row: dict[str, str], rules: Rules, notes: list[str]) -> float:
    text = row["gpu_mem_GB"]
    if not missing(text):
        try:
            return float(text)
        except ValueError:
            raise Skip("incomplete", f"gpu_mem_GB {text!r} is not a number") from None
    memory = rules.value(row, "gpu_memory_gb", notes)
    if memory is None:
        raise Skip("incomplete", f"memory of the {row['gpu']} GPUs not stated")
    return float(memory)


def _inter_node_gbps(text: str, notes: list[str]) -> float | None:
    """A per-node network the row states: '1600 Gbps node-node ...', '4 OPA links per node'."""
    m = re.search(r"(\d+)\s*Gbps node-node", text)
    if m:
        notes.append(f"inter_node_gbps {m.group(1)}: the row's network ({text})")
        return float(m.group(1))
    m = re.search(r"(\d+)\s*OPA links", text)
    if m:
        gbps = int(m.group(1)) * OMNIPATH_LINK_GBPS
        notes.append(f"inter_node_gbps {gbps}: {m.group(1)} Omni-Path links x {OMNIPATH_LINK_GBPS} Gb/s")
        return float(gbps)
    return None


def global_batch(row: dict[str, str], dp: int, seq_len: int, notes: list[str]) -> int:
    """Sequences per step: '1536'; '32 seq per DP group; 16M tokens' -> 32 x dp; '491,520 tokens' / s."""
    text = row["global_batch"]
    value, _ = leading_int(text)
    if value is not None:
        if value < 1:
            raise Skip("inconsistent", f"global batch {text!r}: at least 1 sequence")
        return value
    per_dp = re.match(r"\s*(\d+)\s*seq per DP group", text)
    if per_dp:
        notes.append(f"global_batch {int(per_dp.group(1)) * dp}: {per_dp.group(1)} sequences x dp {dp}")
        return int(per_dp.group(1)) * dp
    tokens = re.match(r"\s*([\d,.]+)\s*([kM]?)\s*tokens", text)
    if tokens:
        count = float(tokens.group(1).replace(",", "")) * {"": 1, "k": 1e3, "M": 1e6}[tokens.group(2)]
        if count % seq_len:
            raise Skip("inconsistent", f"global batch {text!r} is not a whole number of "
                       f"{seq_len}-token sequences")
        notes.append(f"global_batch {int(count) // seq_len}: {text} / seq_len {seq_len}")
        return int(count) // seq_len
    raise Skip("incomplete", f"global batch {text or 'not stated'!r}")


def micro_batch(row: dict[str, str], rules: Rules, notes: list[str]) -> int | str:
    """The row's micro-batch, rowmap.yaml's for the row, 1 where neither says, or `FASTEST`
    (validation.tuned) where rowmap.yaml asks for the fastest that fits; only the last leaves
    the note to the caller, which knows the choice."""
    value, _ = leading_int(row["micro_batch"])
    if value is not None:
        if value < 1:
            raise Skip("inconsistent", f"micro_batch {row['micro_batch']!r}: at least 1 sequence")
        return value
    found = rules.setting(row, "micro_batch")
    if found is not None and found[0] == FASTEST:
        return FASTEST
    value = rules.value(row, "micro_batch", notes)
    if value is None:
        notes.append("micro_batch 1: not stated")
        return 1
    return int(value)


def precision(row: dict[str, str], rules: Rules, system_name: str, notes: list[str]) -> str:
    text = row["precision"].lower()
    if "fp8" in text:
        return "fp8"
    if "bf16" in text and "fp16 or bf16" not in text:
        if "not stated" in text or "likely" in text:
            notes.append(f"precision bf16: the row says {row['precision']!r}")
        return "bf16"
    if "fp16" in text and "bf16" not in text:
        return "fp16"
    if "tf32" in text:
        return "tf32"
    if text.strip() in ("fp32", "float32"):
        return "fp32"
    chosen = rules.value(row, "precision", notes)
    if chosen is None:
        chosen = "fp16" if "v100" in system_name else "bf16"
        notes.append(f"precision {chosen}: the row says {row['precision'] or 'nothing'!r}"
                     + ("" if chosen == "fp16" else " (A100/H100 run fp16 and bf16 at one peak)"))
    return chosen


def framework(row: dict[str, str], rules: Rules, notes: list[str]) -> str:
    """The row's own rule, else the framework the row names (DeepSpeed, FSDP), else the source's
    rule, else Megatron-LM. (A row's rule comes first: a baseline run of plain PyTorch reported in a
    DeepSpeed repository names DeepSpeed in its source.)"""
    own = rules.rows.get(row["id"], {}).get("framework")
    if own is not None:
        notes.append(f"framework {own[0]}: {own[1]}")
        return own[0]
    text = " ".join(row.get(k, "") for k in ("other_parallelism", "source", "notes")).lower()
    if "deepspeed" in text:
        return "deepspeed"
    if "fsdp" in text:
        return "fsdp"
    chosen = rules.value(row, "framework", notes)
    if chosen is None:
        notes.append("framework megatron: the row names neither DeepSpeed nor FSDP")
        return "megatron"
    return chosen


def recompute(row: dict[str, str], rules: Rules, notes: list[str], *, layers: int,
              pipeline: int) -> tuple[str, int | None]:
    """(none | selective | selective-op | full, blocks recomputed or None for all) from the row's
    cell, else the rules. Checkpointing of every n-th block (`_SOME_BLOCKS`) is full recompute of
    layers // n blocks where the rules give n (`recompute_every_nth_block`; torchtitan and fms-fsdp
    count the blocks of the whole model, so only without a pipeline; every n-th block with n
    unknown skips the row); torchtitan's operator policy (`_OP_POLICY`) is selective-op."""
    text = row["recompute"].lower().strip()
    found = None
    if _SOME_BLOCKS.search(text) and not _OP_POLICY.search(text):
        nth = rules.value(row, "recompute_every_nth_block", notes)
        if nth is not None and pipeline == 1:
            return "full", max(1, layers // nth)
        why = ("n is not known" if nth is None else
               f"counted over the whole model, not per pipeline stage (pipeline {pipeline})")
        raise Skip("unsupported", f"recompute {row['recompute']!r}: checkpoints every n-th block, "
                   f"{why}")
    if _OP_POLICY.search(text):      # torchtitan's op-level selective activation checkpointing
        return "selective-op", None
    if text.startswith(("no", "none")) and not text.startswith("not"):
        found = "none"
    elif "selective" in text:
        found = "selective"
    elif text.startswith(("yes", "full")) or "checkpointing" in text or "materialization" in text:
        found = "full"
    if found is not None:
        if " at " in text:      # a qualified statement, e.g. Llama 3's 'none at 8K'
            notes.append(f"recompute {found}: the row says {row['recompute']!r}")
        return found, None
    chosen = rules.value(row, "recompute", notes)
    if chosen is None:
        notes.append("recompute none: not stated")
        return "none", None
    return chosen, None


def parallel_section(row: dict[str, str], rules: Rules, plan: tuple[int, int, int, int],
                     model: dict[str, Any], microbatches: int, notes: list[str]) -> dict[str, Any]:
    """The scenario's `parallel:` section from the degrees and the other_parallelism text."""
    tp, pp, dp, cp = plan
    out: dict[str, Any] = {"tensor": tp, "pipeline": pp, "data": dp, "context": cp,
                           "zero": zero_stage(row, rules, notes)}
    schedule, virtual = _schedule(row, rules, pp, microbatches, notes)
    out["schedule"] = schedule
    if virtual > 1:
        out["virtual_stages"] = virtual
    if tp > 1 and rules.value(row, "sequence_parallel", notes):
        out["sequence_parallel"] = True
    for key in ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap"):
        value = rules.value(row, key, notes)
        if value is not None:
            out[key] = bool(value)
    shard = rules.value(row, "data_shard", notes)
    if shard is not None:
        out["data_shard"] = int(shard)
    cp_comm = rules.value(row, "cp_comm_type", notes) if cp > 1 else None
    if cp_comm is not None and cp_comm != "p2p":
        out["cp_comm_type"] = cp_comm
    layout = rules.value(row, "layout", notes) if pp > 1 else None
    if layout is not None:              # the chunks as the source lays them out (planner/layout.py)
        out.pop("virtual_stages", None)
        out["layout"] = layout
        return out
    stages = _uneven_stages(_layers(model), pp * virtual, notes) if pp > 1 else None
    if stages is not None:
        out["stages"] = stages
    return out


def zero_stage(row: dict[str, str], rules: Rules, notes: list[str]) -> int:
    """ZeRO stage from 'ZeRO-1', 'FSDP FULL_SHARD' or 'HYBRID_SHARD' (3; its shard group is the
    rules' `data_shard`), 'SHARD_GRAD_OP' (2), 'ZeRO stage 2', ..."""
    text = row["other_parallelism"].lower()
    if "shard_grad_op" in text:
        return 2
    if "no reshard after fwd" in text:
        notes.append("zero 2: FSDP without resharding after forward keeps parameters gathered "
                     "through backward and shards gradients and optimizer state (ZeRO-2)")
        return 2
    if "full_shard" in text or "hybrid_shard" in text:     # HYBRID_SHARD: FULL_SHARD in a group
        return 3
    m = re.search(r"stage\s*(\d)", text) or re.search(r"zero-(\d)\b", text)
    if m and "zero" in text:
        return int(m.group(1))
    if "optimizer-state sharding" in text or "optimizer state sharding" in text:
        return 1
    if "fsdp" in text:
        notes.append("zero 3: FSDP's default sharding is FULL_SHARD")
        return 3
    value = rules.value(row, "zero", notes)
    return int(value) if value is not None else 0


def _schedule(row: dict[str, str], rules: Rules, pp: int, microbatches: int,
              notes: list[str]) -> tuple[str, int]:
    text = row["other_parallelism"].lower()
    if re.search(r"interleaved (?:pp |pipeline )?schedule", text):
        schedule = "interleaved-1f1b"
    elif "gpipe" in text:
        schedule = "gpipe"
    else:
        schedule = rules.value(row, "schedule", notes) or "1f1b"
    if schedule != "interleaved-1f1b" or pp == 1:
        return ("1f1b" if pp == 1 else schedule), 1
    virtual = int(rules.value(row, "virtual_stages", notes) or 2)
    if microbatches % pp:
        raise Skip("inconsistent", f"interleaved schedule needs micro-batches per replica "
                   f"({microbatches}) to be a multiple of pp ({pp})")
    return schedule, virtual


def _layers(model: dict[str, Any]) -> int:
    if "preset" in model:
        return preset_dims(model["preset"]).total_layers
    return model["layers"]


def _uneven_stages(layers: int, chunks: int, notes: list[str]) -> list[list[int]] | None:
    """None when layers split evenly; else the first and last chunk hold one layer fewer, where
    that splits; else None too (the simulator's balanced split, planner.stages, with a note).

    That is the split DeepSpeed's partitioner makes when the embedding and the head count as one
    layer each (BLOOM's 70 layers on 12 stages: 5 + 10 x 6 + 5). Llama 3 405B applies the same
    rule at one block per chunk (Sec. 3.3.2: "we reduce one Transformer layer each from the first
    and the last stages"), which leaves the embedding and the head chunks of their own; its rows
    say so with a `layout` (rowmap.yaml), which replaces this split.
    """
    if layers % chunks == 0:
        return None
    if layers < chunks:
        raise Skip("inconsistent", f"{layers} layers do not fill {chunks} pipeline chunks")
    if (layers + 2) % chunks or (layers + 2) // chunks < 2:
        notes.append(f"stages: {layers} layers over {chunks} chunks, the simulator's balanced split "
                     "(the row does not say how its framework split them)")
        return None
    size = (layers + 2) // chunks
    bounds, start = [], 0
    for i in range(chunks):
        stop = start + size - (1 if i in (0, chunks - 1) else 0)
        bounds.append([start, stop])
        start = stop
    notes.append(f"stages: {layers} layers over {chunks} chunks, first and last hold {size - 1}, "
                 f"the others {size} (embedding and head count as a layer each)")
    return bounds
