-- Version 8 -> 9: the per-call tables (ledger, token_rows, rejects) leave the file for Parquet
-- beside it (reassembler/call_tables.py). warehouse.py has written their rows out as the run
-- "migrated" of each night, and named it in night_calls, before this runs; the views that
-- replace them are defined once the schema is current.
CREATE TABLE IF NOT EXISTS night_calls (
    ds   DATE    NOT NULL,
    run  VARCHAR NOT NULL
);
DROP TABLE IF EXISTS ledger;
DROP TABLE IF EXISTS token_rows;
DROP TABLE IF EXISTS rejects;
