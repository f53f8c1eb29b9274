# Source me: the embedded Airflow settings (SQLite metadata DB under the repo).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$REPO/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$REPO/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$REPO/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-sqlite:///$AIRFLOW_HOME/airflow.db}"
export REASSEMBLER_INPUT="${REASSEMBLER_INPUT:-$REPO/data/input}"
export REASSEMBLER_OUTPUT="${REASSEMBLER_OUTPUT:-$REPO/data/output}"
mkdir -p "$AIRFLOW_HOME"
