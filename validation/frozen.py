"""The frozen test sets: measured step times reported once per model change, never fitted on (#16).

data/validation/frozen_test.yaml names each set under `sets:`, in the order `partita validate
--frozen-test` reports them:

    sets:
      <name>:
        csv: <file beside frozen_test.yaml>
        frozen: <YYYY-MM-DD, the day its rows were fixed>
        rows: [<row id>, ...]        # or `all`: every row of a CSV that holds the set alone

A row of a frozen set never enters a fit (the dev CSV's split and the leave-one-source-out
refits read published_dev.csv only), and no other report shows its predicted step time:
`partita validate` and `partita report validate` withhold it (`withhold_step_times`).
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from partita.planner.documents import Checker, load_document
from partita.planner.errors import unknown_name
from partita.planner.paths import VALIDATION_DIR
from partita.validation.rowmap import read_rows

FROZEN_TEST = VALIDATION_DIR / "frozen_test.yaml"


@dataclass(frozen=True)
class FrozenSet:
    """One frozen test set: its rows of one CSV."""
    name: str
    csv: Path
    row_ids: tuple[str, ...]
    frozen: str                      # the date its rows were fixed (ISO)


def load_frozen_sets(path: str | Path = FROZEN_TEST) -> tuple[FrozenSet, ...]:
    """Every set of frozen_test.yaml, checked: its CSV exists, every named row is in it, no row is
    in two sets."""
    path = Path(path)
    top = Checker(load_document(path), "", str(path))
    top.only(("sets",))
    sets = top.mapping.get("sets")
    if not isinstance(sets, dict) or not sets:
        raise top.error("expected a mapping of set names to {csv, frozen, rows}", "sets")
    out, seen = [], {}
    for name, body in sets.items():
        c = Checker(body, f"sets.{name}", str(path))
        c.only(("csv", "frozen", "rows"))
        csv = path.parent / c.str("csv", required=True)
        frozen = _date(c)
        if not csv.is_file():
            raise c.error(f"no such file {csv}", "csv")
        in_csv = [r["id"] for r in read_rows(csv)]
        ids = _row_ids(c, in_csv)
        for i in ids:
            if (csv, i) in seen:
                raise c.error(f"row {i} is already in set {seen[(csv, i)]!r}", "rows")
            seen[(csv, i)] = name
        out.append(FrozenSet(str(name), csv, ids, frozen))
    return tuple(out)


def frozen_row_ids(csv: str | Path, sets: tuple[FrozenSet, ...] | None = None) -> frozenset[str]:
    """The ids of `csv`'s rows that belong to a frozen set."""
    sets = load_frozen_sets() if sets is None else sets
    target = Path(csv).resolve()
    return frozenset(i for s in sets if s.csv.resolve() == target for i in s.row_ids)


def frozen_report(frozen_set: FrozenSet, catalog=None):
    """One frozen set's rows simulated (a `validation.runner.Report`), every row hold-out."""
    from partita.validation.runner import Split, run_validation
    return run_validation(frozen_set.csv, rows=frozen_set.row_ids, split=Split(fit=frozenset()),
                          catalog=catalog)


def withhold_step_times(report):
    """`report` (a `validation.runner.Report`) without the predicted step times of the frozen test
    sets' rows (their peak memory stays): a frozen set is reported by `partita validate
    --frozen-test` alone, once per model change, so no other report, printed or HTML, may show
    its errors. Returns (report, rows withheld)."""
    from dataclasses import replace
    frozen = frozen_row_ids(report.csv)
    if not frozen:
        return report, 0
    results = tuple(replace(r, predicted_step_s=None) if r.row.row_id in frozen else r
                    for r in report.results)
    withheld = sum(r.row.row_id in frozen and r.predicted_step_s is not None
                   for r in report.results)
    return replace(report, results=results), withheld


def _date(c: Checker) -> str:
    raw = c.mapping.get("frozen")
    text = raw.isoformat() if isinstance(raw, datetime.date) else raw
    try:
        return datetime.date.fromisoformat(text).isoformat()
    except (TypeError, ValueError):
        raise c.error(f"expected a date YYYY-MM-DD, got {raw!r}", "frozen") from None


def _row_ids(c: Checker, in_csv: list[str]) -> tuple[str, ...]:
    rows = c.mapping.get("rows")
    if rows == "all":
        if not in_csv:
            raise c.error("rows: all, but the CSV has no rows", "rows")
        return tuple(in_csv)
    if not isinstance(rows, list) or not rows or not all(isinstance(i, str) and i for i in rows):
        raise c.error("expected `all` or a non-empty list of row ids", "rows")
    if len(set(rows)) != len(rows):
        dup = sorted({i for i in rows if rows.count(i) > 1})
        raise c.error(f"duplicate row ids {', '.join(dup)}", "rows")
    for i in rows:
        if i not in in_csv:
            raise c.error(str(unknown_name("row id", i, in_csv)), "rows")
    return tuple(rows)
