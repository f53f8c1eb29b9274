#!/usr/bin/env bash
# `make airflow` / `make airflow-stop`: this repo's DAG and plugins under a real Airflow, on the
# embedded defaults: SQLite metadata DB in .airflow/, LocalExecutor, api-server + scheduler +
# dag-processor + triggerer in the background (logs in .airflow/logs/services/).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/airflow_env.sh
export PATH="$PWD/.venv/bin:$PATH"
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS=reassembler_airflow.sqlite.CONNECT_ARGS
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-admin:admin}"
PORT="${AIRFLOW_PORT:-8080}"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://localhost:$PORT/execution/"
RUN="$AIRFLOW_HOME/services"
mkdir -p "$RUN" "$AIRFLOW_HOME/logs/services"

stop() {
  for pidfile in "$RUN"/*.pid; do
    [ -e "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  echo "Airflow services stopped"
}

if [ "${1:-start}" = stop ]; then stop; exit 0; fi

stop >/dev/null
airflow db migrate > "$AIRFLOW_HOME/logs/services/db-migrate.log" 2>&1
# the warehouse's writers take all of this pool's slots, its readers one each (dags/)
airflow pools set reassembler_warehouse 4 "DuckDB warehouse: writers take 4 slots, readers 1" > /dev/null
for service in "api-server --port $PORT" scheduler dag-processor triggerer; do
  name="${service%% *}"
  nohup airflow $service > "$AIRFLOW_HOME/logs/services/$name.log" 2>&1 &
  echo $! > "$RUN/$name.pid"
done
for _ in $(seq 1 90); do
  curl -sf "http://localhost:$PORT/api/v2/monitor/health" > /dev/null && break
  sleep 1
done
password="$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['admin'])" \
            "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" 2>/dev/null || echo '(see the api-server log)')"
cat <<MSG
Airflow is up: http://localhost:$PORT   login: admin / $password
  DAG capture_rows_nightly (paused: unpause it in the UI or with 'airflow dags unpause capture_rows_nightly')
  input  $REASSEMBLER_INPUT   output $REASSEMBLER_OUTPUT   metadata DB $AIRFLOW_HOME/airflow.db
  logs   $AIRFLOW_HOME/logs/ (task logs) and $AIRFLOW_HOME/logs/services/ (the services)
  stop   make airflow-stop
In another shell, use the same settings: source scripts/airflow_env.sh && export PATH=\$PWD/.venv/bin:\$PATH
MSG
