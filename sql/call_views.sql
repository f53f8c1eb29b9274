-- A per-call table as a view (reassembler/call_tables.py): the rows of the files of each
-- night's current run (`night_calls`), over its source: the table's Parquet folder, its
-- partitions ds and run read from the folder names. Files of other runs (an earlier load,
-- one that failed) are never seen.
CREATE OR REPLACE {view} {table} AS
SELECT f.ds, f.* EXCLUDE (ds, run)
FROM {source} f
SEMI JOIN night_calls c ON c.ds = f.ds AND c.run = f.run
