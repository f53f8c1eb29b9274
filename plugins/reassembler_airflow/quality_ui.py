"""The capture-quality reports inside the Airflow UI (Airflow 3 plugin).

Thin on purpose: the core writes the reports (`reassembler/report_html.py`); this plugin
only serves the files of `<output>/reports/` through a FastAPI app mounted on the API
server at `/capture-quality`, and links them with two external views:

- "Capture quality" in the navigation: the index over all nights;
- "Capture quality" on each DAG run: that run's night (`/capture-quality/runs/<run_id>`
  finds the night whose publish manifest names the run, and redirects to its report).

The output folder is `REASSEMBLER_OUTPUT` (default `data/output` under the repo), the same
the DAG file reads. Nothing outside `<output>/reports/` is ever served.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, RedirectResponse

REPO = Path(__file__).resolve().parents[2]
URL_PREFIX = "/capture-quality"


def output_dir() -> Path:
    return Path(os.environ.get("REASSEMBLER_OUTPUT", str(REPO / "data" / "output")))


def create_app(output: Path | None = None) -> FastAPI:
    app = FastAPI(title="Capture quality reports", docs_url=None, redoc_url=None, openapi_url=None)

    def root() -> Path:
        return ((output or output_dir()) / "reports").resolve()

    def serve(relative: str) -> FileResponse:
        base = root()
        target = (base / relative).resolve()
        if not target.is_relative_to(base) or not target.is_file():
            raise HTTPException(status_code=404, detail="no such report")
        return FileResponse(target)

    @app.get("/")
    def index() -> FileResponse:
        return serve("index.html")

    @app.get("/runs/{run_id}")
    def run_report(run_id: str) -> RedirectResponse:
        key = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)  # the DAG's run_key
        for manifest in sorted(((output or output_dir()) / "_published").glob("ds=*.json")):
            try:
                if json.loads(manifest.read_text()).get("run_id") == key:
                    return RedirectResponse(f"../{manifest.stem}/index.html", status_code=307)
            except (OSError, ValueError):
                continue
        raise HTTPException(status_code=404, detail=f"no capture-quality report for run {run_id}")

    @app.get("/{relative:path}")
    def files(relative: str) -> FileResponse:
        return serve(relative if not relative.endswith("/") else relative + "index.html")

    return app


class CaptureQualityPlugin(AirflowPlugin):
    name = "capture_quality"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Capture quality reports"}]
    external_views = [
        {
            "name": "Capture quality",
            "href": "capture-quality/",
            "destination": "nav",
            "category": "browse",
            "url_route": "capture-quality",
        },
        {
            "name": "Capture quality",
            "href": "capture-quality/runs/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "capture-quality-run",
        },
    ]
