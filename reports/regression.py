"""CI regression of predictions (`partita check`): record a baseline, recompute, compare, JUnit XML.

A baseline is a JSON document: the partita version, SHA-256 hashes of the catalog and calibration
files in use (so a move can be traced to a data change), the node-sweep multipliers, and per
scenario its file (a shipped example's name or a path) and metrics: step_time_s, tokens_per_s,
peak_memory_gib, and scaling_efficiency_x<K> for each multiplier K of the scenario's own node count
(weak scaling, the scaling report's sweep with the scenario's own gradient reduction). A metric
moved when |new / old - 1| > tolerance; a point that simulated before and fails now (or the
reverse) moved too. `record_baseline` and `check_baseline` are the two runs of `partita check`;
the command only prints what they report.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partita import __version__
from partita.planner.errors import PartitaError

FORMAT = "partita-check-baseline/1"
DEFAULT_SWEEP = (1, 2, 4)
METRICS = ("step_time_s", "tokens_per_s", "peak_memory_gib")


@dataclass(frozen=True, kw_only=True)
class Finding:
    scenario: str
    metric: str
    baseline: float | str | None
    current: float | str | None
    moved: bool
    message: str


def data_hashes(extra_catalog: str | None) -> dict[str, str]:
    """SHA-256 over the catalog files and over the calibration files the simulator reads."""
    from partita.planner.catalog import local_catalog_path, shipped_files
    from partita.planner.paths import CALIBRATION_DIR
    from partita.simulator.calibration import local_calibration_path
    catalog = list(shipped_files()) + [p for p in (local_catalog_path(),) if p.is_file()]
    if extra_catalog:
        catalog.append(Path(extra_catalog))
    calibration = sorted(CALIBRATION_DIR.glob("*.yaml"))
    calibration += [p for p in (local_calibration_path(),) if p.is_file()]
    return {"catalog_sha256": _hash(catalog), "calibration_sha256": _hash(calibration)}


def _hash(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def scenario_metrics(scenario, catalog, sweep: Sequence[int], *,
                     simulate: Callable | None = None) -> dict[str, float | str]:
    """The recorded metrics of one scenario (a failed sweep point records its error text)."""
    from partita.reports.scaling import sweep as scaling_sweep
    if simulate is None:
        from partita.simulator.step import simulate
    r = simulate(scenario, catalog)
    out: dict[str, float | str] = {"step_time_s": r.step_time_s, "tokens_per_s": r.tokens_per_s,
                                   "peak_memory_gib": r.peak_memory_gib}
    hw = catalog.resolve_cluster(scenario.cluster, origin=scenario.origin)
    if hw.gpus % hw.system.gpus_per_node:
        return out                   # part of one node: a node sweep would change the x1 point
    nodes0 = hw.gpus // hw.system.gpus_per_node
    points = scaling_sweep(scenario, catalog, [nodes0 * k for k in sweep],
                           [scenario.parallel.grad_reduce], simulate=simulate)
    base = points[0].result
    for k, pt in zip(sweep, points):
        key = f"scaling_efficiency_x{k}"
        if pt.result is None or base is None:
            out[key] = f"error: {pt.error or points[0].error}"
        else:
            out[key] = pt.result.tokens_per_s / (base.tokens_per_s * k)
    return out


def scenario_key(scenario, file: str) -> str:
    return scenario.name or Path(file).stem


def new_baseline(entries: dict[str, dict[str, Any]], sweep: Sequence[int],
                 hashes: dict[str, str]) -> dict[str, Any]:
    return {"format": FORMAT, "partita_version": __version__, **hashes,
            "sweep_multipliers": list(sweep), "scenarios": entries}


def read_baseline(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise PartitaError(f"{path}: no such baseline file; create it with "
                           f"`partita check {path} --record`")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PartitaError(f"{path}: not a partita check baseline (invalid JSON: "
                           f"{getattr(exc, 'msg', exc)})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PartitaError(f"{path}: not a partita check baseline (format is "
                           f"{doc.get('format') if isinstance(doc, dict) else None!r}, "
                           f"expected {FORMAT!r})")
    scenarios = doc.get("scenarios")
    if not isinstance(scenarios, dict) or not scenarios:
        raise PartitaError(f"{path}: 'scenarios' must be a non-empty mapping of name -> "
                           "{file, metrics}")
    for name, entry in scenarios.items():
        if (not isinstance(entry, dict) or not isinstance(entry.get("file"), str)
                or not isinstance(entry.get("metrics"), dict)):
            raise PartitaError(f"{path}: scenarios.{name}: needs 'file' (text) and 'metrics' "
                               "(a mapping)")
        for metric, value in entry["metrics"].items():
            if not isinstance(value, (int, float, str)) or isinstance(value, bool):
                raise PartitaError(f"{path}: scenarios.{name}.metrics.{metric}: expected a "
                                   f"number or an error text, got {value!r}")
    sweep = doc.get("sweep_multipliers", list(DEFAULT_SWEEP))
    if not (isinstance(sweep, list) and sweep and all(isinstance(k, int) and k >= 1 for k in sweep)):
        raise PartitaError(f"{path}: sweep_multipliers must be a list of whole numbers >= 1, "
                           f"got {sweep!r}")
    return doc


def write_json_atomic(path: str | Path, doc: dict[str, Any]) -> None:
    """Write through a temporary file beside `path`, so a failure never leaves half a baseline."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PartitaError(f"{path}: cannot write: {exc.strerror}") from None


def compare(scenario: str, old: dict[str, Any], new: dict[str, Any],
            tolerance: float) -> list[Finding]:
    """One finding per metric in either set; `moved` beyond the relative tolerance."""
    out = []
    for metric in list(old) + [m for m in new if m not in old]:
        a, b = old.get(metric), new.get(metric)
        out.append(_finding(scenario, metric, a, b, tolerance))
    return out


def _finding(scenario: str, metric: str, a, b, tol: float) -> Finding:
    def f(kind: str, moved: bool) -> Finding:
        return Finding(scenario=scenario, metric=metric, baseline=a, current=b, moved=moved,
                       message=kind)
    if a is None:
        return f(f"new metric {metric} = {_show(b)}, not in the baseline", True)
    if b is None:
        return f(f"{metric} is in the baseline ({_show(a)}) but no longer computed", True)
    if isinstance(a, str) or isinstance(b, str):
        if isinstance(a, str) and isinstance(b, str):
            return f(f"{metric} still fails", False)
        return f(f"{metric}: {_show(a)} -> {_show(b)}", True)
    if a == b:
        return f(f"{metric} {_show(b)} unchanged", False)
    rel = math.inf if a == 0 else b / a - 1.0
    moved = abs(rel) > tol
    return f(f"{metric}: {_show(a)} -> {_show(b)} ({100 * rel:+.2f}%, tolerance "
             f"{100 * tol:g}%)", moved)


def _show(v) -> str:
    return f"{v:.6g}" if isinstance(v, (int, float)) else str(v)


def shipped_scenarios() -> list[str]:
    """Every shipped example's name (data/scenarios/*.yaml): what a bare `--record` records."""
    from partita.planner.paths import SCENARIOS_DIR
    return sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml"))


def _quiet(message: str) -> None:
    """The default progress and note sink: says nothing."""


def record_baseline(files: Sequence[str], *, catalog, sweep: Sequence[int],
                    extra_catalog: str | None, progress: Callable[[str], None] = _quiet,
                    note: Callable[[str], None] = _quiet) -> dict[str, Any]:
    """The baseline document of `files`; none: every shipped example. A named file must simulate;
    a shipped example that cannot here, or that names this machine (`local`), is skipped with a
    note. `progress` hears each file before it is simulated, when there is more than one (a
    single named file's error is then the only line on stderr)."""
    from partita.planner.scenario import load_scenario
    explicit = bool(files)
    entries, problems = {}, []
    todo = list(files or shipped_scenarios())
    for file in todo:
        if len(todo) > 1:
            progress(f"recording {file}")
        try:
            scenario = load_scenario(file)
            if not explicit and scenario.cluster.system.lower() == "local":
                problems.append(f"skipped {file}: system local (this machine) is not portable "
                                "to a CI host; name it to record it")
                continue
            metrics = scenario_metrics(scenario, catalog, sweep)
        except PartitaError as exc:
            if explicit:
                raise
            problems.append(f"skipped {file}: {exc}")       # a shipped example this host can't run
            continue
        key = scenario_key(scenario, file)
        if key in entries:
            raise PartitaError(f"{file}: scenario name {key!r} given twice; names must be unique")
        entries[key] = {"file": file, "metrics": metrics}
    for line in problems:
        note(line)
    if not entries:
        raise PartitaError("no scenario could be simulated; nothing recorded")
    return new_baseline(entries, sweep, data_hashes(extra_catalog))


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """A baseline rechecked: every metric compared, and the scenarios that failed to simulate."""
    scenarios: tuple[str, ...]          # the baseline's scenarios that were recomputed
    findings: tuple[Finding, ...]
    errors: dict[str, str]              # scenario -> why it did not simulate

    @property
    def moved(self) -> list[Finding]:
        return [f for f in self.findings if f.moved]


def check_baseline(baseline: str, files: Sequence[str], *, catalog, tolerance: float,
                   extra_catalog: str | None, progress: Callable[[str], None] = _quiet,
                   note: Callable[[str], None] = _quiet) -> CheckResult:
    """Recompute the baseline's scenarios (or `files` among them) and compare each metric.
    `note` hears how the data or version differ from the baseline's; `progress` each scenario."""
    from partita.planner.scenario import load_scenario
    base = read_baseline(baseline)
    scenarios = base["scenarios"]
    chosen = chosen_scenarios(files, scenarios, baseline)
    for line in provenance(base, data_hashes(extra_catalog)):
        note(line)
    findings, errors = [], {}
    for name in chosen:
        entry = scenarios[name]
        progress(name)
        try:
            metrics = scenario_metrics(load_scenario(entry["file"]), catalog,
                                       base["sweep_multipliers"])
        except PartitaError as exc:
            errors[name] = str(exc)
            continue
        findings += compare(name, entry["metrics"], metrics, tolerance)
    return CheckResult(scenarios=tuple(chosen), findings=tuple(findings), errors=errors)


def chosen_scenarios(files: Sequence[str], scenarios: dict, baseline: str) -> list[str]:
    """The baseline's names of `files` (a name, a recorded file, or its stem); none: all."""
    if not files:
        return list(scenarios)
    by_file = {entry["file"]: name for name, entry in scenarios.items()}
    chosen = []
    for f in files:
        name = f if f in scenarios else by_file.get(f) or by_file.get(Path(f).stem)
        if name is None:
            raise PartitaError(f"{f}: not in the baseline {baseline} (it has "
                               f"{', '.join(scenarios)}); record it with --record")
        chosen.append(name)
    return chosen


def provenance(base: dict, hashes: dict[str, str]) -> list[str]:
    """How this partita and its data differ from what recorded the baseline."""
    out = []
    if base.get("partita_version") != __version__:
        out.append(f"baseline recorded with partita {base.get('partita_version')}, "
                   f"this is {__version__}")
    for key, what in (("catalog_sha256", "catalog"), ("calibration_sha256", "calibration data")):
        if base.get(key) != hashes[key]:
            out.append(f"the {what} differs from the baseline's ({key} "
                       f"{str(base.get(key))[:12]} -> {hashes[key][:12]})")
    return out


def junit_xml(findings: Sequence[Finding], errors: dict[str, str], *, tolerance: float) -> str:
    """JUnit XML: one testsuite, one testcase per (scenario, metric); a scenario that could not be
    simulated is one testcase with an <error>."""
    failures = sum(1 for f in findings if f.moved)
    suite = ET.Element("testsuite", name="partita check", tests=str(len(findings) + len(errors)),
                       failures=str(failures), errors=str(len(errors)), skipped="0")
    ET.SubElement(ET.SubElement(suite, "properties"), "property", name="tolerance",
                  value=f"{100 * tolerance:g}%")
    for f in findings:
        case = ET.SubElement(suite, "testcase", classname=f.scenario, name=f.metric)
        if f.moved:
            node = ET.SubElement(case, "failure", message=f.message, type="moved")
            node.text = f"{f.scenario} {f.message}"
    for name, why in errors.items():
        case = ET.SubElement(suite, "testcase", classname=name, name="simulate")
        ET.SubElement(case, "error", message=why, type="PartitaError").text = why
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
