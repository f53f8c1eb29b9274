"""A wheel built from the repo works from any directory: the SQL ships as package data."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_a_wheel_installed_in_a_fresh_venv_builds_a_night_from_another_directory(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
    )
    [wheel] = list(wheels.glob("reassembler-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "reassembler/sql/schema.sql" in names and "reassembler/sql/migrations/002_contract_v2.sql" in names
    assert not any(n.startswith(("tests/", "dags/", "plugins/")) for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    with zipfile.ZipFile(wheel) as z:  # a pure-Python wheel installs by unpacking it
        z.extractall(site)
    # the dependencies come from the test environment (no network needed); the package itself
    # only from the wheel (a .pth line adds a folder but runs none of its .pth files)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(*args: str) -> str:
        res = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "reassembler.cli", *args],
            cwd=elsewhere,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import reassembler.warehouse as w; print(w.SQL_DIR)"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(site)) and not where.startswith(str(REPO))
    # the Airflow side: the plugin by its entry point, the DAG importable from the package (a
    # deployment's DAG file is one import line)
    assert "reassembler_airflow/dag.py" in names and "reassembler_airflow/quality_ui.py" in names
    probe = (
        "from importlib.metadata import entry_points; "
        "[ep] = [e for e in entry_points(group='airflow.plugins') if e.name == 'capture_quality']; "
        "name = ep.load().name; "
        "from reassembler_airflow.dag import capture_rows_nightly as d; print('FOUND', name, d.dag_id, len(d.tasks))"
    )
    res = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow-home"), "PYTHONPATH": ""},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    [found] = [line.split()[1:] for line in res.stdout.splitlines() if line.startswith("FOUND ")]
    assert found == ["capture_quality", "capture_rows_nightly", "13"], res.stdout
    run("synth", "--output", "in", "--ds", "2026-11-28", "--rollouts", "8", "--max-calls", "6", "--token-scale", "0.02")
    assert "8 rollouts" in run("build", "--input", "in", "--output", "out", "--ds", "2026-11-28")
    assert (elsewhere / "out" / "rows" / "ds=2026-11-28").is_dir()
