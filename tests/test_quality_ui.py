"""The Airflow UI plugin's app: both views answer, every route checks access first, nothing
outside the reports is served, malformed paths are 404s, and every page carries its policy.
Airflow's own check against a running api-server is in tests/test_dag.py."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from fastapi import HTTPException, Request

PAGE = b'<html><script src="../plotly.min.js"></script><script type="text/javascript">draw(1)</script></html>'


def stub_access(request: Request) -> None:
    """Stands in for Airflow's check: a user header, and read access for `reader` only."""
    user = request.headers.get("x-user")
    if user is None:
        raise HTTPException(status_code=401, detail="Not authenticated")
    if user != "reader":
        raise HTTPException(status_code=403, detail="Forbidden")


@pytest.fixture
def out(tmp_path):
    out = tmp_path / "out"
    (out / "reports" / "ds=2026-11-28").mkdir(parents=True)
    (out / "reports" / "index.html").write_text("<html>all nights</html>")
    (out / "reports" / "ds=2026-11-28" / "index.html").write_bytes(PAGE)
    (out / "_published").mkdir()
    (out / "_published" / "ds=2026-11-28.json").write_text(
        json.dumps({"run_id": "scheduled__2026-11-29T02_00_00_00_00"})
    )
    (out / "warehouse.duckdb").write_text("secret")
    return out


RUNS = {}  # run id -> RunInfo, what Airflow's metadata DB says of a run that published nothing


@pytest.fixture
def client(out):
    from fastapi.testclient import TestClient

    from reassembler_airflow.quality_ui import create_app

    return TestClient(create_app(out, access=stub_access, lookup=RUNS.get), headers={"x-user": "reader"})


def _runs_snapshot(out, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (out / "tables").mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out / "tables" / "runs.parquet")


def test_the_index_and_a_nights_report_answer(client):
    assert client.get("/").text == "<html>all nights</html>"
    assert client.get("/ds=2026-11-28/index.html").content == PAGE
    assert client.get("/ds=2026-11-28/").content == PAGE


def test_a_dag_run_view_finds_its_night_or_says_what_became_of_it(client, out):
    from datetime import datetime

    from reassembler_airflow.quality_ui import RunInfo

    _runs_snapshot(
        out,
        [
            {
                "run_id": "scheduled__2026-11-29T02_00_00_00_00",
                "ds": "2026-11-28",
                "published_at": datetime(2026, 11, 29, 2, 9),
            },
            {"run_id": "manual__early", "ds": "2026-11-28", "published_at": datetime(2026, 11, 28, 23, 1)},
        ],
    )
    # the run the manifest names (its id made path-safe by an older release): its report
    res = client.get("/runs/scheduled__2026-11-29T02:00:00+00:00", follow_redirects=False)
    assert res.status_code == 307 and res.headers["location"] == "../ds=2026-11-28/index.html"
    assert client.get("/runs/scheduled__2026-11-29T02:00:00+00:00").content == PAGE
    # a run whose night a later run published again: it says so, and links to the current report
    res = client.get("/runs/manual__early")
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/html")
    assert "This run published night 2026-11-28 on 2026-11-28 23:01 UTC. A later run, scheduled__2026" in res.text
    assert "href='../ds=2026-11-28/index.html'" in res.text
    # runs that published nothing: what they are doing, from Airflow's metadata DB
    RUNS["manual__waiting"] = RunInfo(
        "running", {"check_input": "success", "wait_for_input": "up_for_reschedule"}, "2026-11-30", str(out / "input")
    )
    res = client.get("/runs/manual__waiting")
    assert "This run builds night 2026-11-30 and is waiting for its input (not there yet: " in res.text
    assert "input partition folder is missing" in res.text
    RUNS["manual__failed"] = RunInfo(
        "failed", {"check_input": "success", "wait_for_input": "success", "load_ledger": "failed"}, "2026-11-30", "x"
    )
    assert "failed at load_ledger and published nothing" in client.get("/runs/manual__failed").text
    RUNS["manual__queued"] = RunInfo("queued", {})
    assert "has not resolved its night yet (run state: queued)" in client.get("/runs/manual__queued").text
    res = client.get("/runs/manual__other")
    assert (
        res.status_code == 404
        and res.text.startswith("<!doctype html>")
        and "No run of the capture_rows_nightly" in res.text
    )
    # markup in a run id is text
    res = client.get("/runs/<b>x")
    assert "<b>" not in res.text and "&lt;b&gt;x" in res.text


@pytest.mark.parametrize(
    "path", ["/", "/ds=2026-11-28/index.html", "/runs/scheduled__2026-11-29T02:00:00+00:00", "/missing", "/%00"]
)
def test_every_route_checks_access_before_anything_else(client, path):
    anonymous = client.get(path, headers={"x-user": ""})  # an empty header is still a header: stub says 403
    assert anonymous.status_code == 403
    del client.headers["x-user"]
    res = client.get(path, follow_redirects=False)
    assert res.status_code == 401 and "all nights" not in res.text and res.content != PAGE
    assert client.get(path, headers={"x-user": "someone"}).status_code == 403


def test_the_app_checks_access_the_way_airflows_api_does_by_default():
    import inspect

    from reassembler_airflow import quality_ui

    assert inspect.signature(quality_ui.create_app).parameters["access"].default is quality_ui.airflow_dag_read
    [app] = [a["app"] for a in quality_ui.CaptureQualityPlugin.fastapi_apps]
    assert [d.dependency for d in app.router.dependencies] == [quality_ui.airflow_dag_read]


@pytest.mark.parametrize(
    "path",
    [
        "/../warehouse.duckdb",
        "/%2e%2e/warehouse.duckdb",
        "/..%2fwarehouse.duckdb",
        "/ds=2026-11-28/../../warehouse.duckdb",
        "//etc/passwd",
        "/missing.html",
        "/%00",
        "/ds=2026-11-28/%00index.html",
        "/" + "x" * 5000,
        "/" + "/".join(["a" * 250] * 30),
        "/ds=2026-11-28\\..\\..\\warehouse.duckdb",
        "/%ff%fe",
        "/runs/" + "r" * 5000,
        "/ds=2026-11-28/index.html/",
    ],
)
def test_malformed_and_outside_paths_are_404(client, path):
    res = client.get(path)
    assert res.status_code == 404 and "secret" not in res.text


def test_a_link_inside_the_reports_that_points_outside_is_404(client, out):
    """The request's path is clean (no `..`): only where the link leads says it is outside."""
    (out / "reports" / "leak.html").symlink_to(out / "warehouse.duckdb")
    (out / "reports" / "ds=2026-11-28" / "up").symlink_to(out)
    for path in ("/leak.html", "/ds=2026-11-28/up/warehouse.duckdb"):
        res = client.get(path)
        assert res.status_code == 404 and "secret" not in res.text, path
    (out / "reports" / "latest").symlink_to(out / "reports" / "ds=2026-11-28")  # a link that stays inside
    assert client.get("/latest/index.html").content == PAGE


def test_a_link_loop_inside_the_reports_is_404(client, out):
    (out / "reports" / "self").symlink_to(out / "reports" / "self")
    (out / "reports" / "a").symlink_to(out / "reports" / "b")
    (out / "reports" / "b").symlink_to(out / "reports" / "a")
    for path in ("/self", "/a", "/b/index.html", "/self/x/y"):
        assert client.get(path).status_code == 404, path


def test_every_response_carries_a_policy_that_allows_only_the_pages_own_scripts(client):
    page = client.get("/ds=2026-11-28/index.html")
    digest = base64.b64encode(hashlib.sha256(b"draw(1)").digest()).decode()
    policy = page.headers["content-security-policy"]
    assert f"script-src 'self' 'sha256-{digest}';" in policy
    assert "connect-src 'none'" in policy and "default-src 'none'" in policy and "frame-ancestors 'self'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    for other in ("/missing", "/runs/manual__other"):
        res = client.get(other)
        assert (
            "connect-src 'none'" in res.headers["content-security-policy"]
            and "sha256" not in res.headers["content-security-policy"]
        )


def test_the_plugin_registers_the_app_and_both_views():
    from reassembler_airflow.quality_ui import CaptureQualityPlugin

    assert [a["url_prefix"] for a in CaptureQualityPlugin.fastapi_apps] == ["/capture-quality"]
    assert {v["destination"] for v in CaptureQualityPlugin.external_views} == {"nav", "dag_run"}
    assert all(not v["href"].startswith("/") for v in CaptureQualityPlugin.external_views)
