"""The nightly capture-quality report as HTML pages that open from disk, with no network.

`write_reports(con, output, ds)` writes `<output>/reports/ds=<ds>/index.html` (one night,
quality.py's numbers) and `<output>/reports/index.html` (every night). Charts are Plotly
figures; the Plotly library is written once beside the pages (`reports/plotly.min.js`) and
loaded by a relative path, so the pages stay small (summaries, never one point per call)
and need no CDN. Every number is also in a table, so the page reads without scripts too.
Each page is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import plotly
import plotly.graph_objects as go
import plotly.io as pio

from .. import storage
from ..settings import REPORT_NIGHTS
from .quality import MASKED_COLUMNS, masked_rollouts, night_quality, nights_overview

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


def _e(x) -> str:
    return html.escape(str(x))


def _plain(x) -> str:
    """Text for a Plotly label, title or hover: Plotly draws a subset of HTML in them (links
    among it), so capture's strings are escaped and drawn as the characters they are."""
    return html.escape(str(x), quote=False)


def _fig(fig: go.Figure, div_id: str, height: int = 320, x: str | None = None, y: str | None = None) -> str:
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


def _rate_axis(fig: go.Figure, rates: list[float]) -> None:
    """A share axis from 0 (never below it), to above the highest value shown (room for its label)."""
    fig.update_yaxes(tickformat=".0%", range=[0, max([0.05, *rates]) * 1.25], rangemode="nonnegative")


SMALL_N = 10  # a rate over fewer rollouts is drawn grey: too few to read as a rate
BAR_COLOR, SMALL_COLOR = "#3182bd", "#bdbdbd"


STATUS_CLASS = {"ok": "ok", "warn": "warn", "breach": "breach"}


def _num(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else f"{x:,}"


def _nights(n: int) -> str:
    return f"{n} night" if n == 1 else f"{n} nights"


def _table(header: list[str], rows: list[list], numeric: frozenset[int] | set[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(title: str, body: str, plotly_src: str) -> str:
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f'<style>{CSS}</style><script src="{plotly_src}"></script></head><body>{body}</body></html>'
    )


def _delta(value, base, fmt: str, rise_is_bad) -> str:
    if base is None or rise_is_bad is None:
        return ""
    diff = value - base
    cls = "flat" if abs(diff) < 1e-12 else ("up" if (diff > 0) == rise_is_bad else "down")
    shown = f"{diff:+.1%}" if "%" in fmt else f"{diff:+,.0f}"
    return f'<div class="d {cls}">{shown} vs trailing mean</div>'


def _inputs_line(inputs: str | None) -> str:
    """The locations the night's run read (runs.inputs), or nothing for a run before they
    were recorded."""
    if not inputs:
        return ""
    where = json.loads(inputs)
    shown = " · ".join(
        f"{kind} <code>{_e(where[kind])}</code>" for kind in ("rollouts", "ledger", "tokens") if kind in where
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


def _masked_section(masked: list[dict]) -> str:
    """Every masked rollout (the first MASKED_SHOWN on the page), filterable by reason,
    capture, agent, env and model server, with the whole list as CSV and Parquet."""
    parts = [
        '<h2 id="masked">Masked rollouts</h2>',
        f'<div class="sub">{len(masked):,} masked rollouts · download every one: '
        '<a href="masked.csv" download>CSV</a> · <a href="masked.parquet" download>Parquet</a>'
        + (f" · the first {MASKED_SHOWN:,} are listed here" if len(masked) > MASKED_SHOWN else "")
        + "</div>",
    ]
    if not masked:
        return "".join(parts)
    shown = masked[:MASKED_SHOWN]
    selects = []
    for key in FILTERS:
        values = sorted({str(r[key]) for r in shown if r[key] is not None})
        options = "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in values)
        selects.append(
            f'<label>{_e(key.replace("_", " "))} <select data-filter="{key}"><option value="">all</option>'
            f"{options}</select></label>"
        )
    parts.append(
        '<div class="filters">' + "".join(selects) + f' shown: <span id="masked-shown">{len(shown):,}</span></div>'
    )
    head = "".join(
        f"<th>{_e(h)}</th>"
        for h in ("rollout", "reason", "failed call", "detail", "capture", "agent", "env", "model server", "tokens")
    )
    body = []
    for r in shown:
        data = " ".join(f'data-{k.replace("_", "-")}="{_e(r[k] if r[k] is not None else "")}"' for k in FILTERS)
        cells = [
            _e(r["rollout_id"]),
            f"<code>{_e(r['reason'])}</code>",
            _e(r["failed_call_id"] or ""),
            _e((r["detail"] or "")[:300]),
            _e(r["capture"] or ""),
            _e(r["agent"] or ""),
            _e(r["env"] or ""),
            _e(r["model_server"] or ""),
            f'<td class="n">{r["declared_tokens"]:,}</td>',
        ]
        body.append(f"<tr {data}>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells) + "</tr>")
    parts.append(f'<table id="masked-table"><tr>{head}</tr>{"".join(body)}</table>')
    parts.append(f"<script>{FILTER_SCRIPT}</script>")
    return "".join(parts)


def night_page(q: dict, masked: list[dict] | None = None) -> str:
    ds, n, base = q["ds"], q["night"], q["baseline"]
    parts = [
        f"<h1>Capture quality, night {_e(ds)}</h1>",
        f'<div class="sub">run {_e(n["run_id"])} · <a href="../index.html">all nights</a> · '
        + (
            f"change against the mean of the {q['trailing_nights']} nights before"
            if q["trailing_nights"]
            else "no earlier night to compare with"
        )
        + "</div>",
        _inputs_line(n.get("inputs")),
        '<div class="tiles">',
    ]
    for key, label, fmt, bad in TILES:
        parts.append(
            f'<div class="tile" id="tile-{key}"><div class="v">{fmt.format(n[key])}</div>'
            f'<div class="l">{_e(label)}</div>{_delta(n[key], base and base[key], fmt, bad)}</div>'
        )
    parts.append("</div>")
    latest = q["verdicts"][0] if q["verdicts"] and q["verdicts"][0]["ds"] == ds else None
    if latest:
        cls = "ok" if latest["verdict"] == "ok" else "breach"
        msgs = "; ".join(b["message"] for b in latest["breaches"])
        parts.append(f'<p>Quality gate: <span class="{cls}" id="verdict">{_e(latest["verdict"])}</span> {_e(msgs)}</p>')
        checks = [c for c in latest.get("checks", []) if "status" in c]
        if checks:
            parts.append(
                '<div id="gate-checks">'
                + _table(
                    ["check", "value", "limit", "margin", "status"],
                    [
                        [
                            f"<code>{_e(c['check'])}</code>",
                            _num(c["value"]),
                            _num(c["threshold"]),
                            _num(c["margin"]),
                            f'<span class="{STATUS_CLASS[c["status"]]}">{_e(c["status"])}</span>',
                        ]
                        for c in checks
                    ],
                    {1, 2, 3},
                )
                + '<div class="sub">warn: at 80% of its limit or above, up to the limit itself</div></div>'
            )

    trend, nights = q["trend"], [r["ds"] for r in q["trend"]]
    parts.append(f'<h2>Trends over the last {_nights(len(nights))}</h2><div class="grid">')
    rates = [r["mask_rate"] for r in trend]
    fig = go.Figure(go.Scatter(x=nights, y=rates, mode="lines+markers", name="mask rate"))
    fig.update_layout(title="mask rate")
    _rate_axis(fig, rates)
    parts.append(_fig(fig, "chart-mask-rate", x="night", y="masked / rollouts"))
    fig = go.Figure(
        [
            go.Bar(x=nights, y=[r["rollouts"] for r in trend], name="rollouts"),
            go.Bar(x=nights, y=[r["rows"] for r in trend], name="rows"),
        ]
    )
    fig.update_layout(title="rollouts and rows", barmode="group")
    parts.append(_fig(fig, "chart-volume", x="night", y="count"))
    parts.append("</div>")
    # reasons x nights as a heatmap: one colour scale, whatever the number of reasons
    totals: dict[str, int] = {}
    for x in q["reasons_by_night"]:
        totals[x["reason"]] = totals.get(x["reason"], 0) + x["n"]
    reasons = sorted(totals, key=lambda r: (-totals[r], r))[::-1]  # the most frequent on top
    counts = {(x["reason"], x["ds"]): x["n"] for x in q["reasons_by_night"]}
    if reasons:
        fig = go.Figure(
            go.Heatmap(
                x=nights,
                y=reasons,
                z=[[counts.get((r, d), 0) for d in nights] for r in reasons],
                colorscale="Reds",
                zmin=0,
                colorbar=dict(title="rollouts"),
                texttemplate="%{z}" if len(nights) <= 10 else None,
                hovertemplate="%{y} on %{x}: %{z} rollouts<extra></extra>",
                xgap=2,
                ygap=1,
            )
        )
        fig.update_layout(title="masked rollouts by reason and night")
        parts.append(_fig(fig, "chart-reasons-by-night", max(300, 18 * len(reasons) + 120), x="night", y="reason"))

    captures = q["breakdowns"].get("capture", [])
    if captures:  # which capture each rollout was read from (CONTRACT.md 9)
        parts.append(f"<h2>Rollouts by capture on {_e(ds)}</h2>")
        parts.append(
            _table(
                ["capture", "rollouts", "masked", "mask rate"],
                [[_e(g["value"]), g["rollouts"], g["masked"], f"{g['mask_rate']:.1%}"] for g in captures],
                {1, 2, 3},
            )
        )
    diagnosed = q.get("diagnosed") or []
    if diagnosed:  # the producer's diagnosis beside a valid reward trains (CONTRACT.md 3.0 item 1)
        parts.append(f"<h2>Diagnosed by the producer on {_e(ds)}</h2>")
        parts.append(
            "<p>Rollouts whose result line names a <code>failure_kind</code> / <code>failure_reason</code>. "
            "Beside a valid reward it is a diagnosis of a sample the producer still measured: it trains.</p>"
        )
        parts.append(
            _table(
                ["failure_kind", "rollouts", "trained", "masked"],
                [[_e(d["failure_kind"]), d["rollouts"], d["ok"], d["masked"]] for d in diagnosed],
                {1, 2, 3},
            )
        )
    parts.append(f"<h2>Why rollouts were masked on {_e(ds)}</h2>")
    if q["reasons"]:
        fig = go.Figure(
            go.Bar(
                y=[r["reason"] for r in q["reasons"]][::-1],
                x=[r["n"] for r in q["reasons"]][::-1],
                orientation="h",
                marker_color=[STEP_COLORS[r["step"]] for r in q["reasons"]][::-1],
                customdata=[r["step"] for r in q["reasons"]][::-1],
                hovertemplate="%{y}: %{x} (%{customdata})<extra></extra>",
            )
        )
        fig.update_layout(title="masked rollouts by reason (colour: the step that raises it)")
        parts.append(_fig(fig, "chart-reasons", max(260, 22 * len(q["reasons"]) + 80), x="masked rollouts", y="reason"))
        parts.append(
            '<div class="sub">'
            + " ".join(f'<span style="color:{c}">&#9632;</span> {_e(step)}' for step, c in STEP_COLORS.items())
            + "</div>"
        )
        rows = []
        for r in q["reasons"]:
            examples = "".join(
                f"<details><summary>{_e(x['rollout_id'])}"
                f"{' at ' + _e(x['failed_call_id']) if x['failed_call_id'] else ''}</summary>"
                f"<pre>{_e(chr(10).join(x['trace']))}</pre></details>"
                for x in r["examples"]
            )
            rows.append(
                [
                    f"<code>{_e(r['reason'])}</code>",
                    f'<a href="#masked" data-reason="{_e(r["reason"])}" class="list-reason">{r["n"]:,}</a>',
                    f"{r['share']:.1%}",
                    f"{r.get('tokens_lost', 0):,}",
                    _e(r["step"]),
                    _e(r["meaning"]),
                    examples,
                ]
            )
        parts.append(
            _table(
                [
                    "reason",
                    "rollouts (click: the list)",
                    "share",
                    "tokens lost",
                    "step",
                    "meaning",
                    "examples (click for the trace)",
                ],
                rows,
                {1, 2, 3},
            )
        )
        by_capture = q.get("reason_by_capture") or {}
        captures = sorted({c for per in by_capture.values() for c in per})
        if captures:
            parts.append("<h3>Masked rollouts by reason and capture</h3>")
            parts.append(
                '<div id="reason-by-capture">'
                + _table(
                    ["reason", *captures],
                    [
                        [f"<code>{_e(r['reason'])}</code>"]
                        + [f"{by_capture.get(r['reason'], {}).get(c, 0):,}" for c in captures]
                        for r in q["reasons"]
                    ],
                    set(range(1, len(captures) + 1)),
                )
                + "</div>"
            )
    else:
        parts.append("<p>No rollout was masked.</p>")

    parts.append(
        '<h2>Mask rate by …</h2><div class="sub">each bar says masked/rollouts; '
        f'<span style="color:{SMALL_COLOR}">&#9632;</span> grey bars rest on fewer than {SMALL_N} rollouts: '
        "read them as anecdotes, not rates</div>"
    )
    parts.append('<div class="grid">')
    for k, (name, groups) in enumerate(q["breakdowns"].items()):
        groups = groups[:20]
        fig = go.Figure(
            go.Bar(
                x=[_plain(g["value"]) for g in groups],
                y=[g["mask_rate"] for g in groups],
                text=[f"{g['masked']}/{g['rollouts']}" for g in groups],
                textposition="outside",
                cliponaxis=False,
                marker_color=[SMALL_COLOR if g["rollouts"] < SMALL_N else BAR_COLOR for g in groups],
                customdata=[[g["rollouts"], g["masked"]] for g in groups],
                hovertemplate="%{x}: %{y:.1%} (%{customdata[1]} of %{customdata[0]})<extra></extra>",
            )
        )
        fig.update_layout(title=_plain(f"mask rate by {name}"), xaxis_type="category")
        _rate_axis(fig, [g["mask_rate"] for g in groups])
        parts.append(_fig(fig, f"chart-by-{k}", 300, x=_plain(name), y="masked / rollouts"))
    parts.append("</div>")

    c = q["compaction"]
    parts.append("<h2>Compaction</h2>")
    parts.append(
        _table(
            [
                "rollouts with several roots",
                "off-chain calls",
                "off-chain faults",
                "kept that ordinary capture masks: rollouts",
                "rows",
                "tokens",
            ],
            [
                [
                    f"{c['compacted']:,}",
                    f"{c['offchain_calls']:,}",
                    f"{c['offchain_faults']:,}",
                    f"{c['saved_rollouts']:,}",
                    f"{c['saved_rows']:,}",
                    f"{c['saved_tokens']:,}",
                ]
            ],
            {0, 1, 2, 3, 4, 5},
        )
    )
    fig = go.Figure(go.Bar(x=[str(k) for k in c["segments"]], y=list(c["segments"].values())))
    fig.update_layout(title="rows (segments) per ok rollout", xaxis_type="category")
    parts.append(_fig(fig, "chart-segments", 280, x="rows of the rollout", y="ok rollouts"))
    parts.append(
        '<p class="sub">Ordinary capture (<code>--mode terminal</code>) masks every rollout whose '
        "ledger holds more than one root; the numbers above are the ok rollouts with several roots.</p>"
    )

    lengths = q.get("row_lengths")
    if lengths:  # trainers size their batches by tokens: how long the night's rows run
        parts.append("<h2>Row lengths</h2>")
        parts.append(
            '<div id="row-lengths">'
            + _table(
                ["rows", "median tokens", "90th percentile", "99th percentile", "longest"],
                [[f"{lengths[k]:,}" for k in ("rows", "median", "p90", "p99", "max")]],
                {0, 1, 2, 3, 4},
            )
            + "</div>"
        )
        fig = go.Figure(go.Bar(x=list(lengths["histogram"]), y=list(lengths["histogram"].values())))
        fig.update_layout(title="rows by length", xaxis_type="category")
        parts.append(_fig(fig, "chart-row-lengths", 280, x="tokens in the row", y="rows"))

    if masked is not None:
        parts.append(_masked_section(masked))

    parts.append("<h2>Rejected input</h2>")
    if q["rejects"]:
        parts.append(
            _table(
                ["source", "kind", "lines", "first lines"],
                [
                    [_e(r["source"]), _e(r["kind"]), r["n"], "<pre>" + _e("\n".join(r["first"])) + "</pre>"]
                    for r in q["rejects"]
                ],
                {2},
            )
        )
    else:
        parts.append("<p>Every input line was read.</p>")
    if q["verdicts"]:
        parts.append("<h2>Quality gate, past nights</h2>")
        parts.append(
            _table(
                ["night", "verdict", "breaches"],
                [
                    [
                        _e(v["ds"]),
                        f'<span class="{"ok" if v["verdict"] == "ok" else "breach"}">{_e(v["verdict"])}</span>',
                        _e("; ".join(b["message"] for b in v["breaches"])),
                    ]
                    for v in q["verdicts"]
                ],
            )
        )
    return _page(f"Capture quality {ds}", "".join(parts), "../plotly.min.js")


def index_page(q: dict) -> str:
    trend = q["trend"]
    verdicts = {v["ds"]: v["verdict"] for v in q.get("verdicts", [])}
    nights = [r["ds"] for r in trend]
    rates = [r["mask_rate"] for r in trend]
    fig = go.Figure(go.Scatter(x=nights, y=rates, mode="lines+markers"))
    fig.update_layout(title="mask rate by night")
    _rate_axis(fig, rates)
    rows = [
        [
            f'<a href="ds={_e(r["ds"])}/index.html">{_e(r["ds"])}</a>',
            f"{r['rollouts']:,}",
            f"{r['ok']:,}",
            f"{r['masked']:,}",
            f"{r['mask_rate']:.1%}",
            f"{r['rows']:,}",
            f"{r['rejects']:,}",
            _e(verdicts.get(r["ds"], "")),
        ]
        for r in reversed(trend)
    ]
    body = (
        '<h1>Capture quality, every night</h1><div class="sub">newest first; click a night for its report</div>'
        + _fig(fig, "chart-index", x="night", y="masked / rollouts")
        + _table(
            ["night", "rollouts", "ok", "masked", "mask rate", "rows", "rejects", "gate"], rows, {1, 2, 3, 4, 5, 6}
        )
    )
    return _page("Capture quality", body, "plotly.min.js")


def _write(loc: str, text: str) -> None:
    storage.write_bytes(loc, text.encode("utf-8"))


LENGTH_EDGES = (1_024, 4_096, 16_384, 32_768, 65_536, 131_072)


def row_lengths(partition: str) -> dict | None:
    """The published rows' lengths in tokens (their n_tokens column alone is read): count,
    median, 90th and 99th percentiles, the longest, and a histogram over LENGTH_EDGES."""
    import numpy as np

    files = storage.list_files(partition, ".parquet")
    if not files:
        return None
    n = np.concatenate(
        [storage.read_parquet(storage.join(partition, f), ["n_tokens"]).column(0).to_numpy() for f in files]
    )
    if not len(n):
        return None
    counts = np.bincount(np.searchsorted(LENGTH_EDGES, n, side="right"), minlength=len(LENGTH_EDGES) + 1)
    labels = (
        [f"< {LENGTH_EDGES[0]:,}"]
        + [f"{a:,} - {b:,}" for a, b in zip(LENGTH_EDGES, LENGTH_EDGES[1:])]
        + [f">= {LENGTH_EDGES[-1]:,}"]
    )
    return {
        "rows": int(len(n)),
        "median": int(np.median(n)),
        "p90": int(np.percentile(n, 90)),
        "p99": int(np.percentile(n, 99)),
        "max": int(n.max()),
        "histogram": dict(zip(labels, map(int, counts))),
    }


def _write_masked(folder: str, masked: list[dict]) -> None:
    """The night's masked rollouts as masked.csv and masked.parquet beside its page."""
    import csv
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(
        masked,
        schema=pa.schema(
            [
                (k, pa.int64() if k == "declared_tokens" else pa.int32() if k == "slot" else pa.string())
                for k in MASKED_COLUMNS
            ]
        ),
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    storage.write_bytes(storage.join(folder, "masked.parquet"), sink.getvalue().to_pybytes())
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(MASKED_COLUMNS))
    writer.writeheader()
    writer.writerows(masked)
    _write(storage.join(folder, "masked.csv"), text.getvalue())


def _plotly_js(folder: str) -> None:
    src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    dst = storage.join(folder, "plotly.min.js")
    if not storage.exists(dst) or storage.size(dst) != src.stat().st_size:
        storage.write_bytes(dst, src.read_bytes())


def write_reports(
    con, output, ds: str | None = None, nights: int = REPORT_NIGHTS, by: list[str] | None = None
) -> str | None:
    """Write the night's page (default: the latest night) and the index to the output's
    store; return the page's location."""
    folder = storage.join(storage.location(output), "reports")
    if ds is None:
        row = con.execute("SELECT max(ds) FROM runs").fetchone()
        if row[0] is None:
            return None
        ds = row[0].isoformat()
    q = night_quality(con, ds, nights, by)
    if q["night"] is None:
        return None
    q["row_lengths"] = row_lengths(storage.join(storage.location(output), "rows", f"ds={ds}"))
    _plotly_js(folder)
    page = storage.join(folder, f"ds={ds}", "index.html")
    masked = masked_rollouts(con, ds)
    _write_masked(storage.join(folder, f"ds={ds}"), masked)
    _write(page, night_page(q, masked))
    _write(storage.join(folder, "data", f"ds={ds}.json"), json.dumps(q, default=str))
    _write(storage.join(folder, "index.html"), index_page(nights_overview(con)))
    return page
