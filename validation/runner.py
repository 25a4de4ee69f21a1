"""The simulator against published measurements: per-row error and the fit / hold-out summary.

`run_validation()` maps every CSV row to a scenario (`validation.rowmap`), predicts its step with
`simulator.step.simulate` (imported when called), and compares: error = predicted / measured - 1.
Rows named in data/validation/split.yaml (`fit:`) are the only ones any number may be fitted
on; all others are hold-out, and the summary reports the two groups apart.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partita.planner.documents import Checker, load_document
from partita.planner.errors import PartitaError, unknown_name
from partita.planner.paths import VALIDATION_DIR
from partita.simulator.interval import percentile
from partita.validation.rowmap import MappedRow, SkippedRow, map_row, read_rows
from partita.validation.rowrules import Rules, load_rules

DEFAULT_SPLIT = VALIDATION_DIR / "split.yaml"
MEMORY_CSV = VALIDATION_DIR / "published_memory.csv"      # runs with a published peak memory
MEMORY_SPLIT = VALIDATION_DIR / "split_memory.yaml"
GROUPS = ("fit", "holdout")


@dataclass(frozen=True)
class Split:
    fit: frozenset[str]
    rule: str = ""


@dataclass(frozen=True)
class RowResult:
    row: MappedRow
    group: str                              # fit | holdout
    predicted_step_s: float | None = None
    predicted_peak_memory_gib: float | None = None
    fits_in_memory: bool | None = None
    failure: str = ""                       # why the simulator refused the scenario

    @property
    def error(self) -> float | None:
        """predicted / measured - 1 (signed; 0.1 = predicted 10% slower than measured)."""
        if self.predicted_step_s is None:
            return None
        return self.predicted_step_s / self.row.measured_step_s - 1.0

    @property
    def memory_error(self) -> float | None:
        measured = self.row.measured_peak_memory_gib
        if measured is None or self.predicted_peak_memory_gib is None:
            return None
        return self.predicted_peak_memory_gib / measured - 1.0


@dataclass(frozen=True)
class Summary:
    """Absolute relative errors of one group, in percent."""
    count: int
    median_pct: float | None
    p90_pct: float | None
    max_pct: float | None
    mean_pct: float | None
    bias_pct: float | None                  # mean signed error: > 0 predicts slower than measured

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "median_abs_pct": self.median_pct, "p90_abs_pct": self.p90_pct,
                "max_abs_pct": self.max_pct, "mean_abs_pct": self.mean_pct,
                "mean_signed_pct": self.bias_pct}


@dataclass(frozen=True)
class Report:
    csv: str
    split_rule: str
    results: tuple[RowResult, ...]
    skipped: tuple[SkippedRow, ...]

    def group(self, name: str) -> list[RowResult]:
        return [r for r in self.results if r.group == name and r.error is not None]

    def failed(self) -> list[RowResult]:
        return [r for r in self.results if r.failure]

    def summary(self, group: str | None = None) -> Summary:
        rows = [r for r in self.results if r.error is not None and group in (None, r.group)]
        return summarize([r.error for r in rows])

    def interval_coverage(self) -> tuple[int, int]:
        """(rows whose measured step lies inside the prediction's 90% interval, rows with one):
        the interval of `simulator.interval`, as `simulate` shows it."""
        from partita.simulator.interval import step_time_interval
        inside = total = 0
        for r in self.results:
            band = (step_time_interval(r.predicted_step_s) if r.predicted_step_s is not None
                    else None)
            if band is None:
                continue
            total += 1
            inside += band.low_s <= r.row.measured_step_s <= band.high_s
        return inside, total

    def memory_summary(self, group: str | None = None) -> Summary:
        return summarize([r.memory_error for r in self.results
                          if r.memory_error is not None and group in (None, r.group)])

    def to_json(self) -> dict[str, Any]:
        return {
            "csv": self.csv, "split_rule": self.split_rule,
            "summary": {g: self.summary(g).to_json() for g in GROUPS} | {"all": self.summary().to_json(),
                                                                          "memory": self.memory_summary().to_json()}
            | {f"memory_{g}": self.memory_summary(g).to_json() for g in GROUPS},
            "rows": [_row_json(r) for r in self.results],
            "skipped": [{"id": s.row_id, "model": s.model, "kind": s.kind, "reason": s.reason}
                        for s in self.skipped],
        }


def summarize(errors: Iterable[float]) -> Summary:
    signed = [100.0 * e for e in errors]
    if not signed:
        return Summary(0, None, None, None, None, None)
    absolute = [abs(e) for e in signed]
    return Summary(count=len(signed), median_pct=percentile(absolute, 50), p90_pct=percentile(absolute, 90),
                   max_pct=max(absolute), mean_pct=sum(absolute) / len(absolute),
                   bias_pct=sum(signed) / len(signed))


def load_split(path: str | Path | None = None) -> Split:
    """split.yaml: `rule:` (text) and `fit:` (row ids); every other row is hold-out."""
    path = Path(path) if path is not None else DEFAULT_SPLIT
    c = Checker(load_document(path), "", str(path))
    c.only(("rule", "fit"))
    ids = c.mapping.get("fit") or []
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise c.error("expected a list of row ids", "fit")
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise c.error(f"duplicate row ids {', '.join(dup)}", "fit")
    return Split(fit=frozenset(ids), rule=c.str("rule", "") or "")


def select_rows(rows: list[dict[str, str]], wanted: Iterable[str] | None) -> list[dict[str, str]]:
    """The rows with the given ids, in CSV order; an unknown id is an error naming the closest."""
    if wanted is None:
        return rows
    wanted = list(wanted)
    ids = [r["id"] for r in rows]
    for w in wanted:
        if w not in ids:
            raise unknown_name("row id", w, ids)
    return [r for r in rows if r["id"] in set(wanted)]


def _default_simulate() -> Callable[..., Any]:
    from partita.simulator.step import simulate
    return simulate


def _default_catalog() -> Any:
    from partita.planner.catalog import load_catalog
    return load_catalog()


def run_validation(csv: str | Path | None = None, *, rows: Iterable[str] | None = None,
                   split: Split | None = None, rules: Rules | None = None, catalog: Any = None,
                   simulate: Callable[..., Any] | None = None) -> Report:
    """Map, simulate and compare every row (or the ids in `rows`) of `csv`."""
    path = Path(csv) if csv is not None else None
    table = select_rows(read_rows(path), rows)
    split = split if split is not None else load_split()
    rules = rules if rules is not None else load_rules()
    mapped = [map_row(r, rules, origin=str(path or "")) for r in table]
    usable = [m for m in mapped if isinstance(m, MappedRow)]
    if usable:
        simulate = simulate or _default_simulate()
        catalog = catalog if catalog is not None else _default_catalog()
    results = tuple(_predict(m, split, simulate, catalog) for m in usable)
    skipped = tuple(m for m in mapped if isinstance(m, SkippedRow))
    return Report(csv=str(path or "data/validation/published_dev.csv"), split_rule=split.rule,
                  results=results, skipped=skipped)


def _predict(m: MappedRow, split: Split, simulate: Callable[..., Any], catalog: Any) -> RowResult:
    group = "fit" if m.row_id in split.fit else "holdout"
    try:
        result = simulate(m.scenario, catalog)
    except PartitaError as exc:
        return RowResult(row=m, group=group, failure=str(exc))
    return RowResult(row=m, group=group, predicted_step_s=result.step_time_s,
                     predicted_peak_memory_gib=result.peak_memory_gib,
                     fits_in_memory=result.fits_in_memory)


def plan_text(m: MappedRow) -> str:
    """'tp8 pp12 dp4 cp1 z1 1f1b' (v2 for interleaved)."""
    p = m.scenario.parallel
    text = f"tp{p.tensor} pp{p.pipeline} dp{p.data} cp{p.context} z{p.zero} {p.schedule}"
    return text + (f" v{p.virtual_stages}" if p.virtual_stages > 1 else "")


def _row_json(r: RowResult) -> dict[str, Any]:
    m = r.row
    return {"id": m.row_id, "source_key": m.source_key, "model": m.model, "gpus": m.gpus,
            "system": m.scenario.cluster.system, "plan": plan_text(m), "group": r.group,
            "measured_step_s": m.measured_step_s, "predicted_step_s": r.predicted_step_s,
            "error_pct": None if r.error is None else 100.0 * r.error,
            "measured_peak_memory_gib": m.measured_peak_memory_gib,
            "predicted_peak_memory_gib": r.predicted_peak_memory_gib,
            "fits_in_memory": r.fits_in_memory, "failure": r.failure or None,
            "conversion": m.conversion, "assumptions": list(m.assumptions), "scenario": m.document}
