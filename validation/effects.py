"""Effects of one change: does the simulator predict how much a step speeds up or slows down?

A planner compares candidates: more GPUs or fewer, another parallel layout, recompute or not. What
it needs is the *ratio* of two step times, which can be right where each time is off by the same
factor. Two measured rows of one source that differ in one kind of setting (`KINDS`: parallel
layout, recompute, precision, kernels, model, system, GPU count) are such a comparison, measured.
For every pair the slower run is `a` and the faster `b`; the measured ratio is a / b (>= 1), the
predicted ratio pred(a) / pred(b), and the pair's error the predicted ratio over the measured one,
minus one (0: the effect predicted exactly; < 0: the change predicted to matter less than it did). A
pair whose measured ratio is at least `DECISIVE` apart also asks the planner's question, which of
the two runs is faster; `order_right` counts the pairs where the prediction names the same one.

Only pairs of one source count (`source_key`): a source's measurement convention and unstated
settings are shared by its rows and cancel in the ratio, as they do for a user's own candidates.
The kinds are tested in `KINDS` order, the first whose settings cover every difference names the
pair; a pair that differs in settings of two kinds (say the model and the GPU count) is not one
change and is left out.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from partita.planner.errors import PartitaError
from partita.planner.scenario import Scenario
from partita.validation.rowmap import MappedRow
from partita.validation.runner import summarize

MAX_PAIRS = 200_000   # more pairs than this is thousands of layouts of one job: refused, not cut
DECISIVE = 1.03     # measured ratio from which a pair has a faster run (3% is beyond a rerun's spread)

# The settings of each kind of change, as `settings` names them. Order matters: the first kind
# that covers a pair's differences names it (a micro-batch alone is a layout change).
KINDS: dict[str, frozenset[str]] = {
    "layout": frozenset({
        "parallel.tensor", "parallel.pipeline", "parallel.data", "parallel.context",
        "parallel.sequence_parallel", "parallel.schedule", "parallel.virtual_stages",
        "parallel.zero", "parallel.stages", "parallel.data_shard", "parallel.overlap_grad_reduce",
        "parallel.overlap_param_gather", "parallel.tp_comm_overlap", "parallel.grad_reduce",
        "training.micro_batch"}),
    "recompute": frozenset({"training.recompute", "training.recompute_num_layers",
                            "training.recompute_early_stop", "training.micro_batch"}),
    "precision": frozenset({"training.precision", "training.micro_batch"}),
    "kernels": frozenset({"training.attention", "training.attention_softmax_fp32",
                          "training.attention_unpad", "training.optimizer_impl",
                          "training.fused_elementwise", "training.fused_cross_entropy",
                          "training.norm_kernel", "training.rope_kernel", "training.micro_batch"}),
    "model": frozenset({"model.*", "training.micro_batch"}),
    "system": frozenset({"cluster.system", "cluster.inter_node_gbps", "cluster.intra_node_gbps",
                         "cluster.gpus_per_node"}),
    "scale": frozenset({"cluster.gpus", "parallel.data", "parallel.data_shard",
                        "training.global_batch"}),
}
KIND_TEXT = {"layout": "parallel layout or micro-batch, same GPUs",
             "recompute": "activation recompute", "precision": "precision",
             "kernels": "attention kernel or fused operators",
             "model": "model size or shape", "system": "GPU system or network",
             "scale": "GPU count (data parallelism)"}


@dataclass(frozen=True)
class Pair:
    """Two measured rows of one source that differ in one kind of setting; `slower` measured the
    longer step."""
    kind: str
    source_key: str
    slower: str                  # row id
    faster: str                  # row id
    measured_ratio: float        # measured(slower) / measured(faster), >= 1
    predicted_ratio: float       # predicted(slower) / predicted(faster)
    changed: tuple[str, ...]     # the settings that differ

    @property
    def error(self) -> float:
        """Predicted ratio / measured ratio - 1."""
        return self.predicted_ratio / self.measured_ratio - 1.0

    @property
    def decisive(self) -> bool:
        return self.measured_ratio >= DECISIVE

    @property
    def order_right(self) -> bool:
        """The prediction names the measured faster run faster."""
        return self.predicted_ratio > 1.0


@dataclass(frozen=True)
class EffectSummary:
    kind: str                    # a KINDS key, or "all"
    pairs: int
    sources: int
    median_pct: float | None     # of |error| in percent
    p90_pct: float | None
    max_pct: float | None
    bias_pct: float | None       # mean signed error in percent
    decisive: int                # pairs with a faster run (measured ratio >= DECISIVE)
    order_right: int             # of those, the ones whose faster run the prediction names

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def settings(s: Scenario) -> dict[str, Any]:
    """A scenario's settings by name ("training.micro_batch", "model.hidden", ...): the model's
    resolved transformer dims (or its module path), the cluster, training and parallel sections."""
    out: dict[str, Any] = {}
    dims = s.model.resolve()
    model = dataclasses.asdict(dims) if dims is not None else {"module": s.model.module}
    out |= {f"model.{k}": v for k, v in model.items()}
    for section, spec in (("cluster", s.cluster), ("training", s.training),
                          ("parallel", s.parallel)):
        if spec is not None:
            out |= {f"{section}.{f.name}": getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return out


def change_kind(changed: Iterable[str]) -> str | None:
    """The first kind of `KINDS` whose settings cover every name in `changed`; None if none does
    (two kinds of change at once) or nothing changed."""
    names = set(changed)
    if not names:
        return None
    for kind, keys in KINDS.items():
        if all(_in_kind(n, keys) for n in names):
            return kind
    return None


def _in_kind(name: str, keys: frozenset[str]) -> bool:
    return name in keys or (name.startswith("model.") and "model.*" in keys)


def one_change_pairs(rows: Iterable[tuple[MappedRow, float]]) -> list[Pair]:
    """Every pair of `rows` ((row, predicted seconds per step)) of one source that differs in one
    kind of setting, in row order.

    Rows are grouped, per kind, by the source and every setting outside that kind, so only rows
    that can pair are compared (a CSV of many unrelated rows costs its row count, not its square).
    More than MAX_PAIRS pairs (thousands of layouts of one job) is an error, not a truncation."""
    known = [(m, p, settings(m.scenario)) for m, p in rows
             if p is not None and p > 0 and m.measured_step_s > 0]
    candidates: set[tuple[int, int]] = set()
    for keys in KINDS.values():
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, (m, _, s) in enumerate(known):
            rest = tuple(sorted((k, repr(v)) for k, v in s.items() if not _in_kind(k, keys)))
            groups[(m.source_key, rest)].append(i)
        for members in groups.values():
            candidates.update(itertools.combinations(members, 2))
            if len(candidates) > MAX_PAIRS:
                raise PartitaError(f"more than {MAX_PAIRS:,} pairs of runs that differ in one kind "
                                   "of setting: split the CSV by job to price the effects")
    out = []
    for i, j in sorted(candidates):
        (ma, pa, sa), (mb, pb, sb) = known[i], known[j]
        changed = tuple(sorted(k for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k)))
        kind = change_kind(changed)
        if kind is None:
            continue
        if (ma.measured_step_s, ma.row_id) < (mb.measured_step_s, mb.row_id):
            (ma, pa), (mb, pb) = (mb, pb), (ma, pa)
        out.append(Pair(kind, ma.source_key, ma.row_id, mb.row_id,
                        ma.measured_step_s / mb.measured_step_s, pa / pb, changed))
    return out


def summarize_effects(pairs: list[Pair], kind: str = "all") -> EffectSummary:
    """The pairs of `kind` ("all": every pair) summarised."""
    mine = [p for p in pairs if kind in ("all", p.kind)]
    decisive = [p for p in mine if p.decisive]
    right = sum(p.order_right for p in decisive)
    errors = summarize(p.error for p in mine)
    return EffectSummary(kind, len(mine), len({p.source_key for p in mine}), errors.median_pct,
                         errors.p90_pct, errors.max_pct, errors.bias_pct, len(decisive), right)


def effect_summaries(pairs: list[Pair]) -> list[EffectSummary]:
    """One summary per kind with pairs (in `KINDS` order), then the one over all pairs."""
    kinds = [k for k in KINDS if any(p.kind == k for p in pairs)]
    return [summarize_effects(pairs, k) for k in kinds] + [summarize_effects(pairs)]


def effect_line(s: EffectSummary) -> str:
    """One line over all pairs (README quotes the cross-validated one; tests check it)."""
    if not s.pairs:
        return "Effects of one change: no pair of rows of one source differs in one kind of setting"
    return (f"Effects of one change ({s.pairs} pairs of {s.sources} sources): ratio error median "
            f"{s.median_pct:.1f}%, p90 {s.p90_pct:.1f}%, max {s.max_pct:.1f}%; the faster run "
            f"named in {s.order_right} of {s.decisive} pairs {DECISIVE - 1:.0%} or more apart")


def effect_lines(pairs: list[Pair], *, per_pair: bool = False) -> list[str]:
    """The report's section: a table by kind of change (optionally every pair), then the line."""
    if not pairs:
        return [effect_line(summarize_effects(pairs))]
    lines = ["Effects of one change: pairs of rows of one source that differ in one kind of setting; "
             "error = predicted ratio of their step times / measured ratio - 1",
             f"  {'change':<10} {'pairs':>5} {'sources':>7} {'median':>7} {'p90':>7} {'max':>7} "
             f"{'bias':>7}  faster run named"]
    for s in effect_summaries(pairs):
        lines.append(f"  {s.kind:<10} {s.pairs:>5} {s.sources:>7} {s.median_pct:7.1f} "
                     f"{s.p90_pct:7.1f} {s.max_pct:7.1f} {s.bias_pct:+7.1f}  "
                     f"{s.order_right} of {s.decisive}")
    if per_pair:
        for p in sorted(pairs, key=lambda p: -abs(p.error)):
            lines.append(f"    {p.kind:<10} {p.slower:<11} / {p.faster:<11} measured "
                         f"{p.measured_ratio:6.3f} predicted {p.predicted_ratio:6.3f} "
                         f"({100 * p.error:+.1f}%)  changed: {', '.join(_short(p.changed))}")
    lines.append(effect_line(summarize_effects(pairs)))
    return lines


def _short(changed: tuple[str, ...]) -> list[str]:
    return [c.split(".", 1)[1] for c in changed]


def pair_json(p: Pair) -> dict[str, Any]:
    return {"kind": p.kind, "source": p.source_key, "slower": p.slower, "faster": p.faster,
            "measured_ratio": p.measured_ratio, "predicted_ratio": p.predicted_ratio,
            "error_pct": 100.0 * p.error, "changed": list(p.changed)}


def effects_json(pairs: list[Pair], *, per_pair: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"by_kind": {s.kind: s.to_json() for s in effect_summaries(pairs)},
                           "decisive_ratio": DECISIVE}
    if per_pair:
        out["pairs"] = [pair_json(p) for p in pairs]
    return out

