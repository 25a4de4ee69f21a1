"""Report assembly: a `Report` of sections (text, figures, tables) written as one self-contained HTML
page (figures inline as base64 PNG, styles inline: it opens from disk with no server), a Markdown page
and the PNG and CSV files beside them.

Every table is a pandas DataFrame and is written to CSV with full precision; the HTML and Markdown
show the same values rounded by the table's `formats` (the digits `partita simulate` prints).
"""
from __future__ import annotations

import base64
import html
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from partita import __version__
from partita.planner.errors import PartitaError


@dataclass(frozen=True, kw_only=True)
class FigureItem:
    name: str                     # file stem: <name>.png
    title: str
    png: bytes
    caption: str = ""


@dataclass(frozen=True, kw_only=True)
class TableItem:
    name: str                     # file stem: <name>.csv
    title: str
    frame: pd.DataFrame
    formats: Mapping[str, str] = field(default_factory=dict)   # column -> format spec, e.g. ".4f"
    caption: str = ""


@dataclass(frozen=True, kw_only=True)
class Section:
    heading: str
    text: tuple[str, ...] = ()            # paragraphs (plain text)
    figures: tuple[FigureItem, ...] = ()
    tables: tuple[TableItem, ...] = ()
    side_by_side: bool = False            # figures in one row


@dataclass(frozen=True, kw_only=True)
class Report:
    kind: str                             # file stem of the page: <kind>.html, <kind>.md
    title: str
    subtitle: str = ""
    sections: tuple[Section, ...] = ()

    def figures(self) -> list[FigureItem]:
        return [f for s in self.sections for f in s.figures]

    def tables(self) -> list[TableItem]:
        return [t for s in self.sections for t in s.tables]


def write_report(report: Report, out_dir: str | Path) -> list[Path]:
    """Write <kind>.html, <kind>.md, every figure's PNG and every table's CSV under out_dir."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PartitaError(f"-o {out}: exists and is not a directory")
    names = [f.name + ".png" for f in report.figures()] + [t.name + ".csv" for t in report.tables()]
    if len(set(names)) != len(names):
        raise ValueError(f"report {report.kind}: two files share a name in {sorted(names)}")
    _refuse_foreign(out, report.kind, names + [f"{report.kind}.md", f"{report.kind}.html"])
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for fig in report.figures():
            written.append(_write(out / f"{fig.name}.png", fig.png))
        for table in report.tables():
            path = out / f"{table.name}.csv"
            table.frame.to_csv(path, index=False)
            written.append(path)
        written.append(_write(out / f"{report.kind}.md", to_markdown(report).encode()))
        written.append(_write(out / f"{report.kind}.html", to_html(report).encode()))
    except OSError as exc:
        raise PartitaError(f"-o {out}: cannot write the report: {exc.strerror}") from None
    return written


def _refuse_foreign(out: Path, kind: str, names: list[str]) -> None:
    """Overwrite a file only where an earlier `partita report KIND` wrote this directory's page."""
    existing = sorted(n for n in names if (out / n).exists())
    if not existing:
        return
    page = out / f"{kind}.html"
    try:
        ours = page.is_file() and _GENERATOR.format(kind=kind) in page.read_text(errors="replace")
    except OSError:
        ours = False
    if not ours:
        raise PartitaError(f"-o {out}: would overwrite {', '.join(existing)}, not written by "
                           f"partita report {kind}; choose another directory")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def formatted(table: TableItem) -> pd.DataFrame:
    """The table as strings, each column by its format spec (no spec: str())."""
    frame = table.frame.copy()
    for col in frame.columns:
        frame[col] = frame[col].map(_formatter(table.formats.get(col)))
    return frame


def _formatter(spec: str | None) -> Callable[[object], str]:
    def fmt(value: object) -> str:
        if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
            return ""
        if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
            return format(value, spec)
        return str(value)
    return fmt


# ---- HTML ----

_GENERATOR = '<meta name="generator" content="partita report {kind}">'

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:1200px;
padding:0 1rem;color:#222;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.25rem;margin-top:2rem;border-bottom:1px solid #ddd}
.sub{color:#555;margin-top:0}figure{margin:1rem 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.9rem}.row{display:flex;flex-wrap:wrap;gap:1rem}.row figure{flex:1 1 45%}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0 1rem}caption{text-align:left;font-weight:600;
padding:.3rem 0}th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;white-space:nowrap}
th{background:#f5f5f5}.num{text-align:right;font-variant-numeric:tabular-nums}.tablewrap{overflow-x:auto}footer{color:#777;font-size:.8rem;
margin-top:3rem}
"""


def to_html(report: Report) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             _GENERATOR.format(kind=e(report.kind)),
             f"<title>{e(report.title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{e(report.title)}</h1>"]
    if report.subtitle:
        parts.append(f'<p class="sub">{e(report.subtitle)}</p>')
    for section in report.sections:
        parts.append(f"<h2>{e(section.heading)}</h2>")
        parts += [f"<p>{e(p)}</p>" for p in section.text]
        if section.figures:
            parts.append('<div class="row">' if section.side_by_side else "<div>")
            parts += [_html_figure(f) for f in section.figures]
            parts.append("</div>")
        parts += [_html_table(t) for t in section.tables]
    parts.append(f"<footer>partita {e(__version__)} &middot; files beside this page: "
                 f"{e(report.kind)}.md, " + ", ".join(
                     e(n) for n in [f.name + ".png" for f in report.figures()]
                     + [t.name + ".csv" for t in report.tables()]) + "</footer>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _html_figure(f: FigureItem) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    caption = f"<figcaption>{html.escape(f.caption)}</figcaption>" if f.caption else ""
    return (f'<figure><img alt="{html.escape(f.title)}" src="data:image/png;base64,{data}">'
            f"{caption}</figure>")


def _html_table(t: TableItem) -> str:
    """Numeric columns right-aligned, text left; cells never wrap (the wrapper scrolls sideways)."""
    e = html.escape
    numeric = [pd.api.types.is_numeric_dtype(t.frame[c]) and not pd.api.types.is_bool_dtype(t.frame[c])
               for c in t.frame.columns]
    head = "".join(f'<th{" class=num" if n else ""}>{e(str(c))}</th>'
                   for c, n in zip(t.frame.columns, numeric))
    rows = []
    for values in formatted(t).itertuples(index=False):
        rows.append("<tr>" + "".join(f'<td{" class=num" if n else ""}>{e(str(v))}</td>'
                                     for v, n in zip(values, numeric)) + "</tr>")
    caption = f"<p>{e(t.caption)}</p>" if t.caption else ""
    return (f'<div class="tablewrap"><table><caption>{e(t.title)} ({e(t.name)}.csv)</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>{caption}")


# ---- Markdown ----

def to_markdown(report: Report) -> str:
    lines = [f"# {report.title}", ""]
    if report.subtitle:
        lines += [report.subtitle, ""]
    for section in report.sections:
        lines += [f"## {section.heading}", ""]
        for p in section.text:
            lines += [p, ""]
        for f in section.figures:
            lines += [f"![{f.title}]({f.name}.png)", ""]
            if f.caption:
                lines += [f"*{f.caption}*", ""]
        for t in section.tables:
            lines += [f"**{t.title}** ([{t.name}.csv]({t.name}.csv))", "", _md_table(t), ""]
            if t.caption:
                lines += [t.caption, ""]
    return "\n".join(lines)


def _md_table(t: TableItem) -> str:
    frame = formatted(t)
    cols = [str(c) for c in frame.columns]
    rows = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for values in frame.itertuples(index=False):
        rows.append("| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |")
    return "\n".join(rows)
