"""Writing a fitted data file from data structures: the values, and the command, objective and rows
that produced them.

`write_fitted_file(path, fitted)` emits the whole file (a header comment, then YAML from
`yaml.safe_dump`) with everything under the `fitted` provenance section (planner/provenance.py), so
`partita catalog numbers` lists each value with the command that wrote it. The file holds nothing
else: no hand-written text is parsed, kept or rewritten, and a fit is stored by running its command.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True, kw_only=True)
class FittedFile:
    """One fitted data file: `values` in the layout its loader reads, and how they were fitted."""
    title: str                        # the header's first line: what the numbers are
    command: str                      # the command that fits and writes them
    objective: str                    # what the fit minimised, and with which optimiser
    rows: tuple[str, ...]             # the measurement rows fitted on
    loss: float                       # the objective at the optimum
    values: dict[str, Any]            # key -> number, or a mapping of name -> number
    notes: tuple[str, ...] = ()       # further header lines (what a key means, which rows)


def render(fitted: FittedFile) -> str:
    header = [fitted.title, "Written by `command` below from the fit's result; do not edit by hand: "
              "re-run the command when the model or the rows change.", *fitted.notes]
    section = {"command": fitted.command, "objective": fitted.objective,
               "rows": list(fitted.rows), "loss": fitted.loss, **fitted.values}
    body = yaml.safe_dump({"fitted": section}, sort_keys=False, default_flow_style=None,
                          width=100, allow_unicode=True)
    lines = [wrapped for line in header for wrapped in textwrap.wrap(line, width=98)]
    return "".join(f"# {line}\n" for line in lines) + body


def write_fitted_file(path: str | Path, fitted: FittedFile) -> Path:
    path = Path(path)
    path.write_text(render(fitted))
    return path
