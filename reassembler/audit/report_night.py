"""One night's capture-quality page (report_html.py writes it): quality.py's numbers as
tiles, Plotly charts and tables, and the masked rollouts with their filters."""

from __future__ import annotations

import plotly.graph_objects as go

from .report_parts import (
    BAR_COLOR,
    SMALL_COLOR,
    SMALL_N,
    STATUS_CLASS,
    STEP_COLORS,
    TILES,
    chart,
    delta_text,
    esc,
    html_page,
    html_table,
    inputs_line,
    masked_section,
    nights_text,
    num_text,
    plain,
    rate_axis,
)


def night_page(q: dict, masked: list[dict] | None = None) -> str:
    ds, n, base = q["ds"], q["night"], q["baseline"]
    parts = [
        f"<h1>Capture quality, night {esc(ds)}</h1>",
        f'<div class="sub">run {esc(n["run_id"])} · <a href="../index.html">all nights</a> · '
        + (
            f"change against the mean of the {q['trailing_nights']} nights before"
            if q["trailing_nights"]
            else "no earlier night to compare with"
        )
        + "</div>",
        inputs_line(n.get("inputs")),
        '<div class="tiles">',
    ]
    for key, label, fmt, bad in TILES:
        parts.append(
            f'<div class="tile" id="tile-{key}"><div class="v">{fmt.format(n[key])}</div>'
            f'<div class="l">{esc(label)}</div>{delta_text(n[key], base and base[key], fmt, bad)}</div>'
        )
    parts.append("</div>")
    latest = q["verdicts"][0] if q["verdicts"] and q["verdicts"][0]["ds"] == ds else None
    if latest:
        cls = "ok" if latest["verdict"] == "ok" else "breach"
        msgs = "; ".join(b["message"] for b in latest["breaches"])
        parts.append(
            f'<p>Quality gate: <span class="{cls}" id="verdict">{esc(latest["verdict"])}</span> {esc(msgs)}</p>'
        )
        checks = [c for c in latest.get("checks", []) if "status" in c]
        if checks:
            parts.append(
                '<div id="gate-checks">'
                + html_table(
                    ["check", "value", "limit", "margin", "status"],
                    [
                        [
                            f"<code>{esc(c['check'])}</code>",
                            num_text(c["value"]),
                            num_text(c["threshold"]),
                            num_text(c["margin"]),
                            f'<span class="{STATUS_CLASS[c["status"]]}">{esc(c["status"])}</span>',
                        ]
                        for c in checks
                    ],
                    {1, 2, 3},
                )
                + '<div class="sub">warn: at 80% of its limit or above, up to the limit itself; a rate past its '
                "limit on a night under the gate's minimum of rollouts; a torn final line (no limit). Each "
                "check's message: the task log and <code>reassembler gate --json</code></div></div>"
            )

    trend, nights = q["trend"], [r["ds"] for r in q["trend"]]
    parts.append(f'<h2>Trends over the last {nights_text(len(nights))}</h2><div class="grid">')
    rates = [r["mask_rate"] for r in trend]
    fig = go.Figure(go.Scatter(x=nights, y=rates, mode="lines+markers", name="mask rate"))
    fig.update_layout(title="mask rate")
    rate_axis(fig, rates)
    parts.append(chart(fig, "chart-mask-rate", x="night", y="masked / rollouts"))
    fig = go.Figure(
        [
            go.Bar(x=nights, y=[r["rollouts"] for r in trend], name="rollouts"),
            go.Bar(x=nights, y=[r["rows"] for r in trend], name="rows"),
        ]
    )
    fig.update_layout(title="rollouts and rows", barmode="group")
    parts.append(chart(fig, "chart-volume", x="night", y="count"))
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
        parts.append(chart(fig, "chart-reasons-by-night", max(300, 18 * len(reasons) + 120), x="night", y="reason"))

    captures = q["breakdowns"].get("capture", [])
    if captures:  # which capture each rollout was read from (CONTRACT.md 9)
        parts.append(f"<h2>Rollouts by capture on {esc(ds)}</h2>")
        parts.append(
            html_table(
                ["capture", "rollouts", "masked", "mask rate"],
                [[esc(g["value"]), g["rollouts"], g["masked"], f"{g['mask_rate']:.1%}"] for g in captures],
                {1, 2, 3},
            )
        )
    diagnosed = q.get("diagnosed") or []
    if diagnosed:  # the producer's diagnosis beside a valid reward trains (CONTRACT.md 3.0 item 1)
        parts.append(f"<h2>Diagnosed by the producer on {esc(ds)}</h2>")
        parts.append(
            "<p>Rollouts whose result line names a <code>failure_kind</code> / <code>failure_reason</code>. "
            "Beside a valid reward it is a diagnosis of a sample the producer still measured: it trains.</p>"
        )
        parts.append(
            html_table(
                ["failure_kind", "rollouts", "trained", "masked"],
                [[esc(d["failure_kind"]), d["rollouts"], d["ok"], d["masked"]] for d in diagnosed],
                {1, 2, 3},
            )
        )
    art = q.get("art") or {}
    if art.get("rollouts"):  # OpenPipe ART (CONTRACT.md 13.6)
        parts.append(f"<h2>OpenPipe ART on {esc(ds)}</h2>")
        parts.append(
            f"<p>{art['rollouts']} trajectories; {art['zero_variance_groups']} groups whose rewards are all equal "
            f"({art['zero_variance_rollouts']} rollouts: advantage 0 on every row; ART drops them from its batch, "
            f"they are kept here); {art['duplicates']} stored as a duplicate of an earlier trajectory of their "
            "group (ART trains both copies; their audit metadata names the first).</p>"
        )
    parts.append(f"<h2>Why rollouts were masked on {esc(ds)}</h2>")
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
        parts.append(
            chart(fig, "chart-reasons", max(260, 22 * len(q["reasons"]) + 80), x="masked rollouts", y="reason")
        )
        parts.append(
            '<div class="sub">'
            + " ".join(f'<span style="color:{c}">&#9632;</span> {esc(step)}' for step, c in STEP_COLORS.items())
            + "</div>"
        )
        rows = []
        for r in q["reasons"]:
            examples = "".join(
                f"<details><summary>{esc(x['rollout_id'])}"
                f"{' at ' + esc(x['failed_call_id']) if x['failed_call_id'] else ''}</summary>"
                f"<pre>{esc(chr(10).join(x['trace']))}</pre></details>"
                for x in r["examples"]
            )
            rows.append(
                [
                    f"<code>{esc(r['reason'])}</code>",
                    f'<a href="#masked" data-reason="{esc(r["reason"])}" class="list-reason">{r["n"]:,}</a>',
                    f"{r['share']:.1%}",
                    f"{r.get('tokens_lost', 0):,}",
                    esc(r["step"]),
                    esc(r["meaning"]),
                    examples,
                ]
            )
        parts.append(
            html_table(
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
                + html_table(
                    ["reason", *captures],
                    [
                        [f"<code>{esc(r['reason'])}</code>"]
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
                x=[plain(g["value"]) for g in groups],
                y=[g["mask_rate"] for g in groups],
                text=[f"{g['masked']}/{g['rollouts']}" for g in groups],
                textposition="outside",
                cliponaxis=False,
                marker_color=[SMALL_COLOR if g["rollouts"] < SMALL_N else BAR_COLOR for g in groups],
                customdata=[[g["rollouts"], g["masked"]] for g in groups],
                hovertemplate="%{x}: %{y:.1%} (%{customdata[1]} of %{customdata[0]})<extra></extra>",
            )
        )
        fig.update_layout(title=plain(f"mask rate by {name}"), xaxis_type="category")
        rate_axis(fig, [g["mask_rate"] for g in groups])
        parts.append(chart(fig, f"chart-by-{k}", 300, x=plain(name), y="masked / rollouts"))
    parts.append("</div>")

    c = q["compaction"]
    parts.append("<h2>Compaction</h2>")
    parts.append(
        html_table(
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
    parts.append(chart(fig, "chart-segments", 280, x="rows of the rollout", y="ok rollouts"))
    parts.append(
        '<p class="sub">Ordinary capture (<code>--mode terminal</code>) masks every rollout whose '
        "ledger holds more than one root; the numbers above are the ok rollouts with several roots.</p>"
    )

    lengths = q.get("row_lengths")
    if lengths:  # trainers size their batches by tokens: how long the night's rows run
        parts.append("<h2>Row lengths</h2>")
        parts.append(
            '<div id="row-lengths">'
            + html_table(
                ["rows", "median tokens", "90th percentile", "99th percentile", "longest"],
                [[f"{lengths[k]:,}" for k in ("rows", "median", "p90", "p99", "max")]],
                {0, 1, 2, 3, 4},
            )
            + "</div>"
        )
        fig = go.Figure(go.Bar(x=list(lengths["histogram"]), y=list(lengths["histogram"].values())))
        fig.update_layout(title="rows by length", xaxis_type="category")
        parts.append(chart(fig, "chart-row-lengths", 280, x="tokens in the row", y="rows"))

    if masked is not None:
        parts.append(masked_section(q["ds"], masked))

    parts.append("<h2>Rejected input</h2>")
    if q["rejects"]:
        parts.append(
            html_table(
                ["source", "kind", "lines", "first lines"],
                [
                    [esc(r["source"]), esc(r["kind"]), r["n"], "<pre>" + esc("\n".join(r["first"])) + "</pre>"]
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
            html_table(
                ["night", "verdict", "breaches"],
                [
                    [
                        esc(v["ds"]),
                        f'<span class="{"ok" if v["verdict"] == "ok" else "breach"}">{esc(v["verdict"])}</span>',
                        esc("; ".join(b["message"] for b in v["breaches"])),
                    ]
                    for v in q["verdicts"]
                ],
            )
        )
    return html_page(f"Capture quality {ds}", "".join(parts), "../plotly.min.js")
