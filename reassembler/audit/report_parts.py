"""The building blocks of the report's pages (report_html.py, report_night.py): styles,
charts, tables, number formats and the masked-rollout section with its filters."""

from __future__ import annotations

import html
import json

import plotly.graph_objects as go
import plotly.io as pio

from .quality import masked_file

STEP_COLORS = {
    "rollout checks": "#8c6bb1",
    "select": "#e6550d",
    "cut": "#fdae6b",
    "finalize": "#3182bd",
    "record checks": "#31a354",
}
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1f2933;max-width:1200px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e4e7eb;padding-bottom:4px}
.sub{color:#616e7c;margin-bottom:16px} .tiles{display:flex;flex-wrap:wrap;gap:10px}
.tile{border:1px solid #e4e7eb;border-radius:6px;padding:8px 12px;min-width:120px}
.tile .v{font-size:20px;font-weight:600} .tile .l{font-size:12px;color:#616e7c} .tile .d{font-size:12px}
.up{color:#c81e1e} .down{color:#057a55} .flat{color:#616e7c}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border-bottom:1px solid #e4e7eb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f5f7fa} td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f5f7fa;padding:8px;font-size:12px;white-space:pre-wrap;margin:4px 0}
details summary{cursor:pointer} .grid{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.breach{color:#c81e1e;font-weight:600} .ok{color:#057a55;font-weight:600} a{color:#1a56db}
.warn{color:#b45309;font-weight:600} select{margin-right:8px}
"""
# headline tiles: (key, label, format, whether a rise is bad)
TILES = [
    ("rollouts", "rollouts", "{:,}", None),
    ("ok", "ok", "{:,}", False),
    ("masked", "masked", "{:,}", True),
    ("mask_rate", "mask rate", "{:.1%}", True),
    ("rows", "rows", "{:,}", False),
    ("tokens", "tokens published", "{:,}", False),
    ("tokens_lost", "tokens lost to masking", "{:,}", True),
    ("rows_lost", "rows lost to masking", "{:,}", True),
    ("rejects", "rejected input lines", "{:,}", True),
]


def esc(x) -> str:
    return html.escape(str(x))


def plain(x) -> str:
    """Text for a Plotly label, title or hover: Plotly draws a subset of HTML in them (links
    among it), so capture's strings are escaped and drawn as the characters they are."""
    return html.escape(str(x), quote=False)


def chart(fig: go.Figure, div_id: str, height: int = 320, x: str | None = None, y: str | None = None) -> str:
    """A chart as an HTML fragment; `x` and `y`: its axis titles (every chart has both)."""
    fig.update_layout(
        height=height,
        margin=dict(l=60, r=20, t=40, b=50),
        template="plotly_white",
        legend=dict(orientation="h", y=-0.3),
    )
    fig.update_xaxes(title_text=x, automargin=True)
    fig.update_yaxes(title_text=y, automargin=True)
    if div_id in ("chart-mask-rate", "chart-volume", "chart-reasons-by-night", "chart-index"):
        fig.update_xaxes(type="category", categoryorder="category ascending")  # nights, not a time axis
    return pio.to_html(
        fig, include_plotlyjs=False, full_html=False, div_id=div_id, config={"displaylogo": False, "responsive": True}
    )


def rate_axis(fig: go.Figure, rates: list[float]) -> None:
    """A share axis from 0 (never below it), to above the highest value shown (room for its label)."""
    fig.update_yaxes(tickformat=".0%", range=[0, max([0.05, *rates]) * 1.25], rangemode="nonnegative")


SMALL_N = 10  # a rate over fewer rollouts is drawn grey: too few to read as a rate
BAR_COLOR, SMALL_COLOR = "#3182bd", "#bdbdbd"


STATUS_CLASS = {"ok": "ok", "warn": "warn", "breach": "breach"}


def num_text(x) -> str:
    """A number as the report shows it; None (a check without a limit) as a dash."""
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else f"{x:,}"


def nights_text(n: int) -> str:
    return f"{n} night" if n == 1 else f"{n} nights"


def html_table(header: list[str], rows: list[list], numeric: frozenset[int] | set[int] = frozenset()) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def html_page(title: str, body: str, plotly_src: str) -> str:
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f'<style>{CSS}</style><script src="{plotly_src}"></script></head><body>{body}</body></html>'
    )


def delta_text(value, base, fmt: str, rise_is_bad) -> str:
    if base is None or rise_is_bad is None:
        return ""
    diff = value - base
    cls = "flat" if abs(diff) < 1e-12 else ("up" if (diff > 0) == rise_is_bad else "down")
    shown = f"{diff:+.1%}" if "%" in fmt else f"{diff:+,.0f}"
    return f'<div class="d {cls}">{shown} vs trailing mean</div>'


def inputs_line(inputs: str | None) -> str:
    """The locations the night's run read (runs.inputs), or nothing for a run before they
    were recorded."""
    if not inputs:
        return ""
    where = json.loads(inputs)
    shown = " · ".join(
        f"{kind} <code>{esc(where[kind])}</code>" for kind in ("rollouts", "ledger", "tokens") if kind in where
    )
    return f'<div class="sub inputs">read from {shown}</div>'


MASKED_SHOWN = 1000  # rows of the page's masked-rollout table; the downloads hold every one
FILTERS = ("reason", "capture", "agent", "env", "model_server")
FILTER_SCRIPT = """
(function () {
  var table = document.getElementById('masked-table'); if (!table) return;
  var selects = document.querySelectorAll('select[data-filter]');
  function apply() {
    var want = {}; selects.forEach(function (s) { if (s.value) want[s.dataset.filter] = s.value; });
    var shown = 0;
    table.querySelectorAll('tr[data-reason]').forEach(function (row) {
      var ok = Object.keys(want).every(function (k) { return row.dataset[k] === want[k]; });
      row.style.display = ok ? '' : 'none'; if (ok) shown += 1;
    });
    document.getElementById('masked-shown').textContent = shown;
  }
  selects.forEach(function (s) { s.addEventListener('change', apply); });
  document.querySelectorAll('a.list-reason').forEach(function (a) {
    a.addEventListener('click', function () {
      selects.forEach(function (s) { s.value = s.dataset.filter === 'reason' ? a.dataset.reason : ''; });
      apply();
    });
  });
})();
"""


def masked_section(ds: str, masked: list[dict]) -> str:
    """Every masked rollout (the first MASKED_SHOWN on the page), filterable by reason,
    capture, agent, env and model server, with the whole list as CSV and Parquet."""
    csv, parquet = masked_file(ds, "csv"), masked_file(ds, "parquet")
    parts = [
        '<h2 id="masked">Masked rollouts</h2>',
        f'<div class="sub">{len(masked):,} masked rollouts · download every one: '
        f'<a href="{csv}" download>CSV</a> · <a href="{parquet}" download>Parquet</a>'
        + (f" · the first {MASKED_SHOWN:,} are listed here" if len(masked) > MASKED_SHOWN else "")
        + "</div>",
    ]
    if not masked:
        return "".join(parts)
    shown = masked[:MASKED_SHOWN]
    selects = []
    for key in FILTERS:
        values = sorted({str(r[key]) for r in shown if r[key] is not None})
        options = "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in values)
        selects.append(
            f'<label>{esc(key.replace("_", " "))} <select data-filter="{key}"><option value="">all</option>'
            f"{options}</select></label>"
        )
    parts.append(
        '<div class="filters">' + "".join(selects) + f' shown: <span id="masked-shown">{len(shown):,}</span></div>'
    )
    head = "".join(
        f"<th>{esc(h)}</th>"
        for h in ("rollout", "reason", "failed call", "detail", "capture", "agent", "env", "model server", "tokens")
    )
    body = []
    for r in shown:
        data = " ".join(f'data-{k.replace("_", "-")}="{esc(r[k] if r[k] is not None else "")}"' for k in FILTERS)
        cells = [
            esc(r["rollout_id"]),
            f"<code>{esc(r['reason'])}</code>",
            esc(r["failed_call_id"] or ""),
            esc((r["detail"] or "")[:300]),
            esc(r["capture"] or ""),
            esc(r["agent"] or ""),
            esc(r["env"] or ""),
            esc(r["model_server"] or ""),
            f'<td class="n">{r["declared_tokens"]:,}</td>',
        ]
        body.append(f"<tr {data}>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells) + "</tr>")
    parts.append(f'<table id="masked-table"><tr>{head}</tr>{"".join(body)}</table>')
    parts.append(f"<script>{FILTER_SCRIPT}</script>")
    return "".join(parts)
