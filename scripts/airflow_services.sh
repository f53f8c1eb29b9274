#!/usr/bin/env bash
# `make airflow` / `make airflow-stop`: this repo's DAG and plugins under a real Airflow, on the
# embedded defaults: SQLite metadata DB in .airflow/, LocalExecutor, api-server + scheduler +
# dag-processor + triggerer in the background (logs in .airflow/logs/services/).
#
# A demo deployment: the trigger form's default night is the night `make run` writes (DS,
# 2026-11-28), written now if it is missing; the warehouse pool is created and used. Each
# service runs in a session of its own, so that `make airflow-stop` (scripts/stop_services.py)
# stops it with every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/airflow_env.sh
export PATH="$PWD/.venv/bin:$PATH"
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS=reassembler_airflow.sqlite.CONNECT_ARGS
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-admin:admin}"
PORT="${AIRFLOW_PORT:-8080}"
# loopback only unless told otherwise (AIRFLOW_HOST=0.0.0.0 to serve other machines); the
# scheduler and triggerer serve no log server (their 0.0.0.0/[::] listeners have no host
# setting): the api-server reads the task logs from $AIRFLOW_HOME/logs on this machine
HOST="${AIRFLOW_HOST:-127.0.0.1}"
LOCAL="127.0.0.1"  # how this machine's processes reach the api-server, whichever HOST it listens on
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://$LOCAL:$PORT/execution/"
# a scheduled night of the demo (unpausing starts yesterday's) whose input is not there fails
# at once saying so, instead of waiting 6 hours for input that cannot come
export REASSEMBLER_INPUT_WAIT_HOURS="${REASSEMBLER_INPUT_WAIT_HOURS:-0}"
export AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT="${AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT:-8793}"
export AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT="${AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT:-8794}"
export REASSEMBLER_WAREHOUSE_POOL="${REASSEMBLER_WAREHOUSE_POOL:-reassembler_warehouse}"
export REASSEMBLER_DEFAULT_DS="${REASSEMBLER_DEFAULT_DS:-${DS:-2026-11-28}}"
export REASSEMBLER_INPUT_POKE_SECONDS="${REASSEMBLER_INPUT_POKE_SECONDS:-60}"
export ARROW_DEFAULT_MEMORY_POOL="${ARROW_DEFAULT_MEMORY_POOL:-jemalloc}"  # as the command sets for itself
RUN="$AIRFLOW_HOME/services"
mkdir -p "$RUN" "$AIRFLOW_HOME/logs/services"

stop() { python3 scripts/stop_services.py --run-dir "$RUN" "$@"; }

if [ "${1:-start}" = stop ]; then stop; exit $?; fi

stop > /dev/null || { echo "Airflow services of an earlier start are still running: make airflow-stop"; exit 1; }
if [ ! -d "$REASSEMBLER_INPUT/rollouts/ds=$REASSEMBLER_DEFAULT_DS" ]; then
  reassembler synth --output "$REASSEMBLER_INPUT" --ds "$REASSEMBLER_DEFAULT_DS" --rollouts "${ROLLOUTS:-240}" \
    --seed "${SEED:-7}" > /dev/null
  echo "wrote the demo night ds=$REASSEMBLER_DEFAULT_DS to $REASSEMBLER_INPUT"
fi
airflow db migrate > "$AIRFLOW_HOME/logs/services/db-migrate.log" 2>&1
# the warehouse's writers take all of this pool's slots, its readers one each (plugins/reassembler_airflow/warehouse.py)
airflow pools set "$REASSEMBLER_WAREHOUSE_POOL" 4 "DuckDB warehouse: writers take 4 slots, readers 1" > /dev/null
echo "$PORT $AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT $AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT" > "$RUN/ports"
for service in "api-server --host $HOST --port $PORT" "scheduler --skip-serve-logs" dag-processor \
               "triggerer --skip-serve-logs"; do
  name="${service%% *}"
  setsid nohup airflow $service > "$AIRFLOW_HOME/logs/services/$name.log" 2>&1 < /dev/null &
  pid=$!
  echo "$pid $(awk '{print $22}' "/proc/$pid/stat")" > "$RUN/$name.pid"
done
for _ in $(seq 1 90); do
  curl -sf "http://$LOCAL:$PORT/api/v2/monitor/health" > /dev/null && break
  sleep 1
done
password="$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['admin'])" \
            "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" 2>/dev/null || echo '(see the api-server log)')"
cat <<MSG
Airflow is up: http://$HOST:$PORT   login: admin / $password   (AIRFLOW_HOST=0.0.0.0 for other machines)
  DAG capture_rows_nightly (paused: unpause it in the UI or with 'airflow dags unpause capture_rows_nightly')
  Trigger it with the form's defaults to build the demo night ds=$REASSEMBLER_DEFAULT_DS
  input  $REASSEMBLER_INPUT   output $REASSEMBLER_OUTPUT   metadata DB $AIRFLOW_HOME/airflow.db
  logs   $AIRFLOW_HOME/logs/ (task logs) and $AIRFLOW_HOME/logs/services/ (the services)
  stop   make airflow-stop
In another shell, use the same settings: source scripts/airflow_env.sh && export PATH=\$PWD/.venv/bin:\$PATH
MSG
