"""Airflow wrapper of the reassembler core: the ReassembleOperator, task failures, and the
capture-quality UI plugin."""

DAG_ID = "capture_rows_nightly"  # the DAG (dags/capture_rows_nightly.py) whose read access the reports need
