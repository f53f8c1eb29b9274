"""Object-storage credentials from an Airflow Connection, as Airflow users keep them.

A run's `aws_conn_id` param (default `aws_default`) names an Airflow Connection of the Amazon
provider's shape: login = access key id, password = secret access key, extra
`endpoint_url` (or `service_config.s3.endpoint_url`: MinIO, Ceph), `region_name`,
`aws_session_token`. The task hands it to the core as the standard AWS environment of its
own process (the core's storage reads that, and the load's child processes inherit it). A
Connection that is not defined, or an empty param, leaves the environment as the deployment
set it: the `AWS_*` variables of the worker. The command line always uses the environment.
"""

from __future__ import annotations

import os

DEFAULT_CONN_ID = "aws_default"


def aws_environment(conn) -> dict[str, str]:
    """The AWS environment variables a Connection stands for (those it sets)."""
    extra = conn.extra_dejson or {}
    s3 = (extra.get("service_config") or {}).get("s3") or {}
    values = {
        "AWS_ACCESS_KEY_ID": conn.login,
        "AWS_SECRET_ACCESS_KEY": conn.password,
        "AWS_SESSION_TOKEN": extra.get("aws_session_token"),
        "AWS_ENDPOINT_URL": extra.get("endpoint_url") or s3.get("endpoint_url") or conn.host,
        "AWS_DEFAULT_REGION": extra.get("region_name"),
    }
    return {k: str(v) for k, v in values.items() if v}


def use_connection(params) -> str:
    """Point this task's object-storage access at the run's `aws_conn_id` Connection; returns
    where the credentials come from (for the task's log)."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    conn_id = (params or {}).get("aws_conn_id", DEFAULT_CONN_ID)
    if not conn_id:
        return "the worker's AWS_* environment (no aws_conn_id)"
    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        return f"the worker's AWS_* environment (no Connection {conn_id!r})"
    env = aws_environment(conn)
    os.environ.update(env)
    return f"the Airflow Connection {conn_id!r} ({', '.join(sorted(env)) or 'no fields set'})"
