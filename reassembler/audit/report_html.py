"""The nightly capture-quality report as HTML pages that open from disk, with no network.

`write_reports(con, output, ds)` writes `<output>/reports/ds=<ds>/index.html` (one night,
quality.py's numbers) and `<output>/reports/index.html` (every night). Charts are Plotly
figures; the Plotly library is written once beside the pages (`reports/plotly.min.js`) and
loaded by a relative path, so the pages stay small (summaries, never one point per call)
and need no CDN. Every number is also in a table, so the page reads without scripts too.
Each page is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import json
from pathlib import Path

import plotly
import plotly.graph_objects as go

from .. import storage
from ..settings import REPORT_NIGHTS
from .quality import MASKED_COLUMNS, masked_file, masked_rollouts, night_quality, nights_overview
from .report_night import night_page
from .report_parts import chart, esc, html_page, html_table, rate_axis


def index_page(q: dict) -> str:
    trend = q["trend"]
    verdicts = {v["ds"]: v["verdict"] for v in q.get("verdicts", [])}
    nights = [r["ds"] for r in trend]
    rates = [r["mask_rate"] for r in trend]
    fig = go.Figure(go.Scatter(x=nights, y=rates, mode="lines+markers"))
    fig.update_layout(title="mask rate by night")
    rate_axis(fig, rates)
    rows = [
        [
            f'<a href="ds={esc(r["ds"])}/index.html">{esc(r["ds"])}</a>',
            f"{r['rollouts']:,}",
            f"{r['ok']:,}",
            f"{r['masked']:,}",
            f"{r['mask_rate']:.1%}",
            f"{r['rows']:,}",
            f"{r['rejects']:,}",
            esc(verdicts.get(r["ds"], "")),
        ]
        for r in reversed(trend)
    ]
    body = (
        '<h1>Capture quality, every night</h1><div class="sub">newest first; click a night for its report</div>'
        + chart(fig, "chart-index", x="night", y="masked / rollouts")
        + html_table(
            ["night", "rollouts", "ok", "masked", "mask rate", "rows", "rejects", "gate"], rows, {1, 2, 3, 4, 5, 6}
        )
    )
    return html_page("Capture quality", body, "plotly.min.js")


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


def _write_masked(folder: str, ds: str, masked: list[dict]) -> None:
    """The night's masked rollouts as masked-<ds>.csv and masked-<ds>.parquet beside its page."""
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
    storage.write_bytes(storage.join(folder, masked_file(ds, "parquet")), sink.getvalue().to_pybytes())
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(MASKED_COLUMNS))
    writer.writeheader()
    writer.writerows(masked)
    _write(storage.join(folder, masked_file(ds, "csv")), text.getvalue())


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
    _write_masked(storage.join(folder, f"ds={ds}"), ds, masked)
    _write(page, night_page(q, masked))
    _write(storage.join(folder, "data", f"ds={ds}.json"), json.dumps(q, default=str))
    _write(storage.join(folder, "index.html"), index_page(nights_overview(con)))
    return page
