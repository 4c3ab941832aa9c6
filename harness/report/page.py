"""index.html: the report a person opens and shares. One file beside its PNGs, no network: a header saying
when, on what and how the figures were made, the verdict in words, a table sortable by any column, and
the plots laid out for a wide screen and a narrow one."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from pathlib import Path

from harness.parity import report as parity
from harness.report import columns
from harness.report.rows import PER, Context, Row, reproducibility, summary, winners

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1400px;padding:0 1em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em} .meta{display:grid;grid-template-columns:max-content 1fr;gap:.15em 1em;
font-size:13px;margin:.5em 0 1em} .meta dt{color:#666} .meta dd{margin:0;overflow-wrap:anywhere}
.meta code{font-size:12px} .verdict{background:#f3f6fb;border-left:4px solid #1f77b4;padding:.6em 1em;margin:1em 0}
.scroll{overflow-x:auto} table{border-collapse:collapse;font-size:13px;width:100%}
th,td{border-bottom:1px solid #ddd;padding:4px 8px;text-align:right;white-space:nowrap;vertical-align:top}
th{cursor:pointer;background:#fafafa;position:sticky;top:0} th:hover{background:#eef}
td.name,th.name{text-align:left} td.status{text-align:left;white-space:normal;min-width:12em;max-width:32em}
.figures{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,620px),1fr));gap:1em;margin-top:1.5em}
figure{margin:0} figure img{width:100%;height:auto;border:1px solid #eee}
@media (max-width:900px){body{margin:.5em;padding:0} table{font-size:12px}}
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


def to_html(rows: Sequence[Row], baseline: str | None, pngs: Sequence[Path], skipped: Sequence[str],
            ctx: Context | None = None) -> str:
    shown, body = columns.table(rows)
    won = winners(rows)
    head = "".join(f'<th class="{"name" if i == 0 else ""}">{html.escape(c.header or "")}</th>'
                   for i, c in enumerate(shown))
    trs = []
    for row, cells in zip(rows, body, strict=True):
        tds = []
        for i, (column, cell) in enumerate(zip(shown, cells, strict=True)):
            klass = "name" if i == 0 else "status" if column.header == "status" else ""
            star = "★ " if column.star and won.get(column.star) == row.label else ""
            tds.append(f'<td class="{klass}" data-v="{html.escape(_sort_value(cell) if column.numeric else cell)}">'
                       f"{star}{html.escape(cell)}</td>")
        trs.append("<tr>" + "".join(tds) + "</tr>")
    figures = "".join(f'<figure><img src="{html.escape(p.name)}" alt="{html.escape(p.stem.replace("_", " "))}">'
                      f"</figure>" for p in pngs)
    warn = "".join(f"<li>{html.escape(s)}</li>" for s in skipped)
    said = "".join(f"<li>{html.escape(line)}</li>" for line in parity.notes(rows))
    parity_notes = f"<h2>Numerical parity</h2><ul>{said}</ul>" if said else ""
    meta = ""
    if ctx is not None:
        items = [("when", _when(ctx)), ("runs", str(ctx.runs)), ("machine", ctx.machine), ("versions", ctx.versions),
                 ("command", "<br>".join(f"<code>{html.escape(c)}</code>" for c in ctx.commands) or "unknown"),
                 ("harness commit", ", ".join(ctx.commits) or "unknown")]
        meta = '<dl class="meta">' + "".join(
            f"<dt>{k}</dt><dd>{v if k == 'command' else html.escape(v)}</dd>" for k, v in items) + "</dl>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Strategies side by side</title><style>{STYLE}</style></head>
<body><h1>Strategies side by side</h1>
<p class="verdict"><strong>Verdict:</strong> {html.escape(summary(rows, baseline))}</p>
{meta}
<p>Speedup against {html.escape(baseline or "no row (none ran)")}. Throughput is the geometric mean of a row's runs
(steady-state windows, warm-up excluded), time per {PER} iterations the same figure as time, each with its 95 %
interval from the runs in brackets; ★ marks the winner when it is ahead beyond the noise of identical runs.
{html.escape(reproducibility(rows))}. Click a column to sort.</p>
<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(trs)}</tbody></table></div>
{parity_notes}
{f"<h2>Unreadable results files</h2><ul>{warn}</ul>" if warn else ""}
<div class="figures">{figures}</div>
<script>{SORT}</script>
</body></html>
"""
