"""The wheel installs into the Airflow its users run, as a platform engineer installs it.

A team's image already holds Airflow and its own pins (tests/install/airflow-3.2-image.txt:
Airflow 3.2.2 and other patch releases of duckdb, pyarrow, numpy, orjson and plotly than the
development lock's). Installing `reassembler[airflow]` into it must change none of them; the
DAG must parse with no import error, the capture-quality plugin must register once (by its
entry point, even with this repo's plugins/ as the plugins folder), and a small night must
run through `airflow dags test`. The core alone (`pip install reassembler`) installs and
builds a night without Airflow.

These tests install from PyPI into fresh venvs (about two minutes): `make test-install` runs
them (`.ci/run` calls it); `make test` skips them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IMAGE = REPO / "tests" / "install" / "airflow-3.2-image.txt"
DS = "2026-11-28"

pytestmark = pytest.mark.skipif(
    os.environ.get("REASSEMBLER_INSTALL_TESTS") != "1",
    reason="installs from PyPI into fresh venvs: run by `make test-install` (.ci/run)",
)


def _run(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 600) -> str:
    res = subprocess.run(list(args), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{args[:3]} exit {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout + res.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO))
    [whl] = out.glob("reassembler-*.whl")
    return whl


def _venv(where: Path) -> Path:
    _run(sys.executable, "-m", "venv", str(where))
    return where / "bin"


def _freeze(bin: Path) -> dict[str, str]:
    """Every installed distribution and its version (a wheel installed from a file included)."""
    res = subprocess.run(
        [str(bin / "python"), "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True
    )
    return {d["name"].lower(): d["version"] for d in json.loads(res.stdout)}


def _pins(path: Path) -> dict[str, str]:
    return dict(line.split("==", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


@pytest.mark.timeout(1200)
def test_the_wheel_installs_into_an_airflow_3_2_image_and_runs_a_night(tmp_path, wheel):
    bin = _venv(tmp_path / "image")
    _run(str(bin / "python"), "-m", "pip", "install", "-q", "-r", str(IMAGE))
    before = _freeze(bin)
    assert {k: before[k] for k in ("apache-airflow", "duckdb", "pyarrow")} == {
        "apache-airflow": "3.2.2",
        "duckdb": "2.0.1",
        "pyarrow": "26.0.0",
    }
    # as the README says: pip install reassembler[airflow], with the image's own pins in place
    _run(str(bin / "python"), "-m", "pip", "install", "-q", f"{wheel}[airflow]")
    after = _freeze(bin)
    changed = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
    assert changed == {}, f"the install changed the image's packages: {changed}"
    assert set(after) - set(before) == {"reassembler"}

    home, dags = tmp_path / "airflow", tmp_path / "dags"
    home.mkdir()
    dags.mkdir()
    # a deployment's DAG file is the one line the README gives
    (dags / "capture_rows_nightly.py").write_text(
        "from reassembler_airflow.dag import capture_rows_nightly  # noqa: F401\n"
    )
    inp, out = tmp_path / "input", tmp_path / "output"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "REASSEMBLER", "PYTHON"))},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        # the worst case: the repo's plugins/ as the plugins folder beside the installed wheel
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "REASSEMBLER_INPUT": str(inp),
        "REASSEMBLER_OUTPUT": str(out),
        "REASSEMBLER_TASK_RETRIES": "0",
    }
    probe = (
        "import json\n"
        "from airflow import plugins_manager as pm\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "pm.ensure_plugins_loaded()\n"
        f"bag = DagBag({str(dags)!r}, include_examples=False)\n"
        "print('PROBE ' + json.dumps({'plugin_errors': pm.get_import_errors(), 'dag_errors': bag.import_errors,\n"
        "    'dags': sorted(bag.dag_ids), 'plugins': [p['name'] for p in pm.get_plugin_info()]}))\n"
    )
    lines = _run(str(bin / "python"), "-c", probe, env=env, cwd=tmp_path).splitlines()
    [found] = [json.loads(line[6:]) for line in lines if line.startswith("PROBE ")]
    assert found == {
        "plugin_errors": {},
        "dag_errors": {},
        "dags": ["capture_rows_nightly"],
        "plugins": ["capture_quality"],
    }

    _run(str(bin / "reassembler"), "synth", "--output", str(inp), "--ds", DS, "--rollouts", "8", "--max-calls", "6",
         "--token-scale", "0.02", "--fault-rate", "0", env=env)  # fmt: skip
    _run(str(bin / "airflow"), "db", "migrate", env=env, cwd=tmp_path)
    log = _run(str(bin / "airflow"), "dags", "test", "capture_rows_nightly", "2026-11-29", env=env, cwd=tmp_path)
    assert "state=success" in log, log[-3000:]
    manifest = json.loads((out / "_published" / f"ds={DS}.json").read_text())
    assert manifest["ds"] == DS
    assert (out / "rows" / f"ds={DS}").is_dir() and any((out / "rows" / f"ds={DS}").iterdir())


@pytest.mark.timeout(900)
def test_the_core_installs_and_builds_without_airflow(tmp_path, wheel):
    bin = _venv(tmp_path / "core")
    # the core's tested range: the image's patch releases, without Airflow
    pins = _pins(IMAGE)
    core = [f"{k}=={pins[k]}" for k in ("duckdb", "pyarrow", "numpy", "orjson", "plotly")]
    _run(str(bin / "python"), "-m", "pip", "install", "-q", *core, str(wheel))
    after = _freeze(bin)
    assert "apache-airflow" not in after and "apache-airflow-core" not in after
    assert {k: after[k] for k in ("duckdb", "pyarrow")} == {"duckdb": pins["duckdb"], "pyarrow": pins["pyarrow"]}
    version = _run(str(bin / "reassembler"), "--version").strip()
    assert version == f"reassembler {after['reassembler']}"
    _run(str(bin / "reassembler"), "synth", "--output", "in", "--ds", DS, "--rollouts", "8", "--max-calls", "6",
         "--token-scale", "0.02", cwd=tmp_path)  # fmt: skip
    built = _run(str(bin / "reassembler"), "build", "--input", "in", "--output", "out", "--ds", DS, cwd=tmp_path)
    assert "8 rollouts" in built
