"""Run report: a measured run (`partita run --out DIR`) against the simulator's prediction.

A run directory holds result.json (plan, step times, losses, the prediction made at launch),
metrics.jsonl (one line per step with every rank's spans) and trace.json (the last step as a Chrome
trace). This report draws per step the measured time against the predicted one, and the last
measured step beside the simulated step on the same time axis (the Gantt of the timeline report),
and joins their actions on (pipeline rank, action name), the names simulator.trace and the
executor share ("0F1", "1B0", ...).

The executor numbers world ranks rank = tp + T * (dp + D * pp) (executor/plan.py); the simulator
simulates one rank per pipeline stage, so each stage's measured representative is its rank with
tp = dp = 0, relabelled to the stage index.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from partita.planner.errors import PartitaError
from partita.reports.figures import KIND_COLOURS, SERIES, new_figure, png_bytes, time_unit
from partita.reports.html import FigureItem, Report, Section, TableItem
from partita.reports.timeline import add_legend, gantt, kind_of
from partita.simulator.result import Span


@dataclass(frozen=True, kw_only=True)
class RunDir:
    path: Path
    result: dict
    steps: tuple[dict, ...]            # metrics.jsonl lines


def load_run(run_dir: str | Path) -> RunDir:
    path = Path(run_dir)
    if not path.is_dir():
        raise PartitaError(f"{path}: no such run directory (give the --out DIR of `partita run`)")
    for name in ("result.json", "metrics.jsonl"):
        if not (path / name).is_file():
            raise PartitaError(f"{path}: no {name}; is this the --out DIR of `partita run`?")
    result = _json(path / "result.json")
    steps = []
    for i, line in enumerate((path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()):
        if line.strip():
            try:
                steps.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise PartitaError(f"{path / 'metrics.jsonl'}: line {i + 1}: invalid JSON: "
                                   f"{exc.msg}") from None
    for key in ("scenario", "plan", "step_times_s"):
        if key not in result:
            raise PartitaError(f"{path / 'result.json'}: no {key!r}; not written by `partita run`")
    if not steps:
        raise PartitaError(f"{path / 'metrics.jsonl'}: no steps recorded")
    return RunDir(path=path, result=result, steps=tuple(steps))


def _json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PartitaError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise PartitaError(f"{path}: expected a JSON object")
    return doc


def stage_spans(run: RunDir, step: dict) -> list[Span]:
    """The spans of one measured step on each pipeline stage's representative rank, as stage ranks."""
    plan = run.result["plan"]
    width = int(plan.get("tensor", 1)) * int(plan.get("data", 1))
    out = []
    for s in step.get("spans", []):
        if s["rank"] % width == 0:
            out.append(Span(s["rank"] // width, s["lane"], s["name"], float(s["start_s"]),
                            float(s["end_s"]), s.get("cat", "")))
    return out


def predict(run: RunDir, scenario_file: str | None, catalog):
    """(scenario, SimResult with spans) or (None, why not)."""
    from partita.planner.scenario import load_scenario
    from partita.simulator.step import simulate
    name = scenario_file or run.result["scenario"]
    try:
        scenario = load_scenario(name)
        return scenario, simulate(scenario, catalog, trace=True)
    except PartitaError as exc:
        return None, f"no prediction for {name}: {exc}"


def steps_table(run: RunDir, predicted_s: float | None) -> pd.DataFrame:
    r = run.result
    warm = int(r.get("warmup_steps", 0))
    rows = []
    for i, line in enumerate(run.steps):
        t = float(line["step_time_s"])
        rows.append({"step": line["step"], "warmup": i < warm, "loss": line.get("loss"),
                     "measured_step_s": t, "predicted_step_s": predicted_s,
                     "measured_over_predicted": t / predicted_s if predicted_s else None})
    return pd.DataFrame(rows)


def actions_table(measured: list[Span], predicted: list[Span]) -> pd.DataFrame:
    """Compute actions joined on (stage, name): measured and predicted seconds, and their ratio."""
    pred = {(s.rank, s.name): s for s in predicted if s.lane == "compute"}
    rows = []
    for s in measured:
        if s.lane != "compute":
            continue
        p = pred.get((s.rank, s.name))
        m_s = s.end_s - s.start_s
        p_s = (p.end_s - p.start_s) if p else None
        rows.append({"stage": s.rank, "action": s.name, "kind": kind_of(s),
                     "measured_start_s": s.start_s, "measured_s": m_s,
                     "predicted_start_s": p.start_s if p else None, "predicted_s": p_s,
                     "measured_over_predicted": m_s / p_s if p_s else None})
    return pd.DataFrame(rows)


def _step_figure(frame: pd.DataFrame, title: str) -> bytes:
    fig = new_figure(7.5, 4.0)
    ax = fig.add_subplot()
    scale, unit = time_unit(float(frame["measured_step_s"].max()))
    for warm, colour, label in ((False, SERIES[0], "measured"),
                                (True, SERIES[7], "measured (warm-up)")):
        part = frame[frame["warmup"] == warm]
        if len(part):
            ax.bar(part["step"], part["measured_step_s"] * scale, color=colour, label=label)
    pred = frame["predicted_step_s"].dropna()
    if len(pred):
        ax.axhline(float(pred.iloc[0]) * scale, color=SERIES[1], lw=2, ls="--", label="predicted")
    ax.set_xlabel("optimizer step (index)")
    ax.set_ylabel(f"step time ({unit})")
    ax.set_title(title)
    ax.legend()
    return png_bytes(fig)


def _gantt_figure(measured: list[Span], predicted: list[Span] | None, title: str) -> bytes:
    ranks = sorted({s.rank for s in measured} | {s.rank for s in predicted or []})
    end = max([s.end_s for s in measured] + [s.end_s for s in predicted or []])
    panels = [("measured (last step)", measured)] + ([("simulated", predicted)] if predicted else [])
    fig = new_figure(11.0, max(3.2, 0.34 * 4 * len(ranks) * len(panels) + 1.8))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    used: set[str] = set()
    for ax, (label, spans) in zip(axes, panels):
        used |= gantt(ax, spans, ranks=ranks, end_s=end, label_prefix="stage")
        ax.set_title(f"{title}: {label}")
    add_legend(fig, used)
    return png_bytes(fig)


def _action_figure(frame: pd.DataFrame, title: str) -> bytes:
    fig = new_figure(7.5, 4.2)
    ax = fig.add_subplot()
    both = frame[frame["predicted_s"].notna()]
    scale, unit = time_unit(float(max(both["measured_s"].max(), both["predicted_s"].max())))
    for kind, part in both.groupby("kind", sort=True):
        ax.scatter(part["predicted_s"] * scale, part["measured_s"] * scale, s=18,
                   color=KIND_COLOURS.get(kind, SERIES[7]), label=kind)
    hi = float(max(both["measured_s"].max(), both["predicted_s"].max())) * scale * 1.1
    ax.plot([0, hi], [0, hi], color="black", lw=0.8, label="measured = predicted")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel(f"predicted action time ({unit})")
    ax.set_ylabel(f"measured action time ({unit})")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return png_bytes(fig)


def run_report(run: RunDir, *, scenario_file: str | None = None, catalog=None) -> Report:
    r = run.result
    scenario, sim = predict(run, scenario_file, catalog)
    note = sim if isinstance(sim, str) else ""
    sim = None if isinstance(sim, str) else sim
    predicted_s = sim.step_time_s if sim is not None else None
    frame = steps_table(run, predicted_s)
    last = run.steps[-1]
    measured = stage_spans(run, last)
    predicted = list(sim.spans) if sim is not None else None
    name = r["scenario"]
    steady = frame[~frame["warmup"]] if (~frame["warmup"]).any() else frame
    median = statistics.median(steady["measured_step_s"])
    text = [f"{name}: {r.get('world', '?')} processes ({r.get('backend', '?')}, "
            f"{r.get('device', '?')}), {len(frame)} steps, torch {r.get('torch', '?')}. "
            f"Median measured step after warm-up {median:.4f} s"
            + (f"; predicted {predicted_s:.4f} s (measured / predicted "
               f"{median / predicted_s:.2f})." if predicted_s else ".")]
    if note:
        text.append(note + " (give --scenario FILE, or run `partita calibrate` for a local run)")
    sections = [Section(heading="Per step", text=tuple(text), figures=(FigureItem(
        name="run_steps", title="Step times", png=_step_figure(frame, f"{name}: step time")),),
        tables=(TableItem(name="steps", title="Per step", frame=frame, formats={
            "loss": ".5f", "measured_step_s": ".4f", "predicted_step_s": ".4f",
            "measured_over_predicted": ".2f"}),))]
    sections.append(_timeline_section(name, last, measured, predicted))
    return Report(kind="run", title=f"Measured run: {name}", subtitle=str(run.path),
                  sections=tuple(sections))


def _timeline_section(name: str, last: dict, measured: list[Span],
                      predicted: list[Span] | None) -> Section:
    if not measured:
        return Section(heading="The last measured step", text=(
            f"Step {last['step']} recorded no spans (metrics.jsonl), so there is no timeline.",))
    figs = [FigureItem(name="run_timeline", title="Measured and simulated step",
                       png=_gantt_figure(measured, predicted, name))]
    tables = []
    if measured:
        actions = actions_table(measured, predicted or [])
        if predicted and actions["predicted_s"].notna().any():
            figs.append(FigureItem(name="run_actions", title="Per action",
                                   png=_action_figure(actions, f"{name}: per action, last step")))
        tables.append(TableItem(name="actions", title=f"Compute actions of step {last['step']}",
                                frame=actions, formats={c: ".6f" for c in (
                                    "measured_start_s", "measured_s", "predicted_start_s",
                                    "predicted_s")} | {"measured_over_predicted": ".2f"}))
    return Section(heading="The last measured step beside the simulated one", text=(
        "Both on one time axis from the step's start; actions joined on (stage, name).",),
        figures=tuple(figs), tables=tuple(tables))
