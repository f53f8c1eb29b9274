"""The capture-quality report as a person sees it: several synthetic nights with faults,
rendered by headless Chromium (Debian's package, driven by Playwright): every chart drew,
no console error, no network request, and the numbers on the page are the warehouse's."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from reassembler.audit.quality import Thresholds
from reassembler.build import build_night, gate_step, report_step
from reassembler.producer.synth import SynthConfig, synth_night
from reassembler.warehouse import Warehouse

NIGHTS = ["2026-11-25", "2026-11-26", "2026-11-27", "2026-11-28"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    for k, ds in enumerate(NIGHTS):
        cfg = SynthConfig(
            rollouts=48,
            seed=20 + k,
            fault_rate=0.1 + 0.1 * k,
            max_calls=10,
            prompt_tokens=(20, 60),
            observation_tokens=(5, 30),
            generated_tokens=(3, 20),
        )
        synth_night(root / "input", ds, cfg)
        build_night(root / "input", root / "out", ds)
        gate_step(Warehouse(root / "out"), ds, None, Thresholds(min_rollouts=0))  # 48-rollout nights
    with open(root / "input" / "rollouts" / f"ds={NIGHTS[-1]}" / "rollouts-00000.jsonl", "a") as fh:
        fh.write("{not json\n")  # one rejected line on the last night
    build_night(root / "input", root / "out", NIGHTS[-1])
    page = report_step(Warehouse(root / "out"), NIGHTS[-1])
    return root / "out", Path(page)


def test_the_report_is_written_small_and_self_contained(reports):
    out, page = reports
    assert page == out / "reports" / f"ds={NIGHTS[-1]}" / "index.html"
    text = page.read_text()
    assert len(text) < 400_000  # summaries, not one point per call
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text.replace(
        "https://plotly.com", ""
    )
    assert '<script src="../plotly.min.js">' in text and (out / "reports" / "plotly.min.js").exists()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_the_report_in_headless_chromium(reports, tmp_path):
    from playwright.sync_api import sync_playwright

    out, page_path = reports
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        rollouts, masked, rows = con.execute(
            "SELECT count(*), count(*) FILTER (status = 'masked'), sum(n_segments) FROM audit WHERE ds = ?",
            [NIGHTS[-1]],
        ).fetchone()
        rejects = con.execute("SELECT count(*) FROM rejects WHERE ds = ?", [NIGHTS[-1]]).fetchone()[0]
        top_reason, top_n = con.execute(
            "SELECT reason, count(*) FROM audit WHERE ds = ? AND status = 'masked' GROUP BY 1 ORDER BY 2 DESC, 1 "
            "LIMIT 1",
            [NIGHTS[-1]],
        ).fetchone()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors, requests = [], []
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.on("request", lambda r: requests.append(r.url))
        tab.goto(page_path.as_uri())
        tab.wait_for_function("document.querySelectorAll('.js-plotly-plot').length > 0")
        charts = tab.locator("div.js-plotly-plot")
        assert charts.count() >= 10
        for i in range(charts.count()):  # every chart drew its plot area and some marks
            assert charts.nth(i).locator("svg.main-svg").count() >= 1
            marks = "g.trace, g.barlayer path, g.scatterlayer path, g.heatmaplayer image"
            assert charts.nth(i).locator(marks).count() >= 1, i
        assert errors == [] and all(u.startswith("file://") for u in requests), (errors, requests)

        shot = tmp_path / "report.png"
        tab.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000
        docs = Path(__file__).resolve().parents[1] / "docs"
        if os.environ.get("REASSEMBLER_UPDATE_SCREENSHOT"):
            tab.screenshot(path=str(docs / "report.png"))

        def tile(key: str) -> str:
            return tab.locator(f"#tile-{key} .v").inner_text()

        assert (tile("rollouts"), tile("masked"), tile("rows"), tile("rejects")) == (
            f"{rollouts:,}",
            f"{masked:,}",
            f"{rows:,}",
            f"{rejects:,}",
        )
        assert tile("mask_rate") == f"{masked / rollouts:.1%}"
        assert tab.locator("table", has_text=top_reason).first.is_visible()
        details = tab.locator("details").first  # an example's trace, one click away
        details.locator("summary").click()
        assert "select:" in details.locator("pre").inner_text() or "ledger:" in details.locator("pre").inner_text()
        if os.environ.get("REASSEMBLER_UPDATE_SCREENSHOT"):
            tab.screenshot(path=str(docs / "report-reasons.png"))
        index = out / "reports" / "index.html"
        tab.goto(index.as_uri())
        tab.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")
        assert tab.locator("table tr").count() == len(NIGHTS) + 1
        browser.close()
    assert top_n >= 1


def test_the_gate_lists_every_breached_threshold_and_keeps_the_verdict(reports):
    from reassembler.audit.quality import gate, night_quality
    from reassembler.warehouse import connect

    out, _ = reports
    with connect(out, read_only=True) as con:
        q = night_quality(con, NIGHTS[-1], traces=False)
    night = q["night"]
    assert night["rejects"] == 1 and q["trailing_nights"] == 3
    everything = gate(q, Thresholds(0.0, 0.0, 0.0, 0, min_rollouts=0))
    checks = {b["check"] for b in everything}
    assert {"mask_rate", "mask_rate_rise", "rejects"} <= checks
    assert {c for c in checks if c.startswith("reason:")} == {f"reason:{r['reason']}" for r in q["reasons"]}
    assert gate(q, Thresholds(None, None, None, None, min_rollouts=0)) == []
    assert (
        gate(
            q,
            Thresholds(night["mask_rate"], None, None, None, min_rollouts=0),
        )
        == []
    )  # at the threshold is not over it
    rise = night["mask_rate"] - q["baseline"]["mask_rate"]
    [b] = gate(q, Thresholds(None, None, rise - 0.001, None, min_rollouts=0))
    assert b["check"] == "mask_rate_rise" and "over the trailing 3-night mean" in b["message"]
    breaches = gate_step(
        Warehouse(out),
        NIGHTS[-1],
        "run-x",
        Thresholds(0.0, None, None, None, min_rollouts=0),
    )
    assert [b["check"] for b in breaches] == ["mask_rate"]
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT verdict, run_id FROM quality WHERE ds = ?", [NIGHTS[-1]]).fetchall() == [
            ("breached", "run-x")
        ]
    assert "breached" in (out / "reports" / f"ds={NIGHTS[-1]}" / "index.html").read_text()


LINK = '<a href="https://evil.example/x">click</a>'
IMG = "<img src=x onerror=alert(1)>"


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_capture_strings_are_drawn_as_text_never_as_markup(tmp_path):
    """Markup in every field that comes from capture (ids, metadata keys and values, a
    reason's detail, the model server's folder, a rejected line) is shown as the characters
    it is: no link, no image, no script, in the charts (Plotly draws a subset of HTML in
    labels, titles and hovers) as in the tables."""
    from playwright.sync_api import sync_playwright

    from nights import Night, answer, call, reasoning, worked_example

    n = Night(tmp_path / "n")
    meta = {f"key {LINK}": f"value {LINK}{IMG}", "model_server": f"server {IMG}"}
    worked_example(n, f"r{LINK}_g0", metadata=meta)
    worked_example(n, f"r{LINK}_g1", compaction=False, metadata=meta, reward=0.0)
    c1 = call(f"c1{IMG}", None, [1, 2], [3], [reasoning("x"), answer("y")])
    c2 = call(f"c2{LINK}", f"parent {LINK}", [4], [5], [reasoning("z"), answer("w")])
    n.add(f"m{LINK}_g0", [c1, c2], [reasoning("x"), answer("y"), reasoning("z"), answer("w")], metadata=meta)
    inp = n.write()
    with open(inp / "rollouts" / "ds=2026-11-28" / "rollouts.jsonl", "a") as fh:
        fh.write(f"{{not json {LINK}{IMG}\n")
    server = inp / "ledger" / "ds=2026-11-28" / f"srv {IMG.replace('/', '')}"
    server.mkdir()
    (inp / "ledger" / "ds=2026-11-28" / "ledger.jsonl").rename(server / "ledger.jsonl")
    out = tmp_path / "out"
    build_night(inp, out, "2026-11-28")
    gate_step(Warehouse(out), "2026-11-28", None, Thresholds())
    page_path = out / "reports" / "ds=2026-11-28" / "index.html"
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        [(reason, failed, detail)] = con.execute(
            "SELECT reason, failed_call_id, detail FROM audit WHERE status = 'masked'"
        ).fetchall()
    assert LINK in failed + detail  # the data really carries the markup

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1280, "height": 1000})
        dialogs, errors = [], []
        tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        tab.on("pageerror", lambda e: errors.append(str(e)))
        for path in (page_path, out / "reports" / "index.html"):
            tab.goto(path.as_uri())
            tab.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")
            for summary in tab.locator("details summary").all():
                summary.click()
            hovers = []
            for bar in tab.locator("div[id^='chart-by-'] .bars path").all():  # the hover labels too
                bar.scroll_into_view_if_needed()
                box = bar.bounding_box()
                tab.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                tab.wait_for_timeout(100)
                hovers.append(
                    tab.evaluate("() => [...document.querySelectorAll('.hoverlayer')].map(h => h.innerHTML).join('')")
                )
            found = tab.evaluate(
                """() => ({
                    links: [...document.querySelectorAll('a')]
                        .map(a => a.getAttribute('href') || a.getAttribute('xlink:href')),
                    svgLinks: [...document.querySelectorAll('.js-plotly-plot .main-svg a')].length,
                    images: [...document.querySelectorAll('img, image')]
                        .filter(i => !i.closest('.heatmaplayer')).length,  // a heatmap draws itself as one
                    bold: document.querySelectorAll('.js-plotly-plot b, .js-plotly-plot tspan[style*="bold"]').length,
                    svgText: [...document.querySelectorAll('.js-plotly-plot .main-svg text')]
                        .map(t => t.textContent).join('|'),
                    text: document.body.innerText,
                })"""
            )
            assert found["svgLinks"] == 0 and found["images"] == 0 and found["bold"] == 0, found
            assert all(h and "evil" not in h and not h.startswith("javascript") for h in found["links"]), found["links"]
            assert not any("<a" in h or "<b>" in h or "<img" in h for h in hovers), hovers
            if path == page_path:
                assert any("value &lt;a href" in h for h in hovers), hovers  # drawn as text, escaped in the SVG
                assert "value " + LINK in found["svgText"] or "value " + LINK[:20] in found["svgText"]
                assert "key " + LINK in found["svgText"]  # a breakdown's title: the metadata key
                assert f"server {IMG}" in found["svgText"] or f"srv {IMG.replace('/', '')}" in found["svgText"]
                for shown in (f"m{LINK}_g0", f"{{not json {LINK}{IMG}", f"parent {LINK}"):
                    assert shown in found["text"], shown
        assert dialogs == [] and errors == []
        browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_an_auditor_sees_counts_margins_and_every_masked_rollout(reports, tmp_path):
    """The rates carry their counts on the bars (small denominators grey), the gate says each
    check's value against its limit with its margin, and every masked rollout can be listed
    per reason (one click from the reasons table), filtered, and downloaded."""
    import pandas as pd
    from playwright.sync_api import sync_playwright

    out, page_path = reports
    folder = page_path.parent
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        audit = con.execute(
            "SELECT rollout_id, reason FROM audit WHERE ds = ? AND status = 'masked' ORDER BY ALL", [NIGHTS[-1]]
        ).fetchall()
    # named for the night, with its ds; captures as the audit table writes them
    listed = pd.read_parquet(folder / f"masked-{NIGHTS[-1]}.parquet")
    assert sorted(zip(listed["rollout_id"], listed["reason"])) == audit  # every masked rollout, each once
    assert set(listed["ds"]) == {NIGHTS[-1]}
    with duckdb.connect(str(out / "warehouse.duckdb"), read_only=True) as con:
        captures = dict(con.execute("SELECT rollout_id, capture FROM audit WHERE ds = ?", [NIGHTS[-1]]).fetchall())
    downloaded = pq.read_table(folder / f"masked-{NIGHTS[-1]}.parquet").to_pylist()
    assert {r["rollout_id"]: r["capture"] for r in downloaded} == {
        r["rollout_id"]: captures[r["rollout_id"]] for r in downloaded
    }
    csv = pd.read_csv(folder / f"masked-{NIGHTS[-1]}.csv")
    assert csv.shape[0] == len(audit) and list(csv.columns)[:2] == ["ds", "rollout_id"]
    assert not (folder / "masked.csv").exists()
    reason, n = max(((r, sum(x == r for _, x in audit)) for r in {x for _, x in audit}), key=lambda t: (t[1], t[0]))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto(page_path.as_uri())
        tab.wait_for_function("document.querySelectorAll('.js-plotly-plot').length > 0")
        labels = tab.locator("#chart-by-0 text.bartext").all_text_contents()  # capture: "masked/rollouts"
        assert labels and all(re.fullmatch(r"\d+/\d+", t) for t in labels), labels
        checks = tab.locator("#gate-checks tr").all_inner_texts()
        [mask_rate] = [c.split() for c in checks if c.split()[:1] == ["mask_rate"]]  # value, limit, margin, status
        value, limit, margin = map(float, mask_rate[1:4])
        assert abs(margin - (limit - value)) < 1e-3 and mask_rate[4] in ("ok", "warn", "breach"), checks
        tab.locator(f'a.list-reason[data-reason="{reason}"]').click()
        assert tab.locator("#masked-shown").inner_text() == str(n)
        visible = tab.locator("#masked-table tr[data-reason]:visible")
        assert visible.count() == n and set(visible.evaluate_all("rs => rs.map(r => r.dataset.reason)")) == {reason}
        tab.select_option('select[data-filter="reason"]', "")
        assert tab.locator("#masked-shown").inner_text() == str(len(audit))
        tab.locator("#masked").scroll_into_view_if_needed()
        shot = tmp_path / "masked.png"
        tab.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000 and errors == []
        browser.close()


def test_the_report_gives_the_rows_lengths(reports):
    """Trainers size batches by tokens: the page gives the night's row lengths, as the rows say."""
    import numpy as np
    import pyarrow.parquet as pq

    out, page_path = reports
    n = pq.read_table(out / "rows" / f"ds={NIGHTS[-1]}").column("n_tokens").to_numpy()
    cells = re.search(r'id="row-lengths">(.*?)</table>', page_path.read_text()).group(1)
    numbers = [int(x.replace(",", "")) for x in re.findall(r'<td class="n">([\d,]+)</td>', cells)]
    assert numbers == [len(n), int(np.median(n)), int(np.percentile(n, 90)), int(np.percentile(n, 99)), int(n.max())]
