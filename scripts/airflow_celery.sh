#!/usr/bin/env bash
# `make airflow-celery`: the DAG on Airflow's CeleryExecutor, as a lab deploys it, on one
# machine: Redis (broker) and PostgreSQL (metadata DB and Celery's result backend) from
# Debian's packages, installed when missing, their data under $AIRFLOW_HOME/celery/, loopback
# only; moto's S3-compatible server with the buckets `capture` and `rows` (the demo night
# uploaded to s3://capture/nightly); the api-server, scheduler and dag-processor; and two
# Celery workers, each with a working folder of its own:
#   worker-1 serves the queues `default` and `warehouse` (REASSEMBLER_WAREHOUSE_QUEUE) and
#            holds the DuckDB warehouse (REASSEMBLER_WAREHOUSE, in its folder);
#   worker-2 serves `default` only: it runs shards, and has no warehouse setting at all.
# With ISOLATE=1 (root only) each worker runs in a mount namespace of its own where the
# other's folder is an empty tmpfs: they share nothing but the object store (and the DAG
# code and Airflow's config). `make airflow-stop` stops every process by its pid record.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$REPO/.airflow}"
CELERY_DIR="$AIRFLOW_HOME/celery"
RUN="$AIRFLOW_HOME/services"
LOGS="$AIRFLOW_HOME/logs/services"
PORT="${AIRFLOW_PORT:-8080}"
REDIS_PORT="${REDIS_PORT:-6389}"
PG_PORT="${PG_PORT:-5439}"
S3_PORT="${S3_PORT:-9100}"
DS="${DS:-2026-11-28}"
export PATH="$REPO/.venv/bin:$PATH"
mkdir -p "$CELERY_DIR" "$RUN" "$LOGS"

stop() { python3 scripts/stop_services.py --run-dir "$RUN" "$@"; }
if [ "${1:-start}" = stop ]; then stop; exit $?; fi
stop > /dev/null || { echo "services of an earlier start are still running: make airflow-stop"; exit 1; }

# -- Debian's Redis and PostgreSQL, when missing
PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)"
if ! command -v redis-server > /dev/null || [ -z "$PG_BIN" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    apt-get update -qq > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server postgresql > /dev/null
    PG_BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
  else
    echo "redis-server and postgresql are missing: install Debian's redis-server and postgresql"; exit 1
  fi
fi

record() {  # name pid: the pid and its start time, as scripts/stop_services.py reads them
  echo "$2 $(awk '{print $22}' "/proc/$2/stat")" > "$RUN/$1.pid"
}
start() {  # name command...: in a session of its own, logging to $LOGS/name.log
  local name="$1"; shift
  setsid nohup "$@" > "$LOGS/$name.log" 2>&1 < /dev/null &
  record "$name" $!
}
AS_POSTGRES=(); if [ "$(id -u)" = 0 ]; then AS_POSTGRES=(runuser -u postgres --); fi
wait_for() {  # what, command...
  local what="$1"; shift
  for _ in $(seq 1 120); do "$@" > /dev/null 2>&1 && return 0; sleep 0.5; done
  echo "$what did not come up (logs: $LOGS)"; exit 1
}

# -- PostgreSQL: initdb refuses root, so the cluster belongs to `postgres` when run as root
PGDATA="$CELERY_DIR/postgres"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA"
  if [ "$(id -u)" = 0 ]; then chown postgres "$PGDATA" "$CELERY_DIR"; chmod o+x "$AIRFLOW_HOME" "$CELERY_DIR"; fi
  "${AS_POSTGRES[@]}" "$PG_BIN/initdb" -D "$PGDATA" -A trust -U postgres > "$LOGS/initdb.log" 2>&1 \
    || { echo "initdb failed (can user postgres reach $PGDATA?): $LOGS/initdb.log"; exit 1; }
fi
start postgres "${AS_POSTGRES[@]}" "$PG_BIN/postgres" -D "$PGDATA" -p "$PG_PORT" -c listen_addresses=127.0.0.1 \
  -c unix_socket_directories="$PGDATA"
wait_for PostgreSQL "$PG_BIN/pg_isready" -h 127.0.0.1 -p "$PG_PORT"
psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -tc "SELECT 1 FROM pg_database WHERE datname = 'airflow'" | grep -q 1 \
  || psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -qc "CREATE DATABASE airflow" > /dev/null

# -- Redis, the broker
mkdir -p "$CELERY_DIR/redis"
start redis redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$CELERY_DIR/redis" --save "" --appendonly no
wait_for Redis redis-cli -p "$REDIS_PORT" ping

# -- the object store: moto's S3 server, the buckets, the demo night
start s3 python -c "from moto.server import main; main()" -H 127.0.0.1 -p "$S3_PORT"
export AWS_ENDPOINT_URL="http://127.0.0.1:$S3_PORT" AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo AWS_DEFAULT_REGION=us-east-1
wait_for "the S3 server" curl -s -o /dev/null "$AWS_ENDPOINT_URL"
LOCAL_INPUT="${LOCAL_INPUT:-$REPO/data/input}"
if [ ! -d "$LOCAL_INPUT/rollouts/ds=$DS" ]; then
  reassembler synth --output "$LOCAL_INPUT" --ds "$DS" --rollouts "${ROLLOUTS:-240}" --seed "${SEED:-7}" > /dev/null
fi
python scripts/s3_put.py "$LOCAL_INPUT" s3://capture/nightly --bucket rows > "$LOGS/s3-upload.log"

# -- Airflow: every process's environment (the workers get theirs below)
export AIRFLOW__CORE__DAGS_FOLDER="$REPO/dags" AIRFLOW__CORE__PLUGINS_FOLDER="$REPO/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False AIRFLOW__CORE__EXECUTOR=CeleryExecutor
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql+psycopg2://postgres@127.0.0.1:$PG_PORT/airflow"
export AIRFLOW__CELERY__BROKER_URL="redis://127.0.0.1:$REDIS_PORT/0"
export AIRFLOW__CELERY__RESULT_BACKEND="db+postgresql+psycopg2://postgres@127.0.0.1:$PG_PORT/airflow"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://localhost:$PORT/execution/"
export AIRFLOW__CORE__HOSTNAME_CALLABLE=reassembler_airflow.workers.worker_name
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-admin:admin}"
[ -s "$CELERY_DIR/jwt_secret" ] || python -c "import secrets; print(secrets.token_hex(32))" > "$CELERY_DIR/jwt_secret"
export AIRFLOW__API_AUTH__JWT_SECRET="$(cat "$CELERY_DIR/jwt_secret")"
export REASSEMBLER_INPUT=s3://capture/nightly REASSEMBLER_OUTPUT=s3://rows/nightly
export REASSEMBLER_WAREHOUSE_QUEUE=warehouse REASSEMBLER_DEFAULT_DS="$DS" REASSEMBLER_INPUT_POKE_SECONDS=30
export ARROW_DEFAULT_MEMORY_POOL=jemalloc
# a shell's environment for this deployment: source $CELERY_DIR/env.sh
export -p | grep -E ' (AIRFLOW|AWS|REASSEMBLER)[A-Z_]*=' > "$CELERY_DIR/env.sh"
echo "export PATH=\"$REPO/.venv/bin:\$PATH\"" >> "$CELERY_DIR/env.sh"
airflow db migrate > "$LOGS/db-migrate.log" 2>&1
echo "$PORT" > "$RUN/ports"
start api-server airflow api-server --port "$PORT"
start scheduler airflow scheduler
start dag-processor airflow dag-processor

W1="$CELERY_DIR/worker-1" W2="$CELERY_DIR/worker-2"
mkdir -p "$W1/tmp" "$W2/tmp"
worker() {  # name folder hidden-folder queues [VAR=value ...]
  local name="$1" folder="$2" hidden="$3" queues="$4"; shift 4
  local cmd=(env "$@" TMPDIR="$folder/tmp" REASSEMBLER_WORKER_NAME="$name"
             AIRFLOW__LOGGING__BASE_LOG_FOLDER="$folder/logs"
             airflow celery worker --queues "$queues" --concurrency "${WORKER_CONCURRENCY:-2}" --skip-serve-logs
             --celery-hostname "$name@%h")
  if [ "${ISOLATE:-0}" = 1 ]; then  # the other worker's folder is an empty tmpfs in this one's view
    start "$name" unshare --mount --propagation private sh -c \
      'mount -t tmpfs none "$0" && cd "$1" && shift && exec "$@"' "$hidden" "$folder" "${cmd[@]}"
  else
    start "$name" sh -c 'cd "$0" && exec "$@"' "$folder" "${cmd[@]}"
  fi
}
worker worker-1 "$W1" "$W2" default,warehouse REASSEMBLER_WAREHOUSE="$W1/warehouse.duckdb"
worker worker-2 "$W2" "$W1" default
wait_for "the api-server" curl -sf "http://localhost:$PORT/api/v2/monitor/health"
password="$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['admin'])" \
            "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" 2>/dev/null || echo '(see the api-server log)')"
cat <<MSG
Airflow on Celery is up: http://localhost:$PORT   login: admin / $password
  broker redis://127.0.0.1:$REDIS_PORT   metadata DB postgresql://127.0.0.1:$PG_PORT/airflow   S3 $AWS_ENDPOINT_URL
  worker-1 queues default,warehouse (the warehouse: $W1/warehouse.duckdb); worker-2 queue default
  input s3://capture/nightly   output s3://rows/nightly
  trigger a night: source $CELERY_DIR/env.sh && airflow dags unpause capture_rows_nightly &&
                   airflow dags trigger capture_rows_nightly -c '{"ds": "$DS"}'     (or from the UI)
  logs $LOGS/ and each worker's folder; stop: make airflow-stop
MSG
