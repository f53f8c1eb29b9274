"""The Airflow UI plugin's app: both views answer, nothing outside the reports is served."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def served(tmp_path):
    from fastapi.testclient import TestClient

    from reassembler_airflow.quality_ui import create_app

    out = tmp_path / "out"
    (out / "reports" / "ds=2026-11-28").mkdir(parents=True)
    (out / "reports" / "index.html").write_text("<html>all nights</html>")
    (out / "reports" / "ds=2026-11-28" / "index.html").write_text("<html>night 2026-11-28</html>")
    (out / "_published").mkdir()
    (out / "_published" / "ds=2026-11-28.json").write_text(
        json.dumps({"run_id": "scheduled__2026-11-29T02_00_00_00_00"})
    )
    (out / "warehouse.duckdb").write_text("secret")
    return TestClient(create_app(out))


def test_the_index_and_a_nights_report_answer(served):
    assert served.get("/").text == "<html>all nights</html>"
    assert served.get("/ds=2026-11-28/index.html").text == "<html>night 2026-11-28</html>"
    assert served.get("/ds=2026-11-28/").text == "<html>night 2026-11-28</html>"


def test_a_dag_run_view_finds_its_night(served):
    res = served.get("/runs/scheduled__2026-11-29T02:00:00+00:00", follow_redirects=False)
    assert res.status_code == 307 and res.headers["location"] == "../ds=2026-11-28/index.html"
    assert served.get("/runs/scheduled__2026-11-29T02:00:00+00:00").text == "<html>night 2026-11-28</html>"
    assert served.get("/runs/manual__other").status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/../warehouse.duckdb",
        "/%2e%2e/warehouse.duckdb",
        "/..%2fwarehouse.duckdb",
        "/ds=2026-11-28/../../warehouse.duckdb",
        "//etc/passwd",
        "/missing.html",
    ],
)
def test_nothing_outside_the_reports_folder_is_served(served, path):
    res = served.get(path)
    assert res.status_code == 404 and "secret" not in res.text


def test_the_plugin_registers_the_app_and_both_views():
    from reassembler_airflow.quality_ui import CaptureQualityPlugin

    assert [a["url_prefix"] for a in CaptureQualityPlugin.fastapi_apps] == ["/capture-quality"]
    assert {v["destination"] for v in CaptureQualityPlugin.external_views} == {"nav", "dag_run"}
    assert all(not v["href"].startswith("/") for v in CaptureQualityPlugin.external_views)
