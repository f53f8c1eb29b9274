#!/usr/bin/env bash
# `make run`: scripts/make_run.py on the embedded defaults (scripts/airflow_env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/airflow_env.sh
export PATH="$PWD/.venv/bin:$PATH"
export REASSEMBLER_TASK_RETRIES="${REASSEMBLER_TASK_RETRIES:-0}"
exec .venv/bin/python scripts/make_run.py
