"""Published training measurements (CSV rows) as scenarios, with every assumption written down.

`read_rows(path)` reads a CSV in the columns of data/validation/published_dev.csv (a user's own
measurements in the same columns work the same way). `map_row(row, rules)` turns one row into a
scenario document plus the measured seconds per step, or says why the row cannot be simulated
(a TPU, a CNN, a speed-up ratio, degrees not stated, ...). Cell parsing lives in
`validation.rowcells`; what a row leaves unsaid comes from data/validation/rowmap.yaml
(`validation.rowrules`).
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partita.planner.documents import read_text
from partita.planner.errors import PartitaError, closest
from partita.planner.modelspec import preset_dims
from partita.planner.paths import VALIDATION_DIR
from partita.planner.scenario import Scenario, parse_scenario
from partita.validation import rowcells as cells
from partita.validation.metrics import Unconvertible, step_time_from_metric
from partita.validation.rowcells import Skip
from partita.validation.rowrules import Rules
from partita.validation.tuned import FASTEST, fastest_micro_batch

DEFAULT_CSV = VALIDATION_DIR / "published_dev.csv"
COLUMNS = ("id", "source_key", "source", "locator", "model", "params_B", "layers", "hidden", "heads",
           "seq_len", "vocab", "precision", "gpu", "gpu_mem_GB", "num_gpus", "num_nodes",
           "gpus_per_node", "intra_node", "inter_node", "tp", "pp", "dp", "other_parallelism",
           "recompute", "global_batch", "micro_batch", "metric", "value", "unit", "quality", "notes",
           "peak_memory_GiB")      # the last is optional: a measured peak memory per GPU, GiB
REQUIRED = ("id", "metric", "value", "unit")


@dataclass(frozen=True)
class MappedRow:
    """A row that is a fully specified GPU training run, ready to simulate."""
    row_id: str
    source_key: str
    model: str
    gpus: int
    document: dict[str, Any]          # the scenario document (parse_scenario input)
    scenario: Scenario
    measured_step_s: float
    conversion: str                   # how the row's metric became seconds per step
    measured_peak_memory_gib: float | None
    assumptions: tuple[str, ...]


@dataclass(frozen=True)
class SkippedRow:
    row_id: str
    model: str
    kind: str       # a short category, see rowcells.SKIP_KINDS
    reason: str


def read_rows(path: str | Path | None = None) -> list[dict[str, str]]:
    """The CSV's rows as dicts of stripped strings; unknown or missing key columns are errors."""
    path = Path(path) if path is not None else DEFAULT_CSV
    text = read_text(path)          # regular files only, size-capped, UTF-8 (else one error line)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        _check_header(path, header)
        rows = [{k: (v or "").strip() for k, v in raw.items() if k is not None} for raw in reader]
    except csv.Error as exc:
        raise PartitaError(f"{path}: line {reader.line_num}: not a valid CSV: {exc}") from None
    seen: set[str] = set()
    for n, row in enumerate(rows, start=2):
        if not row["id"]:
            raise PartitaError(f"{path}: line {n}: empty id")
        if row["id"] in seen:
            raise PartitaError(f"{path}: line {n}: duplicate id {row['id']!r}")
        seen.add(row["id"])
    return rows


def _check_header(path: Path, header: list[str]) -> None:
    if not header:
        raise PartitaError(f"{path}: empty file, expected a header line with columns "
                           f"{', '.join(REQUIRED)}, ...")
    for name in header:
        if name not in COLUMNS:
            near = closest(name, COLUMNS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise PartitaError(f"{path}: unknown column {name!r}{hint} (valid: {', '.join(COLUMNS)})")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise PartitaError(f"{path}: missing column(s) {', '.join(missing)} "
                           f"(every row needs {', '.join(REQUIRED)})")


def map_row(row: dict[str, str], rules: Rules, origin: str = "") -> MappedRow | SkippedRow:
    """The row as a scenario and a measured step time, or the reason it cannot be one."""
    row = {c: row.get(c, "") for c in COLUMNS}
    notes: list[str] = []
    try:
        cells.check_simulable(row, rules)
        doc = build_document(row, rules, notes)
        scenario = _parse(doc, row, origin)
        measured = _measured(row, scenario, rules, notes)
        peak_memory = cells.optional_number(row, "peak_memory_GiB")
    except Skip as skip:
        return SkippedRow(row["id"], row["model"], skip.kind, str(skip))
    except PartitaError as exc:      # a malformed measurement: bad input, not a skipped row
        raise PartitaError(f"{origin or DEFAULT_CSV}: row {row['id']}: {exc}") from None
    return MappedRow(row_id=row["id"], source_key=row["source_key"], model=row["model"],
                     gpus=scenario.parallel.gpus, document=doc, scenario=scenario,
                     measured_step_s=measured.step_time_s, conversion=measured.formula,
                     measured_peak_memory_gib=peak_memory, assumptions=tuple(notes))


def build_document(row: dict[str, str], rules: Rules, notes: list[str], *,
                   micro_batch: int | None = None) -> dict[str, Any]:
    """The scenario document for a row (sections model, cluster, training, parallel);
    `micro_batch` given: at that micro-batch, whatever the row or rowmap.yaml says."""
    tp, pp, dp, cp = cells.degrees(row)
    model = cells.model_section(row, tp, rules, notes)
    seq_len = model["seq_len"]
    predictions = rules.value(row, "mlm_predictions", notes)
    if predictions is not None:
        model["mlm_predictions"] = predictions
    dropout = rules.value(row, "dropout", notes)
    if dropout is not None:
        model["dropout"] = dropout
    gpus = cells.required_int(row, "num_gpus")
    if tp * pp * dp * cp != gpus:
        raise Skip("inconsistent", f"tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} = {tp * pp * dp * cp}, "
                   f"but num_gpus is {gpus}")
    system, extra_cluster = cells.system(row, rules, notes)
    cluster = {"system": system, "gpus": gpus, **extra_cluster}
    global_batch = cells.global_batch(row, dp, seq_len, notes)
    micro = micro_batch if micro_batch is not None else cells.micro_batch(row, rules, notes)
    if micro == FASTEST:
        micro = _fastest(row, rules, global_batch // dp if global_batch % dp == 0 else 0, notes)
    if global_batch % (micro * dp):
        raise Skip("inconsistent", f"global batch {global_batch} does not split into micro-batches of "
                   f"{micro} over dp={dp}")
    layers = model["layers"] if "layers" in model else preset_dims(model["preset"]).layers
    recompute, recomputed = cells.recompute(row, rules, notes, layers=layers, pipeline=pp)
    training = {"global_batch": global_batch, "micro_batch": micro,
                "precision": cells.precision(row, rules, system, notes), "recompute": recompute}
    if recomputed is not None:
        training["recompute_num_layers"] = recomputed
    training["framework"] = cells.framework(row, rules, notes)
    if rules.value(row, "launch_blocking", notes):
        training["launch_blocking"] = True
    if rules.value(row, "fused_elementwise", notes) is False:
        training["fused_elementwise"] = False
    if rules.value(row, "attention_softmax_fp32", notes):
        training["attention_softmax_fp32"] = True
    if rules.value(row, "fused_cross_entropy", notes):
        training["fused_cross_entropy"] = True
    unpad = rules.value(row, "attention_unpad", notes)
    if unpad is not None and unpad != "none":
        training["attention_unpad"] = unpad
    impl = rules.value(row, "optimizer_impl", notes)
    if impl is not None and impl != "fused":
        training["optimizer_impl"] = impl
    for key in ("norm_kernel", "rope_kernel"):
        form = rules.value(row, key, notes)
        if form is not None and form != "fused":
            training[key] = form
    early_stop = rules.value(row, "recompute_early_stop", notes)
    if early_stop is not None:
        training["recompute_early_stop"] = early_stop
    reduce_dtype = rules.value(row, "grad_reduce_dtype", notes)
    if reduce_dtype is not None:
        training["grad_reduce_dtype"] = reduce_dtype
    attention = rules.value(row, "attention", notes)
    if attention is not None:
        training["attention"] = attention
    parallel = cells.parallel_section(row, rules, (tp, pp, dp, cp), model, global_batch // (micro * dp),
                                      notes)
    name = f"{row['id']} {row['model']}".strip()
    return {"name": name, "model": model, "cluster": cluster, "training": training, "parallel": parallel}


def _fastest(row: dict[str, str], rules: Rules, per_rank: int, notes: list[str]) -> int:
    """rowmap.yaml's `micro_batch: fastest` (validation.tuned), with the choice in the notes."""
    why = rules.setting(row, "micro_batch")[1]

    def build(mb: int) -> Scenario | None:
        try:
            return _parse(build_document(row, rules, [], micro_batch=mb), row, "")
        except Skip:
            return None

    if not per_rank:            # the global batch does not split over dp: the caller says so
        return 1
    micro, how = fastest_micro_batch(per_rank, build)
    notes.append(f"micro_batch {micro}: {why}; {how}")
    return micro


def _parse(doc: dict[str, Any], row: dict[str, str], origin: str) -> Scenario:
    try:
        return parse_scenario(doc, origin=f"{origin}:{row['id']}" if origin else row["id"])
    except PartitaError as exc:
        raise Skip("inconsistent", f"not a valid scenario: {exc}") from None


def _measured(row: dict[str, str], s: Scenario, rules: Rules, notes: list[str]):
    value = cells.metric_value(row, notes)
    flop_notes: list[str] = []
    convention = rules.value(row, "flops", flop_notes)
    if convention is None:
        convention = "model"
        flop_notes.append("flops model: the source's FLOP convention is not known; model FLOPs assumed")
    try:
        measured = step_time_from_metric(s, row["metric"], value, row["unit"], convention=convention,
                                         peak_tflops=rules.mfu_peak_tflops(row["gpu"]))
    except Unconvertible as exc:
        raise Skip("ratio", str(exc)) from None
    if not (math.isfinite(measured.step_time_s) and measured.step_time_s > 0):
        raise PartitaError(f"value {row['value']!r} ({row['metric']}) gives a step time of "
                           f"{measured.step_time_s!r} s; expected a positive, finite time")
    if measured.convention:
        notes.extend(flop_notes)
    return measured
