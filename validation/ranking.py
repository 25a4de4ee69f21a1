"""Layout choice: does the simulator rank a job's measured layouts in the measured order?

The planner's use of a prediction is a choice among layouts of one job, where an error common to
every layout cancels and only the relative errors count. A *job* is one training task measured in
several ways: rows with the same model document, system, GPU count, global batch and precision
(`job_key`); its *layouts* are whatever differs (parallel degrees, micro-batch, schedule, recompute,
framework, attention kernel). For every job with two or more simulated layouts, partita's pick is
the layout it predicts fastest; the pick's *regret* is its measured step time over the measured
best, minus one (0 when partita picked the measured best). Kendall's tau between the predicted and
the measured order says how well the whole order is kept (1: the same order).
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from partita.simulator.interval import percentile
from partita.validation.rowmap import MappedRow


@dataclass(frozen=True)
class JobChoice:
    """One job's layouts, partita's pick among them and what the pick costs."""
    job: str                     # "<model> on <gpus> x <system>, batch <global batch>"
    row_ids: tuple[str, ...]     # the job's layouts, measured fastest first
    picked: str                  # the row partita predicts fastest
    regret: float                # measured(picked) / measured(best) - 1
    kendall_tau: float

    @property
    def best(self) -> str:
        return self.row_ids[0]


@dataclass(frozen=True)
class ChoiceSummary:
    jobs: int
    best_picked: int             # jobs where partita's pick is the measured best
    regret_median_pct: float | None
    regret_p90_pct: float | None
    regret_max_pct: float | None
    kendall_tau_mean: float | None

    def to_json(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "best_picked": self.best_picked,
                "regret_median_pct": self.regret_median_pct,
                "regret_p90_pct": self.regret_p90_pct, "regret_max_pct": self.regret_max_pct,
                "kendall_tau_mean": self.kendall_tau_mean}


def job_key(m: MappedRow) -> str:
    """What two rows must share to be layouts of one job (see the module docstring)."""
    d = m.document
    training = d.get("training", {})
    return json.dumps([d.get("model"), d.get("cluster", {}).get("system"), m.gpus,
                       training.get("global_batch"), training.get("precision")], sort_keys=True)


def layout_choices(rows: Iterable[tuple[MappedRow, float]]) -> list[JobChoice]:
    """Every job with two or more layouts among `rows` ((row, predicted seconds per step)), in the
    order the jobs first appear."""
    jobs: dict[str, list[tuple[MappedRow, float]]] = defaultdict(list)
    for m, predicted in rows:
        jobs[job_key(m)].append((m, predicted))
    out = []
    for members in jobs.values():
        if len(members) < 2:
            continue
        by_measured = sorted(members, key=lambda mp: (mp[0].measured_step_s, mp[0].row_id))
        pick = min(members, key=lambda mp: (mp[1], mp[0].row_id))[0]
        first = by_measured[0][0]
        out.append(JobChoice(
            job=f"{first.model} on {first.gpus} x {first.scenario.cluster.system}, batch "
                f"{first.scenario.training.global_batch}",
            row_ids=tuple(m.row_id for m, _ in by_measured), picked=pick.row_id,
            regret=pick.measured_step_s / first.measured_step_s - 1.0,
            kendall_tau=kendall_tau([m.measured_step_s for m, _ in members],
                                    [p for _, p in members])))
    return out


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two equally long lists: (concordant - discordant pairs) / all pairs; a pair
    tied in either list counts as neither."""
    n = len(a)
    if n != len(b) or n < 2:
        raise ValueError(f"kendall_tau needs two lists of one length >= 2, got {len(a)} and {len(b)}")
    score = 0
    for i in range(n):
        for j in range(i + 1, n):
            s = (a[i] - a[j]) * (b[i] - b[j])
            score += (s > 0) - (s < 0)
    return score / (n * (n - 1) / 2)


def summarize_choices(choices: list[JobChoice]) -> ChoiceSummary:
    if not choices:
        return ChoiceSummary(0, 0, None, None, None, None)
    regrets = [100.0 * c.regret for c in choices]
    return ChoiceSummary(len(choices), sum(c.picked == c.best for c in choices),
                         percentile(regrets, 50), percentile(regrets, 90), max(regrets),
                         sum(c.kendall_tau for c in choices) / len(choices))


def choice_lines(choices: list[JobChoice], *, per_job: bool = True) -> list[str]:
    """The report's layout-choice section: one line per job, then the summary line."""
    if not choices:
        return []
    lines = ["Layout choice: jobs measured in several layouts (same model, system, GPUs, batch, "
             "precision)"]
    if per_job:
        for c in choices:
            mark = "best" if c.picked == c.best else f"regret {100 * c.regret:+.1f}%"
            lines.append(f"  {c.job[:56]:<56} {len(c.row_ids):>3} layouts  picked {c.picked:<11} "
                         f"measured best {c.best:<11} {mark:<14} tau {c.kendall_tau:+.2f}")
    lines.append(choice_line(summarize_choices(choices)))
    return lines


def choice_line(s: ChoiceSummary) -> str:
    """One line: how often the predicted-fastest layout is the measured best, and the regret."""
    if not s.jobs:
        return "Layout choice: no job with two or more layouts"
    return (f"Layout choice ({s.jobs} jobs): measured best picked in {s.best_picked}, regret "
            f"median {s.regret_median_pct:.1f}%, p90 {s.regret_p90_pct:.1f}%, max "
            f"{s.regret_max_pct:.1f}%, mean Kendall tau {s.kendall_tau_mean:+.2f}")
