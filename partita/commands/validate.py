"""`partita validate [CSV] [--json] [--rows ID,...] [--verbose]`: the simulator against measurements.

Usage:
    partita validate                              # data/validation/published_dev.csv
    partita validate my_runs.csv --split my_split.yaml
    partita validate --rows NAR21-01,MPT-25 --verbose
    partita validate --json > validation.json
    partita validate --memory                     # data/validation/published_memory.csv, its split
    partita validate --cross-validate             # leave-one-source-out refit (minutes)
    partita validate --cross-validate --write     # ... and store the residuals (crossval.json)
    partita validate --frozen-test                # the frozen test sets' summaries, once per change

Prints one line per simulated row (measured and predicted seconds per step, error =
predicted/measured - 1, fit or hold-out group, the assumptions made to read the row), the rows
that could not be simulated and why, and the summary (median, p90, max, mean absolute error) for
the fit and hold-out groups apart; for rows with a measured peak memory (`peak_memory_GiB`) the
predicted peak and its error too, and a memory summary per group. It is a report: exit 0 whatever
the errors; exit 1 only on bad input (missing CSV, unknown column, unknown row id, malformed split
file). Where rows measure one job in several layouts (same model, system, GPU count, batch and
precision; `validation.ranking`), a layout-choice section says whether the layout predicted fastest
is the measured fastest and what the pick costs (its regret). Where two rows of one source differ
in one kind of setting (GPU count, layout, recompute, precision, model, system;
`validation.effects`), an effects section says how well the ratio of their step times is predicted
(`--verbose`: every pair). `--cross-validate` and `--frozen-test` rank and pair by their own
predictions.

`--cross-validate` refits the framework numbers once per source with that source's rows left out
(`validation.crossval`, the optimiser of benchmarks/fit_overheads.py) and prints each row's error
under the fit that did not see its source, then the leave-one-source-out summary (median, p90, max)
overall and per source; `--write` stores the residuals in data/validation/crossval.json, where the
prediction intervals and the README check read them.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from partita.commands import add_catalog_option

MODEL_WIDTH = 24


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="compare the simulator with published measurements",
                       description="Simulate every published measurement and report the error.")
    p.add_argument("csv", nargs="?", metavar="CSV", default=None,
                   help="measurements in the columns of data/validation/published_dev.csv (default: that file)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--rows", metavar="ID,...", type=_row_ids, default=None, help="only these row ids")
    p.add_argument("--split", metavar="FILE", default=None,
                   help="fit/hold-out split (YAML with fit: [ids]); default data/validation/split.yaml")
    p.add_argument("--memory", action="store_true",
                   help="the published peak-memory runs: data/validation/published_memory.csv with "
                        "its split (split_memory.yaml) unless CSV / --split are given")
    p.add_argument("--cross-validate", action="store_true",
                   help="leave-one-source-out: refit without each source, predict it (minutes)")
    p.add_argument("--frozen-test", action="store_true",
                   help="the frozen test sets (data/validation/frozen_test.yaml): each set's "
                        "summary only; report them once per model change, never tune on them")
    p.add_argument("--write", action="store_true",
                   help="with --cross-validate: store the residuals in data/validation/crossval.json")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="full assumptions and conversion per row, one line per skipped row")
    add_catalog_option(p)
    p.set_defaults(func=run)


def _row_ids(text: str) -> list[str]:
    """--rows: one or more comma-separated ids (a usage error otherwise: exit 2)."""
    ids = [r.strip() for r in text.split(",") if r.strip()]
    if not ids:
        raise argparse.ArgumentTypeError("expected one or more row ids separated by commas, "
                                         f"got {text!r}")
    return ids


def run(args: argparse.Namespace) -> int:
    from partita.commands import catalog_from_args
    from partita.validation.runner import MEMORY_CSV, MEMORY_SPLIT, load_split, run_validation

    if args.write and not args.cross_validate:
        print("error: --write needs --cross-validate (it stores the cross-validated residuals)",
              file=sys.stderr)
        return 2
    if args.cross_validate:
        return _cross_validate(args)
    if args.frozen_test:
        return _frozen_test(args)
    rows = args.rows
    csv, split_file = args.csv, args.split
    if args.memory:
        csv = csv if csv is not None else MEMORY_CSV
        split_file = split_file if split_file is not None else MEMORY_SPLIT
    split = load_split(split_file)
    if args.split is not None or args.csv is None:      # a split chosen for this CSV
        _check_split_ids(split, split_file, csv)
    report = run_validation(csv, rows=rows, split=split, catalog=catalog_from_args(args))
    from partita.validation.frozen import withhold_step_times
    report, withheld = withhold_step_times(report)
    if args.json:
        print(json.dumps(report.to_json() | {"layout_choice": _choices_json(_report_choices(report)),
                                             "effects": _effects_json(_report_effects(report))}))
    else:
        print(format_report(report, verbose=args.verbose))
        if withheld:
            print(f"\nStep times withheld for {withheld} rows of the frozen test set "
                  "(reported by `partita validate --frozen-test` only)")
    return 0


def _check_split_ids(split, split_file, csv) -> None:
    """Every fit id of the split must be a row of the CSV (a typo would move a row silently)."""
    from partita.planner.errors import PartitaError
    from partita.validation.rowmap import DEFAULT_CSV, read_rows
    from partita.validation.runner import DEFAULT_SPLIT
    ids = {r["id"] for r in read_rows(csv)}
    absent = sorted(split.fit - ids)
    if absent:
        more = f", ... ({len(absent) - 10} more)" if len(absent) > 10 else ""
        listed = ", ".join(absent[:10]) + more
        raise PartitaError(f"{split_file or DEFAULT_SPLIT}: fit: row ids not in "
                           f"{csv or DEFAULT_CSV}: {listed}")


def _cross_validate(args: argparse.Namespace) -> int:
    from partita.commands import catalog_from_args
    from partita.validation import crossval
    from partita.validation.runner import load_split

    if args.csv is not None or args.rows or args.memory:
        print("error: --cross-validate runs on the dev CSV and its split only "
              "(no CSV, --rows or --memory)", file=sys.stderr)
        return 2
    cv = crossval.cross_validate(catalog_from_args(args), split=load_split(args.split),
                                 progress=crossval.stderr_progress)
    choices, effects = _cv_choices(cv), _cv_effects(cv)
    if args.write:
        crossval.write_residuals(cv, effects=_effects_json(effects, per_pair=False))
    if args.json:
        from partita.simulator.interval import nested_coverage
        inside, total = nested_coverage([(r.source_key, r.error) for r in cv.residuals])
        print(json.dumps(cv.to_json() | {"layout_choice": _choices_json(choices),
                                         "effects": _effects_json(effects),
                                         "interval_coverage_nested": {"inside": inside,
                                                                      "rows": total}}))
    else:
        print(format_cross_validation(cv, choices, effects))
        if args.write:
            print(f"\nwrote {crossval.RESIDUALS_FILE}")
    return 0


def _frozen_test(args: argparse.Namespace) -> int:
    from partita.commands import catalog_from_args
    from partita.validation.frozen import frozen_report, load_frozen_sets

    if args.csv is not None or args.rows or args.memory or args.split:
        print("error: --frozen-test runs the rows of data/validation/frozen_test.yaml only "
              "(no CSV, --rows, --split or --memory)", file=sys.stderr)
        return 2
    catalog = catalog_from_args(args)
    results = [(s, frozen_report(s, catalog)) for s in load_frozen_sets()]
    if args.json:
        print(json.dumps({"sets": {s.name: _frozen_json(s, r) for s, r in results}}))
        return 0
    print("partita validate --frozen-test: never fitted on, reported once per model change")
    for s, report in results:
        print()
        print(f"{s.name}: {len(s.row_ids)} step times of {s.csv.name}, frozen {s.frozen}"
              + (f" ({len(report.skipped)} not simulated)" if report.skipped else ""))
        print("  " + frozen_line(report.summary(), s.name))
        print("  " + coverage_line(*interval_coverage(report)))
        print("  " + _frozen_choice_line(report))
        print("  " + _frozen_effect_line(report))
        for reason, ids in _by_reason(report.skipped):
            print(f"  not simulated ({len(ids)}): {', '.join(ids)}: {reason}")
    return 0


def _by_reason(skipped) -> list[tuple[str, list[str]]]:
    """Skipped rows grouped by their reason, in the order the reasons first appear."""
    groups: dict[str, list[str]] = {}
    for k in skipped:
        groups.setdefault(k.reason, []).append(k.row_id)
    return list(groups.items())


def _frozen_choice_line(report) -> str:
    from partita.validation.ranking import choice_line, summarize_choices
    return choice_line(summarize_choices(_report_choices(report)))


def _frozen_effect_line(report) -> str:
    from partita.validation.effects import effect_line, summarize_effects
    return effect_line(summarize_effects(_report_effects(report)))


def _frozen_json(frozen_set, report) -> dict:
    from partita.validation.ranking import summarize_choices
    inside, total = interval_coverage(report)
    return {"csv": str(frozen_set.csv), "frozen": frozen_set.frozen,
            "summary": report.summary().to_json(),
            "layout_choice": summarize_choices(_report_choices(report)).to_json(),
            "effects": _effects_json(_report_effects(report), per_pair=False),
            "interval_coverage": {"inside": inside, "rows": total},
            "skipped": [{"id": k.row_id, "kind": k.kind, "reason": k.reason}
                        for k in report.skipped]}


def interval_coverage(report) -> tuple[int, int]:
    """(rows inside their 90% interval, rows with one): `Report.interval_coverage`."""
    return report.interval_coverage()


def coverage_line(inside: int, total: int) -> str:
    """The interval-coverage line README quotes (tests/unit/validation/test_validation.py checks it)."""
    return f"{inside} of {total} measured steps inside their 90% interval"


def frozen_line(s, name: str) -> str:
    """A frozen test set's line (README quotes it; tests/unit/validation/test_validation.py checks it)."""
    return (f"Frozen test {name} ({s.count} rows): median {s.median_pct:.1f}%, p90 {s.p90_pct:.1f}%, "
            f"max {s.max_pct:.1f}%, bias {s.bias_pct:+.1f}%")


def _report_choices(report):
    """Layout choices among a report's simulated rows (validation.ranking)."""
    from partita.validation.ranking import layout_choices
    return layout_choices((r.row, r.predicted_step_s) for r in report.results
                          if r.predicted_step_s is not None)


def _cv_choices(cv):
    """Layout choices by the cross-validated predictions (each job is ranked by the fit that left
    its source out)."""
    from partita.validation.crossval import dev_rows
    from partita.validation.ranking import layout_choices
    rows = {m.row_id: m for m in dev_rows()}
    return layout_choices((rows[r.row_id], r.predicted_step_s) for r in cv.residuals)


def _report_effects(report):
    """Pairs of a report's simulated rows that differ in one kind of setting (validation.effects)."""
    from partita.validation.effects import one_change_pairs
    return one_change_pairs((r.row, r.predicted_step_s) for r in report.results
                            if r.predicted_step_s is not None)


def _cv_effects(cv):
    """The same pairs by the cross-validated predictions (both rows of a pair are of one source,
    so one fit, which left that source out, predicts them)."""
    from partita.validation.crossval import dev_rows
    from partita.validation.effects import one_change_pairs
    rows = {m.row_id: m for m in dev_rows()}
    return one_change_pairs((rows[r.row_id], r.predicted_step_s) for r in cv.residuals)


def _effects_json(pairs, *, per_pair: bool = True) -> dict:
    from partita.validation.effects import effects_json
    return effects_json(pairs, per_pair=per_pair)


def _choices_json(choices) -> dict:
    from partita.validation.ranking import summarize_choices
    return summarize_choices(choices).to_json() | {
        "per_job": [{"job": c.job, "rows_measured_fastest_first": list(c.row_ids),
                  "picked": c.picked, "regret_pct": 100.0 * c.regret,
                  "kendall_tau": c.kendall_tau} for c in choices]}


def format_cross_validation(cv, choices=(), effects=()) -> str:
    """The leave-one-source-out report: per row, per source, then the summary line README quotes."""
    lines = ["partita validate --cross-validate: each source predicted by a fit that left it out",
             "", f"{'id':<11} {'source':<8} {'regime':<22} {'measured s':>10} {'predicted s':>11} "
             f"{'error %':>8}"]
    for r in cv.residuals:
        lines.append(f"{r.row_id:<11} {r.source_key:<8} {r.regime:<22} {r.measured_step_s:10.4g} "
                     f"{r.predicted_step_s:11.4g} {100 * r.error:+8.1f}")
    lines += ["", f"  {'source':<8} {'rows':>5} {'median':>8} {'p90':>8} {'max':>8} {'bias':>8}"]
    for source in cv.sources():
        s = cv.summary(source)
        lines.append(f"  {source:<8} {s.count:>5} {_fmt(s.median_pct)} {_fmt(s.p90_pct)} "
                     f"{_fmt(s.max_pct)} {_fmt(s.bias_pct)}")
    from partita.validation.ranking import choice_lines
    s = cv.summary()
    if choices:
        lines += ["", *choice_lines(list(choices))]
    if effects:
        from partita.validation.effects import effect_lines
        lines += ["", *effect_lines(list(effects))]
    from partita.simulator.interval import nested_coverage
    lines += ["", loso_line(s),
              nested_coverage_line(*nested_coverage([(r.source_key, r.error) for r in cv.residuals]))]
    return "\n".join(lines)


def nested_coverage_line(inside: int, total: int) -> str:
    """How the prediction intervals hold for new sources (README quotes it; tests check it)."""
    return (f"Intervals with each source left out of the residuals too: {inside} of {total} "
            "measured steps inside their 90% interval")


def loso_line(s) -> str:
    """The one line README's accuracy section quotes (tests/unit/validation/test_validation.py checks it)."""
    return (f"Leave-one-source-out ({s.count} rows): median {s.median_pct:.1f}%, "
            f"p90 {s.p90_pct:.1f}%, max {s.max_pct:.1f}%, bias {s.bias_pct:+.1f}%")


def format_report(report, verbose: bool = False) -> str:
    lines = [f"partita validate: {report.csv}  ({len(report.results)} rows simulated, "
             f"{len(report.skipped)} skipped)", ""]
    lines += _table(report, verbose)
    lines += ["", "Summary: |predicted / measured - 1| of the step time, in percent"]
    lines += _summary_lines(report)
    from partita.validation.ranking import choice_lines
    choices = choice_lines(_report_choices(report))
    if choices:
        lines += ["", *choices]
    effects = _report_effects(report)
    if effects:
        from partita.validation.effects import effect_lines
        lines += ["", *effect_lines(effects, per_pair=verbose)]
    failed = report.failed()
    if failed:
        lines += ["", f"Not simulated ({len(failed)}): the simulator refused the scenario"]
        lines += [f"  {r.row.row_id}: {r.failure}" for r in failed]
    lines += ["", *_skipped_lines(report, verbose)]
    if report.split_rule:
        lines += ["", f"Fit rows: {report.split_rule}"]
    return "\n".join(lines)


def _table(report, verbose: bool) -> list[str]:
    from partita.validation.runner import plan_text
    head = (f"{'id':<11} {'model':<{MODEL_WIDTH}} {'GPUs':>5} {'system':<14} {'plan':<36} "
            f"{'measured s':>10} {'predicted s':>11} {'error %':>8} {'group':<7} assumptions")
    out = [head, "-" * len(head)]
    for r in report.results:
        m = r.row
        predicted = f"{r.predicted_step_s:11.4g}" if r.predicted_step_s is not None else f"{'-':>11}"
        error = f"{100 * r.error:+8.1f}" if r.error is not None else f"{'-':>8}"
        fits = "" if r.fits_in_memory in (None, True) else " [does not fit in memory]"
        keys = ", ".join(a.split(" ", 1)[0].rstrip(":") for a in m.assumptions)
        memory = ""
        if r.memory_error is not None:
            memory = (f" [memory {m.measured_peak_memory_gib:.0f} GiB, predicted "
                      f"{r.predicted_peak_memory_gib:.1f} ({100 * r.memory_error:+.1f}%)]")
        out.append(f"{m.row_id:<11} {m.model[:MODEL_WIDTH]:<{MODEL_WIDTH}} {m.gpus:>5} "
                   f"{m.scenario.cluster.system:<14} {plan_text(m):<36} {m.measured_step_s:10.4g} "
                   f"{predicted} {error} {r.group:<7} {keys}{fits}{memory}")
        if verbose:
            out.append(f"    measured: {m.conversion}")
            out += [f"    assumed:  {a}" for a in m.assumptions]
    return out


def _fmt(value) -> str:
    return f"{value:8.1f}" if value is not None else f"{'-':>8}"


def _summary_lines(report) -> list[str]:
    out = [f"  {'group':<8} {'rows':>5} {'median':>8} {'p90':>8} {'max':>8} {'mean':>8} {'bias':>8}"]
    for name in ("fit", "holdout", None):
        s = report.summary(name)
        out.append(f"  {name or 'all':<8} {s.count:>5} {_fmt(s.median_pct)} {_fmt(s.p90_pct)} "
                   f"{_fmt(s.max_pct)} {_fmt(s.mean_pct)} {_fmt(s.bias_pct)}")
    if report.memory_summary().count:
        out += ["", "Peak memory per GPU: |predicted / measured - 1|, in percent", out[0]]
        for name in ("fit", "holdout", None):
            mem = report.memory_summary(name)
            out.append(f"  {name or 'all':<8} {mem.count:>5} {_fmt(mem.median_pct)} "
                       f"{_fmt(mem.p90_pct)} {_fmt(mem.max_pct)} {_fmt(mem.mean_pct)} "
                       f"{_fmt(mem.bias_pct)}")
    out.append("  (bias: mean signed error; > 0 means the simulator predicts slower steps, or more "
               "memory, than measured)")
    return out


def _skipped_lines(report, verbose: bool) -> list[str]:
    from partita.validation.rowcells import SKIP_KINDS
    if not report.skipped:
        return ["Skipped: none"]
    out = [f"Skipped ({len(report.skipped)} rows{'' if verbose else '; --verbose gives each reason'}):"]
    if verbose:
        return out + [f"  {s.row_id:<11} {s.kind:<15} {s.reason}" for s in report.skipped]
    by_kind: dict[str, list[str]] = defaultdict(list)
    for s in report.skipped:
        by_kind[s.kind].append(s.row_id)
    for kind, ids in by_kind.items():
        listed = ", ".join(ids[:8]) + (f", ... ({len(ids) - 8} more)" if len(ids) > 8 else "")
        out.append(f"  {len(ids):>3}  {SKIP_KINDS.get(kind, kind)}: {listed}")
    return out
