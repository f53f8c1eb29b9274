"""capture_rows_nightly: one night of agent capture -> verified training rows + an audit table.

The DAG is defined in the installed package (plugins/reassembler_airflow/dag.py, shipped in
the wheel as reassembler_airflow.dag); a deployment's DAG file is this one import line.
"""

from reassembler_airflow.dag import capture_rows_nightly  # noqa: F401
