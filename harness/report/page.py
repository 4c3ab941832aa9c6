"""index.html: the report a person opens and shares. One self-contained file (the plots inside it), no network:
the verdict first, a header saying when, on what and how the figures were made, then a section per question
(speed, time over iterations, memory, parity, where the time goes), each with a table of at most ten columns,
sortable by any of them, and its plots; what did not run is one list. At 1400 px nothing scrolls sideways, with
every feature's columns: cells break at their spaces and a cell listing devices puts each on its own line, so a
table narrows to its box before it grows past it; narrower, only a table scrolls, inside its own box."""

from __future__ import annotations

import base64
import datetime as dt
import html
import re
from collections.abc import Sequence
from pathlib import Path

from harness.parity import report as parity
from harness.report import columns
from harness.report.decision import Decision
from harness.report.findings import Report
from harness.report.rows import PER, Context, Row
from harness.search.answer import SearchAnswer

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1400px;padding:0 1em;color:#222;box-sizing:border-box}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin:1.6em 0 .5em}
.meta{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:.15em 1em;font-size:13px;margin:.5em 0 1em}
.meta dt{color:#666} .meta dd{margin:0;overflow-wrap:anywhere} .meta code{font-size:12px}
.verdict{background:#f3f6fb;border-left:4px solid #1f77b4;padding:.6em 1em;margin:1em 0;overflow-wrap:anywhere}
p,li{overflow-wrap:anywhere}
.scroll{overflow-x:auto;max-width:100%} table{border-collapse:collapse;font-size:13px}
th,td{border-bottom:1px solid #ddd;padding:4px 6px;text-align:right;vertical-align:top}
th{cursor:pointer;background:#fafafa;position:sticky;top:0} th:hover{background:#eef}
td.name,th.name{text-align:left} td.name{min-width:8em;overflow-wrap:anywhere}
td .part{display:block} td .nw{white-space:nowrap}
#projection table{display:block;overflow-x:auto;max-width:100%}
.figures{display:grid;grid-template-columns:minmax(0,1fr);gap:1em;margin-top:1em}
figure{margin:0} figure img{width:100%;max-width:1100px;height:auto;border:1px solid #eee}
@media (max-width:900px){body{margin:.5em auto} table{font-size:12px}}
"""

SORT = """
document.querySelectorAll('th').forEach(function(th, i) {
  th.addEventListener('click', function() {
    var body = th.closest('table').tBodies[0], rows = Array.from(body.rows), up = th.dataset.up !== '1';
    th.dataset.up = up ? '1' : '0';
    rows.sort(function(a, b) {
      var x = a.cells[i].dataset.v, y = b.cells[i].dataset.v, nx = parseFloat(x), ny = parseFloat(y);
      var r = (isNaN(nx) || isNaN(ny)) ? String(x).localeCompare(String(y)) : nx - ny;
      if (isNaN(nx) !== isNaN(ny)) r = isNaN(nx) ? 1 : -1;  /* rows without a figure last */
      return up ? r : -r;
    });
    rows.forEach(function(row) { body.appendChild(row); });
  });
});
"""


def _when(ctx: Context) -> str:
    stamps = [t for t in (ctx.first_started, ctx.last_finished) if t]
    if not stamps:
        return "unknown"
    start, end = (dt.datetime.fromtimestamp(t) for t in (min(stamps), max(stamps)))
    return f"{start:%Y-%m-%d %H:%M} – {end:%H:%M}" if start.date() == end.date() else f"{start:%Y-%m-%d} – {end:%Y-%m-%d}"


def _sort_value(cell: str) -> str:
    """The number a cell starts with ("1280.0", "2.00×", "0.500 (0.48–0.52)"), for sorting; else the text."""
    head = cell.split(" ")[0].rstrip("×%?").lstrip("★")
    try:
        return repr(float(head))
    except ValueError:
        return "" if cell == "—" else cell


PLOT_SECTION = {"throughput": "speed", "cumulative_time": "cumulative", "memory_per_device": "memory",
                "loss": "cumulative", "breakdown": "time"}  # which section a plot answers, by its file's stem


def embedded(png: Path) -> str:
    """The plot inside the page (a data URL): the file sent alone still shows it. The PNG stays beside it too."""
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    alt = html.escape(png.stem.replace("_", " "))
    return f'<figure><img src="data:image/png;base64,{data}" alt="{alt}"></figure>'


def _header(text: str) -> str:
    """A header may break at its spaces, and inside a long word after each `/` (`compute/comm/data/...`)."""
    return " ".join("/<wbr>".join(html.escape(p) for p in word.split("/")) if len(word) > 12 else html.escape(word)
                    for word in text.split(" "))


def _words(text: str) -> str:
    """A cell breaks at its spaces only: a range (`[1.85–2.01]`, `cuda:0–7`) or a ratio stays whole."""
    return re.sub(r"\S*[–/-]\S*", lambda m: f'<span class="nw">{m.group(0)}</span>', html.escape(text))


def _cell_html(column: columns.Column, cell: str) -> str:
    """A figure's cell keeps its ranges whole; a cell listing several things (devices with their PIDs) puts each
    on a line of its own, not one long line; a name may break anywhere (td.name)."""
    if column.parts and column.parts in cell:
        return "".join(f'<span class="part">{html.escape(part)}</span>' for part in cell.split(column.parts))
    return _words(cell) if column.numeric else html.escape(cell)


def _table(rows: Sequence[Row], shown: Sequence[columns.Column], body: Sequence[Sequence[str]],
           won: dict[str, str]) -> str:
    head = "".join(f'<th class="{"name" if i == 0 else ""}">{_header(c.header or "")}</th>'
                   for i, c in enumerate(shown))
    trs = []
    for row, cells in zip(columns.ran(rows), body, strict=True):
        tds = []
        for i, (column, cell) in enumerate(zip(shown, cells, strict=True)):
            star = "★ " if column.star and won.get(column.star) == row.label else ""
            value = _sort_value(cell) if column.numeric else cell
            tds.append(f'<td class="{"name" if i == 0 else ""}" data-v="{html.escape(value)}">'
                       f"{star}{_cell_html(column, cell)}</td>")
        trs.append("<tr>" + "".join(tds) + "</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(trs)}</tbody></table></div>'


def _notes(rows: Sequence[Row], section: str, baseline: str | None, decision: Decision) -> str:
    """What a section's figures mean, under its table."""
    if section == "speed":
        return (f"<p>Speedup against {html.escape(baseline or 'no row (none ran)')}. Throughput is the geometric "
                f"mean of a row's runs (steady-state windows, warm-up excluded), time per {PER} iterations each run's "
                "median window pooled the same way, each with its 95 % interval from the runs in brackets; ★ marks "
                f"the winner when the rule finds it faster than every other row. {html.escape(decision.reproducibility)}"
                ". Click a column to sort.</p>")
    if section == "memory" and any(columns.memory(r).source == "psutil" for r in columns.ran(rows)):
        return ("<p>On CPU each worker is a process, not a device: the figures are each process's resident memory "
                "growth, and imbalance (a device holding more than its share) has no meaning there (n/a).</p>")
    if section == "prediction" and any(r.busy and columns.prediction(r).time_error is not None
                                       for r in columns.ran(rows)):
        return ("<p>— (busy): every run of the row was timed while the machine was busy, so its time says "
                "nothing of the prediction; its error is not judged (memory is unaffected).</p>")
    if section == "parity":
        said = "".join(f"<li>{html.escape(line)}</li>" for line in parity.notes(rows))
        return f"<ul>{said}</ul>" if said else ""
    return ""


def to_html(report: Report, pngs: Sequence[Path] = (), scaling: Path | None = None) -> str:
    """The page in the order a reader asks: the verdict, then a section per question (its table, what the
    figures mean, its plots), the projection when one was asked for (`scaling`: its plot), then what did not
    run, in one list grouped by reason."""
    rows, baseline, decision, skipped, ctx = (report.rows, report.baseline, report.decision, report.skipped_files,
                                              report.context)
    won = decision.winners
    plots: dict[str, list[str]] = {}
    for png in pngs:
        plots.setdefault(PLOT_SECTION.get(png.stem, "speed"), []).append(embedded(png))
    sections = []
    for key, heading in columns.SECTIONS:
        shown, body = columns.section_table(rows, key)
        figures = plots.get(key, [])
        if not shown and not figures:
            continue
        sections.append(f'<section id="{key}"><h2>{html.escape(heading)}</h2>'
                        + (_table(rows, shown, body, won) if shown else "") + _notes(rows, key, baseline, decision)
                        + (f'<div class="figures">{"".join(figures)}</div>' if figures else "") + "</section>")
    if report.projected:
        from harness.report import projection

        sections.append(projection.html_section(report.projected, embedded(scaling) if scaling else ""))
    missing = columns.not_run(rows)
    if missing:
        items = "".join(f"<li><strong>{html.escape(status)}</strong>: {html.escape(reason)} — "
                        f"{html.escape(', '.join(labels))}</li>" for status, reason, labels in missing)
        sections.append(f'<section id="not_run"><h2>What did not run here</h2><ul class="missing">{items}</ul>'
                        "</section>")
    if skipped:
        warn = "".join(f"<li>{html.escape(s)}</li>" for s in skipped)
        sections.append(f"<section><h2>Unreadable results files</h2><ul>{warn}</ul></section>")
    meta = ""
    if ctx is not None:
        items = [("when", _when(ctx)), ("runs", str(ctx.runs)), ("machine", ctx.machine), ("versions", ctx.versions),
                 ("kernels", ctx.kernels),
                 ("command", "<br>".join(f"<code>{html.escape(c)}</code>" for c in ctx.commands) or "unknown"),
                 ("harness commit", ", ".join(ctx.commits) or "unknown")]
        meta = '<dl class="meta">' + "".join(
            f"<dt>{k}</dt><dd>{v if k == 'command' else html.escape(v)}</dd>" for k, v in items) + "</dl>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Strategies side by side</title><style>{STYLE}</style></head>
<body><h1>Strategies side by side</h1>
{_search_section(report.search)}
<p class="verdict"><strong>Verdict:</strong> {html.escape(decision.verdict)}</p>
{meta}
{"".join(sections)}
<script>{SORT}</script>
</body></html>
"""


def _search_section(found: SearchAnswer | None) -> str:
    """A search's answer, first on the page: the sentence, the command, the cost, what was pruned and failed."""
    if found is None:
        return ""

    def listed(title: str, items: list[tuple[str, str]]) -> str:
        if not items:
            return ""
        body = "".join(f"<li><strong>{html.escape(n)}</strong>: {html.escape(r)}</li>" for n, r in items)
        return f"<details><summary>{html.escape(title)} ({len(items)})</summary><ul>{body}</ul></details>"

    command = f"<p>Train with it:</p><pre><code>{html.escape(found.command)}</code></pre>" if found.command else ""
    return (f'<section id="search"><h2>Search</h2><p class="verdict"><strong>Answer:</strong> '
            f"{html.escape(found.sentence)}</p>{command}<p>Cost: {html.escape(found.cost)}</p>"
            f"{listed('Pruned by prediction, not run', found.pruned)}"
            f"{listed('Failed, skipped or stopped', found.failed)}</section>")
