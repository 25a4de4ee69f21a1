"""The rules for published rows (data/validation/rowmap.yaml): what a row leaves unsaid.

`load_rules(path)` reads and checks the file into `Rules`: per-source and per-row settings (micro
batch, precision, recompute, framework, ...), each a (value, why) pair, and the peak each source
divided by for MFU. `validation.rowcells` reads a row's cells with them; `validation.rowmap` maps
rows to scenarios.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from partita.planner.documents import Checker, load_document
from partita.planner.enums import (ARCHS, ATTENTION, CP_COMM_TYPES, FRAMEWORKS, NORM_FORMS,
                                   OPTIMIZER_IMPLS, PRECISIONS, RECOMPUTE, REDUCE_DTYPES,
                                   ROPE_FORMS, SCHEDULES, UNPAD_FORMS)
from partita.planner.paths import VALIDATION_DIR
from partita.validation.metrics import CONVENTIONS
from partita.validation.tuned import FASTEST

DEFAULT_RULES = VALIDATION_DIR / "rowmap.yaml"


@dataclass(frozen=True)
class Rules:
    """data/validation/rowmap.yaml: per-source and per-row settings, each a (value, why) pair."""
    sources: dict[str, dict[str, tuple[Any, str]]] = field(default_factory=dict)
    rows: dict[str, dict[str, tuple[Any, str]]] = field(default_factory=dict)
    peaks_tflops: dict[str, float] = field(default_factory=dict)

    def setting(self, row: dict[str, str], key: str) -> tuple[Any, str] | None:
        """The row's own setting for `key`, else its source's, else None."""
        for table, name in ((self.rows, row["id"]), (self.sources, row["source_key"])):
            if key in table.get(name, {}):
                return table[name][key]
        return None

    def value(self, row: dict[str, str], key: str, notes: list[str]) -> Any:
        """Like `setting`, recording `key value: why` among the row's assumptions."""
        found = self.setting(row, key)
        if found is None:
            return None
        value, why = found
        notes.append(f"{key} {str(value).lower() if isinstance(value, bool) else value}: {why}")
        return value

    def mfu_peak_tflops(self, gpu: str) -> float | None:
        """The peak a source divided by for MFU, by GPU family named in the row's gpu cell."""
        for family, peak in self.peaks_tflops.items():
            if family.lower() in gpu.lower():
                return peak
        return None


_SETTING_CHECKS = {
    "flops": ("choice", CONVENTIONS), "micro_batch": ("int_or_fastest", None),
    "recompute": ("choice", RECOMPUTE), "precision": ("choice", PRECISIONS),
    "gpu_memory_gb": ("number", None), "zero": ("choice", ("0", "1", "2", "3")),
    "schedule": ("choice", SCHEDULES), "virtual_stages": ("int", None),
    "sequence_parallel": ("bool", None), "overlap_grad_reduce": ("bool", None),
    "overlap_param_gather": ("bool", None), "inter_node_gbps": ("number", None),
    "tp_comm_overlap": ("bool", None),
    "exclude": ("bool", None), "attention": ("choice", ATTENTION),
    "framework": ("choice", FRAMEWORKS), "launch_blocking": ("bool", None),
    "fused_elementwise": ("bool", None), "attention_softmax_fp32": ("bool", None),
    "fused_cross_entropy": ("bool", None), "recompute_every_nth_block": ("int", None),
    "data_shard": ("int", None), "grad_reduce_dtype": ("choice", REDUCE_DTYPES),
    "mlm_predictions": ("int", None), "norm_kernel": ("choice", NORM_FORMS),
    "rope_kernel": ("choice", ROPE_FORMS), "arch": ("choice", ARCHS),
    "recompute_early_stop": ("bool", None), "dropout": ("bool", None),
    "attention_unpad": ("choice", UNPAD_FORMS), "optimizer_impl": ("choice", OPTIMIZER_IMPLS),
    "layout": ("str", None), "cp_comm_type": ("choice", CP_COMM_TYPES),
}


def load_rules(path: str | Path | None = None) -> Rules:
    """Read and check rowmap.yaml (every setting is `{value: ..., why: "..."}`)."""
    path = Path(path) if path is not None else DEFAULT_RULES
    top = Checker(load_document(path), "", str(path))
    top.only(("mfu_peak_tflops", "sources", "rows"))
    peaks: dict[str, float] = {}
    psec = top.sub("mfu_peak_tflops", required=False)
    if psec is not None:
        peaks = {k: psec.number(k) for k in psec.mapping if k != "source"}
    tables = []
    for section in ("sources", "rows"):
        sec = top.sub(section, required=False)
        names = list(sec.mapping) if sec is not None else []
        tables.append({str(n): _settings(sec.sub(n)) for n in names})
    return Rules(sources=tables[0], rows=tables[1], peaks_tflops=peaks)


def _settings(c: Checker) -> dict[str, tuple[Any, str]]:
    c.only(_SETTING_CHECKS)
    out = {}
    for key in c.mapping:
        entry = c.sub(key)
        entry.only(("value", "why"))
        why = entry.str("why", required=True)
        kind, choices = _SETTING_CHECKS[key]
        if kind == "choice":
            value = entry.choice("value", choices)
            value = int(value) if key == "zero" else value
        elif kind == "int":
            value = entry.int("value", required=True)
        elif kind == "int_or_fastest":      # validation.tuned: the fastest predicted that fits
            raw = entry.mapping.get("value")
            if isinstance(raw, str) and raw != FASTEST:
                raise entry.error(f"expected an integer or {FASTEST!r}, got {raw!r}", "value")
            value = FASTEST if raw == FASTEST else entry.int("value", required=True)
        elif kind == "number":
            value = entry.number("value", required=True)
        elif kind == "str":
            value = entry.str("value", required=True)
        else:
            value = entry.bool("value", False) if entry.has("value") else None
        if value is None:
            raise entry.error("missing required key", "value")
        out[key] = (value, why)
    return out
