"""Schedules as CSV, the format of torch's `_dump_csv` / `_load_csv`, so users can supply their own.

One row per rank (row 0 is rank 0), one cell per step, actions in torch's text ("0F0", "1SEND_B3");
an empty cell is a bubble:

    0F0,0F1,0F2,0F3,0B0,0F4,0B1,...
    ,1F0,1F1,1F2,1B0,1F3,...
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from partita.planner.errors import PartitaError
from partita.planner.schedules.actions import Action, Schedule


def format_csv(schedule: Schedule) -> str:
    """The CSV text of a schedule (rows in rank order)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for r in sorted(schedule):
        writer.writerow(["" if a is None else str(a) for a in schedule[r]])
    return buf.getvalue()


def parse_csv(text: str, origin: str = "schedule") -> Schedule:
    """Read CSV text; errors name `origin`, the row (rank) and the column (step)."""
    schedule: Schedule = {}
    for rank, row in enumerate(csv.reader(io.StringIO(text))):
        schedule[rank] = [_cell(cell, origin, rank, step) for step, cell in enumerate(row)]
    if not schedule:
        raise PartitaError(f"{origin}: empty schedule, expected one row of actions per rank")
    return schedule


def _cell(cell: str, origin: str, rank: int, step: int) -> Action | None:
    try:
        return Action.from_str(cell)
    except PartitaError as exc:
        raise PartitaError(f"{origin}: row {rank + 1} (rank {rank}), column {step + 1}: "
                           f"{exc}") from None


def to_csv(schedule: Schedule, path: str | Path) -> None:
    """Write the schedule to `path`."""
    try:
        Path(path).write_text(format_csv(schedule), encoding="utf-8")
    except OSError as exc:
        raise PartitaError(f"{path}: cannot write schedule: {exc.strerror}") from None


def from_csv(path: str | Path) -> Schedule:
    """Read a schedule written by `to_csv` or by torch's `_dump_csv`."""
    path = Path(path)
    if not path.is_file():
        raise PartitaError(f"{path}: no such file" if not path.exists()
                           else f"{path}: is a directory, expected a schedule .csv file")
    return parse_csv(path.read_text(encoding="utf-8"), str(path))
