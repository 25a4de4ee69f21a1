"""Spans as a Chrome trace (the JSON that Perfetto and chrome://tracing open), and back.

One process per rank (pid = rank, named "rank N"), one thread per lane (tid = a small integer,
named by a thread_name metadata event: "compute", "send", "recv", ...), one complete ("X") event
per span with ts and dur in microseconds. Events are sorted, so the same spans always give the same
file. The executor writes its measured spans the same way; `spans_from_trace` reads either back so
that predicted and measured steps can be joined on (rank, name).
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from partita.planner.errors import PartitaError
from partita.simulator.result import Span

LANE_ORDER = ("compute", "send", "recv", "tp", "cp", "dp", "optimizer")
_US = 1e6


def lane_ids(lanes: Iterable[str]) -> dict[str, int]:
    """Thread ids: the known lanes in LANE_ORDER first, then any others alphabetically."""
    lanes = set(lanes)
    known = [lane for lane in LANE_ORDER if lane in lanes]
    return {lane: i for i, lane in enumerate(known + sorted(lanes - set(known)))}


def chrome_trace(spans: Iterable[Span], *, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": metadata}."""
    spans = list(spans)
    tids = lane_ids(s.lane for s in spans)
    events = _metadata_events(sorted({(s.rank, s.lane) for s in spans}), tids)
    events += sorted((_event(s, tids) for s in spans),
                     key=lambda e: (e["pid"], e["tid"], e["ts"], e["dur"], e["name"]))
    doc: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if metadata:
        doc["otherData"] = dict(metadata)
    return doc


def _event(span: Span, tids: dict[str, int]) -> dict[str, Any]:
    return {"name": span.name, "cat": span.cat or span.lane, "ph": "X", "pid": span.rank,
            "tid": tids[span.lane], "ts": span.start_s * _US,
            "dur": (span.end_s - span.start_s) * _US}


def _metadata_events(rank_lanes: list[tuple[int, str]], tids: dict[str, int]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for rank in sorted({r for r, _ in rank_lanes}):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
    for rank, lane in sorted(rank_lanes, key=lambda rl: (rl[0], tids[rl[1]])):
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tids[lane],
                       "args": {"name": lane}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tids[lane],
                       "args": {"sort_index": tids[lane]}})
    return events


def write_trace(spans: Iterable[Span], path: str | Path, *,
                metadata: dict[str, Any] | None = None) -> None:
    """Write the Chrome trace of `spans` to `path` (open it in https://ui.perfetto.dev)."""
    text = json.dumps(chrome_trace(spans, metadata=metadata), separators=(",", ":"))
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PartitaError(f"{path}: cannot write trace: {exc.strerror}") from None


def spans_from_trace(doc: dict[str, Any], origin: str = "trace") -> list[Span]:
    """The spans of a Chrome trace written by `chrome_trace` (lanes from thread_name events)."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise PartitaError(f"{origin}: not a Chrome trace (no traceEvents list)")
    lanes = {(e.get("pid"), e.get("tid")): e.get("args", {}).get("name")
             for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = []
    for e in events:
        if e.get("ph") != "X":
            continue
        lane = lanes.get((e.get("pid"), e.get("tid")))
        if lane is None:
            raise PartitaError(f"{origin}: event {e.get('name')!r} on pid {e.get('pid')}, "
                               f"tid {e.get('tid')} has no thread_name")
        try:
            start, dur = float(e["ts"]) / _US, float(e["dur"]) / _US
        except (KeyError, TypeError, ValueError):
            raise PartitaError(f"{origin}: event {e.get('name')!r} needs numeric ts and dur "
                               "(microseconds)") from None
        cat = e.get("cat", "")
        spans.append(Span(e["pid"], lane, str(e.get("name", "")), start, start + dur,
                          "" if cat == lane else cat))
    return spans


def read_trace(path: str | Path) -> list[Span]:
    """Read the spans of a trace file written by `write_trace` (or by the executor)."""
    path = Path(path)
    if not path.is_file():
        raise PartitaError(f"{path}: no such file")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PartitaError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    return spans_from_trace(doc, str(path))
