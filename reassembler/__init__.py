"""Rebuild verified training rows from one night of LLM-agent token capture (README.md).

The core, by stage, as the data flows: formats/ (what the files hold), load/ (input ->
warehouse), verify/ (select, cut, finalize, rows), publish/ (the staged night swapped in),
audit/ (quality, reports, explain); settings, reasons and errors beneath them all; build.py
runs a night's steps and cli.py is the `reassembler` command. Importing the package sets
nothing in the process (the command sets its own environment: cli.entry).
"""
