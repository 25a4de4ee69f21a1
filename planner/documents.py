"""Reading YAML/JSON documents and checking their keys and values, with errors that name the path.

Every loader of user files (scenarios, catalog files, calibration files) goes through here so that
bad input always reads the same way: `FILE: key.path: what was expected, got what`.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from partita.planner.errors import PartitaError, closest


def load_document(path: str | Path) -> dict[str, Any]:
    """A YAML (.yaml/.yml) or JSON (.json) file holding one mapping."""
    path = Path(path)
    if not path.exists():
        raise PartitaError(f"{path}: no such file")
    if path.is_dir():
        raise PartitaError(f"{path}: is a directory, expected a .yaml, .yml or .json file")
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            doc = json.loads(text)
        elif suffix in (".yaml", ".yml"):
            doc = yaml.safe_load(text)
        else:
            raise PartitaError(f"{path}: unknown file type {suffix!r} (valid: .yaml, .yml, .json)")
    except json.JSONDecodeError as exc:
        raise PartitaError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PartitaError(f"{path}: invalid YAML{where}: {problem}") from None
    if not isinstance(doc, dict):
        raise PartitaError(f"{path}: expected a mapping at the top level, got {type(doc).__name__}")
    return doc


class Checker:
    """Typed access to one mapping of a document; every error names `origin: path.key`."""

    def __init__(self, mapping: Any, path: str, origin: str):
        self.origin = origin
        self.path = path
        if not isinstance(mapping, Mapping):
            raise self.error(f"expected a mapping, got {_show(mapping)}")
        self.mapping = mapping

    def error(self, msg: str, key: str | None = None) -> PartitaError:
        where = self.key_path(key) if key else self.path
        prefix = f"{self.origin}: " if self.origin else ""
        return PartitaError(f"{prefix}{where}: {msg}" if where else f"{prefix}{msg}")

    def key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def only(self, allowed: Iterable[str]) -> None:
        """Reject keys outside `allowed`, suggesting the closest valid key."""
        allowed = list(allowed)
        for key in self.mapping:
            if key not in allowed:
                near = closest(str(key), allowed, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise self.error(f"unknown key{hint} (valid: {', '.join(allowed)})", str(key))

    def has(self, key: str) -> bool:
        return key in self.mapping and self.mapping[key] is not None

    def sub(self, key: str, required: bool = True) -> "Checker | None":
        if not self.has(key):
            if required:
                raise self.error("missing required section", key)
            return None
        return Checker(self.mapping[key], self.key_path(key), self.origin)

    def int(self, key: str, default: int | None = None, *, minimum: int | None = 1,
            required: bool = False) -> int | None:
        if not self.has(key):
            if required:
                raise self.error("missing required key (expected an integer)", key)
            return default
        value = self.mapping[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"expected an integer, got {_show(value)}", key)
        if minimum is not None and value < minimum:
            raise self.error(f"must be >= {minimum}, got {value}", key)
        return value

    def number(self, key: str, default: float | None = None, *, positive: bool = True,
               required: bool = False) -> float | None:
        if not self.has(key):
            if required:
                raise self.error("missing required key (expected a number)", key)
            return default
        value = self.mapping[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(f"expected a number, got {_show(value)}", key)
        if positive and value <= 0:
            raise self.error(f"must be > 0, got {value}", key)
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        if not self.has(key):
            return default
        value = self.mapping[key]
        if not isinstance(value, bool):
            raise self.error(f"expected true or false, got {_show(value)}", key)
        return value

    def str(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        if not self.has(key):
            if required:
                raise self.error("missing required key (expected a string)", key)
            return default
        value = self.mapping[key]
        if not isinstance(value, str) or not value:
            raise self.error(f"expected a non-empty string, got {_show(value)}", key)
        return value

    def choice(self, key: str, choices: Iterable[str], default: str | None = None) -> str | None:
        choices = list(choices)
        value = self.mapping.get(key)
        if value is None:
            return default
        value = str(value).lower() if isinstance(value, (str, int)) and not isinstance(value, bool) else value
        if value not in choices:
            near = closest(str(value), choices, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise self.error(f"expected one of {', '.join(choices)}, got {_show(self.mapping[key])}{hint}", key)
        return value


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "nothing"
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__}"
    return repr(value)
