"""Reading YAML/JSON documents and checking their keys and values, with errors that name the path.

Every loader of user files (scenarios, catalog files, calibration files) goes through here so that
bad input always reads the same way: `FILE: key.path: what was expected, got what`.
"""
from __future__ import annotations

import codecs
import errno
import json
import math
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from partita.planner.errors import PartitaError, closest
from partita.planner.units import MIB


MAX_FILE_BYTES = 16 * MIB     # no scenario, catalog or CSV partita reads is near this
MAX_DEPTH = 32                  # mappings and lists inside each other
MAX_NODES = 2_000_000           # values in one document, YAML aliases expanded


def read_text(path: str | Path, *, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; anything else is a PartitaError.

    Every reader of user files (documents, CSV tables) comes here: a FIFO or device is refused
    without blocking on it (opened non-blocking, checked with fstat), the size is capped before
    anything is read in full, and an encoding problem names the file and the byte's position.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise PartitaError(f"{path}: {_os_reason(path, exc)}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise PartitaError(f"{path}: is a directory, expected a file")
        if not stat.S_ISREG(st.st_mode):
            raise PartitaError(f"{path}: is {_file_kind(st.st_mode)}, not a regular file "
                               "(partita reads regular files only)")
        if st.st_size > limit:
            raise PartitaError(f"{path}: {st.st_size:,} bytes, larger than partita's limit of "
                               f"{limit:,} bytes for an input file")
        with os.fdopen(fd, "rb", closefd=True) as fh:
            fd = -1
            data = fh.read(limit + 1)
    except OSError as exc:
        raise PartitaError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:
        raise PartitaError(f"{path}: larger than partita's limit of {limit:,} bytes for an input file")
    return decode_text(data, str(path))


def decode_text(data: bytes, origin: str) -> str:
    """UTF-8 (a UTF-8 byte-order mark allowed); UTF-16/32 and binary data are named as such."""
    for bom, name in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                      (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16")):
        if data.startswith(bom):
            raise PartitaError(f"{origin}: is {name} text; save it as UTF-8")
    if b"\x00" in data:
        where = _position(data, data.index(b"\x00"))
        raise PartitaError(f"{origin}: a NUL byte at {where}: a binary file, expected UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        where = _position(data, exc.start)
        raise PartitaError(f"{origin}: not UTF-8 text (byte 0x{data[exc.start]:02x} at {where}); "
                           "save it as UTF-8") from None


def _position(data: bytes, offset: int) -> str:
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


def _os_reason(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        if path.is_symlink():
            return f"a symbolic link to {os.readlink(path)!r}, which does not exist"
        return "no such file"
    if exc.errno == errno.ELOOP:
        return "a loop of symbolic links"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOTDIR:
        return "no such file (a part of the path is not a directory)"
    if exc.errno == errno.ENAMETOOLONG:
        return "file name too long"
    return f"cannot open: {exc.strerror or exc}"


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (instead of keeping the last)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue        # an unhashable key: the base class reports it
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first at line {first.line + 1})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _DuplicateKey(Exception):
    pass


def parse_text(text: str, origin: str, suffix: str) -> Any:
    """The value of a YAML or JSON text; every syntax problem is a PartitaError naming the line."""
    try:
        if suffix == ".json":
            return json.loads(text, object_pairs_hook=_unique_pairs)
        return yaml.load(text, Loader=_UniqueKeyLoader)   # noqa: S506 (a SafeLoader subclass)
    except _DuplicateKey as exc:
        raise PartitaError(f"{origin}: duplicate key {exc.args[0]!r} (each key once per mapping)") \
            from None
    except json.JSONDecodeError as exc:
        raise PartitaError(f"{origin}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PartitaError(f"{origin}: invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise PartitaError(f"{origin}: nested deeper than partita's limit of {MAX_DEPTH} levels") \
            from None
    except ValueError as exc:    # e.g. an integer of more than 4,300 digits
        raise PartitaError(f"{origin}: invalid value: {str(exc).splitlines()[0]}") from None


def check_shape(value: Any, origin: str) -> None:
    """Refuse a document nested deeper than MAX_DEPTH or holding more than MAX_NODES values
    (YAML aliases counted each time they are used), so later code never recurses or loops
    without a bound."""
    stack = [(value, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise PartitaError(f"{origin}: more than {MAX_NODES:,} values (YAML aliases expanded); "
                               "partita's limit for one document")
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise PartitaError(f"{origin}: nested deeper than partita's limit of "
                                   f"{MAX_DEPTH} levels")
            items = node.values() if isinstance(node, dict) else node
            stack.extend((v, depth + 1) for v in items)


def load_document(path: str | Path) -> dict[str, Any]:
    """A YAML (.yaml/.yml) or JSON (.json) file holding one mapping."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        if not path.exists() and not path.is_symlink():
            raise PartitaError(f"{path}: no such file")
        if path.is_dir():
            raise PartitaError(f"{path}: is a directory, expected a .yaml, .yml or .json file")
        read_text(path, limit=MAX_FILE_BYTES)    # a device, FIFO or unreadable file: says which
        raise PartitaError(f"{path}: unknown file type {suffix!r} (valid: .yaml, .yml, .json)")
    doc = parse_text(read_text(path), str(path), suffix)
    check_shape(doc, str(path))
    if not isinstance(doc, dict):
        raise PartitaError(f"{path}: expected a mapping at the top level, got {_show(doc)}")
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
                raise self.error(f"unknown key{hint} (valid: {', '.join(allowed)})", short(str(key)))

    def has(self, key: str) -> bool:
        return key in self.mapping and self.mapping[key] is not None

    def sub(self, key: str, required: bool = True) -> "Checker | None":
        if not self.has(key):
            if required:
                raise self.error("missing required section", key)
            return None
        return Checker(self.mapping[key], self.key_path(key), self.origin)

    def int(self, key: str, default: int | None = None, *, minimum: int | None = 1,
            maximum: int | None = None, required: bool = False) -> int | None:
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
        if maximum is not None and value > maximum:
            shown = _show(self.mapping[key])
            raise self.error(f"must be <= {maximum:,} (partita's limit), got {shown}", key)
        return value

    def number(self, key: str, default: float | None = None, *, positive: bool = True,
               minimum: float | None = None, maximum: float | None = None,
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
        if minimum is not None and value < minimum:
            raise self.error(f"must be >= {minimum:g}, got {_show(value)}", key)
        if maximum is not None and value > maximum:
            raise self.error(f"must be <= {maximum:g} (partita's limit), got {_show(value)}", key)
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
    if value is None:
        return "nothing"
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__}"
    return short(repr(value))


def short(text: str, limit: int = 80) -> str:
    """`text` cut to `limit` characters, so an error line stays one readable line."""
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit - 3] + "..."
