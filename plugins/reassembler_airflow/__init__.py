"""Airflow wrapper of the reassembler core: the ReassembleOperator and the night's settings."""
