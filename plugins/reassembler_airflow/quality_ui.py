"""The capture-quality reports inside the Airflow UI (Airflow 3 plugin).

Thin on purpose: the core writes the reports (`reassembler/report_html.py`); this plugin
only serves the files of `<output>/reports/` through a FastAPI app mounted on the API
server at `/capture-quality`, and links them with two external views:

- "Capture quality" in the navigation: the index over all nights;
- "Capture quality" on each DAG run: that run's night (`/capture-quality/runs/<run_id>`
  finds the night whose publish manifest names the run, and redirects to its report).

**Access.** Airflow mounts a plugin's app without authenticating it, so every route here
checks the request as Airflow's own API does (`get_user`: the `Authorization: Bearer`
token, else the UI's session cookie; then the auth manager's `is_authorized_dag`): an
anonymous request gets 401, a signed-in user needs read access to the DAG (403
otherwise). The UI's iframes send the session cookie, so its links work for such a user.

**What a page may do.** Every response carries a Content-Security-Policy: a page loads
scripts and styles from this server only, runs no inline script but its own (by hash), and
opens no connection anywhere (`connect-src 'none'`); only the Airflow UI may frame it.

The output folder is `REASSEMBLER_OUTPUT` (default `data/output` under the repo), the same
the DAG file reads. Nothing outside `<output>/reports/` is ever served; a path that names
nothing there, however malformed, is a 404.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from reassembler_airflow import DAG_ID

REPO = Path(__file__).resolve().parents[2]
URL_PREFIX = "/capture-quality"
_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.DOTALL | re.IGNORECASE)
_POLICY = (
    "default-src 'none'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'none'; frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)


def output_dir() -> Path:
    return Path(os.environ.get("REASSEMBLER_OUTPUT", str(REPO / "data" / "output")))


# -- access, as Airflow's own API checks it (imported when a request comes: this module is
# loaded by every Airflow process, only the API server serves it)


async def airflow_user(request: Request):
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    return await get_user(request, None, await bearer_scheme(request))


def airflow_dag_read(request: Request, user=Depends(airflow_user)) -> None:
    """401 without a valid session or token, 403 without read access to the DAG."""
    from airflow.api_fastapi.core_api.security import requires_access_dag

    requires_access_dag("GET", param_dag_id=DAG_ID)(request, user)


def content_security_policy(body: bytes | None) -> str:
    """The policy of a response: its own inline scripts allowed by their hashes, nothing else."""
    hashes = "".join(
        f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in _INLINE_SCRIPT.findall(body or b"")
    )
    return _POLICY.format(hashes=hashes)


def create_app(output: Path | None = None, access: Callable = airflow_dag_read) -> FastAPI:
    """`access`: the dependency every route runs first (Airflow's check; tests pass their own)."""
    app = FastAPI(
        title="Capture quality reports",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(access)],
    )

    def root() -> Path:
        return ((output or output_dir()) / "reports").resolve()

    def serve(relative: str) -> Response:
        base = root()
        try:
            if "\x00" in relative or "\\" in relative:
                raise ValueError(relative)
            target = (base / relative).resolve()
            found = target.is_relative_to(base) and target.is_file()
        except (OSError, ValueError):  # a name too long, a NUL byte, a loop
            found = False
        if not found:
            raise HTTPException(status_code=404, detail="no such report")
        body = target.read_bytes() if target.suffix == ".html" else None
        response = FileResponse(target)
        response.headers["Content-Security-Policy"] = content_security_policy(body)
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.get("/")
    def index() -> Response:
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
    def files(relative: str) -> Response:
        return serve(relative if not relative.endswith("/") else relative + "index.html")

    @app.middleware("http")
    async def policy_on_every_response(request: Request, call_next):
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", content_security_policy(None))
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

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
