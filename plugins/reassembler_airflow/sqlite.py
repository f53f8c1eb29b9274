"""Connection arguments for Airflow's metadata DB on SQLite, the embedded default of
`make airflow` and the scheduler test: wait up to 30 s for a lock instead of SQLite's 5 s,
so that the scheduler, the dag-processor, the api-server and the CLI share the file without
"database is locked" errors. Set by AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS."""

CONNECT_ARGS = {"timeout": 30}
