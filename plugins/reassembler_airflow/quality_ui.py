"""The capture-quality reports inside the Airflow UI (Airflow 3 plugin).

Thin on purpose: the core writes the reports (`reassembler/report_html.py`); this plugin
only serves the files of `<output>/reports/` through a FastAPI app mounted on the API
server at `/capture-quality`, and links them with two external views:

- "Capture quality" in the navigation: the index over all nights;
- "Capture quality" on each DAG run: that run's night (`/capture-quality/runs/<run_id>`
  finds the night the run published in `tables/runs.parquet` and redirects to its report;
  when a later run published that night again, it says so and links to the current report;
  a run that published nothing says what it is doing: waiting for which input, or where
  it failed, from Airflow's metadata DB).

**Access.** Airflow mounts a plugin's app without authenticating it, so every route here
checks the request as Airflow's own API does (`get_user`: the `Authorization: Bearer`
token, else the UI's session cookie; then the auth manager's `is_authorized_dag`): an
anonymous request gets 401, a signed-in user needs read access to the DAG (403
otherwise). The UI's iframes send the session cookie, so its links work for such a user.

**What a page may do.** Every response carries a Content-Security-Policy: a page loads
scripts and styles from this server only, runs no inline script but its own (by hash), and
opens no connection anywhere (`connect-src 'none'`); only the Airflow UI may frame it.

The output is `REASSEMBLER_OUTPUT` (default `data/output` under the repo; a folder or an
s3:// prefix), the same the DAG file reads; pages are read from its store. Nothing outside
`<output>/reports/` is ever served; a path that names nothing there, however malformed, is
a 404.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import mimetypes
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from reassembler_airflow import DAG_ID

REPO = Path(__file__).resolve().parents[2]
URL_PREFIX = "/capture-quality"
_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.DOTALL | re.IGNORECASE)
_POLICY = (
    "default-src 'none'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'none'; frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)


def output_dir() -> str:
    """The output's location (a folder or s3://bucket/prefix), as the DAG file reads it."""
    from reassembler import storage

    return storage.location(os.environ.get("REASSEMBLER_OUTPUT", str(REPO / "data" / "output")))


def read_report(output, relative: str) -> bytes | None:
    """The bytes of `<output>/reports/<relative>` on the output's store, or None when that
    names nothing there (a malformed path, `..`, a link out of the folder)."""
    from reassembler import storage
    from reassembler.errors import ReassemblerError

    parts = relative.split("/")
    if "\x00" in relative or "\\" in relative or any(p in ("", ".", "..") for p in parts):
        return None
    base = storage.join(storage.location(output), "reports")
    loc = storage.join(base, relative)
    try:
        if not storage.is_remote(loc):
            target = Path(loc).resolve()
            if not (target.is_relative_to(Path(base).resolve()) and target.is_file()):
                return None
        return storage.read_bytes(loc)
    except (OSError, ValueError, RuntimeError, ReassemblerError):
        # a name too long, a link loop (Path.resolve raises RuntimeError), an unreachable store
        return None


# -- access, as Airflow's own API checks it (imported when a request comes: this module is
# loaded by every Airflow process, only the API server serves it)


async def airflow_user(request: Request):
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    return await get_user(request, None, await bearer_scheme(request))


def airflow_dag_read(request: Request, user=Depends(airflow_user)) -> None:
    """401 without a valid session or token, 403 without read access to the DAG."""
    from airflow.api_fastapi.core_api.security import requires_access_dag

    requires_access_dag("GET", param_dag_id=DAG_ID)(request, user)


# -- a DAG run's tab: its report, or what became of its night


@dataclass(frozen=True)
class RunInfo:
    """A DAG run as Airflow's metadata DB knows it: its state, each task's state, and the
    night and input its check_input task resolved (None until that task ran)."""

    state: str
    tasks: dict[str, str]
    ds: str | None = None
    input_dir: str | None = None


def airflow_run(run_id: str) -> RunInfo | None:
    """Read from the metadata DB (the API server's, as Airflow's own views do)."""
    from airflow.models import DagRun, TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == DAG_ID, DagRun.run_id == run_id))
        if run is None:
            return None
        tasks = {
            ti.task_id: str(ti.state or "none")
            for ti in session.scalars(
                select(TaskInstance).where(TaskInstance.dag_id == DAG_ID, TaskInstance.run_id == run_id)
            )
        }
        night = {
            x.key: XComModel.deserialize_value(x)
            for x in session.scalars(XComModel.get_many(run_id=run_id, dag_ids=DAG_ID, task_ids="check_input"))
        }
        return RunInfo(str(run.state), tasks, night.get("ds"), night.get("input_dir"))


def _progress(info: RunInfo) -> str:
    """What a run that has published nothing is doing, in a sentence or two."""
    failed = [t for t, state in info.tasks.items() if state in ("failed", "upstream_failed")]
    if info.ds is None:
        if failed:
            return f"This run failed before it resolved its night ({', '.join(sorted(failed))}); see its task logs."
        return f"This run has not resolved its night yet (run state: {info.state})."
    if failed:
        where = ", ".join(sorted(failed))
        return f"This run of night {info.ds} failed at {where} and published nothing; see the task logs."
    waiting = info.tasks.get("wait_for_input") in ("up_for_reschedule", "running", "queued", "scheduled", "none")
    if waiting:
        from reassembler.errors import InputError
        from reassembler.formats.night import find_night

        try:
            find_night(info.input_dir or "", info.ds)
            missing = "its partitions are there now; it goes on at its next look"
        except InputError as e:
            missing = f"not there yet: {e}"
        return f"This run builds night {info.ds} and is waiting for its input ({missing})."
    return (
        f"This run builds night {info.ds}; its report is written once the night is published (run state: {info.state})."
    )


def path_safe(run_id: str) -> str:
    """A run id as a folder name (as the core names the run's staging folder)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)


def _published_by(out, run_id: str) -> tuple[str, str] | None:
    """(night, when) this run published, from the runs snapshot (`tables/runs.parquet`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reassembler import storage
    from reassembler.errors import ReassemblerError

    try:
        data = storage.read_bytes(storage.join(storage.location(out), "tables", "runs.parquet"))
        runs = pq.read_table(pa.BufferReader(data), columns=["run_id", "ds", "published_at"]).to_pylist()
    except (OSError, ValueError, ReassemblerError, pa.ArrowException):
        return None
    mine = [r for r in runs if r["run_id"] in (run_id, path_safe(run_id))]  # ids of older releases were made path-safe
    if not mine:
        return None
    last = max(mine, key=lambda r: r["published_at"] or datetime.min)
    when = last["published_at"].strftime("%Y-%m-%d %H:%M UTC") if last["published_at"] else "an unknown time"
    return str(last["ds"]), when


def _manifest_run(out, ds: str) -> str | None:
    from reassembler import storage
    from reassembler.errors import ReassemblerError

    try:
        return json.loads(storage.read_bytes(storage.join(storage.location(out), "_published", f"ds={ds}.json"))).get(
            "run_id"
        )
    except (OSError, ValueError, ReassemblerError):
        return None


def _run_page(run_id: str, message: str, link: str | None, status: int = 200) -> HTMLResponse:
    return _page(f"Capture quality of run {run_id}", message, link, status)


def _page(heading: str, message: str, link: str | None, status: int = 200) -> HTMLResponse:
    """A small page of text (every string escaped), never raw JSON."""
    e = html.escape
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(heading)}</title>",
        f"<style>{PAGE_STYLE}</style></head><body><h1>{e(heading)}</h1>",
        f"<p id='status'>{e(message)}</p>",
    ]
    if link:
        label = "the night's current report" if "ds=" in link else "all nights"
        parts.append(f"<p><a id='report' href='{e(link)}'>Open {label}</a></p>")
    return HTMLResponse("".join(parts) + "</body></html>", status_code=status)


PAGE_STYLE = "body{font-family:system-ui,sans-serif;margin:24px;color:#1f2933} h1{font-size:20px} a{color:#1a56db}"


def content_security_policy(body: bytes | None) -> str:
    """The policy of a response: its own inline scripts allowed by their hashes, nothing else."""
    hashes = "".join(
        f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in _INLINE_SCRIPT.findall(body or b"")
    )
    return _POLICY.format(hashes=hashes)


def create_app(output=None, access: Callable = airflow_dag_read, lookup: Callable | None = None) -> FastAPI:
    """`access`: the dependency every route runs first (Airflow's check; tests pass their
    own); `lookup`: a run's state and night (`airflow_run`, from Airflow's metadata DB)."""
    app = FastAPI(
        title="Capture quality reports",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(access)],
    )

    def serve(relative: str) -> Response:
        body = read_report(output or output_dir(), relative)
        if body is None:
            raise HTTPException(status_code=404, detail="no such report")
        kind = mimetypes.guess_type(relative)[0] or "application/octet-stream"
        response = Response(body, media_type=kind)
        response.headers["Content-Security-Policy"] = content_security_policy(body if kind == "text/html" else None)
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.get("/")
    def index() -> Response:
        return serve("index.html")

    @app.get("/runs/{run_id}")
    def run_report(run_id: str) -> Response:
        out = output or output_dir()
        published = _published_by(out, run_id)
        if published is not None:
            ds, when = published
            current = _manifest_run(out, ds)
            if current in (run_id, path_safe(run_id)):
                return RedirectResponse(f"../ds={ds}/index.html", status_code=307)
            return _run_page(
                run_id,
                f"This run published night {ds} on {when}. A later run, {current}, published the "
                "night again; the report shows the night as that run published it.",
                f"../ds={ds}/index.html",
            )
        info = (lookup or airflow_run)(run_id)
        if info is None:
            return _run_page(run_id, "No run of the capture_rows_nightly DAG has this id.", None, status=404)
        return _run_page(run_id, _progress(info), "../", status=200)

    @app.get("/{relative:path}")
    def files(relative: str) -> Response:
        return serve(relative if not relative.endswith("/") else relative + "index.html")

    @app.exception_handler(404)
    async def not_found(request: Request, exc) -> HTMLResponse:
        index = request.scope.get("root_path", "") + "/"
        return _page("Capture quality", "No such report here.", index, 404)

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
