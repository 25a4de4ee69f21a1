"""Data files grouped by provenance: facts, measured, fitted and chosen numbers in separate sections.

A shipped data file of data/calibration/ holds its keys under up to four top-level sections, named
by where the numbers come from:

    facts:     datasheets, specifications, constants of published code (NCCL's tuning tables)
    measured:  measurements, this project's (benchmarks/) or published ones (benchmarks, logs)
    fitted:    numbers a program fitted to measurements (its command, objective and rows beside them)
    chosen:    numbers assumed or chosen where nothing was measured, each with its reason

Each section has the file's own layout (the same keys, nested the same way). `load_by_provenance`
merges the sections into that one layout, so the code that reads the values never sees them: a
number stands in one section only, and `source` entries of one mapping in several sections join.
Every number outside `facts` needs a source: a `source` (in `fitted`, also a `command`) in its own
mapping or one enclosing it within its section. `numbers(path)` lists every number outside `facts`
with its kind, unit, key and source (`partita catalog numbers` prints them).

A file with none of the four sections (a user's override file) is read as it stands.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partita.planner.documents import load_document
from partita.planner.errors import PartitaError

KINDS = ("facts", "measured", "fitted", "chosen")
# Keys that describe numbers rather than being numbers of the model.
META_KEYS = ("source", "notes", "command", "objective", "rows", "loss")
# Unit of a number, by the end of the nearest key that names one (data keys carry their units).
UNIT_SUFFIXES = (("_bytes_per_element", "bytes per element"), ("_kernels", "kernels"),
                 ("_by_ideal_us", "fraction by ideal time (us)"), ("_by_mb", "fraction by MB"),
                 ("_by_gpu", "fraction"), ("mnk_tflops", "[m, n, k, TFLOP/s]"),
                 ("_tflops", "TFLOP/s"), ("_us", "us"), ("_s", "s"), ("_mb", "MB"),
                 ("_gib", "GiB"), ("_fraction", "fraction"), ("_efficiency", "fraction"),
                 ("efficiency", "fraction"), ("_slowdown", "fraction"))


@dataclass(frozen=True, kw_only=True)
class Number:
    """One number of a data file that is not a fact."""
    kind: str            # measured, fitted or chosen
    file: str
    key: str             # dotted key path in the merged layout, e.g. tiers.efa.half_bandwidth_mb
    value: Any           # a number, or a list of points
    unit: str
    source: str


def is_sectioned(doc: dict[str, Any]) -> bool:
    return any(k in KINDS for k in doc)


def load_by_provenance(path: str | Path) -> dict[str, Any]:
    """The file's keys with its provenance sections merged (a file without sections as it is)."""
    doc = load_document(path)
    if not is_sectioned(doc):
        return doc
    _check_sections(doc, str(path))
    merged: dict[str, Any] = {}
    owner: dict[tuple[str, ...], str] = {}
    for kind in KINDS:
        section = doc.get(kind)
        if section is None:
            continue
        _merge(merged, section, (), kind, owner, str(path))
        if kind != "facts":
            _check_sourced(section, (kind,), None, str(path))
    return merged


def numbers(path: str | Path) -> list[Number]:
    """Every number of a sectioned file outside `facts`, in file order."""
    doc = load_document(path)
    if not is_sectioned(doc):
        raise PartitaError(f"{path}: expected the provenance sections {', '.join(KINDS)} at the "
                           f"top level, got {', '.join(map(str, doc)) or 'none'}")
    load_by_provenance(path)                 # the same checks as the loaders
    out: list[Number] = []
    for kind in KINDS[1:]:
        if isinstance(doc.get(kind), dict):
            _collect(doc[kind], (), kind, _source_of(doc[kind], None), str(path), out)
    return out


def unit_of(key: tuple[str, ...]) -> str:
    for part in reversed(key):
        for suffix, unit in UNIT_SUFFIXES:
            if part.endswith(suffix):
                return unit
    return "1"


# ---- merging and checking ----

def _check_sections(doc: dict[str, Any], path: str) -> None:
    for key, value in doc.items():
        if key not in KINDS:
            raise PartitaError(f"{path}: {key}: a file with provenance sections holds only "
                               f"{', '.join(KINDS)} at the top level (put {key!r} in one of them)")
        if not isinstance(value, dict):
            raise PartitaError(f"{path}: {key}: expected a mapping, got {type(value).__name__}")


def _merge(into: dict[str, Any], part: dict[str, Any], at: tuple[str, ...], kind: str,
           owner: dict[tuple[str, ...], str], path: str) -> None:
    for key, value in part.items():
        where = at + (str(key),)
        if key not in into:
            into[key] = _copy(value)
            owner[where] = kind
        elif isinstance(into[key], dict) and isinstance(value, dict):
            _merge(into[key], value, where, kind, owner, path)
        elif key == "source":
            into[key] = _sources(into[key]) + [s for s in _sources(value)
                                               if s not in _sources(into[key])]
        else:
            raise PartitaError(f"{path}: {'.'.join(where)}: stands in both {owner[where]} and "
                               f"{kind} (a number has one provenance)")


def _copy(value: Any) -> Any:
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, dict) else value


def _sources(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _source_of(mapping: dict[str, Any], inherited: str | None) -> str | None:
    if "source" in mapping:
        return "; ".join(str(s) for s in _sources(mapping["source"]))
    if "command" in mapping:
        rows = mapping.get("rows")
        count = f" on {len(rows)} rows" if isinstance(rows, list) else ""
        return f"{mapping['command']}{count}"
    return inherited


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return isinstance(value, list) and bool(value) and all(_is_number(v) for v in value)


def _check_sourced(mapping: dict[str, Any], at: tuple[str, ...], inherited: str | None,
                   path: str) -> None:
    source = _source_of(mapping, inherited)
    for key, value in mapping.items():
        if key in META_KEYS:
            continue
        if isinstance(value, dict):
            _check_sourced(value, at + (str(key),), source, path)
        elif _is_number(value) and source is None:
            raise PartitaError(f"{path}: {'.'.join(at + (str(key),))}: a {at[0]} number needs a "
                               "`source` in its mapping or one enclosing it")


def _collect(mapping: dict[str, Any], at: tuple[str, ...], kind: str, source: str | None,
             path: str, out: list[Number]) -> None:
    for key, value in mapping.items():
        if key in META_KEYS:
            continue
        where = at + (str(key),)
        if isinstance(value, dict):
            _collect(value, where, kind, _source_of(value, source), path, out)
        elif _is_number(value):
            out.append(Number(kind=kind, file=path, key=".".join(where), value=value,
                              unit=unit_of(where), source=_for_key(source or "", where)))


def _for_key(source: str, key: tuple[str, ...]) -> str:
    """Of sources written `KEY: text` for several keys of one mapping, those of this key."""
    own = [s.split(": ", 1)[1] for s in source.split("; ") if s.split(": ", 1)[0] in key]
    return "; ".join(own) if own else source
